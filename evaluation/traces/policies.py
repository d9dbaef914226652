"""Eviction policies replayed on a trace, each the same rule as its press.

A policy scores positions 0..t at step t from the trace (higher is kept), each group on its own. The policies
that have a press call that press's own ``score`` on the trace's rows, through a stand-in layer whose only
attribute is the head count:

- TOVA reads the newest row, per group: on a head-averaged trace (one group per layer, the mean over its
  heads) that is TOVA's rule; on a ``--per-kv-group`` trace, its per-KV-group form;
- ``ObservedAttentionPress`` reads the running column sums (its score reads only ``attentions.sum(2)``);
- SnapKV reads its window's rows, StreamingLLM nothing;
- RMM its ``demonstrated_utility`` of the lag-limited, correctness-weighted column sums.

H2O with a recent window and plain accumulation have no KVPress press; Belady knows the future.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from kvpress import ObservedAttentionPress, ScorerPress, SnapKVPress, StreamingLLMPress

from evaluation.budgets import Budget
from presses import RMMPress, TOVAPress

DEFAULT_THRESHOLD = 0.01  # a position is requested (used) at step t when it receives at least this attention
H2O_WINDOW = 32
LAG_SWEEP = (0, 1, 4, 16, 64, 256)


@dataclass
class LayerTrace:
    """One layer's rows and the sums every policy reads, shapes (groups, length, length)."""

    rows: torch.Tensor
    correct: torch.Tensor  # (length,)
    threshold: float = DEFAULT_THRESHOLD
    cumulative: torch.Tensor = field(init=False)  # [:, t, k] = sum of rows 0..t
    weighted_cumulative: torch.Tensor = field(init=False)  # the same with each row weighted by its correctness
    next_use: torch.Tensor = field(init=False)  # [:, t, k] = the first step after t that uses k (length: never)

    def __post_init__(self) -> None:
        self.cumulative = self.rows.cumsum(1)
        self.weighted_cumulative = (self.rows * self.correct[None, :, None]).cumsum(1)
        uses = self.rows >= self.threshold
        next_use = torch.full_like(self.rows, self.length, dtype=torch.int32)
        for t in range(self.length - 2, -1, -1):
            next_use[:, t] = torch.where(uses[:, t + 1], t + 1, next_use[:, t + 1])
        self.next_use = next_use

    @property
    def groups(self) -> int:
        return self.rows.shape[0]

    @property
    def length(self) -> int:
        return self.rows.shape[1]


class Policy:
    name: str

    def scores(self, trace: LayerTrace, t: int, budget: int) -> torch.Tensor:
        """Scores of positions 0..t at step t, shape (groups, t + 1); the lowest held one is evicted."""
        raise NotImplementedError


@dataclass
class PressPolicy(Policy):
    """A KVPress scorer on trace rows: ``rows`` says which rows its ``attentions`` argument gets."""

    name: str
    press: ScorerPress
    rows: str  # "newest", "cumulative", "window" or "none"

    def scores(self, trace: LayerTrace, t: int, budget: int) -> torch.Tensor:
        n, groups = t + 1, trace.groups
        layer = SimpleNamespace(config=SimpleNamespace(num_attention_heads=groups))
        keys = torch.zeros(1, groups, n, 1)
        if self.rows == "newest":
            attentions = trace.rows[None, :, t : t + 1, :n]
        elif self.rows == "cumulative":
            attentions = trace.cumulative[None, :, t : t + 1, :n]
        elif self.rows == "window":
            attentions = trace.rows[None, :, n - self.press.window_size : n, :n]
        else:
            attentions = None
        self.press.compression_ratio = Budget("tokens", budget).compression_ratio(n)
        return self.press.score(layer, torch.zeros(1, n, 1), keys, keys, attentions, {})[0]


@dataclass
class RMMPolicy(Policy):
    """RMM with commit lag H: demonstrated utility over rows [k, k + H], the last H positions provisional."""

    name: str
    lag: int | None
    teacher_forced: bool = True

    def scores(self, trace: LayerTrace, t: int, budget: int) -> torch.Tensor:
        n = t + 1
        sums = trace.weighted_cumulative if self.teacher_forced else trace.cumulative
        if self.lag is None:
            window_sums = sums[:, t, :n]
        else:
            keys = torch.arange(n)
            window_sums = sums[:, (keys + self.lag).clamp(max=t), keys]
        press = RMMPress(lag=self.lag, correctness="teacher_forced" if self.teacher_forced else "uniform")
        return press.demonstrated_utility(window_sums[None], n, trace.groups)[0]


@dataclass
class AccumulatedPolicy(Policy):
    """Accumulated attention (H2O's heavy-hitter score), the last ``window`` positions always kept."""

    name: str
    window: int = 0

    def scores(self, trace: LayerTrace, t: int, budget: int) -> torch.Tensor:
        scores = trace.cumulative[:, t, : t + 1].clone()
        if self.window:
            scores[:, -self.window :] = float("inf")
        return scores


class BeladyPolicy(Policy):
    """Belady's offline optimum: evict the position whose next use is farthest in the future."""

    name = "belady"

    def scores(self, trace: LayerTrace, t: int, budget: int) -> torch.Tensor:
        return -trace.next_use[:, t, : t + 1].float()


def default_policies(h2o_window: int = H2O_WINDOW) -> list[Policy]:
    return [
        PressPolicy("tova", TOVAPress(per_kv_group=True), "newest"),
        AccumulatedPolicy("h2o", h2o_window),
        AccumulatedPolicy("accumulated"),
        PressPolicy("observed_attention", ObservedAttentionPress(), "cumulative"),
        PressPolicy("snapkv", SnapKVPress(), "window"),
        PressPolicy("streaming_llm", StreamingLLMPress(), "none"),
        RMMPolicy("rmm", None),
        BeladyPolicy(),
    ]


def lag_sweep() -> list[Policy]:
    return [RMMPolicy(f"rmm-H{lag}", lag) for lag in LAG_SWEEP]
