"""A LongBench example as a single-turn case (its official prompt, score and answer length), and the work of one
unit: its cells, run by ``evaluation.protocols.single_turn.cells``."""

from __future__ import annotations

from functools import partial

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.resolved import resolve_presses
from evaluation.metrics.longbench import sample_score
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import Example, TaskConfig
from evaluation.protocols.longbench.prompts import STOP_AT_NEWLINE_TASKS, build_prompt
from evaluation.protocols.single_turn.cells import Case, Cell, run_case
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length
from evaluation.runs.store import ResultStore

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt


def prompt_budget(
    config: LongBenchConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: TaskConfig
) -> int:
    """The official truncation length: ``--max-length``, else the model's context less the answer and chat room."""
    if config.max_length is not None:
        return config.max_length
    context = context_length(tokenizer, model.config)
    return context - task.max_new_tokens - CHAT_MARGIN


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
    resolve_presses(config.presses, config.allow_import)  # once per process: a Ray worker's own resolution
    model, tokenizer = loaded
    example: Example = unit.payload
    task_config = task_configs[example.task]
    length = prompt_budget(config, model, tokenizer, task_config)
    case = case_of(example, task_config, tokenizer, length, config.query_aware)
    run_case(model, tokenizer, store, config, case, cells)
