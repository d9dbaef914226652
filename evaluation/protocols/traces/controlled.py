"""The paper's controlled model of delayed utility (section 6), as a simulator.

N items arrive one per step; U of them, chosen at random, are useful. A useful item is used once at a delay
d <= H after it arrives (its signal) and again at a far test time T; useless items are never used; at
arrival the two look the same. Every step also spreads one unit of background attention evenly over the
items that have arrived (what accumulated attention accumulates besides uses). After the last item, H more
steps pass (H items that are never used arrive), so every signal has happened; test recall is the share of
useful items held, outside the provisional buffer, at T.

Policies, each with K committed slots: recency (the K newest), a predictor that labels each item at arrival
and is right with probability p, Belady (evicts the item whose next use is farthest), and two presses replayed
on the stream's attention as on a recorded trace (``evaluation.protocols.traces.policies``, as the eviction lab runs
them): ``h2o`` is KVPress's ``ObservedAttentionPress`` with K slots, ``smoother`` is ``RMMPress(lag=H,
correctness="uniform")`` with K + H slots, its H newest the provisional buffer. Theory: the smoother and
Belady reach min(1, K / U); online filters hold about K / N of the useful items.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from kvpress import ObservedAttentionPress
from matplotlib.figure import Figure

from evaluation.protocols.traces.policies import LayerTrace, PressPolicy, StreamedPolicy
from evaluation.protocols.traces.replay import replay
from evaluation.reporting.scorecard import save_figure
from evaluation.runs.files import write_atomically

POLICIES = ("recency", "h2o", "predictor", "smoother", "belady")
PRESSES = ("h2o", "smoother")
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Setting:
    items: int  # N
    useful: int  # U
    capacity: int  # K
    lag: int  # H: the largest signal delay, and the smoother's provisional buffer
    accuracy: float = 0.8  # the predictor's p


def stream(setting: Setting, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Which items are useful, and each item's signal step (NEVER for useless items)."""
    useful = np.zeros(setting.items, dtype=bool)
    useful[rng.choice(setting.items, setting.useful, replace=False)] = True
    delays = rng.integers(1, setting.lag + 1, setting.items)
    return useful, np.where(useful, np.arange(setting.items) + delays, NEVER)


def simulate(policy: str, setting: Setting, seed: int) -> float:
    """Test recall of recency, the predictor or Belady on one random stream."""
    rng = np.random.default_rng(seed)
    useful, signal = stream(setting, rng)
    predicted = np.where(rng.random(setting.items) < setting.accuracy, useful, ~useful)
    test_time = setting.items + setting.lag
    cached: list[int] = []
    for step in range(setting.items):
        cached.append(step)
        while len(cached) > setting.capacity:
            cached.remove(victim(policy, cached, predicted, signal, step, test_time, useful))
    return float(useful[cached].sum() / setting.useful)


def victim(
    policy: str,
    cached: list[int],
    predicted: np.ndarray,
    signal: np.ndarray,
    step: int,
    test_time: int,
    useful: np.ndarray,
) -> int:
    """The item each policy evicts (ties: the oldest)."""
    if policy == "recency":
        return cached[0]
    if policy == "belady":
        next_use = [signal[i] if signal[i] > step else (test_time if useful[i] else NEVER) for i in cached]
        return cached[int(np.argmax(next_use))]
    return cached[int(np.argmin(predicted[cached].astype(float)))]


