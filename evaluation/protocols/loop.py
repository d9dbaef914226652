"""The one run loop every protocol shares: the run record, the result store, the backend, resume, the scorecard
and the finish. What differs between protocols is the ``Protocol`` (``evaluation.protocols.protocol``)."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

from evaluation.protocols.protocol import SAMPLE, SCORES, Plan, Protocol, lacks, recorded, results_defining
from evaluation.runs.backends import LOCAL, Backend, run_units
from evaluation.runs.files import PROGRESS_LOG
from evaluation.runs.numerics import fix_numerics, numerics_record
from evaluation.runs.progress import duration, reporting
from evaluation.runs.record import RunRecord, read_record
from evaluation.runs.store import ResultStore


def run(protocol: Protocol, config, backend: Backend = LOCAL) -> Path:
    """Run (or resume) ``config`` under ``protocol`` and write predictions, scorecard and run.json in its folder;
    its progress goes to the terminal and to the folder's ``progress.log``."""
    plan = protocol.plan(config)
    settings = run_settings(config, plan)
    defining = results_defining(config) | dict.fromkeys(plan.sample, SAMPLE)
    pooled = [key for key, defines in defining.items() if defines == SCORES]
    record = RunRecord(config.output, settings, tuple(defining), protocol.record_defaults(), protocol.name, pooled)
    with record, reporting(config.output / PROGRESS_LOG) as progress:
        fix_numerics(config.model.threads)  # as the model's load does in every process that computes rows
        record.note(numerics=numerics_record(config.model.device))
        store = ResultStore(config.output / "predictions.jsonl", protocol.row_key)
        incomplete = partial(lacks, fields=protocol.likelihood)  # older rows without the answer's likelihood
        progress.say(f"{protocol.name} into {config.output}: {plan_line(plan, store)}")
        outcome = run_units(plan.units, plan.work, config.model, store, backend, incomplete, record.unit_done)
        started = time.monotonic()
        progress.say(f"writing the scorecard of {len(store.rows)} rows")
        protocol.write_scorecard(config, store.rows)
        record.finish(outcome, backend=backend.kind)
        progress.say(f"scorecard written in {duration(time.monotonic() - started)}; run finished")
    outcome.raise_failures(backend.retries)
    return config.output


def run_settings(config, plan: Plan) -> dict:
    """What run.json records as a run's ``config``: the configuration, the model and what its plan adds."""
    return {**recorded(config), **config.model.record(), "output": str(config.output), **plan.settings}


def plan_line(plan: Plan, store: ResultStore) -> str:
    """The plan as its first line says it: the protocol's own summary, and what a resumed run already holds."""
    results = sum(len(unit.keys) for unit in plan.units)
    stored = sum(key in store for unit in plan.units for key in unit.keys)
    summary = plan.summary or f"{len(plan.units)} units, {results} results"
    return f"plan: {summary}" + (f"; {stored} of the {results} results already stored (resumed)" if stored else "")


def output_line(protocol: Protocol, config) -> str:
    """Where a real run of ``config`` writes, as its dry run says it: a new folder, a run it resumes, or one with
    other results-defining settings (those its configuration holds; the data's are checked when it starts), which a
    real run refuses."""
    path = config.output / "run.json"
    if not path.is_file():
        return f"output: {config.output} (a new run)"
    stored = {**protocol.record_defaults(), **read_record(path)["config"]}
    asked = json.loads(json.dumps({**recorded(config), **config.model.record()}, default=str))
    changed = [key for key in results_defining(config) if key in asked and stored.get(key) != asked[key]]
    if changed:
        return (
            f"output: {config.output} holds a run with other settings ({', '.join(changed)}): a real run is refused "
            "there; pass another --output"
        )
    return (
        f"output: {config.output} holds a run of these settings: a real run adds its missing cells and rewrites its "
        "scorecard"
    )
