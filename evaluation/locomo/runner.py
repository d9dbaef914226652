"""The streaming protocol (LoCoMo's, and the synthetic families' of ``evaluation.synthetic``): before every
question, re-compress the whole growing history to each budget with each press's own score, answer from the
compressed copy, then append the turn to the history. A ``StreamTask`` says what a dataset contributes: its
conversations, their text, the questions' prompts and gold answers, the scoring rule and the conditions.

Two placements of the questions. ``file`` (the paper's): the conversation first, as much of it as fits the
model's context (the oldest sessions dropped), then every question in file order. ``evidence``: the sessions
stream in one by one and each question is asked right after the session holding its last evidence, so a
model whose context holds only a few sessions still sees the evidence; when the next session would overflow
the context, the history restarts from its newest sessions (half the context), re-prefilled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.backends import LOCAL, Backend, Unit, interactive, run_units
from evaluation.budgets import Budget, Cell, budget_key, budget_label, press_cells, ratio_for
from evaluation.errors import EvaluationError
from evaluation.generation import decode_batch, eos_ids
from evaluation.history import History
from evaluation.locomo.data import Conversation, Question, Session, load_conversations, resolve_path
from evaluation.locomo.render import (
    Framing,
    Message,
    choice_options,
    gold_answer,
    header,
    question_prompt,
    render_session,
    resolve_choice,
)
from evaluation.metrics.locomo import CATEGORIES, PAPER_ORDER, score
from evaluation.models import ModelSettings, context_length, resolve_model_path
from evaluation.press_specs import check_presses, make_press
from evaluation.run_record import RunRecord, fingerprint
from evaluation.scorecard import Benchmark, scores_frame, summarize, write_scorecard
from evaluation.store import ResultStore

TEACHER_FORCED_KINDS = {"answers": frozenset({"answer"}), "all": frozenset({"conversation", "question", "answer"})}
RESULTS_DEFINING = (
    "task",
    "episodes",
    "model",
    "dtype",
    "attn_implementation",
    "placement",
    "history",
    "rmm_weights",
    "max_turns",  # the questions asked set the room left for them, so the history limit
    "max_history_tokens",
    "max_new_tokens",
    "device",
    "data_fingerprint",
)
PLACEMENTS = ("file", "evidence")


@dataclass
class LoCoMoConfig:
    model: ModelSettings
    presses: list[str]
    budgets: list[Budget]
    conversations: list[str] | None
    max_turns: int | None
    max_history_tokens: int | None
    history: str
    rmm_weights: str
    data: str | None
    output: Path
    max_new_tokens: int = 32
    placement: str = "file"
    task: str = "locomo"  # a StreamTask's name (stream_task)
    episodes: dict = field(default_factory=dict)  # a synthetic family's generator settings


@dataclass(frozen=True)
class StreamTask:
    """What a dataset contributes to the streaming protocol."""

    name: str
    load: Callable[[LoCoMoConfig], tuple[dict[str, str], list[Conversation]]]  # (data fingerprint, conversations)
    header: Callable[[Conversation], str]
    render_session: Callable[[Session], str]
    question_prompt: Callable[[Conversation, Question], str]
    gold_answer: Callable[[Question], str]
    scored: Callable[[Conversation, Question, str], tuple[str, float]]  # (the prediction as scored, its score)
    benchmark: Benchmark
    metric: str  # the scorecard note's opening words
    caveat: str = ""  # how the scorecard's note ends
    row_fields: Callable[[Conversation, Question], dict] = lambda conversation, question: {}  # its own row fields

    def text(self, conversation: Conversation, sessions: list[Session]) -> str:
        return self.header(conversation) + "".join(self.render_session(session) for session in sessions)


def stream_task(name: str) -> StreamTask:
    if name == LOCOMO.name:
        return LOCOMO
    from evaluation.synthetic.task import SYNTHETIC_TASKS

    if name not in SYNTHETIC_TASKS:
        raise EvaluationError(f"unknown streamed dataset {name!r}; known: locomo, {', '.join(SYNTHETIC_TASKS)}")
    return SYNTHETIC_TASKS[name]


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


def asked_after_session(conversation: Conversation, question: Question) -> int:
    """The session the evidence placement asks ``question`` after: its last evidence session, else the last one."""
    return max(question.evidence_sessions, default=conversation.sessions[-1].number)


def asked_questions(conversation: Conversation, config: LoCoMoConfig) -> list[Question]:
    """The first ``max_turns`` questions in the order the placement asks them: file order, or for the evidence
    placement stream order (by the session they are asked after, then file order)."""
    questions = conversation.questions
    if config.placement == "evidence":
        questions = sorted(questions, key=lambda q: (asked_after_session(conversation, q), q.index))
    return questions[: config.max_turns]


def fit_sessions(
    framing_for: Callable[[list[Session]], Framing], conversation: Conversation, limit: int
) -> list[Session]:
    """The newest sessions whose rendered conversation fits in ``limit`` tokens (the oldest are dropped)."""
    for first in range(len(conversation.sessions)):
        sessions = conversation.sessions[first:]
        if len(framing_for(sessions).start_ids()) <= limit:
            return sessions
    raise EvaluationError(f"{conversation.sample_id}: not even its last session fits in {limit} history tokens")


def evidence_inside(question: Question, window: set[int]) -> bool:
    """Whether every evidence session of ``question`` is among the sessions ``window`` (none: not visible)."""
    return bool(question.evidence_sessions) and question.evidence_sessions <= window


def turn_room(
    task: StreamTask, conversation: Conversation, framing: Framing, questions: list[Question], max_new_tokens: int
) -> int:
    """Tokens that the questions and gold answers of ``questions`` add, plus room for one generated answer."""
    room = max_new_tokens
    for question in questions:
        prompt, gold = task.question_prompt(conversation, question), task.gold_answer(question)
        room += len(framing.question_ids([], prompt)) + len(framing.answer_ids([], prompt, gold))
    return room + max_new_tokens * len(questions)


def file_sessions(
    conversation: Conversation,
    questions: list[Question],
    tokenizer: PreTrainedTokenizerBase,
    context: int,
    config: LoCoMoConfig,
) -> list[Session]:
    """The sessions the file placement keeps: the newest that fit the history limit (by default the context
    less the room the questions and answers take)."""
    task = stream_task(config.task)

    def framing_for(sessions: list[Session]) -> Framing:
        return Framing(tokenizer, task.text(conversation, sessions))

    limit = config.max_history_tokens
    if limit is None:
        room = turn_room(task, conversation, framing_for(conversation.sessions), questions, config.max_new_tokens)
        if room >= context:
            raise EvaluationError(
                f"{conversation.sample_id}: its {len(questions)} questions and answers take {room} tokens, more than "
                f"the model's context of {context}: ask fewer (--max-turns) or use --placement evidence"
            )
        limit = context - room
    return fit_sessions(framing_for, conversation, limit)


class ConversationRun:
    """One conversation streamed through every cell; one shared history unless answers are the model's own."""

    def __init__(
        self, config: LoCoMoConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cells: list[Cell]
    ) -> None:
        self.config, self.model, self.tokenizer, self.cells = config, model, tokenizer, cells
        self.task = stream_task(config.task)
        self.stop = eos_ids(model)
        self.context = context_length(tokenizer, model.config)
        self.kinds = TEACHER_FORCED_KINDS[config.rmm_weights]

    def history(self, cells: list[Cell]) -> History:
        return History(self.model, self.kinds, [make_press(name, 0.5) for name, _ in cells])

    def run(self, conversation: Conversation, store: ResultStore, bar: tqdm) -> None:
        self.conversation, self.store, self.bar = conversation, store, bar
        questions = asked_questions(conversation, self.config)
        if self.config.placement == "evidence":
            self.stream_sessions(questions)
        else:
            self.stream_file_order(questions)

    def stream_file_order(self, questions: list[Question]) -> None:
        conversation = self.conversation
        sessions = file_sessions(conversation, questions, self.tokenizer, self.context, self.config)
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
        histories: dict[Cell | None, History] = {}  # one stream (key None) in gold mode, else one per cell
        messages: dict[Cell | None, list[Message]] = {}
        for cell in [None] if shared else self.cells:
            histories[cell] = self.history(self.cells if shared else [cell])
            histories[cell].extend(start_ids, "conversation")
            messages[cell] = []
        for turn, question in enumerate(questions):
            prompt = self.task.question_prompt(conversation, question)
            for stream, history in histories.items():
                question_ids = framing.question_ids(messages[stream], prompt)
                self.ask(history, question_ids, question, self.cells if shared else [stream], turn, window)
                answer = (
                    self.task.gold_answer(question)
                    if shared
                    else self.store.get(cell_key(conversation, question, stream))["prediction"]
                )
                self.append_turn(framing, history, messages[stream], question_ids, prompt, answer)

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
        items: list[tuple[str, object, int]] = []  # the stream so far: ("session", text, n) or ("turn", (q, a), n)
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
                self.ask(history, question_ids, question, self.cells, turn, window)
                self.append_turn(framing, history, messages, question_ids, prompt, gold)
                items.append(("turn", (prompt, gold), session.number))
                turn += 1

    def rebuild(self, framing: Framing, items: list[tuple[str, object, int]]) -> tuple[History, list[Message]]:
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
        """Answer the cells that lack a row for ``question`` from ``history``, and store their rows."""
        missing = [cell for cell in cells if cell_key(self.conversation, question, cell) not in self.store]
        if missing:
            visible = evidence_inside(question, window)
            for row in self.answer(history, question_ids, question, missing, turn, visible):
                self.store.append(row)
                self.bar.update()

    @staticmethod
    def append_turn(
        framing: Framing,
        history: History,
        messages: list[Message],
        question_ids: list[int],
        prompt: str,
        answer: str,
    ) -> None:
        history.extend(question_ids, "question")
        history.extend(framing.answer_ids(messages, prompt, answer), "answer")
        messages += [("user", prompt), ("assistant", answer)]

    def answer(
        self,
        history: History,
        question_ids: list[int],
        question: Question,
        cells: list[Cell],
        turn: int,
        visible: bool,
    ) -> list[dict]:
        """The rows of ``cells`` for one question: each cell's cache compressed from the history, all decoded in
        one batch."""
        ratios = [ratio_for(budget, history.length) for _, budget in cells]
        caches = [history.compress(make_press(name, ratio))[0] for (name, _), ratio in zip(cells, ratios, strict=True)]
        generated = decode_batch(
            self.model, caches, torch.tensor([question_ids]), history.length, self.config.max_new_tokens, self.stop
        )
        return [
            self.row(question, cell, ratio, history.length, cache.get_seq_length(), tokens, turn, visible)
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
        visible: bool,
    ) -> dict:
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
            "budget_label": budget_label(budget),
            "compression_ratio": ratio,
            "history_tokens": history_tokens,
            "kept_tokens": kept_tokens,
            "evidence_visible": visible,
            "placement": self.config.placement,
            "history_mode": self.config.history,
            "rmm_weights": self.config.rmm_weights,
            "prediction": prediction,
            "scored_prediction": scored,
            "score": score,
            **self.task.row_fields(self.conversation, question),
        }


