"""The LoCoMo streaming protocol: before every question, re-compress the whole growing history to each
budget with each press's own score, answer from the compressed copy, then append the turn to the history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.backends import LOCAL, Backend, Unit, run_units
from evaluation.budgets import Budget, Cell, budget_key, budget_label, press_cells, ratio_for
from evaluation.errors import EvaluationError
from evaluation.generation import decode_batch, eos_ids
from evaluation.history import History
from evaluation.locomo.data import Conversation, Question, Session, load_conversations, resolve_path
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
from evaluation.press_registry import check_presses, make_press
from evaluation.run_record import RunRecord
from evaluation.scorecard import Entry, entries_from_rows, plot_by_turn, write_tables
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


def row_key(row: dict) -> tuple[str, int, str, str]:
    return row["conversation"], row["question_index"], row["press"], row["budget"]


def cell_key(conversation: Conversation, question: Question, cell: Cell) -> tuple[str, int, str, str]:
    press, budget = cell
    return conversation.sample_id, question.index, press, budget_key(budget)


def select_conversations(conversations: list[Conversation], wanted: list[str] | None) -> list[Conversation]:
    if wanted is None:
        return conversations
    known = {c.sample_id: c for c in conversations}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise EvaluationError(f"unknown conversation(s) {unknown}; the data holds {', '.join(known)}")
    return [known[name] for name in wanted]


def fit_sessions(
    framing_for: Callable[[list[Session]], Framing], conversation: Conversation, limit: int
) -> list[Session]:
    """The newest sessions whose rendered conversation fits in ``limit`` tokens (the oldest are dropped)."""
    for first in range(len(conversation.sessions)):
        sessions = conversation.sessions[first:]
        if len(framing_for(sessions).conversation_ids()) <= limit:
            return sessions
    raise EvaluationError(f"{conversation.sample_id}: not even its last session fits in {limit} history tokens")


class ConversationRun:
    """One conversation streamed through every cell; one shared history unless answers are the model's own."""

    def __init__(
        self, config: LoCoMoConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cells: list[Cell]
    ) -> None:
        self.config, self.model, self.tokenizer, self.cells = config, model, tokenizer, cells
        self.stop = eos_ids(model)

    def history_limit(self, conversation: Conversation, framing: Framing, questions: list[Question]) -> int:
        """``--max-history-tokens``, else the model's context less room for every asked question and answer."""
        if self.config.max_history_tokens is not None:
            return self.config.max_history_tokens
        context = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        room = self.config.max_new_tokens * (len(questions) + 1)
        for question in questions:
            prompt = question_prompt(conversation, question)
            room += len(framing.question_ids([], prompt)) + len(framing.answer_ids([], prompt, gold_answer(question)))
        return context - room

    def run(self, conversation: Conversation, store: ResultStore, bar: tqdm) -> None:
        self.conversation = conversation
        questions = conversation.questions[: self.config.max_turns]

        def framing_for(sessions: list[Session]) -> Framing:
            return Framing(self.tokenizer, render_conversation(conversation, sessions))

        limit = self.history_limit(conversation, framing_for(conversation.sessions), questions)
        sessions = fit_sessions(framing_for, conversation, limit)
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
        histories: dict[Cell | None, History] = {}  # one stream (key None) in gold mode, else one per cell
        turns: dict[Cell | None, list[tuple[str, str]]] = {}
        for cell in [None] if shared else self.cells:
            histories[cell] = History(self.model, kinds)
            histories[cell].extend(conversation_ids, "conversation")
            turns[cell] = []
        for turn, question in enumerate(questions):
            prompt = question_prompt(conversation, question)
            answerable = bool(question.evidence_sessions) and question.evidence_sessions <= kept_sessions
            question_ids = {stream: framing.question_ids(turns[stream], prompt) for stream in histories}
            for stream, history in histories.items():
                cells = self.cells if shared else [stream]
                missing = [cell for cell in cells if cell_key(conversation, question, cell) not in store]
                if missing:
                    for row in self.answer(history, question_ids[stream], question, missing, turn, answerable):
                        store.append(row)
                        bar.update()
                if not shared:
                    answer = store.get(cell_key(conversation, question, stream))["prediction"]
                    self.append_turn(framing, history, turns[stream], prompt, question_ids[stream], answer)
            if shared:
                self.append_turn(
                    framing, histories[None], turns[None], prompt, question_ids[None], gold_answer(question)
                )

    @staticmethod
    def append_turn(
        framing: Framing,
        history: History,
        turns: list[tuple[str, str]],
        prompt: str,
        question_ids: list[int],
        answer: str,
    ) -> None:
        history.extend(question_ids, "question")
        history.extend(framing.answer_ids(turns, prompt, answer), "answer")
        turns.append((prompt, answer))

    def answer(
        self,
        history: History,
        question_ids: list[int],
        question: Question,
        cells: list[Cell],
        turn: int,
        answerable: bool,
    ) -> list[dict]:
        """The rows of ``cells`` for one question: each cell's cache compressed from the history, all decoded in
        one batch."""
        ratios = [ratio_for(budget, history.length) for _, budget in cells]
        caches = [history.compress(make_press(name, ratio))[0] for (name, _), ratio in zip(cells, ratios, strict=True)]
        generated = decode_batch(
            self.model, caches, torch.tensor([question_ids]), history.length, self.config.max_new_tokens, self.stop
        )
        return [
            self.row(question, cell, ratio, history.length, cache.get_seq_length(), tokens, turn, answerable)
            for cell, ratio, cache, tokens in zip(cells, ratios, caches, generated, strict=True)
        ]

    def row(
        self,
        question: Question,
        cell: Cell,
        ratio: float,
        history_tokens: int,
        kept_tokens: int,
        generated: list[int],
        turn: int,
        answerable: bool,
    ) -> dict:
        press_name, budget = cell
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
            "budget": budget_key(budget),
            "budget_label": budget_label(budget),
            "compression_ratio": ratio,
            "history_tokens": history_tokens,
            "kept_tokens": kept_tokens,
            "answerable": answerable,
            "history_mode": self.config.history,
            "rmm_weights": self.config.rmm_weights,
            "prediction": prediction,
            "scored_prediction": scored,
            "score": score(question.category, scored, gold_answer(question)),
        }


