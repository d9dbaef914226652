"""Where a protocol's units of work run: in this process (``local``) or on a Ray cluster (``ray``).

A unit is the protocol's natural piece (one LongBench example with all its cells, one LoCoMo conversation,
one trace). ``work(loaded, unit, store)`` computes a unit's missing rows and appends them to ``store``, and
completes (``store.amend``) the stored rows that older code left ``incomplete`` (without the answer's likelihood).
Locally that is the run's own ``ResultStore``. On Ray each worker loads the model once, fills an in-memory
store seeded with the unit's finished rows, and returns the new rows; only the driver writes them, so the
results file, the resume rule and the scorecards are the same as a local run's. A unit whose worker fails or
dies is retried on a fresh worker up to ``retries`` times, then reported; the other units still finish.
``ray`` is imported only by the Ray backend. What a unit's work reads besides the model travels with the work and
the unit, as values: a run's cells carry their presses resolved where the run started (``catalogue.budgets.Cell``),
so a worker resolves no press spec again, and imports a press's module only as unpickling it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evaluation.errors import EvaluationError, MemoryRefusal, first_line, refused_write
from evaluation.runs.progress import Bar, active, duration
from evaluation.runs.store import MemoryStore, ResultStore

if TYPE_CHECKING:
    from evaluation.runs.models import ModelSettings

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class Unit:
    name: str  # shown in progress and in failure reports
    payload: Any  # what ``work`` needs besides the loaded model (picklable)
    keys: frozenset  # the result keys the unit produces when complete


@dataclass(frozen=True)
class Backend:
    kind: str = "local"
    address: str | None = None  # a Ray cluster to join; None starts a local Ray instance
    workers: int | None = None  # Ray workers (default: one per GPU, else one)
    retries: int = 2

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise EvaluationError(f"unknown backend {self.kind!r}; choose one of {', '.join(BACKENDS)}")
        if self.workers is not None and self.workers < 1:
            raise EvaluationError(f"--workers {self.workers} must be at least 1")
        if self.retries < 0:
            raise EvaluationError(f"--retries {self.retries} must be 0 or more")


LOCAL = Backend()


Work = Callable[[Any, Unit, ResultStore], None]
Incomplete = Callable[[dict], bool]  # a stored row the unit's work completes
UnitDone = Callable[[str, float], None]  # told each finished unit's name and seconds, as it finishes


def complete_nothing(row: dict) -> bool:
    return False


@dataclass(frozen=True)
class Outcome:
    ran: int  # units run (failed ones included)
    failures: dict[str, str]  # unit name -> its last error, for units that failed every try
    unit_seconds: dict[str, float]  # unit name -> seconds its worker spent on it, for units that finished

    def raise_failures(self, retries: int) -> None:
        """Called once the results and scorecards of the finished units are written."""
        if self.failures:
            details = "; ".join(f"{name}: {error}" for name, error in self.failures.items())
            raise EvaluationError(
                f"{len(self.failures)} unit(s) failed after {retries + 1} tries; the rest finished and were saved "
                f"(rerun to retry): {details}"
            )


def run_units(
    units: list[Unit],
    work: Work,
    model: ModelSettings,
    store: ResultStore,
    backend: Backend,
    incomplete: Incomplete = complete_nothing,
    on_unit: UnitDone | None = None,
) -> Outcome:
    """Run every unit that still lacks a result or holds an ``incomplete`` one, with ``model`` loaded once per
    process; ``on_unit`` is told each unit's seconds as it finishes."""
    todo = [unit for unit in units if pending(unit, store, incomplete)]
    if not todo:
        return Outcome(0, {}, {})
    if backend.kind == "local":
        progress = active()
        loaded = loaded_model(model)
        seconds = {}
        missing = {unit.name: len(pending(unit, store, incomplete)) for unit in todo}
        with progress.bar(sum(missing.values()), "run", "cell") as run:
            for finished, unit in enumerate(todo):
                run.set_postfix(units=f"{finished}/{len(todo)}")
                before = run.done
                with progress.bar(missing[unit.name], unit.name, "cell") as cells, counted(store, cells, run):
                    seconds[unit.name] = timed(work, loaded, unit, store, incomplete)
                if on_unit is not None:
                    on_unit(unit.name, seconds[unit.name])
                run.update(max(before + missing[unit.name] - run.done, 0))  # rows completed in place (amended)
            run.set_postfix(units=f"{len(todo)}/{len(todo)}")
        return Outcome(len(todo), {}, seconds)
    return run_on_ray(todo, work, model, store, backend, incomplete, on_unit)


