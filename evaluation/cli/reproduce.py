"""``python -m evaluation reproduce RUN[:K] ...``: re-run a sample of committed runs from their run.json and check
their rows against the committed ones.

A run's run.json names its protocol and records its settings. The protocol's typed configuration is rebuilt through
its own options, each recorded value through its flag's type and range (``evaluation.cli.config_file``;
``Protocol.options_of``, from each setting's declaration, for one recorded under another name or form than its
option's), and planned; every recorded setting must then equal the rebuilt run's (``loop.run_settings``). The sample
keeps the run's batches: whole units, the cheapest first by the run's recorded unit seconds (units whose committed
rows all failed last); where a protocol's unit splits into steps (``Protocol.steps``: a streamed question, a probe,
a trace's replay), the first K steps, the unit's work running as in the run and stopped once the sample's rows are
stored. The units run through ``run_units`` into a temporary folder, at the run's recorded thread count (a run.json
from before ``threads``: this machine's cores), and each row is compared with the committed row of its key: every
float within its field's measured tolerance (``TOLERANCES``), every other value equal (text byte for byte); a field
the committed row predates compares as what its protocol says such a row stands for (``Protocol.row_defaults``).

One line per run, ``reproduced`` or ``differs`` (the first difference); exit status 1 when a run differs, 2 for a
folder it cannot reproduce (no run.json, a protocol or a setting this code no longer has, a press that imports a
module while reproduce's own command line has no ``--allow-import``), one line each, before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from evaluation.catalogue.specs import FULL_CACHE, canonical, import_paths, plan_spec
from evaluation.cli.config_file import option_value, subcommand
from evaluation.cli.main import model_settings, parser_for_every_command
from evaluation.errors import EvaluationError
from evaluation.protocols import shipped_work  # noqa: F401 (registers each protocol's work)
from evaluation.protocols.loop import run_settings
from evaluation.protocols.protocol import Plan, Protocol, lacks
from evaluation.protocols.shipped import protocols
from evaluation.runs.backends import LOCAL, Unit, Work, run_units
from evaluation.runs.json_rows import numbered_rows
from evaluation.runs.numerics import cpu_capability
from evaluation.runs.progress import duration
from evaluation.runs.record import read_record
from evaluation.runs.store import ResultStore

# The largest difference allowed between a committed float and the re-run's, per field (a list's items take its
# field's). Measured (benchmarks/numerics.py, docs/reliability.md "Numerics"): the committed perplexity cell re-run at
# 1 and at 2 intra-op threads moved a text's mean NLL (``nll``) by at most 2.4e-7 and a window of ``nll_by_position``
# by at most 1.9e-6; shorter streams (tests/test_numerics.py, 64 and 128 tokens) moved ``nll`` by up to 4.8e-7. Each
# tolerance is the largest seen, doubled and rounded up to one digit. The answer likelihood and every
# other float (``score``, which other protocols share) keep 1e-6: not measured on a committed cell (a Ray worker's
# one thread moved ``answer_nll`` by about 5e-7). A re-run at the recorded count computes the same bits; a tolerance
# covers what a run did not record (a run.json from before ``threads``). Kernels for another instruction set move
# more (AVX2 against AVX-512: 9.8e-6 on a 2,048-token ``nll``), and a line that differs names both (``kernels_note``).
TOLERANCE = 1e-6
TOLERANCES = {"nll": 1e-6, "nll_by_position": 4e-6, "answer_nll": 1e-6}
NOT_COMPARED = ("output", "allow_import")  # its rows go to a temporary folder; consent is its own command line's
MISSING = object()


class SampleComplete(BaseException):
    """A unit's sampled rows are all stored: its work stops here (a ``BaseException``, so that no work's own
    ``except Exception`` takes it)."""


class SampleStore(ResultStore):
    """A sample's result store: the running unit's work stops (``SampleComplete``) once every key of ``until`` is
    stored."""

    until: frozenset = frozenset()

    def append(self, row: dict) -> None:
        super().append(row)
        if self.until and all(key in self for key in self.until):
            raise SampleComplete


@dataclass(frozen=True)
class Sampled:
    unit: Unit  # the plan's unit with the sampled keys
    steps: int  # its steps re-run
    of: int  # of its steps in all
    seconds: float | None  # what the run's unit took, scaled to the steps re-run; None: not recorded


@dataclass(frozen=True)
class Prepared:
    """A run folder ready to reproduce: its protocol, rebuilt configuration and plan, committed rows and sample."""

    folder: Path
    protocol: Protocol
    config: Any
    plan: Plan
    committed: dict[Hashable, dict]
    sample: list[Sampled]
    made_with: frozenset[str] = frozenset()  # the CPU instruction sets torch's kernels used in the run's sessions

    @property
    def estimate(self) -> float | None:
        seconds = [sampled.seconds for sampled in self.sample]
        return None if None in seconds else sum(seconds)  # type: ignore[arg-type]


def requested(text: str, default: int) -> tuple[Path, int]:
    """A ``RUN[:K]`` argument: the run folder and its sample size."""
    folder, colon, size = text.rpartition(":")
    if not colon or not size.isdigit():
        return Path(text), default
    if int(size) < 1:
        raise EvaluationError(f"{text}: the sample size after ':' must be at least 1")
    return Path(folder), int(size)


def configured(folder: Path, record: dict, output: Path, allow_import: bool = False) -> tuple[Protocol, Any]:
    """The recorded run's protocol and its configuration rebuilt through the protocol's options (into ``output``);
    a press spec's import path is imported only with ``allow_import`` (reproduce's own ``--allow-import``), never
    because the run recorded it."""
    known = protocols()
    name = record.get("protocol", "")
    if name not in known:
        raise EvaluationError(
            f"{folder}/run.json: protocol {name!r} is not one this code has ({', '.join(known)}): reproduce it with "
            "the commit that made it"
        )
    protocol = known[name]
    parser = parser_for_every_command()
    subparser = subcommand(parser, name)
    actions = {a.dest: a for a in subparser._actions if a.option_strings and a.dest != "help"}
    # the bare subcommand's options at their defaults, a required one (kvpress's --dataset) unset until recorded
    args = argparse.Namespace(command=name, **{dest: a.default for dest, a in actions.items()}, **subparser._defaults)
    try:
        values = protocol.options_of(record["config"])
    except (KeyError, TypeError, ValueError, EvaluationError) as error:
        raise EvaluationError(f"{folder}/run.json: its settings are not this code's ({error})") from None
    for dest, value in values.items():
        action = actions.get(dest)
        if action is None or dest in NOT_COMPARED or value is None or value == action.default:
            continue
        try:
            setattr(args, dest, option_value(action, dest, value))
        except (argparse.ArgumentError, ValueError, EvaluationError) as error:
            raise EvaluationError(
                f"{folder}/run.json: the recorded {dest} {value!r} is not one this code takes ({error})"
            ) from None
    args.output = output
    if hasattr(args, "allow_import"):
        args.allow_import = consented(folder, args.presses, allow_import)
    model = model_settings(args)
    model.check()
    return protocol, protocol.configure(args, model, output)


def consented(folder: Path, presses: list[str], allow_import: bool) -> bool:
    """Whether the rebuilt run imports its presses' import paths: only when they name some and reproduce's own
    command line allows it; else naming them is an error that says so."""
    paths = import_paths([plan_spec(spec) for spec in presses if canonical(spec) != FULL_CACHE])
    if paths and not allow_import:
        modules = ", ".join(dict.fromkeys(path.partition(":")[0] for path in paths))
        raise EvaluationError(
            f"{folder}/run.json: its presses import {', '.join(paths)}, which runs the module {modules}: pass "
            "--allow-import to reproduce if you trust that code"
        )
    return bool(paths)


def setting_difference(folder: Path, protocol: Protocol, config: Any, recorded: dict, rebuilt: dict) -> str:
    """The first recorded setting the rebuilt run records otherwise ("" when none). A recorded setting it does not
    record is understood when it says what the rebuilt run does: None (unset), the protocol's default for older
    runs, or the configuration's own value of that name (a setting its task now implies); any other is an
    ``EvaluationError``."""
    defaults = protocol.record_defaults()
    for key, value in recorded.items():
        if key in NOT_COMPARED:
            continue
        if key not in rebuilt:
            if value is None or defaults.get(key, MISSING) == value or getattr(config, key, MISSING) == value:
                continue
            raise EvaluationError(
                f"{folder}/run.json: the recorded setting {key}={value!r} is one this code no longer has: reproduce "
                "it with the commit that made it"
            )
        if rebuilt[key] != value:
            return f"setting {key}: committed {value!r} vs now {rebuilt[key]!r}"
    return ""


def cpu_kernels(record: dict) -> frozenset[str]:
    """The instruction sets of torch's CPU kernels (``cpu_capability``) in the sessions that ran a CPU run's units."""
    numerics = [s.get("numerics") or {} for s in record["sessions"] if s.get("units_run")]
    return frozenset(n["cpu_capability"] for n in numerics if n.get("device") == "cpu" and n.get("cpu_capability"))


def kernels_note(made_with: frozenset[str], here: str) -> str:
    """For a differing line: that the run's kernels were another instruction set's than this machine's (``here``),
    which round otherwise ("" when they were the same or not recorded)."""
    if not made_with or made_with == {here}:
        return ""
    return (
        f" (made with torch's {', '.join(sorted(made_with))} kernels, this machine's are {here}'s, which round "
        'otherwise: docs/reliability.md, "Numerics")'
    )


def unit_seconds(record: dict) -> dict[str, float]:
    """Each unit's recorded seconds, the latest session's where several ran it."""
    seconds: dict[str, float] = {}
    for session in record["sessions"]:
        seconds.update(session.get("unit_seconds") or {})
    return seconds


def sample(
    plan: Plan, steps_of: Callable[[Unit], list[frozenset]], committed: dict, seconds: dict[str, float], size: int
) -> list[Sampled]:
    """``size`` steps of the plan's units whose rows are all committed, the cheapest units first by ``seconds``
    (a unit of failed rows only last, then one without recorded seconds, then plan order), whole units before the
    next; ``steps_of(unit)``: the unit's steps (``Protocol.steps``)."""
    complete = [unit for unit in plan.units if unit.keys and all(key in committed for key in unit.keys)]

    def cost(item: tuple[int, Unit]) -> tuple:
        index, unit = item
        failed = all(committed[key].get("error") for key in unit.keys)
        return failed, unit.name not in seconds, seconds.get(unit.name, 0.0), index

    chosen, left = [], size
    for _, unit in sorted(enumerate(complete), key=cost):
        steps = steps_of(unit)
        taken = steps[:left]
        estimate = seconds[unit.name] * len(taken) / len(steps) if unit.name in seconds else None
        chosen.append(Sampled(replace(unit, keys=frozenset().union(*taken)), len(taken), len(steps), estimate))
        left -= len(taken)
        if not left:
            break
    return chosen


