"""The streaming protocol's work: its cells checked, its plan and dry run, and its scorecard."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pandas as pd
from transformers import AutoConfig, AutoTokenizer

from evaluation.catalogue.budgets import OVER_THE_CONTEXT, Cell, budget_label, press_cells
from evaluation.catalogue.resolved import ResolvedPress, fetch_notes, resolve_presses
from evaluation.engine.retention import RETAINED
from evaluation.errors import EvaluationError
from evaluation.protocols.protocol import REFERENCE, Implementation, Plan, implement
from evaluation.protocols.streaming import conversation as streamed
from evaluation.protocols.streaming.config import PLACEMENTS, StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question
from evaluation.protocols.streaming.placements import (
    asked_questions,
    evidence_inside,
    file_sessions,
    select_conversations,
)
from evaluation.protocols.streaming.protocol import Streamed
from evaluation.reporting.conditions import ANSWER_NLL, Metric
from evaluation.reporting.overlap import overlap_section
from evaluation.reporting.scorecard import contrast_table, press_contrast_table, scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length, local_model, what_loading_fetches


def grid_lines(cells: list[Cell]) -> list[str]:
    return [f"  {cell.label} @ {budget_label(cell.budget)} ({cell.press.describe()})" for cell in cells]


def visibility(rows: list[dict]) -> str:
    """How many of the questions had their evidence inside the history the model saw."""
    questions = {(row["conversation"], row["question_index"]): row["evidence_visible"] for row in rows}
    visible, total = sum(questions.values()), len(questions)
    return f"evidence inside the history for {visible} of {total} questions ({100 * visible / total:.0f}%)"


def evictions(rows: list[dict]) -> str:
    """At each budget, for how many questions the history was longer than the budget (so the presses evicted)."""
    over: dict[str, dict[tuple[str, int], bool]] = {}
    for row in rows:
        if row["press"] != "full" and not row.get("error"):
            key = (row["conversation"], row["question_index"])
            label = row["budget_label"].removesuffix(OVER_THE_CONTEXT)
            over.setdefault(label, {})[key] = row["history_tokens"] > row["kept_tokens"]
    counts = ", ".join(f"{sum(seen.values())} of {len(seen)} questions at {label}" for label, seen in over.items())
    return f"the history exceeded the budget (the presses evicted) for {counts}" if over else ""


def checked_cells(config: StreamConfig, dry_run: bool = False) -> list[Cell]:
    """The settings checked, before any data: the stream's cells (a dry run imports no press)."""
    presses = checked_presses(config, dry_run)
    return press_cells(presses, config.budgets, "--budgets")


