"""Where the offline data lives: ``$KVET_SHARED_DATA``, else ``shared/data`` inside the checkout or beside it."""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def shared_data() -> Path:
    """The folder holding ``longbench/`` and ``locomo/`` (PROVENANCE.md), wherever this checkout was copied."""
    configured = os.environ.get("KVET_SHARED_DATA")
    if configured:
        return Path(configured)
    candidates = (CHECKOUT / "shared" / "data", CHECKOUT.parent / "shared" / "data")
    return next((path for path in candidates if path.is_dir()), candidates[-1])
