"""Eviction policies replayed on a trace, each the rule of a press, run by the press itself.

At step t a policy evicts one of the held positions 0..t of each group. Every policy but Belady is a press:

- stateless presses score positions 0..t through their own ``score``, on a stand-in layer whose only attribute
  is the head count, handed the trace as eager attention weights of a prefill of those positions: the rows
  0..t, or, for a press that reads only their column sums (``catalogue.needs``: ``ObservedAttentionPress``, the
  press the protocols call ``h2o``), those sums as the engine hands them, a one-row stand-in. So TOVA reads the
  newest row (on a head-averaged trace, one group per layer, that is TOVA's rule; on a ``--per-kv-group``
  trace, its per-KV-group form), SnapKV its window's rows, StreamingLLM nothing.
  ``recent_window(h2o,window=W)`` (``RecentWindowPress``) is H2O's score with the W newest positions protected,
  an H2O-style recent window. KVPress's H2O score is a mean: each position's attention divided by the rows that
  saw it, which favours recent positions;
- ``recent_window(h2o_summed,window=W)`` (``SummedH2OPolicy``) is the TOVA seed's H2O: the attention each
  position received summed over every row so far, not averaged, with the W newest positions protected;
- RMM, whose smoother carries state from step to step, is driven one arrival at a time as ``DecodingPress``
  drives it (``StreamedPress``), learning each row's teacher-forced correctness when the next position arrives,
  as on a model: the lag sweep measures the very press users run. Beside each finite lag H > 0
  runs its commit-lag control, ``recent_window(rmm,window=H)`` (``WindowedRMMPolicy``): the same H newest
  positions protected (RMM's provisional buffer), the rest ranked by RMM's own full-horizon score, the
  correctness-weighted utility of ``rmm`` (``lag=None``) over every row so far. The two rank committed positions
  on different rows: ``rmm(lag=H)`` sums the H rows after a position (k < t <= k + H, its own row excluded), the
  control averages every row from the position's own on (t >= k, its own row included). So the sweep separates
  the commit lag from recency (at H = 0 the control is ``rmm`` itself).

Belady knows the future.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress

from evaluation.catalogue.budgets import Budget
from evaluation.catalogue.needs import Protected, budget_refusal, needs, protected
from evaluation.catalogue.resolved import resolve_press
from evaluation.protocols.traces import DEFAULT_THRESHOLD, H2O_WINDOW
from evaluation.protocols.traces.streamed import StreamedPress
from presses.harness import MARK_DIMS, RMMPress, Smoother, TOVAPress

LAG_SWEEP = (0, 1, 4, 16, 64, 256)
PROTECTED = torch.finfo(torch.float32).max  # +inf scores (never evict) stay above every unheld position


@dataclass
class LayerTrace:
    """One layer's rows and the sums the policies read, shapes (groups, length, length)."""

    rows: torch.Tensor
    correct: torch.Tensor  # (length,)
    threshold: float = DEFAULT_THRESHOLD
    cumulative: torch.Tensor = field(init=False)  # [:, t, k] = sum of rows 0..t
    next_use: torch.Tensor = field(init=False)  # [:, t, k] = the first step after t that uses k (length: never)

    def __post_init__(self) -> None:
        self.cumulative = self.rows.cumsum(1)
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

    def start(self, trace: LayerTrace, budget: int) -> None:
        """Called once before step ``budget``, when positions 0..budget-1 are held."""

    def refusal(self, budget: int) -> str:
        """Why the policy cannot keep ``budget`` positions ("" when it can)."""
        return ""

    def evict(self, trace: LayerTrace, t: int, held: torch.Tensor) -> torch.Tensor:
        """The position each group evicts at step t, (groups,); ``held`` (groups, t + 1) includes t."""
        scores = self.scores(trace, t).float().clamp(max=PROTECTED)
        return scores.masked_fill(~held, float("inf")).argmin(-1)

    def scores(self, trace: LayerTrace, t: int) -> torch.Tensor:
        """Scores of positions 0..t at step t, (groups, t + 1): the lowest held one is evicted."""
        raise NotImplementedError


