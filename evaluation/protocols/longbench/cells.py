"""A LongBench example as a single-turn case (its official prompt, score and answer length), and the work of one
unit: its cells, run by ``evaluation.protocols.single_turn.cells``."""

from __future__ import annotations

from functools import partial

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell
from evaluation.metrics.longbench import sample_score
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import Example, TaskConfig
from evaluation.protocols.longbench.prompts import STOP_AT_NEWLINE_TASKS, build_prompt
from evaluation.protocols.single_turn.cells import Case, run_case
from evaluation.protocols.single_turn.room import Room, check_room
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length
from evaluation.runs.store import ResultStore

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt


def prompt_budget(
    config: LongBenchConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, task: TaskConfig
) -> int:
    """The official truncation length: ``--max-length``, else the model's context less the answer and chat room;
    a context that cannot hold them is an error (``room``)."""
    context = context_length(tokenizer, model.config)
    check_room(config.model.name, [room(config, name, task)], context)
    return config.max_length if config.max_length is not None else context - task.max_new_tokens - CHAT_MARGIN


def room(config: LongBenchConfig, name: str, task: TaskConfig) -> Room:
    """What task ``name``'s cases need of a context: its answer, the chat template's margin and a prompt of
    ``--max-length`` tokens, or at least ``MIN_PROMPT`` (cut in the middle)."""
    chat = {"after": CHAT_MARGIN, "after_what": f"{CHAT_MARGIN} for the chat template"}
    if config.max_length is None:
        return Room(name, task.max_new_tokens, **chat)
    what = f"--max-length {config.max_length}"
    return Room(name, task.max_new_tokens, config.max_length, what, **chat, remedy="a smaller --max-length")


def case_of(
    example: Example, task_config: TaskConfig, tokenizer: PreTrainedTokenizerBase, max_length: int, query_aware: bool
) -> Case:
    """The example's official prompt cut to ``max_length`` tokens, scored by its task's official metric; its
    likelihood is the first gold answer's."""
    return Case(
        task=example.task,
        id=example.id,
        prompt=build_prompt(example, task_config, tokenizer, max_length, query_aware),
        answers=example.answers,
        gold=example.answers[0] if example.answers else None,
        answer_length=task_config.max_new_tokens,
        score=partial(sample_score, example.task, answers=example.answers, all_classes=example.all_classes),
        stop_at_newline=example.task in STOP_AT_NEWLINE_TASKS,
        fields={"all_classes": example.all_classes},
    )


def run_example(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: LongBenchConfig,
    task_configs: dict[str, TaskConfig],
    cells: list[Cell],
) -> None:
    """One unit: the missing cells of one example, and the likelihood of those older code stored without it."""
    model, tokenizer = loaded
    example: Example = unit.payload
    task_config = task_configs[example.task]
    length = prompt_budget(config, model, tokenizer, example.task, task_config)
    case = case_of(example, task_config, tokenizer, length, config.query_aware)
    run_case(model, tokenizer, store, config, case, cells)
