"""What a dataset contributes to the streaming protocol (``StreamTask``), and the registry of tasks.

A task module defines its ``StreamTask`` and calls ``register``; ``tasks()`` imports the task modules the project
ships, so the command line builds one subcommand per registered task and the combined scorecard finds a run's
task by the name its run.json records.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question, Session
from evaluation.reporting.conditions import Benchmark

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TASK_MODULES = ("evaluation.protocols.locomo.task", "evaluation.protocols.synthetic.task")


@dataclass(frozen=True)
class StreamTask:
    """A streamed dataset: its conversations, their text, the questions' prompts and gold answers, the scoring
    rule, the scorecard's conditions, and its command line (``add_options`` adds its own options; ``settings``
    turns them into ``StreamConfig`` fields; ``presses``, ``budgets`` and ``max_new_tokens`` are its defaults)."""

    name: str
    help: str
    description: str
    load: Callable[[StreamConfig], tuple[dict[str, str], list[Conversation]]]  # (data fingerprint, conversations)
    header: Callable[[Conversation], str]
    render_session: Callable[[Session], str]
    question_prompt: Callable[[Conversation, Question], str]
    gold_answer: Callable[[Question], str]
    scored: Callable[[Conversation, Question, str], tuple[str, float]]  # (the prediction as scored, its score)
    benchmark: Benchmark
    metric: str  # the scorecard note's opening words
    add_options: Callable[[argparse.ArgumentParser], None]
    settings: Callable[[argparse.Namespace], dict]
    presses: tuple[str, ...]
    budgets: tuple[int, ...]
    max_new_tokens: int
    caveat: str = ""  # how the scorecard's note ends
    # a row's own fields, from its question (and the tokenizer, for token counts)
    row_fields: Callable[[Conversation, Question, PreTrainedTokenizerBase], dict] = field(
        default=lambda conversation, question, tokenizer: {}
    )
    downloads: Callable[[StreamConfig], str] = field(default=lambda config: "")  # what a run would fetch; "": none
    # a question the stream tells (its exchange joins the history with the gold answer) without asking it
    told: Callable[[Question], bool] = field(default=lambda question: False)
    # whether each row records the share of (layer, KV head) slots whose cache still holds a copy of the answer
    retention: bool = False

    def text(self, conversation: Conversation, sessions: list[Session]) -> str:
        return self.header(conversation) + "".join(self.render_session(session) for session in sessions)


_REGISTRY: dict[str, StreamTask] = {}


def register(task: StreamTask) -> StreamTask:
    _REGISTRY[task.name] = task
    return task


def tasks() -> dict[str, StreamTask]:
    """Every registered task, by name (the shipped task modules are imported first)."""
    for module in TASK_MODULES:
        importlib.import_module(module)
    return dict(_REGISTRY)


def stream_task(name: str) -> StreamTask:
    known = tasks()
    if name not in known:
        raise EvaluationError(f"unknown streamed dataset {name!r}; known: {', '.join(known)}")
    return known[name]
