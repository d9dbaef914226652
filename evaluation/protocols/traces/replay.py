"""Step-by-step replay of a policy on one layer's trace at a budget, and the trace-level metrics.

From step ``budget`` on, each step admits the new position and the policy evicts one held position (a scored
policy its lowest-scored one, ties evicting the lower position), so B positions stay held. The groups of a
trace are replayed side by side (each its own cache); stacking every layer's groups into one trace replays
all layers at once.
Metrics per group, over the steps where the cache is full (t >= B):

- retained mass: the share of step t's full-cache attention on what the policy holds at step t (the B
  positions kept so far and t itself);
- hit rate: of the positions step t requests (attention >= the trace's threshold, Belady's requests), the
  share the policy holds;
- heavy-hitter recall: the share of the B positions with the largest cumulative attention over the whole
  trace that the policy holds after the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evaluation.protocols.traces.policies import LayerTrace, Policy


@dataclass(frozen=True)
class Replay:
    """Each metric per group, shape (groups,)."""

    retained_mass: torch.Tensor
    hit_rate: torch.Tensor
    heavy_hitter_recall: torch.Tensor
    held: torch.Tensor  # (groups, length) bool: what the policy holds after the last step


def replay(trace: LayerTrace, policy: Policy, budget: int) -> Replay:
    groups, length = trace.groups, trace.length
    if not 0 < budget < length:
        raise ValueError(f"budget {budget} must be between 1 and the trace length {length} (exclusive)")
    held = torch.zeros(groups, length, dtype=torch.bool)
    held[:, :budget] = True
    mass, hits, requests = torch.zeros(groups), torch.zeros(groups), torch.zeros(groups)
    every_group = torch.arange(groups)
    policy.start(trace, budget)
    for t in range(budget, length):
        held[:, t] = True
        row, now = trace.rows[:, t, : t + 1], held[:, : t + 1]
        mass += (row * now).sum(-1)
        uses = row[:, :t] >= trace.threshold
        hits += (uses & now[:, :t]).sum(-1)
        requests += uses.sum(-1)
        held[every_group, policy.evict(trace, t, now)] = False
    heavy = torch.zeros_like(held).scatter_(1, trace.cumulative[:, -1].topk(budget, dim=-1).indices, True)
    return Replay(
        retained_mass=mass / (length - budget),
        hit_rate=torch.where(requests > 0, hits / requests.clamp(min=1), 1.0),
        heavy_hitter_recall=(held & heavy).sum(-1) / budget,
        held=held,
    )


def recent_share(trace: LayerTrace, window: int = 64) -> torch.Tensor:
    """Per group, the mean share of each step's attention on the ``window`` most recent positions (the step
    included), shape (groups,)."""
    length = trace.length
    keys, steps = torch.arange(length), torch.arange(length)[:, None]
    recent = (steps - keys[None, :] < window) & (keys[None, :] <= steps)
    return (trace.rows * recent).sum(-1).mean(-1)
