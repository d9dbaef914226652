"""Where the offline data lives, one rule for make, the tests and the command line: ``--data`` first, then
``$KVET_SHARED_DATA``, then ``shared/data`` inside or ``../shared/data`` beside the checkout, then the hub."""

from __future__ import annotations

import os
from pathlib import Path

from evaluation.errors import EvaluationError

CHECKOUT = Path(__file__).resolve().parents[2]
VARIABLE = "KVET_SHARED_DATA"


def shared_data() -> Path:
    """The folder holding ``longbench/`` and ``locomo/`` (PROVENANCE.md), wherever this checkout was copied:
    ``$KVET_SHARED_DATA``, else the first of ``shared/data`` inside and beside the checkout that exists."""
    configured = os.environ.get(VARIABLE)
    if configured:
        return Path(configured)
    candidates = (CHECKOUT / "shared" / "data", CHECKOUT.parent / "shared" / "data")
    return next((path for path in candidates if path.is_dir()), candidates[-1])


def located(given: str | None, relative: str) -> Path | None:
    """What a protocol reads without the hub: ``given`` (its ``--data``), else ``relative`` under
    ``$KVET_SHARED_DATA``, else under the checkout's shared data where that holds it; None: the hub.

    Raises
    ------
    EvaluationError
        When ``$KVET_SHARED_DATA`` is set and does not hold ``relative``.
    """
    if given is not None:
        return Path(given)
    path = shared_data() / relative
    if os.environ.get(VARIABLE) and not path.exists():
        raise EvaluationError(f"{VARIABLE}={shared_data()} holds no {relative}: pass --data, or fix or unset it")
    return path if path.exists() else None
