"""A LongBench example as a single-turn case (its official prompt, score and answer length), and the work of one
unit: its cells, run by ``evaluation.protocols.single_turn.cells``."""

from __future__ import annotations

from functools import partial

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell
from evaluation.errors import EvaluationError
from evaluation.metrics.longbench import sample_score
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import Example, TaskConfig
from evaluation.protocols.longbench.prompts import STOP_AT_NEWLINE_TASKS, build_prompt
from evaluation.protocols.single_turn.cells import Case, run_case
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length
from evaluation.runs.store import ResultStore

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt
MIN_PROMPT = 64  # the fewest tokens a truncated prompt keeps: its question and a little of its context


def prompt_budget(
    config: LongBenchConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, task: TaskConfig
) -> int:
    """The official truncation length: ``--max-length``, else the model's context less the answer and chat room;
    a context that cannot hold them is an error (``room_refusal``)."""
    context = context_length(tokenizer, model.config)
    refusal = room_refusal(config, context, name, task)
    if refusal:
        raise EvaluationError(refusal)
    return config.max_length if config.max_length is not None else context - task.max_new_tokens - CHAT_MARGIN


def room_refusal(config: LongBenchConfig, context: int, name: str, task: TaskConfig) -> str:
    """Why a model's ``context`` cannot hold task ``name``'s answer, the chat template and its prompt ("" when it
    can): the prompt is ``--max-length`` tokens, or at least ``MIN_PROMPT``."""
    prompt = config.max_length if config.max_length is not None else MIN_PROMPT
    needed = prompt + task.max_new_tokens + CHAT_MARGIN
    if needed <= context:
        return ""
    what = f"--max-length {prompt}" if config.max_length is not None else f"a prompt of at least {MIN_PROMPT}"
    return (
        f"--model {config.model.name}: its context of {context} tokens cannot hold {what} plus {name}'s answer "
        f"length of {task.max_new_tokens} and {CHAT_MARGIN} for the chat template ({needed} tokens): use a model "
        "with a longer context" + (", or a smaller --max-length" if config.max_length is not None else "")
    )


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
