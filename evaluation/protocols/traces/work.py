"""The eviction lab's work: record attention traces of real texts, replay every policy at every budget against
Belady, sweep RMM's commit lag, and write the scorecard, the plots and the paper's controlled model.

Rows (``predictions.jsonl``, one per trace x policy x budget x metric, resumable) hold the metric's mean over
layers as ``score`` and its value per layer; the scorecard's examples are the traces.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
import torch
from matplotlib.figure import Figure
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Budget
from evaluation.errors import EvaluationError
from evaluation.protocols.protocol import REFERENCE, Implementation, Plan, implement
from evaluation.protocols.texts import source_file, source_text
from evaluation.protocols.traces import controlled
from evaluation.protocols.traces.policies import (
    LAG_SWEEP,
    LayerTrace,
    Policy,
    default_policies,
    lag_control,
    lag_sweep,
    sweep_name,
)
from evaluation.protocols.traces.protocol import BENCHMARK, METRICS, SUMMARY, TraceRow, Traces, TracesConfig
from evaluation.protocols.traces.record import Trace, load_or_record, trace_name
from evaluation.protocols.traces.replay import Replay, recent_share, replay
from evaluation.protocols.traces.tova_claims import (
    FIRST,
    FIRST_HELD,
    RECENT,
    RECENT_HELD,
    RECENT_SHARE,
    tova_claims,
    tova_table,
)
from evaluation.reporting.scorecard import save_figure, scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card
from evaluation.runs.backends import Unit
from evaluation.runs.record import fingerprint
from evaluation.runs.store import ResultStore
from evaluation.runs.terminal import interactive


def held_counts(held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, how many of the ``RECENT`` most recent and of the ``FIRST`` first positions are held."""
    return held[:, -RECENT:].sum(-1).float(), held[:, :FIRST].sum(-1).float()


def per_layer(values: torch.Tensor, layers: int) -> list[float]:
    """Per-group values of a layer-stacked trace, averaged over each layer's groups."""
    return values.view(layers, -1).mean(-1).tolist()


def metric_rows(trace: Trace, policy: Policy, budget: int, result: Replay) -> list[TraceRow]:
    label = Budget("tokens", budget)
    common = {"trace": trace.name, "press": policy.name, "budget": label.key, "budget_label": label.label}
    layers = len(trace.layers)
    recent, first = held_counts(result.held)
    rows = []
    for metric in METRICS:
        values = per_layer(getattr(result, metric), layers)
        rows.append({**common, "metric": metric, "score": sum(values) / layers, "per_layer": values})
    rows[0].update({RECENT_HELD: per_layer(recent, layers), FIRST_HELD: per_layer(first, layers)})
    return rows


def summary_row(trace: Trace, spec: str, stacked: LayerTrace) -> TraceRow:
    """What the trace itself shows: its model's accuracy and how much attention stays near the newest token."""
    return {
        "trace": trace.name,
        "press": "",
        "budget": "",
        "metric": SUMMARY,
        "text": spec,
        "length": trace.length,
        "teacher_forced_accuracy": float(trace.correct[:-1].mean()),
        RECENT_SHARE: per_layer(recent_share(stacked, RECENT), len(trace.layers)),
    }


def run_trace(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], unit: Unit, store: ResultStore, config: TracesConfig
) -> None:
    """One unit: one text's trace (recorded or read from the cache), every missing policy x budget replayed."""
    spec: str = unit.payload
    trace = load_or_record(
        lambda: loaded, config.model.name, spec, config.length, config.per_kv_group, config.data_root
    )
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
    name = trace_name(config.model.name, spec, config.length, config.per_kv_group)
    keys = {(name, p.name, Budget("tokens", b).key, metric) for p, b in replay_cells(config) for metric in METRICS}
    return frozenset(keys | {(name, "", "", SUMMARY)})


def steps(config: TracesConfig, unit: Unit) -> list[frozenset]:
    """The trace's summary, then each policy x budget's metrics in the order ``run_trace`` replays them (each
    replay reads the trace alone)."""
    name = trace_name(config.model.name, unit.payload, config.length, config.per_kv_group)
    replays = [
        frozenset((name, p.name, Budget("tokens", b).key, metric) for metric in METRICS)
        for p, b in replay_cells(config)
    ]
    return [frozenset({(name, "", "", SUMMARY)}), *replays]


def replay_cells(config: TracesConfig) -> list[tuple[Policy, int]]:
    """Every policy (the lag sweep included) at every budget it can run at."""
    policies = default_policies(config.h2o_window) + lag_sweep()
    return [(policy, budget) for budget in config.budgets for policy in policies if not policy.refusal(budget)]


