"""The exceptions the harness raises on purpose: each says what is wrong and what to do."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager


class EvaluationError(Exception):
    """Bad input or a missing resource: the command line prints the message (one line) and exits with 2."""


class PressCannotRun(Exception):
    """A press refused an input of this example (a prompt shorter than its window, a lag over the budget): the
    cell is recorded as failed with this reason, counted in the scorecard and not retried. Nothing else is."""


@contextmanager
def press_refusals(press: object) -> Iterator[None]:
    """Inside the block a press's own checks of its input (KVPress's presses assert them, ours raise
    ``ValueError``) become ``PressCannotRun``; any other error (out of memory, a device error) stays what it is."""
    try:
        yield
    except (AssertionError, ValueError) as error:
        raise PressCannotRun(f"{type(press).__name__}: {first_line(error)}") from error


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
