"""The exceptions the harness raises on purpose: each says what is wrong and what to do."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager


class EvaluationError(Exception):
    """Bad input or a missing resource: the command line prints the message (one line) and exits with 2."""


class PressCannotRun(Exception):
    """A press's cell failed on this example (a prompt shorter than its window, a lag over the budget, an error
    of its code or of the model's forward over the cache it left): the cell is recorded as failed with this reason,
    counted in the scorecard and not retried. Nothing else is."""


class MemoryRefusal(Exception):
    """A cell refused before it runs: this device lacks, now, the memory it needs. Like an out-of-memory error it
    stops the run and stores nothing for the cell, so a resumed run (on a larger device) runs it."""


DEVICE_FAULTS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "NCCL", "HIP error", "device-side")


def stops_run(error: BaseException) -> bool:
    """Whether ``error`` is the machine's, not a press's: out of memory (or a refusal for memory) or a device
    error. Such an error stops the run wherever it is raised."""
    import torch

    if isinstance(error, (torch.OutOfMemoryError, MemoryError, MemoryRefusal, torch.AcceleratorError)):
        return True
    return isinstance(error, RuntimeError) and any(fault in str(error) for fault in DEVICE_FAULTS)


@contextmanager
def press_cell(press: object) -> Iterator[None]:
    """The one rule for errors in a press's cell, in every protocol: inside the block, an exception of the press
    (its construction, its hooks, or the model's forward over the cache it left) becomes ``PressCannotRun``, the
    cell's failure with its reason, named by ``press`` (the press, or its spec before it is built). The machine's
    errors (``stops_run``) and the harness's own (``EvaluationError``) pass through and stop the run. The full-cache
    cell runs outside this rule, and before any press cell's failure is stored: an exception there stops the run
    too, so a fault of the model or the input is never recorded as a press's failure."""
    try:
        yield
    except (PressCannotRun, EvaluationError):
        raise
    except Exception as error:
        if stops_run(error):
            raise
        name = press if isinstance(press, str) else type(press).__name__
        raise PressCannotRun(f"{name}: {first_line(error)}") from error


def first_line(error: BaseException) -> str:
    """An error's message in one line (its first), or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.ENOTDIR}


def refused_write(error: OSError) -> str | None:
    """A write the machine refused, in one line, with what to do (finished cells are on disk and a rerun resumes);
    None for any other error."""
    if error.errno not in WRITE_FAILURES:
        return None
    where = f" ({error.filename})" if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the disk is full{where}: free some space and run the same command again; it resumes after the last "
            "finished cell"
        )
    return (
        f"cannot write{where}: {error.strerror}; point --output at a writable folder, and KVET_CACHE (the cache of "
        "converted models and downloads, default ~/.cache/kv-eviction-toolkit) too if it is the cache"
    )
