"""One conversation streamed through every cell: before every question, re-compress the whole growing history to
each budget with each press's own code, answer from the compressed copy, then append the turn to the history.

The engine's cell server (``evaluation.engine.serving.serve_history``) answers each question's cells: a press the
history serves (``evaluation.catalogue.needs``: its hook reads what the history stores) gets its cache from the
history; any other press (one that runs forward passes of its own) re-prefills the whole history under itself before
each question. Every row records its ``path``, and run.json how each press was served.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell, budget_label
from evaluation.engine.decoding import answer_ids_of, eos_ids
from evaluation.engine.history import History
from evaluation.engine.retention import answer_spans
from evaluation.engine.serving import Asked, Served, Server, serve_history
from evaluation.errors import EvaluationError
from evaluation.protocols.protocol import LIKELIHOOD, REFERENCE, lacks
from evaluation.protocols.streaming.config import TEACHER_FORCED_KINDS, StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question
from evaluation.protocols.streaming.framing import Framing, Message
from evaluation.protocols.streaming.placements import (
    StreamItem,
    asked_after_session,
    asked_questions,
    evidence_inside,
    file_sessions,
    newest_items,
    turn_room,
)
from evaluation.protocols.streaming.protocol import QuestionRow
from evaluation.protocols.streaming.task import StreamTask
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length
from evaluation.runs.store import ResultStore


def cell_key(conversation: Conversation, question: Question, cell: Cell) -> tuple[str, int, str, str]:
    return conversation.sample_id, question.index, cell.label, cell.budget_key


class ConversationRun:
    """One conversation streamed through every cell; one shared history unless answers are the model's own."""

    def __init__(
        self,
        config: StreamConfig,
        task: StreamTask,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cells: list[Cell],
    ) -> None:
        self.config, self.task, self.model, self.tokenizer, self.cells = config, task, model, tokenizer, cells
        self.stop = eos_ids(model)
        self.context = context_length(tokenizer, model.config)
        self.kinds = TEACHER_FORCED_KINDS[config.rmm_weights]
        self.server = Server(model, model.config._attn_implementation, REFERENCE)

    def history(self, cells: list[Cell]) -> History:
        return History(self.model, self.kinds, [cell.press.needs for cell in cells])

    def run(self, conversation: Conversation, store: ResultStore) -> None:
        self.conversation, self.store = conversation, store
        questions = asked_questions(conversation, self.config)
        if self.config.placement == "evidence":
            self.stream_sessions(questions)
        else:
            self.stream_file_order(questions)

    def stream_file_order(self, questions: list[Question]) -> None:
        conversation = self.conversation
        sessions = file_sessions(self.task, conversation, questions, self.tokenizer, self.context, self.config)
        framing = Framing(self.tokenizer, self.task.text(conversation, sessions))
        window = {session.number for session in sessions}
        start_ids = framing.start_ids()
        for budget in self.config.budgets:
            if budget.kind == "tokens" and budget.value >= len(start_ids):
                raise EvaluationError(
                    f"budget {int(budget.value)} is not smaller than the history of {conversation.sample_id} "
                    f"({len(start_ids)} tokens): nothing would be compressed"
                )
        shared = self.config.history == "gold"
        for stream in [None] if shared else self.cells:  # one stream in gold mode, else one per cell, in turn
            cells = self.cells if shared else [stream]
            history, messages = self.history(cells), []
            history.extend(start_ids, "conversation")
            for turn, question in enumerate(questions):
                prompt = self.task.question_prompt(conversation, question)
                question_ids = framing.question_ids(messages, prompt)
                if not self.task.told(question):
                    self.ask(history, question_ids, question, cells, turn, window)
                answer = (
                    self.task.gold_answer(question)
                    if shared
                    else self.store.get(cell_key(conversation, question, stream)).get("prediction", "")
                )
                self.append_turn(framing, history, messages, question_ids, prompt, answer)
            del history  # one full history alive at a time

    def stream_sessions(self, questions: list[Question]) -> None:
        """The evidence placement: sessions one by one, each question after the session of its last evidence."""
        conversation = self.conversation
        framing = Framing(self.tokenizer, self.task.header(conversation))
        asked_after = {q.index: asked_after_session(conversation, q) for q in questions}
        limit = self.config.max_history_tokens
        if limit is None:
            after = {n: [q for q in questions if asked_after[q.index] == n] for n in set(asked_after.values())}
            rooms = (
                turn_room(self.task, conversation, framing, group, self.config.max_new_tokens)
                for group in after.values()
            )
            limit = self.context - max(rooms, default=0)
        items: list[StreamItem] = []  # the stream so far
        history, messages = self.rebuild(framing, items)
        turn = 0
        needed = max(asked_after.values(), default=0)  # the sessions after the last asked question change nothing
        for session in (s for s in conversation.sessions if s.number <= needed):
            text = self.task.render_session(session)
            ids = framing.session_ids(messages, text)
            if history.length + len(ids) > limit:
                items = newest_items(items, framing, (limit // 2) - len(ids))
                history, messages = self.rebuild(framing, items)
                ids = framing.session_ids(messages, text)
                if history.length + len(ids) > limit:
                    raise EvaluationError(
                        f"{conversation.sample_id}: session {session.number} ({len(ids)} tokens) does not fit in "
                        f"{limit} history tokens: pass a larger --max-history-tokens (at most the model's context, "
                        "unless the run is meant to read past it)"
                    )
            history.extend(ids, "conversation")
            messages.append(("user", text))
            items.append(("session", text, session.number))
            window = {number for kind, _, number in items if kind == "session"}
            for question in (q for q in questions if asked_after[q.index] == session.number):
                prompt, gold = self.task.question_prompt(conversation, question), self.task.gold_answer(question)
                question_ids = framing.question_ids(messages, prompt)
                if not self.task.told(question):
                    self.ask(history, question_ids, question, self.cells, turn, window)
                self.append_turn(framing, history, messages, question_ids, prompt, gold)
                items.append(("turn", (prompt, gold), session.number))
                turn += 1

    def rebuild(self, framing: Framing, items: list[StreamItem]) -> tuple[History, list[Message]]:
        """A fresh history of the stream's ``items`` (one prefill per item, the teacher-forced kinds as usual)."""
        history, messages = self.history(self.cells), []
        history.extend(framing.start_ids(), "conversation")
        for kind, content, _ in items:
            if kind == "session":
                history.extend(framing.session_ids(messages, content), "conversation")
                messages.append(("user", content))
            else:
                prompt, answer = content
                self.append_turn(framing, history, messages, framing.question_ids(messages, prompt), prompt, answer)
        return history, messages

    def ask(
        self, history: History, question_ids: list[int], question: Question, cells: list[Cell], turn: int, window: set
    ) -> None:
        """Answer the cells that lack a row for ``question`` from ``history``, and store their rows; complete the
        stored rows that older code left without the answer's likelihood (forced, nothing generated)."""
        missing = [cell for cell in cells if cell_key(self.conversation, question, cell) not in self.store]
        visible = evidence_inside(question, window)
        if missing:
            for row in self.answer(history, question_ids, question, missing, turn, visible):
                self.store.append(row)
        stored = [self.store.get(cell_key(self.conversation, question, cell)) for cell in cells]
        unfilled = [(cell, row) for cell, row in zip(cells, stored, strict=True) if lacks(row, LIKELIHOOD)]
        if unfilled:
            self.store.amend(self.completed(history, question_ids, question, unfilled, turn, visible))

    def completed(
        self,
        history: History,
        question_ids: list[int],
        question: Question,
        unfilled: list[tuple[Cell, QuestionRow]],
        turn: int,
        visible: bool,
    ) -> list[QuestionRow]:
        """The stored rows of ``unfilled`` with their answer's likelihood, each cell's cache built again."""
        if not self.answer_ids(question):
            return [{**row, "answer_nll": None, "answer_tokens": 0} for _, row in unfilled]
        cells = [cell for cell, _ in unfilled]
        forced = self.answer(history, question_ids, question, cells, turn, visible, likelihood_only=True)
        for row in forced:
            if row.get("error"):
                raise EvaluationError(f"{self.conversation.sample_id} {row['press']}: no likelihood: {row['error']}")
        return [
            {**row, **{field: done[field] for field in LIKELIHOOD}}
            for (_, row), done in zip(unfilled, forced, strict=True)
        ]

    @staticmethod
    def append_turn(
        framing: Framing,
        history: History,
        messages: list[Message],
        question_ids: list[int],
        prompt: str,
        answer: str,
    ) -> None:
        history.extend_segments([(question_ids, "question"), (framing.answer_ids(messages, prompt, answer), "answer")])
        messages += [("user", prompt), ("assistant", answer)]

    def answer(
        self,
        history: History,
        question_ids: list[int],
        question: Question,
        cells: list[Cell],
        turn: int,
        visible: bool,
        likelihood_only: bool = False,
    ) -> list[QuestionRow]:
        """The rows of ``cells`` for one question, served from ``history`` (``serve_history``); a failed cell's row
        holds its reason. ``likelihood_only`` (or ``--likelihood-only``): nothing generated."""
        likelihood_only = likelihood_only or self.config.likelihood_only
        asked = Asked(
            torch.tensor([question_ids]),
            self.answer_ids(question),
            0 if likelihood_only else self.config.max_new_tokens,
            self.stop,
            f"question {question.index}",
            likelihood_only,
            spans=self.spans(history, question) if self.task.retention else None,
        )
        return [
            self.row(question, served, turn, visible, history.length, likelihood_only)
            for served in serve_history(self.server, history, cells, asked)
        ]

    def answer_ids(self, question: Question) -> list[int]:
        """The gold answer's tokens, as its likelihood forces them: the answer the task scores against
        (``gold_answer``), its text alone without special tokens, cut to the answer limit (``--max-new-tokens``)."""
        return answer_ids_of(self.tokenizer, self.task.gold_answer(question), self.config.max_new_tokens)

    def spans(self, history: History, question: Question) -> list[list[int]]:
        """Where the history holds copies of the question's answer, whose retention a task may measure."""
        return answer_spans(history.token_ids, self.tokenizer.encode(str(question.answer), add_special_tokens=False))

    def failed_row(
        self, question: Question, served: Served, turn: int, visible: bool, history_tokens: int
    ) -> QuestionRow:
        """A cell whose press refused this history: stored with the reason, counted in the scorecard as failed."""
        return {
            "conversation": self.conversation.sample_id,
            "question_index": question.index,
            "turn": turn,
            "category": question.category,
            "press": served.cell.label,
            "budget": served.cell.budget_key,
            "budget_label": budget_label(served.cell.budget, history_tokens),
            "history_tokens": history_tokens,
            "evidence_visible": visible,
            "placement": self.config.placement,
            "error": served.error,
            "score": None,
            **self.task.row_fields(self.conversation, question, self.tokenizer),
            **served.measures,
        }

    def row(
        self, question: Question, served: Served, turn: int, visible: bool, history_tokens: int, likelihood_only: bool
    ) -> QuestionRow:
        """A cell's row: what it measured (``served.measures``) and its answer's likelihood; a likelihood-only row
        holds no prediction, and its score is its ``answer_nll``."""
        if served.error:
            return self.failed_row(question, served, turn, visible, history_tokens)
        if likelihood_only:
            answered = {"score": served.answer_nll}
        else:
            prediction = self.tokenizer.decode(served.token_ids, skip_special_tokens=True).strip()
            scored, score = self.task.scored(self.conversation, question, prediction)
            answered = {"prediction": prediction, "scored_prediction": scored, "score": score}
        return {
            "conversation": self.conversation.sample_id,
            "question_index": question.index,
            "turn": turn,
            "category": question.category,
            "question": question.question,
            "answer": question.answer,
            "press": served.cell.label,
            "budget": served.cell.budget_key,
            "budget_label": budget_label(served.cell.budget, history_tokens),
            "compression_ratio": served.ratio,
            "history_tokens": history_tokens,
            "kept_tokens": served.kept_tokens,
            "evidence_visible": visible,
            "placement": self.config.placement,
            "history_mode": self.config.history,
            "rmm_weights": self.config.rmm_weights,
            "path": served.path,
            **answered,
            **self.task.row_fields(self.conversation, question, self.tokenizer),
            **served.measures,
            "answer_nll": served.answer_nll,
            "answer_tokens": served.answer_tokens,
        }


def run_conversation(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: StreamConfig,
    task: StreamTask,
    cells: list[Cell],
) -> None:
    """One unit: one conversation streamed through every cell, its finished answers read back from ``store``."""
    model, tokenizer = loaded
    conversation: Conversation = unit.payload
    ConversationRun(config, task, model, tokenizer, cells).run(conversation, store)