def prepare(folder: Path, size: int, output: Path, allow_import: bool = False) -> Prepared | str:
    """The run folder ready to reproduce, or the line saying that its settings differ already."""
    if not (folder / "run.json").is_file():
        raise EvaluationError(f"{folder}: no run.json here: give a run folder (results/<protocol>/<run>)")
    record = read_record(folder / "run.json")
    protocol, config = configured(folder, record, output, allow_import)
    plan = protocol.plan(config)
    rebuilt = json.loads(json.dumps(run_settings(config, plan)))  # as run.json would record it
    differs = setting_difference(folder, protocol, config, record["config"], rebuilt)
    if differs:
        return f"differs: {folder}: {differs}"
    rows = numbered_rows(folder / "predictions.jsonl")
    committed = {protocol.row_key(row): row for _, row in rows}  # type: ignore[arg-type]
    sampled = sample(plan, partial(protocol.steps, config), committed, unit_seconds(record), size)
    if not sampled:
        return f"differs: {folder}: none of its {len(plan.units)} units has all its rows in predictions.jsonl"
    return Prepared(folder, protocol, config, plan, committed, sampled, cpu_kernels(record))


def estimate_line(prepared: Prepared) -> str:
    steps, of = sum(s.steps for s in prepared.sample), sum(s.of for s in prepared.sample)
    units = len(prepared.sample)
    what = f"{units} of {len(prepared.plan.units)} units" + (f" ({steps} of their {of} steps)" if steps < of else "")
    seconds = prepared.estimate
    when = "time unknown: its run.json records no unit seconds" if seconds is None else f"about {duration(seconds)}"
    return f"{prepared.folder}: {what}, {when}"


