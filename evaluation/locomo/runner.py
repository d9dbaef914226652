"""The LoCoMo streaming protocol: before every question, re-compress the whole growing history to each
budget with each press's own score, answer from the compressed copy, then append the turn to the history."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.budgets import Budget
from evaluation.errors import EvaluationError
from evaluation.generation import decode, eos_ids
from evaluation.locomo.data import Conversation, Question, Session, load_conversations, resolve_path
from evaluation.locomo.history import History
from evaluation.locomo.render import (
    Framing,
    choice_options,
    gold_answer,
    question_prompt,
    render_conversation,
    resolve_choice,
)
from evaluation.metrics.locomo import CATEGORIES, PAPER_ORDER, score
from evaluation.models import load_model_or_explain
from evaluation.press_registry import FULL_CACHE, check_presses, make_press
from evaluation.run_record import RunRecord
from evaluation.scorecard import Entry, plot_by_turn, write_tables
from evaluation.store import ResultStore

TEACHER_FORCED_KINDS = {"answers": frozenset({"answer"}), "all": frozenset({"conversation", "question", "answer"})}
RESULTS_DEFINING = ("model", "history", "rmm_weights", "max_history_tokens", "max_new_tokens", "device")


@dataclass
class LoCoMoConfig:
    model: str
    presses: list[str]
    budgets: list[Budget]
    conversations: list[str] | None
    max_turns: int | None
    max_history_tokens: int | None
    history: str
    rmm_weights: str
    data: str | None
    output: Path
    device: str = "cpu"
    max_new_tokens: int = 32


Cell = tuple[str, Budget | None]


def row_key(row: dict) -> tuple[str, int, str, str]:
    return row["conversation"], row["question_index"], row["press"], row["budget"]


def cell_key(conversation: Conversation, question: Question, cell: Cell) -> tuple[str, int, str, str]:
    press, budget = cell
    return conversation.sample_id, question.index, press, budget.key if budget else FULL_CACHE


def select_conversations(conversations: list[Conversation], wanted: list[str] | None) -> list[Conversation]:
    if wanted is None:
        return conversations
    known = {c.sample_id: c for c in conversations}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise EvaluationError(f"unknown conversation(s) {unknown}; the data holds {', '.join(known)}")
    return [known[name] for name in wanted]


def fit_sessions(framing_for, conversation: Conversation, limit: int) -> list[Session]:
    """The newest sessions whose rendered conversation fits in ``limit`` tokens (the oldest are dropped)."""
    for first in range(len(conversation.sessions)):
        sessions = conversation.sessions[first:]
        if len(framing_for(sessions).conversation_ids()) <= limit:
            return sessions
    raise EvaluationError(f"{conversation.sample_id}: not even its last session fits in {limit} history tokens")


class ConversationRun:
    """One conversation streamed through every cell; one shared history unless answers are the model's own."""

    def __init__(self, config: LoCoMoConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.stop = eos_ids(model)
        self.cells: list[Cell] = [(FULL_CACHE, None)] if FULL_CACHE in config.presses else []
        self.cells += [(p, b) for p in config.presses if p != FULL_CACHE for b in config.budgets]

    def history_limit(self, framing: Framing, questions: list[Question]) -> int:
        if self.config.max_history_tokens is not None:
            return self.config.max_history_tokens
        context = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        room = sum(
            len(framing.question_ids([], question_prompt_text)) + len(framing.answer_ids([], question_prompt_text, a))
            for question_prompt_text, a in self.turn_texts(questions)
        )
        return context - room - self.config.max_new_tokens * (len(questions) + 1)

    def turn_texts(self, questions: list[Question]) -> list[tuple[str, str]]:
        return [(question_prompt(self.conversation, q), gold_answer(q)) for q in questions]

    def run(self, conversation: Conversation, store: ResultStore, bar: tqdm) -> int:
        self.conversation = conversation
        questions = conversation.questions[: self.config.max_turns]

        def framing_for(sessions: list[Session]) -> Framing:
            return Framing(self.tokenizer, render_conversation(conversation, sessions))

        sessions = fit_sessions(
            framing_for, conversation, self.history_limit(framing_for(conversation.sessions), questions)
        )
        framing = framing_for(sessions)
        kept_sessions = {session.number for session in sessions}
        conversation_ids = framing.conversation_ids()
        for budget in self.config.budgets:
            if budget.kind == "tokens" and budget.value >= len(conversation_ids):
                raise EvaluationError(
                    f"budget {int(budget.value)} is not smaller than the history of {conversation.sample_id} "
                    f"({len(conversation_ids)} tokens): nothing would be compressed"
                )
        shared = self.config.history == "gold"
        kinds = TEACHER_FORCED_KINDS[self.config.rmm_weights]
        histories: dict[Cell, History] = {}
        turns: dict[Cell, list[tuple[str, str]]] = {}
        for cell in [None] if shared else self.cells:
            histories[cell] = History(self.model, kinds)
            histories[cell].extend(conversation_ids, "conversation")
            turns[cell] = []
        ran = 0
        for turn, question in enumerate(questions):
            prompt = question_prompt(conversation, question)
            answerable = bool(question.evidence_sessions) and question.evidence_sessions <= kept_sessions
            for cell in self.cells:
                stream = None if shared else cell
                history = histories[stream]
                question_ids = framing.question_ids(turns[stream], prompt)
                row = store.get(cell_key(conversation, question, cell))
                if row is None:
                    row = self.answer(history, question_ids, question, cell, turn, answerable)
                    store.append(row)
                    ran += 1
                    bar.update()
                if not shared:
                    self.append_turn(framing, history, turns[stream], prompt, question_ids, row["prediction"])
            if shared:
                question_ids = framing.question_ids(turns[None], prompt)
                self.append_turn(framing, histories[None], turns[None], prompt, question_ids, gold_answer(question))
        return ran

    @staticmethod
    def append_turn(framing, history: History, turns: list, prompt: str, question_ids: list[int], answer: str) -> None:
        history.extend(question_ids, "question")
        history.extend(framing.answer_ids(turns, prompt, answer), "answer")
        turns.append((prompt, answer))

    def answer(
        self, history: History, question_ids: list[int], question: Question, cell: Cell, turn: int, answerable: bool
    ) -> dict:
        press_name, budget = cell
        ratio = budget.compression_ratio(history.length) if budget else 0.0
        start = time.perf_counter()
        cache, kept = history.compress(make_press(press_name, ratio))
        generated = decode(
            self.model, cache, torch.tensor([question_ids]), history.length, self.config.max_new_tokens, self.stop
        )
        history.release(cache)
        prediction = self.tokenizer.decode(generated, skip_special_tokens=True).strip()
        scored = (
            resolve_choice(prediction, choice_options(self.conversation, question))
            if question.category == 5
            else prediction
        )
        return {
            "conversation": self.conversation.sample_id,
            "question_index": question.index,
            "turn": turn,
            "category": question.category,
            "question": question.question,
            "answer": question.answer,
            "press": press_name,
            "budget": budget.key if budget else FULL_CACHE,
            "budget_label": budget.label if budget else FULL_CACHE,
            "compression_ratio": ratio,
            "history_tokens": history.length,
            "kept_tokens": kept[0].shape[-1],
            "answerable": answerable,
            "history_mode": self.config.history,
            "rmm_weights": self.config.rmm_weights,
            "seconds": round(time.perf_counter() - start, 2),
            "prediction": prediction,
            "scored_prediction": scored,
            "score": score(question.category, scored, gold_answer(question)),
        }


def run(config: LoCoMoConfig) -> Path:
    """Run (or resume) the streaming protocol and write predictions, scorecard and run.json."""
    check_presses(config.presses)
    if not config.budgets and any(p != FULL_CACHE for p in config.presses):
        raise EvaluationError("no budget: give at least one --budgets value")
    conversations = select_conversations(load_conversations(resolve_path(config.data)), config.conversations)
    settings = {**asdict(config), "output": str(config.output), "budgets": [b.key for b in config.budgets]}
    record = RunRecord(config.output, settings, RESULTS_DEFINING)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    model, tokenizer = load_model_or_explain(config.model, device=config.device)
    streamer = ConversationRun(config, model, tokenizer)
    total = sum(len(c.questions[: config.max_turns]) for c in conversations) * len(streamer.cells)
    done = sum(
        cell_key(c, q, cell) in store
        for c in conversations
        for q in c.questions[: config.max_turns]
        for cell in streamer.cells
    )
    ran = 0
    with tqdm(total=total, initial=done, desc="locomo", unit="answer") as bar:
        for conversation in conversations:
            keys = [
                cell_key(conversation, q, cell)
                for q in conversation.questions[: config.max_turns]
                for cell in streamer.cells
            ]
            if all(key in store for key in keys):
                continue
            bar.set_postfix_str(conversation.sample_id)
            ran += streamer.run(conversation, store, bar)
    write_locomo_scorecard(config.output, store.rows, config.presses, config.budgets)
    record.finish(ran, model=config.model, device=config.device)
    return config.output


def locomo_entries(rows: list[dict]) -> list[Entry]:
    """Per (press, budget): mean F1 overall, on first and later turns, on answerable questions, per category."""
    groups = {
        "overall": lambda r: True,
        "first turn": lambda r: r["turn"] == 0,
        "later turns": lambda r: r["turn"] > 0,
        "answerable": lambda r: r["answerable"],
        **{f"{CATEGORIES[c]} ({c})": (lambda r, c=c: r["category"] == c) for c in PAPER_ORDER},
    }
    entries = []
    for budget, press in dict.fromkeys((r["budget_label"], r["press"]) for r in rows):
        cell = [r for r in rows if (r["budget_label"], r["press"]) == (budget, press)]
        for condition, member in groups.items():
            scores = [r["score"] for r in cell if member(r)]
            if scores:
                entries.append(Entry(condition, budget, press, round(sum(scores) / len(scores), 3), len(scores)))
    return entries


def write_locomo_scorecard(output: Path, rows: list[dict], presses: list[str], budgets: list[Budget]) -> None:
    if rows:
        labels = [b.label for b in budgets]
        write_tables(output, locomo_entries(rows), presses, labels, f"LoCoMo streaming: {output.name}", "F1", digits=3)
        plot_by_turn(output / "scorecard.png", rows, presses, labels)
