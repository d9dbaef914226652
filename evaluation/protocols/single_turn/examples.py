"""KVPress-format examples run as single-turn cells: each example a unit of every press at every budget, its prompt
built as KVPress's pipeline builds it, scored by its benchmark's rule."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell, budget_label, press_cells
from evaluation.catalogue.resolved import fetch_notes, resolve_presses
from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample, export_parquet
from evaluation.protocols.kvpress.prompt import build_prompt
from evaluation.protocols.protocol import Plan
from evaluation.protocols.single_turn.cells import Case, cell_key, path_records, run_case
from evaluation.protocols.single_turn.config import PATHS, SingleTurnConfig
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length, what_loading_fetches
from evaluation.runs.store import ResultStore

BUDGET_OPTIONS = "--ratios or --budgets"  # the budget options of every single-turn protocol (add_budget_options)
Scorer = Callable[..., float]  # scorer(prediction, example=...): a prediction's score by its benchmark's rule


def checked_cells(config: SingleTurnConfig, dry_run: bool = False) -> list[Cell]:
    """The settings checked before any data: the grid's cells (a dry run imports no press)."""
    presses = resolve_presses(config.presses, config.allow_import, dry_run, config.model.name)
    if config.path not in PATHS:
        raise EvaluationError(f"unknown path {config.path!r}; choose one of {', '.join(PATHS)}")
    return press_cells(presses, config.budgets, BUDGET_OPTIONS)


Gold = Callable[[KVPressExample], str]  # the answer text whose likelihood a cell scores


def after_prefix(example: KVPressExample, text: str) -> str:
    """``text`` as the example's answer prefix continues it: after a space where the prefix ends without one."""
    spaced = example.answer_prefix and not example.answer_prefix[-1].isspace()
    return f" {text}" if spaced else text


def first_answer(example: KVPressExample) -> str:
    """The first gold answer, as the answer prefix continues it."""
    return after_prefix(example, example.answers[0])


def case_of(
    example: KVPressExample,
    tokenizer: PreTrainedTokenizerBase,
    context: int,
    query_aware: bool,
    scorer: Scorer,
    gold: Gold,
) -> Case:
    """The example's cells' case: its prompt within a ``context``-token model (the context cut as KVPress's pipeline
    cuts it, leaving room for the question and the answer), scored by ``scorer``."""
    question = len(tokenizer.encode(example.question, add_special_tokens=False))
    prompt = build_prompt(example, tokenizer, context - example.max_new_tokens - question, query_aware)
    return Case(
        task=example.task,
        id=example.id,
        prompt=prompt,
        answers=list(example.answers),
        gold=gold(example),
        answer_length=example.max_new_tokens,
        score=partial(scorer, example=example),
        identity={"length": example.length, "depth": example.depth},
    )


def run_example(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: SingleTurnConfig,
    cells: list[Cell],
    scorer: Scorer,
    gold: Gold,
) -> None:
    """One unit: one example's missing cells, each scored by ``scorer``, its likelihood that of ``gold``."""
    model, tokenizer = loaded
    example: KVPressExample = unit.payload
    case = case_of(
        example,
        tokenizer,
        context_length(tokenizer, model.config),
        config.query_aware,
        scorer,
        gold,
    )
    run_case(model, tokenizer, store, config, case, cells)


def examples_fingerprint(examples: list[KVPressExample]) -> str:
    """The sha256 of the examples' columns, in order: a resumed run must hold the same examples."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(example.columns(), sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def plan_examples(
    config: SingleTurnConfig,
    examples: list[KVPressExample],
    cells: list[Cell],
    scorer: Scorer,
    gold: Gold,
    settings: dict,
) -> Plan:
    """One unit per example, each holding every cell; ``settings``: what run.json records beside the data's
    fingerprint and each press's path."""
    ids = [example.id for example in examples]
    if len(set(ids)) != len(ids):
        raise EvaluationError("examples with the same id: every example needs its own (an id column, or none)")
    units = [Unit(e.id, e, frozenset(cell_key(e, cell) for cell in cells)) for e in examples]
    engine = config.path == "shared"
    recorded = {
        **settings,
        "budgets": [budget.key for budget in config.budgets],
        "data_fingerprint": examples_fingerprint(examples),
        "paths": path_records(config.presses, cells, engine),
    }
    work = partial(run_example, config=config, cells=cells, scorer=scorer, gold=gold)
    tokens = 0 if config.likelihood_only else sum(e.max_new_tokens for e in examples) * len(cells)
    summary = f"{len(examples)} examples x {len(cells)} cells = {len(examples) * len(cells)} cells, " + (
        f"at most {tokens:,} tokens to decode" if tokens else "no decoding (--likelihood-only)"
    )
    return Plan(units, work, recorded, ("data_fingerprint",), summary)


def exported(examples: list[KVPressExample], path: str | None) -> list[KVPressExample]:
    """``examples``, also written to ``path`` as parquet in KVPress's columns where one is given."""
    if path is not None:
        export_parquet(examples, Path(path))
    return examples


def dry_run_lines(config: SingleTurnConfig, head: str, examples: int) -> str:
    """A dry run of ``examples`` over the grid: the cells and what a real run fetches first."""
    cells = checked_cells(config, dry_run=True)
    lines = [
        f"{head}: {examples} examples x {len(cells)} cells = {examples * len(cells)} cells, model {config.model.label}",
        *(f"  {cell.label} @ {budget_label(cell.budget)}" for cell in cells),
    ]
    fetched = [what_loading_fetches(config.model.name), *fetch_notes([cell.press for cell in cells], config.model.name)]
    return "\n".join(lines + ([f"a real run first fetches: {item}" for item in fetched if item] or []))
