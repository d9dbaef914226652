"""How every benchmark script writes its JSON report: its measurements with the commit and the date they were made
at (``evaluation.runs.record.git_commit``: ``-dirty`` for a checkout with uncommitted changes, but for the reports'
own folder, where ``make bench``'s earlier scripts have just written theirs)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from evaluation.runs.record import git_commit


def stamped(report: dict, folder: Path) -> dict:
    """``report`` after the commit (``folder``'s own files not counting as changes) and the date (UTC, ISO 8601)
    it is measured at."""
    return {"commit": git_commit(folder), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **report}


def write_report(path: Path, report: dict) -> dict:
    """Write ``report``, stamped, to ``path`` (its folder made if missing) as indented JSON; returns what it
    wrote."""
    written = stamped(report, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(written, indent=2) + "\n")
    return written