def pending(unit: Unit, store: ResultStore, incomplete: Incomplete) -> list:
    """The unit's keys whose row is missing from ``store`` or ``incomplete`` there."""
    return [key for key in unit.keys if key not in store or incomplete(store.get(key))]


def loaded_model(model: ModelSettings) -> Any:
    """``model.load()``, with a line before it and one that says how long it took."""
    progress, started = active(), time.monotonic()
    progress.say(f"loading model {model.label}")
    loaded = model.load()
    progress.say(f"model loaded in {duration(time.monotonic() - started)}")
    return loaded


@contextmanager
def counted(store: ResultStore, *bars: Bar) -> Iterator[None]:
    """Every row ``store`` takes in the block moves each of ``bars`` on by one."""

    def moved(row: dict) -> None:
        for bar in bars:
            bar.update()

    store.on_append = moved
    try:
        yield
    finally:
        store.on_append = None


def timed(work: Work, loaded: Any, unit: Unit, store: ResultStore, incomplete: Incomplete = complete_nothing) -> float:
    """Run one unit; an error that is not the harness's own (out of memory, a device error, a bug) stops the run
    with a message that names the unit and says that what finished is saved."""
    start = time.perf_counter()
    try:
        work(loaded, unit, store)
        check_complete(unit, store, incomplete)
    except EvaluationError:
        raise
    except OSError as error:
        if refused_write(error) is None:
            raise
        raise EvaluationError(f"the run stopped in {unit.name}: {refused_write(error)}") from error
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        hint = " (fewer presses or budgets per run, shorter inputs, or more memory)" if is_out_of_memory(error) else ""
        raise EvaluationError(
            f"the run stopped in {unit.name}: {type(error).__name__}: {reason}{hint}. What finished is saved; once "
            "the cause is fixed, the same command resumes."
        ) from error
    return round(time.perf_counter() - start, 2)


def check_complete(unit: Unit, store: ResultStore, incomplete: Incomplete = complete_nothing) -> None:
    """A unit that returned without every result it promised, or with one still incomplete, stops the run (a rerun
    would stream it again forever)."""
    missing = pending(unit, store, incomplete)
    if missing:
        raise EvaluationError(
            f"{unit.name} finished without {len(missing)} of its {len(unit.keys)} results (the first: "
            f"{sorted(map(str, missing))[0]}): a bug or data the run cannot reach; report it with the data file"
        )


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError, MemoryRefusal))


class RayWorker:
    """One model per worker process, reused for every unit it is given; ``load`` (``ModelSettings.load``) sets the
    run's thread count and deterministic kernels in the worker first, so that a worker computes the floats a local
    run does (not Ray's CPU share, which changed their last bits)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.loaded = load()

    def run(
        self, work: Work, unit: Unit, rows: list[dict], key: Callable[[dict], Hashable], incomplete: Incomplete
    ) -> tuple[list[dict], list[dict], float]:
        store = MemoryStore(key, rows)
        seconds = timed(work, self.loaded, unit, store, incomplete)
        return store.new_rows, store.amended_rows, seconds


def stored(store: ResultStore, rows: list[dict], amended: list[dict]) -> None:
    """A Ray worker's results of one unit into ``store``: its new rows (each once) and the rows it amended."""
    for row in rows:
        if store.key(row) not in store:
            store.append(row)
    store.amend(amended)


