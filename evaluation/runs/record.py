"""``run.json``: the configuration, package versions, git commit, model, device and wall times of a run."""

from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError, first_line
from evaluation.runs.files import RUN_FILES, append_only, refuse_foreign, refuse_links, write_atomically

if TYPE_CHECKING:
    from evaluation.runs.backends import Outcome

PACKAGES = ("torch", "transformers", "kvpress", "kv-eviction-toolkit")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(own_output: Path | None = None) -> str | None:
    """The commit of this checkout, with ``-dirty`` when it has uncommitted changes; None outside git. A run's
    ``own_output`` folder (when inside the checkout) is not a change: a resumed run finds its own unfinished files
    there."""
    root = Path(__file__).resolve().parents[2]
    inside = own_output is not None and own_output.resolve().is_relative_to(root)
    outside = [f":(exclude){own_output.resolve()}"] if inside else []
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", *outside], cwd=root, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def refuse_unclean(path: Path, flag: str = "--output") -> None:
    """A committed run or scorecard (``--committed``) is made from a clean commit: a checkout with changes outside
    ``path``, its own folder (another run's uncommitted output among them), is an error before anything runs."""
    commit = git_commit(path)
    if commit is not None and commit.endswith("-dirty"):
        raise EvaluationError(
            f"{flag} {path} with --committed: this checkout has changes outside that folder (git status lists them), "
            "and a committed run records the clean commit it was made from: commit or remove them first"
        )


def fingerprint(*paths: Path) -> dict[str, str]:
    """The sha256 of each data file a run reads, by file name: a resumed run must read the same data."""
    digests = {}
    for path in paths:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digests[path.name] = digest.hexdigest()
    return digests


class RunRecord:
    """Owns a run folder for one session: a lock that a crashed run does not leave held (the operating system
    releases it with the process; leaving the ``with`` block releases it too, an interrupted session's included),
    and ``run.json``, written before the first cell and updated when the session ends. A folder holding a run with
    other results-defining settings (or other data), a link where one of its files belongs, or a folder holding files
    but no run, is refused before anything is touched; ``defaults`` stand for settings an older run.json does not
    record; ``protocol`` names the protocol or streamed task; ``pooled`` names the settings that runs pooled in one
    scorecard must share."""

    def __init__(
        self,
        output: Path,
        config: dict,
        defining: tuple[str, ...],
        defaults: dict | None = None,
        protocol: str = "",
        pooled: list[str] | None = None,
    ) -> None:
        self.path = output / "run.json"
        refuse_links(output, RUN_FILES)
        refuse_foreign(output)
        if self.path.exists():
            read_record(self.path)  # another tool's run.json, or a damaged one, is refused before the lock is made
        try:
            output.mkdir(parents=True, exist_ok=True)
            self.lock = append_only(output / ".lock")
        except OSError as error:
            raise EvaluationError(f"cannot write to {output} ({error.strerror}): pass another --output") from error
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            self.lock.close()
            raise EvaluationError(
                f"another run is writing to {output} right now: wait for it to finish or pass another --output"
            ) from error
        try:
            self._start(output, config, defining, defaults or {}, protocol, pooled or [])
        except BaseException:
            self.lock.close()
            raise

    def _start(
        self, output: Path, config: dict, defining: tuple[str, ...], defaults: dict, protocol: str, pooled: list[str]
    ) -> None:
        """This session's entry in run.json, written before the first cell, once the folder's run is this one."""
        self.record = read_record(self.path) if self.path.exists() else {"config": config, "sessions": []}
        stored = {**defaults, **self.record["config"]}  # a setting recorded before it existed: its default
        changed = {key: (stored.get(key), config.get(key)) for key in defining}
        changed = {key: pair for key, pair in changed.items() if pair[0] != pair[1]}
        if changed:
            details = ", ".join(f"{key}: stored {old!r}, asked {new!r}" for key, (old, new) in changed.items())
            raise EvaluationError(f"{output} holds a run with other settings ({details}); pass another --output.")
        self.record["config"] = config
        self.record["protocol"] = protocol  # the scorecard's key to the run's benchmark
        self.record["pooled_settings"] = pooled
        self.started = time.time()
        self.session = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "finished": False,
            "config": config,  # each session's own grid: a resume may ask for a part of what the folder holds
            "versions": package_versions(),
            "git_commit": git_commit(output),
        }
        self.record["sessions"].append(self.session)
        self.write()

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.lock.close()

    def write(self) -> None:
        write_atomically(self.path, json.dumps(self.record, indent=2) + "\n")

    def note(self, **fields: object) -> None:
        """Add ``fields`` to this session's entry now (what its numerics depend on, ``loop.run``)."""
        self.session.update(fields)
        self.write()

    def unit_done(self, name: str, seconds: float) -> None:
        """Add a finished unit's seconds, and the wall time so far, to this session's entry now: a session cut off
        before ``finish`` (its process killed, its machine gone) keeps the time its finished units took."""
        unit_seconds = {**self.session.get("unit_seconds", {}), name: seconds}
        self._timed(units_run=len(unit_seconds), unit_seconds=unit_seconds)

    def finish(self, outcome: Outcome, **extra: object) -> None:
        """Complete this session's entry (units run, wall time, each unit's seconds, device...)."""
        self._timed(finished=True, units_run=outcome.ran, unit_seconds=outcome.unit_seconds, **extra)

    def _timed(self, **fields: object) -> None:
        self.session.update(wall_seconds=round(time.time() - self.started, 2), **fields)
        self.record["total_wall_seconds"] = round(sum(s.get("wall_seconds", 0) for s in self.record["sessions"]), 2)
        self.write()


def read_record(path: Path) -> dict:
    """A folder's run.json; a damaged one is an error that says what to do (the predictions are kept)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        reason = "" if isinstance(record, dict) and isinstance(record.get("config"), dict) else "no settings"
        if not reason and not isinstance(record.get("sessions"), list):
            reason = "no sessions"
    except (OSError, ValueError) as error:
        reason = first_line(error)
    if reason:
        raise EvaluationError(
            f"{path} is damaged ({reason}), so the settings of the finished cells are unknown: restore it from a "
            "copy, or run into a new --output"
        )
    return record
