"""The trace protocol: record attention traces of real texts, replay every policy at every budget against
Belady, sweep RMM's commit lag, and write the scorecard, the plots and the paper's controlled model.

Rows (``predictions.jsonl``, one per trace x policy x budget x metric, resumable) hold the metric's mean over
layers as ``score`` and its value per layer; the scorecard's examples are the traces.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from matplotlib.figure import Figure
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.backends import LOCAL, Backend, Unit, interactive, run_units
from evaluation.budgets import Budget
from evaluation.errors import EvaluationError
from evaluation.models import load_model_or_explain
from evaluation.run_record import RunRecord
from evaluation.scorecard import Entry, entries_from_rows, write_tables
from evaluation.store import ResultStore
from evaluation.traces import controlled
from evaluation.traces.policies import (
    H2O_WINDOW,
    LAG_SWEEP,
    LayerTrace,
    Policy,
    default_policies,
    lag_sweep,
    runnable,
)
from evaluation.traces.record import Trace, load_or_record, parse_source, trace_name
from evaluation.traces.replay import Replay, recent_share, replay

METRICS = ("retained_mass", "heavy_hitter_recall", "hit_rate")
RECENT, FIRST = 64, 4  # the TOVA seed's claim: the 64 most recent and the 4 first positions stay held
RESULTS_DEFINING = ("model", "length", "per_kv_group", "threshold", "h2o_window")
SUMMARY = "summary"


@dataclass
class TracesConfig:
    model: str
    texts: list[str]
    length: int
    budgets: list[int]
    per_kv_group: bool
    threshold: float
    data_root: Path
    output: Path
    device: str = "cpu"
    h2o_window: int = H2O_WINDOW


def row_key(row: dict) -> tuple[str, str, str, str]:
    return row["trace"], row["press"], row["budget"], row["metric"]


def held_counts(held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, how many of the ``RECENT`` most recent and of the ``FIRST`` first positions are held."""
    return held[:, -RECENT:].sum(-1).float(), held[:, :FIRST].sum(-1).float()


def per_layer(values: torch.Tensor, layers: int) -> list[float]:
    """Per-group values of a layer-stacked trace, averaged over each layer's groups."""
    return values.view(layers, -1).mean(-1).tolist()


def metric_rows(trace: Trace, policy: Policy, budget: int, result: Replay) -> list[dict]:
    label = Budget("tokens", budget)
    common = {"trace": trace.name, "press": policy.name, "budget": label.key, "budget_label": label.label}
    layers = len(trace.layers)
    recent, first = held_counts(result.held)
    rows = []
    for metric in METRICS:
        values = per_layer(getattr(result, metric), layers)
        rows.append({**common, "metric": metric, "score": sum(values) / layers, "per_layer": values})
    rows[0].update(
        {f"recent_{RECENT}_held": per_layer(recent, layers), f"first_{FIRST}_held": per_layer(first, layers)}
    )
    return rows


def summary_row(trace: Trace, spec: str, stacked: LayerTrace) -> dict:
    """What the trace itself shows: its model's accuracy and how much attention stays near the newest token."""
    return {
        "trace": trace.name,
        "press": "",
        "budget": "",
        "metric": SUMMARY,
        "text": spec,
        "length": trace.length,
        "teacher_forced_accuracy": float(trace.correct[:-1].mean()),
        f"recent_{RECENT}_attention_share": per_layer(recent_share(stacked, RECENT), len(trace.layers)),
    }


def run_trace(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], unit: Unit, store: ResultStore, config: TracesConfig
) -> None:
    """One unit: one text's trace (recorded or read from the cache), every missing policy x budget replayed."""
    spec: str = unit.payload
    trace = load_or_record(lambda: loaded, config.model, spec, config.length, config.per_kv_group, config.data_root)
    stacked = LayerTrace(torch.cat(trace.layers), trace.correct, config.threshold)  # every layer's groups at once
    if (trace.name, "", "", SUMMARY) not in store:
        store.append(summary_row(trace, spec, stacked))
    todo = [
        (p, b)
        for p, b in replay_cells(config)
        if (trace.name, p.name, Budget("tokens", b).key, METRICS[0]) not in store
    ]
    for policy, budget in tqdm(
        todo, desc=f"replay {spec}", unit="policy x budget", leave=False, disable=not interactive()
    ):
        for row in metric_rows(trace, policy, budget, replay(stacked, policy, budget)):
            store.append(row)


