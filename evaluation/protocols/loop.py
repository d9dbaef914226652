"""The one run loop every protocol shares: the run record, the result store, the backend, resume, the scorecard
and the finish. What differs between protocols is the ``Protocol`` (``evaluation.protocols.protocol``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from evaluation.protocols.protocol import SAMPLE, SCORES, Protocol, lacks, recorded, results_defining
from evaluation.runs.backends import LOCAL, Backend, run_units
from evaluation.runs.record import RunRecord
from evaluation.runs.store import ResultStore


def run(protocol: Protocol, config, backend: Backend = LOCAL) -> Path:
    """Run (or resume) ``config`` under ``protocol`` and write predictions, scorecard and run.json in its folder."""
    plan = protocol.plan(config)
    settings = {**recorded(config), **config.model.record(), "output": str(config.output), **plan.settings}
    defining = results_defining(config) | dict.fromkeys(plan.sample, SAMPLE)
    pooled = [key for key, defines in defining.items() if defines == SCORES]
    record = RunRecord(config.output, settings, tuple(defining), protocol.record_defaults(), protocol.name, pooled)
    with record:
        store = ResultStore(config.output / "predictions.jsonl", protocol.row_key)
        incomplete = partial(lacks, fields=protocol.likelihood)  # older rows without the answer's likelihood
        outcome = run_units(plan.units, plan.work, config.model, store, backend, incomplete)
        protocol.write_scorecard(config, store.rows)
        record.finish(outcome, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output
