"""One conversation streamed through every cell: before every question, re-compress the whole growing history to
each budget with each press's own code, answer from the compressed copy, then append the turn to the history.

A press the history serves (``evaluation.catalogue.needs``: its hook reads what the history stores) gets its cache
from the history; any other press (one that runs forward passes of its own) re-prefills the whole history under
itself before each question. Every row records its ``path``, and run.json how each press was served.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import (
    Cell,
    budget_key,
    budget_label,
    ratio_for,
)
from evaluation.catalogue.registry import SHARED, question_position
from evaluation.catalogue.resolved import resolve_press, resolve_presses
from evaluation.engine.decoding import answer_ids_of, decode_batch_forced, eos_ids, generate
from evaluation.engine.history import History
from evaluation.engine.overlap import UNKNOWN, overlaps
from evaluation.engine.retention import answer_spans, held_positions, retention
from evaluation.errors import EvaluationError, PressCannotRun, press_cell
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
from presses.harness import attention_implementation


def cell_key(conversation: Conversation, question: Question, cell: Cell) -> tuple[str, int, str, str]:
    press, budget = cell
    return conversation.sample_id, question.index, press, budget_key(budget)


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

    def history(self, cells: list[Cell]) -> History:
        return History(self.model, self.kinds, [resolve_press(name).needs for name, _ in cells])

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
        """The rows of ``cells`` for one question. A press the history serves gets its cache from the history (its
        own hook on the stored inputs), all of them decoded in one batch; any other press re-prefills the history
        under itself (``generate``), the model's attention implementation restored afterwards. A press's error is
        its cell's failure (``press_cell``), stored with the others' rows once the batch (the full-cache cell's
        among them) has run. ``likelihood_only`` (or ``--likelihood-only``): nothing generated."""
        likelihood_only = likelihood_only or self.config.likelihood_only
        ratios = [ratio_for(budget, history.length) for _, budget in cells]
        resolved = [resolve_press(name) for name, _ in cells]
        rules = [nullcontext if budget is None else press_cell for _, budget in cells]
        presses: list = [None] * len(cells)
        caches, refused, starts = {}, {}, {}
        for i, (press, ratio) in enumerate(zip(resolved, ratios, strict=True)):
            try:
                with rules[i](cells[i][0]):
                    built = press.build(ratio, history.length)
                if history.can_serve(built):
                    with rules[i](built):
                        caches[i] = history.compress(built)
                    starts[i] = question_position(built, history.length, caches[i].cache.get_seq_length())
                else:
                    presses[i] = built  # it runs its own forward passes below
            except PressCannotRun as error:
                refused[i] = error
        kept_sets = [held_positions(history.cache, cache) for cache in caches.values()]
        named = [(cells[i][0], budget_key(cells[i][1])) for i in caches]
        agreement = dict(zip(caches, overlaps(named, kept_sets, REFERENCE), strict=True))
        del kept_sets
        held = {}
        if self.task.retention:
            spans = answer_spans(
                history.token_ids, self.tokenizer.encode(str(question.answer), add_special_tokens=False)
            )
            held = {i: retention(history.cache, cache, spans) for i, cache in caches.items()}
        asked = torch.tensor([question_ids])
        answer = self.answer_ids(question)
        cap = 0 if likelihood_only else self.config.max_new_tokens
        if likelihood_only and not answer:
            error = PressCannotRun(f"question {question.index} has no gold answer: no likelihood to score")
            refused |= dict.fromkeys(range(len(cells)), error)
            caches, starts = {}, {}
        generated, forced = decode_batch_forced(
            self.model,
            list(caches.values()),
            asked,
            list(starts.values()),
            cap,
            self.stop,
            answer,
            consume=True,
        )
        tokens = dict(zip(caches, generated, strict=True))
        nlls = dict(zip(caches, forced, strict=True))
        kept = {i: cache.kept_tokens for i, cache in caches.items()}
        paths = {i: SHARED if i in caches else press.needs.path for i, press in enumerate(resolved)}
        context = torch.tensor([history.token_ids], device=self.model.device)
        for i in (i for i in range(len(cells)) if i not in caches and i not in refused):
            implementation = "eager" if resolved[i].reads_weights else self.model.config._attn_implementation
            try:
                with rules[i](presses[i]), attention_implementation(self.model, implementation):
                    generation = generate(self.model, context, asked, presses[i], cap, self.stop, answer)
                tokens[i], kept[i], nlls[i] = generation.token_ids, generation.kept_tokens, generation.answer_nll
            except PressCannotRun as error:
                refused[i] = error
        rows = [
            self.failed_row(question, cell, turn, visible, history.length, refused[i])
            if i in refused
            else self.row(question, cell, ratios[i], history.length, kept[i], tokens[i], turn, visible, paths[i])
            for i, cell in enumerate(cells)
        ]
        for i, row in enumerate(rows):
            if i not in refused:
                row.update(agreement.get(i, UNKNOWN))
        if self.task.retention:  # unknown (None) for a press on its own prefill
            for i, row in enumerate(rows):
                row["retention"] = held.get(i)
        for i, row in enumerate(rows):
            if i not in refused:
                row["answer_nll"], row["answer_tokens"] = nlls[i], len(answer)
                if likelihood_only:  # no prediction: the row's score is its answer's likelihood
                    del row["prediction"], row["scored_prediction"]
                    row["score"] = nlls[i]
        return rows

    def answer_ids(self, question: Question) -> list[int]:
        """The gold answer's tokens, as its likelihood forces them: the answer the task scores against
        (``gold_answer``), its text alone without special tokens, cut to the answer limit (``--max-new-tokens``)."""
        return answer_ids_of(self.tokenizer, self.task.gold_answer(question), self.config.max_new_tokens)

    def failed_row(
        self, question: Question, cell: Cell, turn: int, visible: bool, history_tokens: int, error: PressCannotRun
    ) -> QuestionRow:
        """A cell whose press refused this history: stored with the reason, counted in the scorecard as failed."""
        press_name, budget = cell
        return {
            "conversation": self.conversation.sample_id,
            "question_index": question.index,
            "turn": turn,
            "category": question.category,
            "press": press_name,
            "budget": budget_key(budget),
            "budget_label": budget_label(budget, history_tokens),
            "history_tokens": history_tokens,
            "evidence_visible": visible,
            "placement": self.config.placement,
            "error": str(error).splitlines()[0],
            "score": None,
            **self.task.row_fields(self.conversation, question, self.tokenizer),
        }

    def row(
        self,
        question: Question,
        cell: Cell,
        ratio: float,
        history_tokens: int,
        kept_tokens: int,
        generated: list[int],
        turn: int,
        visible: bool,
        path: str,
    ) -> QuestionRow:
        press_name, budget = cell
        prediction = self.tokenizer.decode(generated, skip_special_tokens=True).strip()
        scored, score = self.task.scored(self.conversation, question, prediction)
        return {
            "conversation": self.conversation.sample_id,
            "question_index": question.index,
            "turn": turn,
            "category": question.category,
            "question": question.question,
            "answer": question.answer,
            "press": press_name,
            "budget": budget_key(budget),
            "budget_label": budget_label(budget, history_tokens),
            "compression_ratio": ratio,
            "history_tokens": history_tokens,
            "kept_tokens": kept_tokens,
            "evidence_visible": visible,
            "placement": self.config.placement,
            "history_mode": self.config.history,
            "rmm_weights": self.config.rmm_weights,
            "path": path,
            "prediction": prediction,
            "scored_prediction": scored,
            "score": score,
            **self.task.row_fields(self.conversation, question, self.tokenizer),
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
    resolve_presses(config.presses, config.allow_import)  # once per process: a Ray worker's own resolution
    model, tokenizer = loaded
    conversation: Conversation = unit.payload
    ConversationRun(config, task, model, tokenizer, cells).run(conversation, store)
