"""The row of one single-turn cell, as every single-turn protocol stores it."""

from __future__ import annotations

from typing_extensions import NotRequired

from evaluation.protocols.protocol import Row


class CellRow(Row):
    """One cell: an example (``task``, ``id``) under one press at one budget. A failed cell holds its identity,
    ``path`` and ``error`` alone."""

    task: str
    id: str
    path: str
    compression_ratio: NotRequired[float]
    context_tokens: NotRequired[int]
    kept_tokens: NotRequired[int]
    question_tokens: NotRequired[int]
    truncated: NotRequired[bool]
    query_aware: NotRequired[bool]
    attn_implementation: NotRequired[str]
    overlap_with_reference: NotRequired[list[float] | None]  # per layer, mean Jaccard over KV heads with h2o's
    overlap_min_head: NotRequired[list[float] | None]  # per layer, the least KV head's
    generated_tokens: NotRequired[int]
    prediction: NotRequired[str]
    answers: NotRequired[list[str]]
    answer_nll: NotRequired[float | None]  # the gold answer's mean negative log-likelihood per token (nats)
    answer_tokens: NotRequired[int]  # its tokens, cut to the task's answer length