def worker_options(model: ModelSettings, resources: dict, workers: int | None) -> tuple[int, dict]:
    """How many Ray workers to start and what each asks Ray for: one GPU for a model on ``cuda``, ``cuda:N`` or a
    device map (the worker sees it as ``cuda``), and an equal share of the cluster's CPUs."""
    gpu = model.uses_gpu
    slots = int(resources.get("GPU", 0)) if gpu else int(resources.get("CPU", 1))
    if slots < 1:
        raise EvaluationError(f"--device {model.device} asks for GPU workers, but the Ray cluster has no GPU")
    count = min(workers or (slots if gpu else 1), slots)  # more would wait for resources forever
    return count, {"num_gpus": 1 if gpu else 0, "num_cpus": max(1, int(resources.get("CPU", 1)) // count)}


def check_ray_address(address: str | None, seconds: float = 10.0) -> None:
    """A ``host:port`` address (or ``ray://host:port``) that does not accept a connection within ``seconds`` is an
    error, instead of Ray's retries without end."""
    import socket

    if address is None or address == "auto" or ":" not in address:
        return
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            pass
    except (OSError, ValueError) as error:
        raise EvaluationError(
            f"--ray-address {address} does not answer within {seconds:g} s ({error}): give the address of a running "
            "cluster (ray start --head prints it) or leave --ray-address out to start a local instance"
        ) from None


def run_on_ray(
    units: list[Unit],
    work: Work,
    model: ModelSettings,
    store: ResultStore,
    backend: Backend,
    incomplete: Incomplete,
    on_unit: UnitDone | None = None,
) -> Outcome:
    import ray

    if not ray.is_initialized():
        check_ray_address(backend.address)
        try:
            ray.init(address=backend.address, include_dashboard=False, log_to_driver=False)
        except ConnectionError as error:
            raise EvaluationError(
                f"--ray-address {backend.address}: no Ray cluster answers ({first_line(error)}); start one "
                "(ray start --head) or leave --ray-address out to start a local instance"
            ) from None
    workers, options = worker_options(model, ray.cluster_resources(), backend.workers)
    actor = ray.remote(**options)(RayWorker)
    load = model.on_worker().load

    def fresh():
        return actor.remote(load)

    def unit_rows(unit: Unit) -> list[dict]:
        return [row for row in store.rows if store.key(row) in unit.keys]

    pool = [fresh() for _ in range(min(workers, len(units)))]
    queue, running, tries, failures, seconds = list(units), {}, dict.fromkeys((u.name for u in units), 0), {}, {}
    with active().bar(len(units), f"units on {len(pool)} Ray workers", "unit") as bar:
        while queue or running:
            while queue and len(running) < len(pool):
                worker = next(w for w in pool if all(w is not busy for busy, _ in running.values()))
                unit = queue.pop(0)
                running[worker.run.remote(work, unit, unit_rows(unit), store.key, incomplete)] = (worker, unit)
            ready, _ = ray.wait(list(running), num_returns=1)
            worker, unit = running.pop(ready[0])
            try:
                rows, amended, seconds[unit.name] = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
                tries[unit.name] += 1
                if isinstance(error, ray.exceptions.RayActorError):
                    pool[pool.index(worker)] = fresh()
                if tries[unit.name] <= backend.retries:
                    queue.append(unit)
                else:
                    failures[unit.name] = f"{type(error).__name__}: {str(error).strip().splitlines()[-1]}"
                    bar.update()
                bar.set_postfix(retries=sum(tries.values()), failed=len(failures))
                continue
            stored(store, rows, amended)
            if on_unit is not None:
                on_unit(unit.name, seconds[unit.name])
            bar.update()
    return Outcome(len(units), failures, seconds)