def stopping(work: Work, until: dict[str, frozenset]) -> Work:
    """``work``, stopped once a unit named in ``until`` has stored those keys."""

    def run(loaded, unit: Unit, store: SampleStore) -> None:
        store.until = until.get(unit.name, frozenset())
        try:
            work(loaded, unit, store)
        except SampleComplete:
            pass
        finally:
            store.until = frozenset()

    return run


def first_difference(committed: object, now: object, where: str, tolerance: float = TOLERANCE) -> str:
    """Where ``now`` differs from ``committed`` ("" when it does not): a list or mapping item by item, a float by
    more than ``tolerance``, anything else by type and value (text byte for byte)."""
    if isinstance(committed, list) and isinstance(now, list) and len(committed) == len(now):
        pairs = enumerate(zip(committed, now, strict=True))
        return next(filter(None, (first_difference(a, b, f"{where}[{i}]", tolerance) for i, (a, b) in pairs)), "")
    if isinstance(committed, dict) and isinstance(now, dict) and list(committed) == list(now):
        items = (first_difference(committed[k], now[k], f"{where}.{k}", tolerance) for k in committed)
        return next(filter(None, items), "")
    if isinstance(committed, float) and isinstance(now, float):
        if abs(committed - now) <= tolerance or committed == now or (math.isnan(committed) and math.isnan(now)):
            return ""
    elif type(committed) is type(now) and committed == now:
        return ""
    return f"{where}: committed {shown(committed)} vs now {shown(now)}"