def plot_lag_sweep(path: Path, summary: pd.DataFrame, labels: list[str]) -> None:
    """Hit rate against the commit lag, a line per budget, its commit-lag controls (the lag's newest positions
    protected, ``rmm``'s full-horizon ranking for the rest) as hollow squares, and TOVA, H2O and Belady as
    horizontal lines."""
    hits = summary[summary["condition"] == "hit_rate"].set_index(["budget", "press"])["mean"]
    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for label in labels:
        points = [(lag, hits[label, name]) for lag in LAG_SWEEP if (label, name := sweep_name(lag)) in hits.index]
        if not points:
            continue
        line = axes.plot([max(lag, 0.5) for lag, _ in points], [s for _, s in points], marker="o", label=label)[0]
        controls = [
            (lag, hits[label, name]) for lag in LAG_SWEEP if lag and (label, name := lag_control(lag)) in hits.index
        ]
        axes.plot(
            [lag for lag, _ in controls],
            [s for _, s in controls],
            marker="s",
            markerfacecolor="none",
            linestyle=(0, (1, 3)),
            color=line.get_color(),
        )
        for name, style in (("tova", ":"), ("h2o", "--"), ("belady", "-.")):
            if (label, name) in hits.index:
                axes.axhline(hits[label, name], linestyle=style, color=line.get_color(), alpha=0.6)
    axes.set_xscale("log")
    axes.set_xlabel("RMM commit lag H (0 drawn at 0.5)")
    axes.set_ylabel("hit rate on Belady's requests")
    axes.set_title(
        "lag sweep (circles) and its controls, rmm's full-horizon score with the H newest protected (hollow squares);\n"
        "horizontal lines: TOVA (dotted), H2O (dashed), Belady (dash-dot)",
        fontsize=9,
    )
    axes.legend(title="budget", fontsize=8)
    axes.grid(alpha=0.3)
    save_figure(figure, path, dpi=None)


def checked(config: TracesConfig) -> list[tuple[Policy, int]]:
    """The checked settings and every policy x budget a trace is replayed at."""
    for spec in config.texts:
        source_text(spec, config.data_root)
    if any(b < 64 or b >= config.length for b in config.budgets):
        raise EvaluationError(f"budgets must be at least 64 (SnapKV's window) and below --length {config.length}")
    if not 0 <= config.h2o_window < min(config.budgets):
        raise EvaluationError(f"--h2o-window {config.h2o_window} must be in [0, the smallest budget)")
    if not 0 < config.threshold < 1:
        raise EvaluationError(f"--threshold {config.threshold} must be in (0, 1): the attention that counts as a use")
    return replay_cells(config)


def dry_run(protocol: Traces, config: TracesConfig) -> str:
    cells = checked(config)
    return "\n".join(
        [
            f"Traces: {len(config.texts)} texts of {config.length} tokens ({' '.join(config.texts)}), model "
            f"{config.model.name}: {len(cells)} policy x budget replays each",
            *(f"  {policy.name} @ {budget}" for policy, budget in cells),
            f"prefills: {len(config.texts)} (one per trace, skipped when the trace is cached); decodes: none",
        ]
    )


def plan(protocol: Traces, config: TracesConfig) -> Plan:
    checked(config)
    files = sorted({source_file(spec, config.data_root) for spec in config.texts})
    settings = {"data_root": str(config.data_root), "data_fingerprint": fingerprint(*files)}
    units = [Unit(spec, spec, unit_keys(config, spec)) for spec in config.texts]
    return Plan(units, partial(run_trace, config=config), settings, sample=("data_fingerprint",))


def write_scorecard(protocol: Traces, config: TracesConfig, rows: list[dict]) -> None:
    output, budgets, h2o_window = config.output, config.budgets, config.h2o_window
    labels = [Budget("tokens", b).label for b in budgets]
    policies = [p.name for p in default_policies(h2o_window) + lag_sweep()]
    summary = summarize(scores_frame(BENCHMARK, rows), REFERENCE)
    note = (
        "Trace metrics, mean over layers; each cell: mean [95% bootstrap interval over traces] (n traces). With "
        "two texts an interval describes those two texts, not a population. Heavy-hitter recall is agreement with "
        "attention summed over the whole trace, in hindsight, not a measure of holding what later steps use: read "
        "it beside Belady's (the offline optimum of hit rate). RMM learns each row's teacher-forced correctness "
        "when the next position arrives, as the press does on a model."
    )
    appendix = tova_table(tova_claims(rows, budgets, h2o_window), h2o_window)
    write_card(output, summary, f"Traces: {output.name}", note, REFERENCE, policies, labels, appendix)
    plot_lag_sweep(output / "lag_sweep.png", summary, labels)
    controlled.run(output)


class TracesWork(Implementation[TracesConfig]):
    def dry_run(self, protocol: Traces, config: TracesConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Traces, config: TracesConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Traces, config: TracesConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)

    def steps(self, protocol: Traces, config: TracesConfig, unit: Unit) -> list[frozenset]:
        return steps(config, unit)


TRACES_WORK = TracesWork()
implement(Traces, TRACES_WORK)
