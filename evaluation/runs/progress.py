"""Progress a person can follow: bars on a terminal, and the same progress as plain, timestamped lines in the run's
log (``PROGRESS_LOG`` in its folder) and, without a terminal, on stderr.

A run installs one ``Progress`` (``reporting``); the code that does the work reaches it with ``active()``, so a
model load, the plan, each unit, each cell and each decoding step report without a reporter passed through every
call. A bar writes a line when it opens (unless it is a step bar), then at most every ``EVERY`` seconds as it moves,
and when it closes; while a bar is open and nothing has been written for ``SILENCE`` seconds (one long prefill), a
line says what is still running, so the log is never silent for a minute.

A cell bar's estimate of the time left is its measured cost per cell times the cells left. Cells come in bursts
(the rows of one batch, stored together once it is computed), so a line waits for its burst to end, and the cost
is measured from the end of the first burst, which holds the setup (a model's warm-up, a history's first prefill),
once a later burst has ended; until then over the first burst from the bar's opening.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from evaluation.runs.files import append_only
from evaluation.runs.terminal import interactive

EVERY = 20.0  # seconds between two lines of a moving bar
SILENCE = 45.0  # seconds without a line before one says what is still running
BURST = 0.5  # seconds: rows stored closer together than this were computed together (one burst)

Arrival = tuple[float, int]  # when a bar moved, and its count then


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: 42 s, 3 min 5 s, 1 h 2 min."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def seconds_per_thing(started: float, first_end: Arrival | None, last: Arrival | None) -> float | None:
    """A cell bar's measured cost of one thing: from the end of its first burst (``first_end``) to its ``last``
    arrival where a later burst has ended, else over the first burst from ``started``; None before any arrival."""
    if last is None:
        return None
    if first_end is not None and last[1] > first_end[1]:
        return (last[0] - first_end[0]) / (last[1] - first_end[1])
    return (last[0] - started) / last[1]


class Bar:
    """One bar: ``total`` things of one ``unit``, advanced by ``update``; its lines give the count, the time spent
    and an estimate of the time left (a step bar's from its mean pace after its first step, a cell bar's from its
    measured cost per cell: ``seconds_per_thing``)."""

    def __init__(self, progress: Progress, total: int, desc: str, unit: str, step: bool) -> None:
        self.progress, self.total, self.desc, self.unit, self.step = progress, total, desc, unit, step
        self.done, self.started, self.written = 0, time.monotonic(), time.monotonic()
        self.written_done = -1  # the count its last line gave
        self.paced = self.started  # when the pace starts: a step bar's first step holds its setup (a forward)
        self.first_end: Arrival | None = None  # the last arrival of the first burst, once a later one came
        self.last: Arrival | None = None
        self.pending: threading.Timer | None = None  # a line waiting for its burst to end
        self.closed = False
        self.lock = threading.Lock()  # a settled line and the closing one: one of them, once
        self.postfix = ""
        self.terminal = tqdm(total=total, desc=desc, unit=unit, leave=not step, disable=not interactive())

    def update(self, n: int = 1) -> None:
        now = time.monotonic()
        if self.step and not self.done:
            self.paced = now
        if self.last is not None and self.first_end is None and now - self.last[0] >= BURST:
            self.first_end = self.last
        self.done += n
        self.last = (now, self.done)
        self.terminal.update(n)
        if now - self.written < EVERY:
            return
        if self.step:
            self.write()
        else:
            self.write_after_burst()

    def write_after_burst(self) -> None:
        if self.pending is None:
            self.pending = threading.Timer(BURST, self.settled)
            self.pending.daemon = True
            self.pending.start()

    def settled(self) -> None:
        with self.lock:
            self.pending = None
            if not self.closed and self.written_done != self.done:
                self.write()

    def set_postfix(self, **values: object) -> None:
        self.terminal.set_postfix(**values)
        self.postfix = ", ".join(f"{key} {value}" for key, value in values.items())

    def seconds_left(self, now: float) -> float | None:
        if self.done >= self.total:
            return None
        if not self.step:
            each = seconds_per_thing(self.started, self.first_end, self.last)
            return None if each is None else each * (self.total - self.done)
        paced = self.done - 1  # a step bar's pace starts after its first step
        return (now - self.paced) / paced * (self.total - self.done) if paced > 0 else None

    def line(self) -> str:
        now = time.monotonic()
        left = self.seconds_left(now)
        extra = f" ({self.postfix})" if self.postfix else ""
        estimate = f", about {duration(left)} left" if left is not None else ""
        return f"{self.desc}: {self.done}/{self.total} {self.unit}s{extra}, {duration(now - self.started)}{estimate}"

    def write(self) -> None:
        self.written, self.written_done = time.monotonic(), self.done
        self.progress.log(self.line())

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.pending is not None:
                self.pending.cancel()
            self.terminal.close()
            if not self.step and self.written_done != self.done:
                self.write()


class Progress:
    """Where progress goes: ``log`` (a file, appended), and the terminal as bars, or stderr as lines without one."""

    def __init__(self, log: Path | None = None) -> None:
        self.file: BinaryIO | None = append_only(log) if log is not None else None
        self.bars: list[Bar] = []
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.stopped = threading.Event()
        self.watch = threading.Thread(target=self.watch_silence, daemon=True)
        self.watch.start()

    def say(self, message: str) -> None:
        """A line for the terminal (above its bars) and the log."""
        if interactive():
            tqdm.write(message, file=sys.stderr)
        self.log(message)

    def log(self, message: str) -> None:
        """A line for the log (and stderr without a terminal: a terminal shows the bars instead)."""
        with self.lock:
            self.last = time.monotonic()
            stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
            if not interactive():
                print(stamped, file=sys.stderr, flush=True)
            if self.file is not None:
                self.file.write((stamped + "\n").encode())
                self.file.flush()

    @contextmanager
    def bar(self, total: int, desc: str, unit: str, step: bool = False) -> Iterator[Bar]:
        """A bar for the block; ``step``: a short-lived inner bar (a decode's tokens) that writes lines only while
        it moves slowly, not when it opens or closes."""
        bar = Bar(self, total, desc, unit, step)
        if not step:
            bar.write()
        self.bars.append(bar)
        try:
            yield bar
        finally:
            self.bars.remove(bar)
            bar.close()

    def watch_silence(self) -> None:
        while not self.stopped.wait(SILENCE / 3):
            bars = list(self.bars)
            if bars and time.monotonic() - self.last >= SILENCE:
                self.log(f"still running: {bars[-1].line()}")

    def close(self) -> None:
        self.stopped.set()
        if self.file is not None:
            self.file.close()


_ACTIVE: list[Progress] = []


def active() -> Progress:
    """The run's progress, or one that writes no log (a model loaded outside a run, a Ray worker)."""
    if not _ACTIVE:
        _ACTIVE.append(Progress())
    return _ACTIVE[-1]


@contextmanager
def reporting(log: Path | None) -> Iterator[Progress]:
    """``active()`` is a ``Progress`` that writes ``log`` for the block."""
    progress = Progress(log)
    _ACTIVE.append(progress)
    try:
        yield progress
    finally:
        _ACTIVE.remove(progress)
        progress.close()
