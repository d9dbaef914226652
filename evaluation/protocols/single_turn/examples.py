"""KVPress-format examples run as single-turn cells: each example a unit of every press at every budget, its prompt
built as KVPress's pipeline builds it, scored by its benchmark's rule."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell, budget_label, press_cells
from evaluation.catalogue.resolved import fetch_notes, resolve_presses
from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample, export_parquet
from evaluation.protocols.kvpress.prompt import after_context, build_prompt
from evaluation.protocols.options import PATHS
from evaluation.protocols.protocol import Plan
from evaluation.protocols.single_turn.cells import Case, cell_key, path_records, run_case
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.room import Room, check_room
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length, local_model, what_loading_fetches
from evaluation.runs.store import ResultStore

BUDGET_OPTIONS = (
    "--ratios or --budgets"  # the budget options of every single-turn protocol (options.ratio_or_token_budgets)
)
Scorer = Callable[..., float]  # scorer(prediction, example=...): a prediction's score by its benchmark's rule


def checked_cells(config: SingleTurnConfig, rooms: list[Room], dry_run: bool = False) -> list[Cell]:
    """The settings checked before the model loads: the grid's cells (a dry run imports no press), then whether
    the model's context holds every one of ``rooms`` (``check_room``)."""
    presses = resolve_presses(config.presses, config.allow_import, dry_run, config.model.name)
    if config.path not in PATHS:
        raise EvaluationError(f"unknown path {config.path!r}; choose one of {', '.join(PATHS)}")
    cells = press_cells(presses, config.budgets, BUDGET_OPTIONS)
    check_room(config.model.name, rooms)
    return cells


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
    config: SingleTurnConfig,
    scorer: Scorer,
    gold: Gold,
) -> Case:
    """The example's cells' case: its prompt within a ``context``-token model (the context cut as KVPress's pipeline
    cuts it, leaving room for what follows it and the answer: ``check_room`` first), scored by ``scorer``."""
    after = after_context(tokenizer, example, config.query_aware)
    check_room(config.model.name, [example_room(example, after)], context)
    prompt = build_prompt(example, tokenizer, context - example.max_new_tokens - after, config.query_aware)
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


def example_room(example: KVPressExample, after: int | None) -> Room:
    """What a KVPress-format example needs of a context, its context cut as KVPress's pipeline cuts it: its answer,
    ``after`` tokens after its context (None: not yet counted) and a prompt of at least ``MIN_PROMPT``."""
    if after is None:
        return Room(example.task, example.max_new_tokens)
    return Room(example.task, example.max_new_tokens, after=after, after_what=f"the {after} tokens after its context")


def dataset_rooms(config: SingleTurnConfig, examples: list[KVPressExample]) -> list[Room]:
    """Each example's ``example_room``, what follows its context counted where the model's tokenizer is local."""
    tokenizer = local_tokenizer(config.model.name) if examples else None
    counted = (None if tokenizer is None else after_context(tokenizer, e, config.query_aware) for e in examples)
    return [example_room(example, after) for example, after in zip(examples, counted, strict=True)]


def local_tokenizer(name: str) -> PreTrainedTokenizerBase | None:
    """``name``'s tokenizer where its files are local, without loading its model; None otherwise."""
    path = local_model(name)
    if path is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception:  # an unreadable folder is named when the model loads
        return None


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
    case = case_of(example, tokenizer, context_length(tokenizer, model.config), config, scorer, gold)
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


def dry_run_lines(config: SingleTurnConfig, head: str, examples: int, rooms: list[Room]) -> str:
    """A dry run of ``examples`` over the grid, checked as a real run checks it (``checked_cells``): the cells and
    what a real run fetches first."""
    cells = checked_cells(config, rooms, dry_run=True)
    lines = [
        f"{head}: {examples} examples x {len(cells)} cells = {examples * len(cells)} cells, model {config.model.label}",
        *(f"  {cell.label} @ {budget_label(cell.budget)}" for cell in cells),
    ]
    fetched = [what_loading_fetches(config.model.name), *fetch_notes([cell.press for cell in cells], config.model.name)]
    return "\n".join(lines + ([f"a real run first fetches: {item}" for item in fetched if item] or []))