def shown(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def row_difference(key: Hashable, committed: dict | None, row: dict) -> str:
    if committed is None:
        return f"{key}: no committed row"
    for field in dict.fromkeys([*committed, *row]):
        if field not in committed or field not in row:
            held = "committed" if field in committed else "now"
            return f"{key} {field}: only {held}"
        difference = first_difference(committed[field], row[field], field, TOLERANCES.get(field, TOLERANCE))
        if difference:
            return f"{key} {difference}"
    return ""


def committed_row(prepared: Prepared, key: Hashable, row: dict) -> dict | None:
    """The committed row of ``key``, with each field that ``row`` holds and the committed row predates as what its
    protocol says such a row stands for (``Protocol.row_defaults``: perplexity's ``path``, per cell before
    batching)."""
    committed = prepared.committed.get(key)
    if committed is None:
        return None
    defaults = prepared.protocol.row_defaults
    return committed | {field: defaults[field] for field in row if field in defaults and field not in committed}


def reproduce(prepared: Prepared, output: Path) -> str:
    """Re-run the sample into ``output`` and the run's line: ``reproduced`` or its first difference."""
    protocol, plan = prepared.protocol, prepared.plan
    store = SampleStore(output / "predictions.jsonl", protocol.row_key)
    partial_units = {s.unit.name: s.unit.keys for s in prepared.sample if s.steps < s.of}
    units = [s.unit for s in prepared.sample]
    incomplete = partial(lacks, fields=protocol.likelihood)
    run_units(units, stopping(plan.work, partial_units), prepared.config.model, store, LOCAL, incomplete)
    for row in store.rows:
        key = protocol.row_key(row)  # type: ignore[arg-type]
        difference = row_difference(key, committed_row(prepared, key, row), row)
        if difference:
            note = kernels_note(prepared.made_with, cpu_capability())
            return f"differs: {prepared.folder}: {difference}{note}"
    return f"reproduced: {prepared.folder} ({len(units)} units, {len(store.rows)} rows)"


def command(args: argparse.Namespace) -> int:
    """``python -m evaluation reproduce``: every run checked first (exit 2 on bad input), then each re-run."""
    with tempfile.TemporaryDirectory(prefix="reproduce-") as scratch:
        outputs = [Path(scratch) / str(index) for index in range(len(args.runs))]
        prepared, bad = [], []
        for text, output in zip(args.runs, outputs, strict=True):
            try:
                folder, size = requested(text, args.sample)
                prepared.append(prepare(folder, size, output, args.allow_import))
            except EvaluationError as error:
                bad.append(f"error: {error}")
        if bad:
            print("\n".join(bad), file=sys.stderr)
            return 2
        ready = [p for p in prepared if isinstance(p, Prepared)]
        for item in ready:
            print(estimate_line(item), flush=True)
        known = [p.estimate for p in ready if p.estimate is not None]
        print(f"estimate: about {duration(sum(known))} for the {len(known)} runs whose run.json records unit seconds")
        lines = []
        for item, output in zip(prepared, outputs, strict=True):
            line = item if isinstance(item, str) else reproduce(item, output)
            print(line, flush=True)
            lines.append(line)
    return 1 if any(line.startswith("differs") for line in lines) else 0