def press_recalls(policy: str, setting: Setting, seeds: int) -> np.ndarray:
    """Test recall of a press-run policy on the streams of seeds 0..seeds-1, replayed side by side."""
    steps = setting.items + setting.lag
    streams = [stream(setting, np.random.default_rng(seed)) for seed in range(seeds)]
    useful = torch.tensor(np.stack([u for u, _ in streams]))
    signal = torch.tensor(np.stack([np.append(s, [NEVER] * setting.lag) for _, s in streams]))
    arrived = torch.arange(steps)[None, :] <= torch.arange(steps)[:, None]  # [step, item]
    uses = (signal[:, None, :] == torch.arange(steps)[None, :, None]).float()
    rows = (uses + 1 / arrived.sum(1, keepdim=True)) * arrived  # (seeds, step, item): uses plus background
    trace = LayerTrace(rows, torch.ones(steps))
    smoother = policy == "smoother"
    budget = setting.capacity + (setting.lag if smoother else 0)
    if budget >= steps:  # the memory holds the whole stream
        return np.ones(seeds)
    press = StreamedPolicy("smoother", setting.lag, teacher_forced=False) if smoother else None
    held = replay(trace, press or PressPolicy("h2o", ObservedAttentionPress()), budget).held
    if smoother:
        held = held & (torch.arange(steps) < setting.items)  # the committed part: older than the buffer
    return ((held[:, : setting.items] & useful).sum(1) / setting.useful).numpy()


def recall(policy: str, setting: Setting, seeds: int = 20) -> float:
    """Mean test recall over ``seeds`` random streams (seeds 0..seeds-1: deterministic)."""
    if policy in PRESSES:
        return float(press_recalls(policy, setting, seeds).mean())
    return float(np.mean([simulate(policy, setting, seed) for seed in range(seeds)]))


PAPER_SETTING = Setting(items=300, useful=30, capacity=100, lag=8)  # K / N = 0.33, K / U > 1
FIGURE_2_CAPACITY, FIGURE_2_USEFUL = 40, 20
FIGURE_2_LENGTHS = tuple(range(40, 401, 40))


def figure_2(policy: str, seeds: int = 20) -> list[float]:
    """Retention of the reused items against trajectory length, at K = 40 (U = 20 reused items)."""
    return [recall(policy, Setting(n, FIGURE_2_USEFUL, FIGURE_2_CAPACITY, 8), seeds) for n in FIGURE_2_LENGTHS]


def run(folder: Path, seeds: int = 20) -> dict:
    """Both experiments: ``controlled.json`` (the numbers) and ``controlled.png`` (the two panels)."""
    setting = PAPER_SETTING
    results = {
        "setting": {"N": setting.items, "U": setting.useful, "K": setting.capacity, "H": setting.lag, "seeds": seeds},
        "theory": {
            "online_floor_K_over_N": setting.capacity / setting.items,
            "smoother": min(1, setting.capacity / setting.useful),
        },
        "test_recall": {policy: recall(policy, setting, seeds) for policy in POLICIES},
        "figure_2": {"lengths": list(FIGURE_2_LENGTHS), **{policy: figure_2(policy, seeds) for policy in POLICIES}},
    }
    write_atomically(folder / "controlled.json", json.dumps(results, indent=2) + "\n")
    figure = Figure(figsize=(10, 4), dpi=100)
    left, right = figure.subplots(1, 2)
    left.bar(POLICIES, [results["test_recall"][p] for p in POLICIES], color="tab:blue")
    left.axhline(setting.capacity / setting.items, linestyle="--", color="gray", label="K / N (online floor)")
    left.axhline(min(1, setting.capacity / setting.useful), linestyle=":", color="black", label="min(1, K / U)")
    left.set_title(f"test recall, N={setting.items} U={setting.useful} K={setting.capacity} H={setting.lag}")
    left.legend(fontsize=8)
    left.tick_params(axis="x", labelsize=8)
    for policy in POLICIES:
        right.plot(FIGURE_2_LENGTHS, results["figure_2"][policy], marker="o", markersize=3, label=policy)
    right.set_xlabel("trajectory length (items)")
    right.set_ylabel("retention of reused items")
    right.set_title(f"K = {FIGURE_2_CAPACITY}, {FIGURE_2_USEFUL} reused items")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    figure.tight_layout()
    save_figure(figure, folder / "controlled.png", dpi=None)
    return results
