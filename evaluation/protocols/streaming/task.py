"""What a dataset contributes to the streaming protocol (``StreamTask``).

A task module defines its ``StreamTask`` and registers it as a protocol of its own
(``evaluation.protocols.streaming.protocol.register_task``): one subcommand per task, each with its own options
and its own typed settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evaluation.protocols.streaming.config import StreamConfig, StreamSettings
from evaluation.protocols.streaming.episodes import Conversation, Question, Session
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.rescoring import Rescoring

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class StreamTask:
    """A streamed dataset: its conversations, their text, the questions' prompts and gold answers, the scoring
    rule, the scorecard's conditions, and its command line: ``settings``, the class of its own settings
    (``StreamConfig.settings``), each declared with its option (``evaluation.settings``); ``presses``, ``budgets``
    and ``max_new_tokens`` are its defaults of the options every streamed task shares."""

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
    settings: type[StreamSettings]
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
    rescoring: Rescoring | None = None  # how ``python -m evaluation score`` rescores its predictions; None: it does not

    def text(self, conversation: Conversation, sessions: list[Session]) -> str:
        return self.header(conversation) + "".join(self.render_session(session) for session in sessions)