def unit_keys(config: TracesConfig, spec: str) -> frozenset:
    name = trace_name(config.model, spec, config.length, config.per_kv_group)
    keys = {(name, p.name, Budget("tokens", b).key, metric) for p, b in replay_cells(config) for metric in METRICS}
    return frozenset(keys | {(name, "", "", SUMMARY)})


def run(config: TracesConfig, backend: Backend = LOCAL) -> Path:
    for spec in config.texts:
        parse_source(spec)
    if any(b < 64 or b >= config.length for b in config.budgets):
        raise EvaluationError(f"budgets must be at least 64 (SnapKV's window) and below --length {config.length}")
    if not 0 <= config.h2o_window < min(config.budgets):
        raise EvaluationError(f"--h2o-window {config.h2o_window} must be in [0, the smallest budget)")
    if not 0 < config.threshold < 1:
        raise EvaluationError(f"--threshold {config.threshold} must be in (0, 1): the attention that counts as a use")
    settings = {**asdict(config), "output": str(config.output), "data_root": str(config.data_root)}
    record = RunRecord(config.output, settings, RESULTS_DEFINING)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    units = [Unit(spec, spec, unit_keys(config, spec)) for spec in config.texts]
    load = partial(load_model_or_explain, config.model, device=config.device)
    outcome = run_units(units, partial(run_trace, config=config), load, store, backend, config.device)
    write_traces_scorecard(config.output, store.rows, config.budgets, config.h2o_window)
    record.finish(outcome.ran, model=config.model, device=config.device, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output


def replay_cells(config: TracesConfig) -> list[tuple[Policy, int]]:
    """Every policy (the lag sweep included) at every budget it can run at."""
    policies = default_policies(config.h2o_window) + lag_sweep()
    return [(policy, budget) for budget in config.budgets for policy in policies if runnable(policy, budget)]


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a trace row counts in: its metric (a trace's summary row counts in none)."""
    return [] if row["metric"] == SUMMARY else [row["metric"]]


def traces_entries(rows: list[dict]) -> list[Entry]:
    return entries_from_rows(rows, conditions, scale=1, digits=3)


def write_traces_scorecard(output: Path, rows: list[dict], budgets: list[int], h2o_window: int) -> None:
    labels = [Budget("tokens", b).label for b in budgets]
    main = [p.name for p in default_policies(h2o_window)]
    sweep = [p.name for p in lag_sweep()]
    entries = traces_entries(rows)
    write_tables(output, entries, main + sweep, labels, f"Traces: {output.name}", "Trace metrics, mean over layers", 3)
    plot_retained_mass(output / "retained_mass.png", entries, main, labels)
    plot_lag_sweep(output / "lag_sweep.png", entries, labels)
    controlled.run(output)


def plot_retained_mass(path: Path, entries: list[Entry], policies: list[str], labels: list[str]) -> None:
    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    for policy in policies:
        points = [
            (i, e.score)
            for i, label in enumerate(labels)
            for e in entries
            if (e.condition, e.budget, e.press) == ("retained_mass", label, policy)
        ]
        if points:
            style = {"color": "black", "linewidth": 2.5} if policy == "belady" else {}
            axes.plot(*zip(*points, strict=True), marker="o", label=policy, **style)
    axes.set_xticks(range(len(labels)), labels)
    axes.set_xlabel("budget")
    axes.set_ylabel("retained attention mass (mean over steps and layers)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def plot_lag_sweep(path: Path, entries: list[Entry], labels: list[str]) -> None:
    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    for label in labels:
        points = [
            (lag, e.score)
            for lag in LAG_SWEEP
            for e in entries
            if (e.condition, e.budget, e.press) == ("hit_rate", label, f"rmm-H{lag}")
        ]
        if not points:
            continue
        line = axes.plot([max(lag, 0.5) for lag, _ in points], [s for _, s in points], marker="o", label=label)[0]
        for name, style in (("tova", ":"), ("h2o", "--"), ("belady", "-.")):
            reference = [e.score for e in entries if (e.condition, e.budget, e.press) == ("hit_rate", label, name)]
            if reference:
                axes.axhline(reference[0], linestyle=style, color=line.get_color(), alpha=0.6)
    axes.set_xscale("log")
    axes.set_xlabel("RMM commit lag H (0 drawn at 0.5)")
    axes.set_ylabel("hit rate on Belady's requests")
    axes.set_title("lag sweep; horizontal lines: TOVA (dotted), H2O (dashed), Belady (dash-dot)", fontsize=9)
    axes.legend(title="budget", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