def checked_presses(config: StreamConfig, dry_run: bool = False) -> list[ResolvedPress]:
    """The settings checked, before any data: the run's presses, one per spec (a dry run imports none)."""
    presses = resolve_presses(config.presses, config.allow_import, dry_run, config.model.name)
    if config.placement not in PLACEMENTS:
        raise EvaluationError(f"unknown placement {config.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if config.placement == "evidence" and config.history != "gold":
        raise EvaluationError("--placement evidence streams one history with the gold answers: use --history gold")
    if config.likelihood_only and config.history != "gold":
        raise EvaluationError("--likelihood-only generates no answers for the history: use --history gold")
    return presses


def streamed_conversations(protocol: Streamed, config: StreamConfig) -> tuple[dict[str, str], list[Conversation]]:
    """The data's fingerprint and the conversations the run streams.

    Raises
    ------
    EvaluationError
        One line, for a conversation the run would ask nothing (a run that exits 0 must have answered something).
    """
    data_fingerprint, conversations = protocol.task.load(config)
    selected = select_conversations(conversations, config.conversations)
    for conversation in selected:
        if not answered(protocol, conversation, config):
            raise EvaluationError(
                f"{conversation.sample_id}: this run asks it nothing (no question to answer among the "
                f"{len(asked_questions(conversation, config))} it asks first): ask more (--max-turns) or leave it "
                "out (--conversations)"
            )
    return data_fingerprint, selected


def answered(protocol: Streamed, conversation: Conversation, config: StreamConfig) -> list[Question]:
    """The asked questions that get rows: every one but those the task only tells."""
    return [question for question in asked_questions(conversation, config) if not protocol.task.told(question)]


def dry_run(protocol: Streamed, config: StreamConfig) -> str:
    fetched = [protocol.task.downloads(config), what_loading_fetches(config.model.name)]
    cells = checked_cells(config, dry_run=True)
    if fetched[0]:
        asked = f"{len(config.conversations)} conversations" if config.conversations else "every conversation"
        lines = [
            f"{protocol.benchmark.name} ({config.placement} placement, {config.history} history): {asked} x "
            f"{len(cells)} cells (questions counted once the data is local), model {config.model.label}",
            *grid_lines(cells),
        ]
    else:
        lines = plan_lines(protocol, config, cells)
    fetched += fetch_notes([cell.press for cell in cells], config.model.name)
    return "\n".join(lines + [f"a real run first fetches: {item}" for item in fetched if item])


def plan_lines(protocol: Streamed, config: StreamConfig, cells: list[Cell]) -> list[str]:
    """The work of a stream whose data is local."""
    _, conversations = streamed_conversations(protocol, config)
    questions = sum(len(answered(protocol, c, config)) for c in conversations)
    histories = len(conversations) * (1 if config.history == "gold" else len(cells))
    lines = [
        f"{protocol.benchmark.name} ({config.placement} placement, {config.history} history): "
        f"{len(conversations)} conversations, {questions} questions x {len(cells)} cells = "
        f"{questions * len(cells)} answers, model {config.model.label}",
        *grid_lines(cells),
        f"prefills: {histories} growing histories, extended by every session and turn (re-prefilled only at the "
        "evidence placement's restarts when the context is full); a press on its own prefill re-prefills the "
        "history before each of its questions",
        f"decodes: {questions * len(cells)}, in {questions * histories // len(conversations)} batches, at most "
        f"{config.max_new_tokens} tokens each"
        if not config.likelihood_only
        else "decodes: none (--likelihood-only: each question's gold answer forced in one forward per batch)",
    ]
    if config.placement == "file":
        lines.append(file_visibility(protocol, config, conversations))
    return lines


def file_visibility(protocol: Streamed, config: StreamConfig, conversations: list[Conversation]) -> str:
    """For the file placement, how many asked questions have their evidence in the sessions that fit: it needs
    the model's tokenizer and configuration only."""
    path = local_model(config.model.name)
    if path is None:
        return f"evidence visibility: needs the tokenizer of {config.model.name}, which is not local"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        context = context_length(tokenizer, AutoConfig.from_pretrained(path, trust_remote_code=False))
    except Exception as error:  # an unreachable hub id or a folder without a tokenizer: the plan stands without it
        return f"evidence visibility: needs the tokenizer of {config.model.name} ({type(error).__name__})"
    visible = total = 0
    for conversation in conversations:
        questions = asked_questions(conversation, config)
        window = {s.number for s in file_sessions(protocol.task, conversation, questions, tokenizer, context, config)}
        visible += sum(evidence_inside(question, window) for question in questions)
        total += len(questions)
    return f"evidence inside the history for {visible} of {total} questions ({100 * visible / max(total, 1):.0f}%)"


def plan(protocol: Streamed, config: StreamConfig) -> Plan:
    presses = checked_presses(config)
    cells = press_cells(presses, config.budgets, "--budgets")
    data_fingerprint, conversations = streamed_conversations(protocol, config)
    settings = {
        "budgets": [b.key for b in config.budgets],
        "data_fingerprint": data_fingerprint,
        "paths": {spec: press.describe() for spec, press in zip(config.presses, presses, strict=True)},
    }
    units = [
        Unit(
            c.sample_id,
            c,
            frozenset(streamed.cell_key(c, q, cell) for q in answered(protocol, c, config) for cell in cells),
        )
        for c in conversations
    ]
    work = partial(streamed.run_conversation, config=config, task=protocol.task, cells=cells)
    questions = sum(len(answered(protocol, c, config)) for c in conversations)
    answers = questions * len(cells)
    decoding = (
        "no decoding (--likelihood-only)"
        if config.likelihood_only
        else f"at most {answers * config.max_new_tokens:,} tokens to decode"
    )
    summary = f"{len(conversations)} conversations, {questions} questions x {len(cells)} cells = {answers} answers"
    return Plan(units, work, settings, ("data_fingerprint",), f"{summary}, {decoding}")


def steps(protocol: Streamed, config: StreamConfig, unit: Unit) -> list[frozenset]:
    """One group per answered question, in the order the stream asks them: a question's cells are decoded as one
    batch from the history streamed so far, so the rows of the first questions are the whole stream's."""
    questions = answered(protocol, unit.payload, config)
    return [frozenset(key for key in unit.keys if key[1] == question.index) for question in questions]


ANSWER_HELD = Metric(
    "answer held", "% of layer x KV head slots holding a copy of the answer", 1, 100, field="retention", output=None
)  # where a task records retention; equal shares, not equal predictions, make two presses identical


def write_scorecard(protocol: Streamed, config: StreamConfig, rows: list[dict]) -> None:
    if not rows:
        return
    task, output = protocol.task, config.output
    benchmark = replace(task.benchmark, measured=(ANSWER_NLL,)) if config.likelihood_only else task.benchmark
    frame = scores_frame(benchmark, rows)
    if task.retention:
        held = replace(task.benchmark, measured=(ANSWER_HELD,))
        frame = pd.concat([frame, scores_frame(held, rows, RETAINED)], ignore_index=True)
    order = task.benchmark.order

    def rank(name: str) -> int:
        plain = name.removeprefix(RETAINED)
        return (plain != name) * (len(order) + 1) + (order.index(plain) if plain in order else len(order))

    frame = frame.sort_values("condition", key=lambda c: c.map(rank), kind="stable")
    metric = "Likelihood only: the gold answer's likelihood" if config.likelihood_only else task.metric
    note = (
        f"{metric}, {rows[0]['placement']} placement; {visibility(rows)}; {evictions(rows)}. Each cell: mean "
        f"[95% bootstrap interval over {task.benchmark.cluster_unit}s, which the questions share] (n questions)"
        f"{task.caveat}."
    )
    labels = [b.label for b in config.budgets]
    summary = summarize(frame, REFERENCE)
    title = f"{task.benchmark.name} streaming: {output.name}"
    contrasts = contrast_table(benchmark, rows)
    against = press_contrast_table(frame, benchmark.press_contrasts)
    appendix = overlap_section(output, rows, REFERENCE, task.benchmark)
    write_card(
        output, summary, title, note, REFERENCE, config.presses, labels, appendix, contrasts, press_contrasts=against
    )


class StreamWork(Implementation[StreamConfig]):
    def dry_run(self, protocol: Streamed, config: StreamConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Streamed, config: StreamConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Streamed, config: StreamConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)

    def steps(self, protocol: Streamed, config: StreamConfig, unit: Unit) -> list[frozenset]:
        return steps(protocol, config, unit)


STREAM_WORK = StreamWork()
implement(Streamed, STREAM_WORK)
