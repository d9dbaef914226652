"""The exceptions the harness raises on purpose: each says what is wrong and what to do."""

from __future__ import annotations

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
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PressCannotRun(f"{type(press).__name__}: {reason}") from error