def run_conversation(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: LoCoMoConfig,
    cells: list[Cell],
) -> None:
    """One unit: one conversation streamed through every cell, its finished answers read back from ``store``."""
    model, tokenizer = loaded
    conversation: Conversation = unit.payload
    missing = sum(key not in store for key in unit.keys)
    with tqdm(total=missing, desc=conversation.sample_id, unit="answer", leave=False) as bar:
        ConversationRun(config, model, tokenizer, cells).run(conversation, store, bar)


def run(config: LoCoMoConfig, backend: Backend = LOCAL) -> Path:
    """Run (or resume) the streaming protocol and write predictions, scorecard and run.json."""
    check_presses(config.presses)
    cells = press_cells(config.presses, config.budgets, "--budgets")
    conversations = select_conversations(load_conversations(resolve_path(config.data)), config.conversations)
    settings = {**asdict(config), "output": str(config.output), "budgets": [b.key for b in config.budgets]}
    record = RunRecord(config.output, settings, RESULTS_DEFINING)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    units = [
        Unit(c.sample_id, c, frozenset(cell_key(c, q, cell) for q in c.questions[: config.max_turns] for cell in cells))
        for c in conversations
    ]
    load = partial(load_model_or_explain, config.model, device=config.device)
    outcome = run_units(
        units, partial(run_conversation, config=config, cells=cells), load, store, backend, config.device
    )
    write_locomo_scorecard(config.output, store.rows, config.presses, config.budgets)
    record.finish(outcome.ran, model=config.model, device=config.device, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a LoCoMo row counts in: overall, its turn regime, answerable, its category."""
    regime = "first turn" if row["turn"] == 0 else "later turns"
    answerable = ["answerable"] if row["answerable"] else []
    return ["overall", regime, *answerable, f"{CATEGORIES[row['category']]} ({row['category']})"]


CONDITION_ORDER = [
    "overall",
    "first turn",
    "later turns",
    "answerable",
    *(f"{CATEGORIES[c]} ({c})" for c in PAPER_ORDER),
]


def locomo_entries(rows: list[dict]) -> list[Entry]:
    """Per (press, budget): mean F1 with its bootstrap interval, per condition, in the paper's order."""
    entries = entries_from_rows(rows, conditions, scale=1, digits=3)
    return sorted(entries, key=lambda e: CONDITION_ORDER.index(e.condition))


def write_locomo_scorecard(output: Path, rows: list[dict], presses: list[str], budgets: list[Budget]) -> None:
    if rows:
        labels = [b.label for b in budgets]
        write_tables(output, locomo_entries(rows), presses, labels, f"LoCoMo streaming: {output.name}", "F1", digits=3)
        plot_by_turn(output / "scorecard.png", rows, presses, labels)