def newest_items(items: list[tuple[str, object, int]], framing: Framing, budget: int) -> list[tuple[str, object, int]]:
    """The newest whole sessions of the stream (each with the turns asked after it) that fit in ``budget`` tokens."""
    sizes = []
    for kind, content, _ in items:
        sizes.append(len(framing.encode(content if kind == "session" else " ".join(content))))
    starts = [i for i, (kind, _, _) in enumerate(items) if kind == "session"]
    for start in starts:
        if sum(sizes[start:]) <= budget:
            return items[start:]
    return []


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
    with tqdm(total=missing, desc=conversation.sample_id, unit="answer", leave=False, disable=not interactive()) as bar:
        ConversationRun(config, model, tokenizer, cells).run(conversation, store, bar)


def prepare(config: LoCoMoConfig) -> tuple[dict[str, str], list[Conversation], list[Cell]]:
    """Everything a run reads before the model: checked settings, the data's fingerprint, the conversations
    and the cells."""
    check_presses(config.presses)
    if config.placement not in PLACEMENTS:
        raise EvaluationError(f"unknown placement {config.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if config.placement == "evidence" and config.history != "gold":
        raise EvaluationError("--placement evidence streams one history with the gold answers: use --history gold")
    cells = press_cells(config.presses, config.budgets, "--budgets")
    data_fingerprint, conversations = stream_task(config.task).load(config)
    return data_fingerprint, select_conversations(conversations, config.conversations), cells


def load_locomo(config: LoCoMoConfig) -> tuple[dict[str, str], list[Conversation]]:
    path = resolve_path(config.data)
    return fingerprint(path), load_conversations(path)


def dry_run(config: LoCoMoConfig) -> str:
    """The stream and the work it takes, without a model."""
    _, conversations, cells = prepare(config)
    questions = sum(len(asked_questions(c, config)) for c in conversations)
    histories = len(conversations) * (1 if config.history == "gold" else len(cells))
    name = stream_task(config.task).benchmark.name
    lines = [
        f"{name} ({config.placement} placement, {config.history} history): {len(conversations)} conversations, "
        f"{questions} questions x {len(cells)} cells = {questions * len(cells)} answers, model {config.model.name} "
        f"({config.model.dtype}, {config.model.attn_implementation}, {config.model.device})",
        *(f"  {press} @ {budget_label(budget)}" for press, budget in cells),
        f"prefills: {histories} growing histories, extended by every session and turn (never re-prefilled, but for "
        "the evidence placement's restarts when the context is full)",
        f"decodes: {questions * len(cells)}, in {questions * histories // len(conversations)} batches, at most "
        f"{config.max_new_tokens} tokens each",
    ]
    if config.placement == "file":
        lines.append(file_visibility(config, conversations))
    return "\n".join(lines)


def file_visibility(config: LoCoMoConfig, conversations: list[Conversation]) -> str:
    """For the file placement, how many asked questions have their evidence in the sessions that fit: it needs
    the model's tokenizer and configuration only."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        path = resolve_model_path(config.model.name)
        tokenizer = AutoTokenizer.from_pretrained(path)
        context = context_length(tokenizer, AutoConfig.from_pretrained(path))
    except Exception as error:  # an unreachable hub id or a folder without a tokenizer: the plan stands without it
        return f"evidence visibility: needs the tokenizer of {config.model.name} ({type(error).__name__})"
    visible = total = 0
    for conversation in conversations:
        questions = asked_questions(conversation, config)
        window = {s.number for s in file_sessions(conversation, questions, tokenizer, context, config)}
        visible += sum(evidence_inside(question, window) for question in questions)
        total += len(questions)
    return f"evidence inside the history for {visible} of {total} questions ({100 * visible / max(total, 1):.0f}%)"


def run(config: LoCoMoConfig, backend: Backend = LOCAL) -> Path:
    """Run (or resume) the streaming protocol and write predictions, scorecard and run.json."""
    data_fingerprint, conversations, cells = prepare(config)
    settings = {**asdict(config), **config.model.record(), "output": str(config.output)}
    settings["budgets"] = [b.key for b in config.budgets]
    settings["data_fingerprint"] = data_fingerprint
    defaults = {**ModelSettings().record(), "task": LOCOMO.name, "episodes": {}}  # what older runs did not record
    record = RunRecord(config.output, settings, RESULTS_DEFINING, defaults)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    units = [
        Unit(c.sample_id, c, frozenset(cell_key(c, q, cell) for q in asked_questions(c, config) for cell in cells))
        for c in conversations
    ]
    outcome = run_units(
        units,
        partial(run_conversation, config=config, cells=cells),
        config.model.load,
        store,
        backend,
        config.model.device,
    )
    write_stream_scorecard(stream_task(config.task), config.output, store.rows, config.presses, config.budgets)
    record.finish(outcome, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output


OVERALL = "overall (1-4)"
VISIBLE = "evidence visible"


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a LoCoMo row counts in: categories 1-4 overall, by turn regime, with the
    evidence visible, and by category; adversarial questions (5), scored by their own rule, only apart."""
    category = f"{CATEGORIES[row['category']]} ({row['category']})"
    if row["category"] == 5:
        return [category]
    regime = "first turn" if row["turn"] == 0 else "later turns"
    return [OVERALL, regime, *([VISIBLE] if row["evidence_visible"] else []), category]


CONDITION_ORDER = [
    OVERALL,
    "first turn",
    "later turns",
    VISIBLE,
    *(f"{CATEGORIES[c]} ({c})" for c in PAPER_ORDER),
]


def visibility(rows: list[dict]) -> str:
    """How many of the questions had their evidence inside the history the model saw."""
    questions = {(row["conversation"], row["question_index"]): row["evidence_visible"] for row in rows}
    visible, total = sum(questions.values()), len(questions)
    return f"evidence inside the history for {visible} of {total} questions ({100 * visible / total:.0f}%)"


def evictions(rows: list[dict]) -> str:
    """At each budget, for how many questions the history was longer than the budget (so the presses evicted)."""
    over: dict[str, dict[tuple[str, int], bool]] = {}
    for row in rows:
        if row["press"] != "full":
            key = (row["conversation"], row["question_index"])
            over.setdefault(row["budget_label"], {})[key] = row["history_tokens"] > row["kept_tokens"]
    counts = ", ".join(f"{sum(seen.values())} of {len(seen)} at {label}" for label, seen in over.items())
    return f"the history exceeded the budget (the presses evicted) for {counts} questions" if over else ""


BENCHMARK = Benchmark(
    "LoCoMo", conditions, lambda row: (row["conversation"], row["question_index"]), 1, 3, tuple(CONDITION_ORDER)
)
REFERENCE = "h2o"


def locomo_scored(conversation: Conversation, question: Question, prediction: str) -> tuple[str, float]:
    """The official rule of the question's category; a category 5 letter answer is scored as its option."""
    scored = (
        resolve_choice(prediction, choice_options(conversation, question)) if question.category == 5 else prediction
    )
    return scored, score(question.category, scored, gold_answer(question))


LOCOMO = StreamTask(
    name="locomo",
    load=load_locomo,
    header=header,
    render_session=render_session,
    question_prompt=question_prompt,
    gold_answer=gold_answer,
    scored=locomo_scored,
    benchmark=BENCHMARK,
    metric="F1",
    caveat="; adversarial questions (category 5) are scored by their own rule and kept apart",
)


def write_stream_scorecard(
    task: StreamTask, output: Path, rows: list[dict], presses: list[str], budgets: list[Budget]
) -> None:
    if rows:
        frame = scores_frame(task.benchmark, rows)
        order = task.benchmark.order
        frame = frame.sort_values(
            "condition",
            key=lambda c: c.map(lambda name: order.index(name) if name in order else len(order)),
            kind="stable",
        )
        note = (
            f"{task.metric}, {rows[0]['placement']} placement; {visibility(rows)}; {evictions(rows)}. Each cell: mean "
            f"[95% bootstrap interval over questions] (n){task.caveat}."
        )
        labels = [b.label for b in budgets]
        summary = summarize(frame, REFERENCE)
        title = f"{task.benchmark.name} streaming: {output.name}"
        write_scorecard(output, summary, title, note, REFERENCE, presses, labels)