@dataclass
class PressPolicy(Policy):
    """A stateless KVPress scorer on trace rows as the eager weights of a prefill of positions 0..t (or their
    column sums, for a press that reads only those)."""

    name: str
    press: BasePress
    budget: int = field(default=0, init=False, repr=False)

    @classmethod
    def of(cls, spec: str) -> PressPolicy:
        """The policy of a press spec, named by it."""
        resolved = resolve_press(spec)
        return cls(resolved.label, resolved.build())

    def refusal(self, budget: int) -> str:
        return budget_refusal(protected(self.press), budget)

    def start(self, trace: LayerTrace, budget: int) -> None:
        self.budget = budget

    def scores(self, trace: LayerTrace, t: int) -> torch.Tensor:
        n, groups = t + 1, trace.groups
        layer = SimpleNamespace(config=SimpleNamespace(num_attention_heads=groups))
        keys = torch.zeros(1, groups, n, 1)
        if needs(self.press).reads_weights:
            attentions = trace.cumulative[None, :, t : t + 1, :n]
        else:
            attentions = trace.rows[None, :, :n, :n]
        self.press.compression_ratio = Budget("tokens", self.budget).compression_ratio(n)
        return self.press.score(layer, torch.zeros(1, n, 1), keys, keys, attentions, {})[0]


@dataclass
class StreamedPolicy(Policy):
    """RMM at a commit lag, its press run one arrival at a time on the trace (``StreamedPress``), reading the
    trace's teacher-forced correctness as it does on a model, each row's once the next position arrives (or
    uniform weights)."""

    name: str
    lag: int | None
    teacher_forced: bool = True
    stream: StreamedPress | None = field(default=None, init=False, repr=False)

    def refusal(self, budget: int) -> str:
        return resolve_press(sweep_name(self.lag)).budget_refusal(budget)

    def start(self, trace: LayerTrace, budget: int) -> None:
        press = RMMPress(lag=self.lag, correctness="teacher_forced" if self.teacher_forced else "uniform")
        correct = trace.correct if self.teacher_forced else None
        self.stream = StreamedPress(press, budget, trace.rows[:, :budget, :budget], correct)

    def evict(self, trace: LayerTrace, t: int, held: torch.Tensor) -> torch.Tensor:
        before = torch.cat([self.stream.held, torch.full((trace.groups, 1), t)], dim=1)
        after = self.stream.step(t, trace.rows[:, t].gather(1, before))
        gone = ~(before[:, :, None] == after[:, None, :]).any(-1)
        return before[gone]


@dataclass
class WindowedPolicy(Policy):
    """A score with the ``window`` newest positions protected, ``RecentWindowPress``'s rule (they score +inf and
    are never evicted), for a score the press cannot wrap; ``unprotected`` gives the score itself."""

    name: str
    window: int

    def refusal(self, budget: int) -> str:
        return budget_refusal([Protected("RecentWindowPress", "window", self.window)], budget)

    def scores(self, trace: LayerTrace, t: int) -> torch.Tensor:
        scores = self.unprotected(trace, t)
        scores[:, t + 1 - self.window :] = float("inf")
        return scores

    def unprotected(self, trace: LayerTrace, t: int) -> torch.Tensor:
        """Scores of positions 0..t at step t, (groups, t + 1), a tensor the window may overwrite."""
        raise NotImplementedError


@dataclass
class WindowedRMMPolicy(WindowedPolicy):
    """RMM's full-horizon score with the ``window`` newest positions protected: at ``window`` = H, the commit-lag
    control of ``rmm(lag=H)``; at 0, ``rmm`` itself.

    The score is ``rmm``'s (``RMMPress(lag=None)``), ranked through RMM's ``Smoother``: every row t >= k weighted
    by the trace's teacher-forced correctness w(t), summed and divided by the rows counted, with the press's timing:
    the newest row counts as correct (weight 1) until the next position arrives. The window is
    ``RecentWindowPress``'s rule (the newest positions score +inf), which cannot wrap ``RMMPress`` itself (its
    smoother must follow its own evictions); ties keep the older position, as RMM's commit rule does."""

    sums: torch.Tensor | None = field(default=None, init=False, repr=False)  # (groups, length): sum of w(t) a(t -> k)

    def start(self, trace: LayerTrace, budget: int) -> None:
        self.sums = (trace.rows[:, :budget] * trace.correct[:budget, None]).sum(1)

    def evict(self, trace: LayerTrace, t: int, held: torch.Tensor) -> torch.Tensor:
        scores = self.scores(trace, t).clamp(max=PROTECTED).masked_fill(~held, float("inf"))
        self.sums += trace.correct[t] * trace.rows[:, t]  # row t's weight, known once position t + 1 arrives
        return t - scores.flip(-1).argmin(-1)

    def unprotected(self, trace: LayerTrace, t: int) -> torch.Tensor:
        """RMM's scores at step t: the rows before t with their weights, row t as correct."""
        positions = torch.arange(t + 1).expand(1, trace.groups, -1)
        smoother = Smoother.start(None, positions, torch.zeros(*positions.shape, MARK_DIMS))
        smoother.set_sums((self.sums + trace.rows[:, t])[None, :, : t + 1].float())
        return smoother.scores()[0]


@dataclass
class SummedH2OPolicy(WindowedPolicy):
    """The TOVA seed's H2O: the attention each position received, summed over every row so far (the trace's
    ``cumulative``, where KVPress's ``h2o`` divides it by the rows counted), with the ``window`` newest positions
    protected (``RecentWindowPress``'s rule); ties evict the lower position."""

    def unprotected(self, trace: LayerTrace, t: int) -> torch.Tensor:
        return trace.cumulative[:, t, : t + 1].clone()


class BeladyPolicy(Policy):
    """Belady's offline optimum: evict the position whose next use is farthest in the future."""

    name = "belady"

    def scores(self, trace: LayerTrace, t: int) -> torch.Tensor:
        return -trace.next_use[:, t, : t + 1].float()


def default_policies(h2o_window: int = H2O_WINDOW) -> list[Policy]:
    return [
        PressPolicy("tova", TOVAPress(per_kv_group=True)),
        PressPolicy("h2o", ObservedAttentionPress()),
        *([PressPolicy.of(recent_h2o(h2o_window))] if h2o_window else []),
        SummedH2OPolicy(seed_h2o(h2o_window), h2o_window),
        PressPolicy("snapkv", SnapKVPress()),
        PressPolicy("streaming_llm", StreamingLLMPress()),
        StreamedPolicy("rmm", None),
        BeladyPolicy(),
    ]


def sweep_name(lag: int | None) -> str:
    """A lag-sweep policy's name: the spec of the press it runs."""
    return f"rmm(lag={lag})"


def recent_h2o(window: int) -> str:
    """The spec of H2O with its ``window`` newest positions protected (``RecentWindowPress``)."""
    return f"recent_window(h2o,window={window})"


def seed_h2o(window: int) -> str:
    """The name of the TOVA seed's H2O, attention summed with its ``window`` newest positions protected
    (``SummedH2OPolicy``; the lab's name, not a press spec)."""
    return f"recent_window(h2o_summed,window={window})"


def lag_control(lag: int) -> str:
    """The name of ``rmm(lag=H)``'s commit-lag control at H = ``lag``: ``rmm``'s score, the ``lag`` newest
    protected (``WindowedRMMPolicy``)."""
    return f"recent_window(rmm,window={lag})"


def lag_sweep() -> list[Policy]:
    """RMM at every lag of the sweep and, beside each finite lag H > 0, its commit-lag control."""
    controls = [WindowedRMMPolicy(lag_control(lag), lag) for lag in LAG_SWEEP if lag]
    return [StreamedPolicy(sweep_name(lag), lag) for lag in LAG_SWEEP] + controls
