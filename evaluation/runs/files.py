"""How the harness writes a file: never through a link, so nothing it writes lands outside its folder.

A file is written whole to a new file beside it and renamed over it (``replaced``, ``write_atomically``), or opened
to append where the system refuses a link (``append_only``). A folder in which a link (a symbolic link, or a file
with a second name: a hard link, a ``cp -al`` copy), or anything but a file, stands where one of the harness's files
belongs is refused before anything in it is touched (``refuse_links``), as is an existing folder that holds files
but no run of the harness (``refuse_foreign``). The checkout's ``results/`` holds the committed runs: a folder
under it is written only with ``--committed``, which the Makefile's committed targets alone pass
(``refuse_committed``).
An ``OSError`` of a write names the file it was writing (``naming``), a full disk included.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from evaluation.errors import EvaluationError
from evaluation.runs.data_location import CHECKOUT

SCORECARD_FILES = ("scorecard.md", "scorecard.csv", "contrasts.csv", "press_contrasts.csv", "*.png")
PROGRESS_LOG = "progress.log"  # a run's progress, one timestamped line per step (evaluation.runs.progress)
RUN_FILES = (".lock", "predictions.jsonl", "*.json", PROGRESS_LOG, *SCORECARD_FILES)
STAGED = re.compile(r"\..+-[0-9a-f]{12}(\.\w+)?")  # a file ``replaced`` writes before its rename
LEFT_BEFORE_RECORD = re.compile(r"\.lock|\.run-[0-9a-f]{12}\.json")  # what a run leaves before its run.json
COMMITTED = CHECKOUT / "results"  # the committed runs and scorecards
COMMITTED_FLAG = "--committed"  # passed by the Makefile's committed targets only


def refuse_committed(path: Path, committed: bool, flag: str = "--output") -> None:
    """A ``path`` (given as ``flag``) inside the checkout's ``results/``, by any path or link that leads there, is an
    error unless the command line says ``--committed``: a newcomer's command never writes a committed run."""
    if path.resolve().is_relative_to(COMMITTED.resolve()) and not committed:
        raise EvaluationError(
            f"{flag} {path} is inside this checkout's results/, the committed runs, which only the Makefile's "
            f"committed targets write (they pass {COMMITTED_FLAG}): pass {flag} outside it, such as scratch/..."
        )


def refuse_link(path: Path) -> None:
    """A link, or anything but a file, where the harness writes ``path`` is an error that says what to do."""
    if path.is_symlink():
        raise EvaluationError(
            f"{path} is a link (to {os.readlink(path)}): the harness writes its own files and never through a "
            "link; remove the link, or pass another --output"
        )
    if path.exists() and not path.is_file():
        raise EvaluationError(f"{path} is not a file: remove it, or pass another --output")
    if path.is_file() and path.stat().st_nlink > 1:
        raise hard_link(path, path.stat().st_nlink)


def hard_link(path: Path, links: int) -> EvaluationError:
    return EvaluationError(
        f"{path} has {links} names (a hard link, or a copy made with cp -al): a write here would change the other "
        "file too; copy the folder with cp -a, or pass another --output"
    )


def refuse_foreign(folder: Path, record: str = "run.json") -> None:
    """An existing folder that holds entries but no ``record`` (and more than a crashed run's lock or staged file)
    is not a run of this harness: an error, before anything in it is touched."""
    if not folder.is_dir() or (folder / record).exists():
        return
    held = sorted(entry.name for entry in os.scandir(folder) if not LEFT_BEFORE_RECORD.fullmatch(entry.name))
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise EvaluationError(
            f"{folder} is a folder that holds no run of this harness (no {record}; it holds {shown}): pass a new or "
            "empty folder as --output"
        )


def refuse_links(folder: Path, names: Iterable[str]) -> None:
    """A file where the output ``folder`` belongs, or in it a link (or anything but a file) where a file named by
    one of ``names`` (names or glob patterns) belongs, is an error; a folder yet to be made passes."""
    if folder.exists() and not folder.is_dir():
        raise EvaluationError(
            f"cannot write to {folder}: it is a file, not a folder; pass a folder (new or existing) as --output"
        )
    if folder.is_dir():
        patterns = list(names)
        for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
            if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in patterns):
                refuse_link(Path(entry.path))


def refuse_run_folder(folder: Path) -> None:
    """A combined scorecard's ``folder``: a run folder, or one holding other files than a scorecard's, is an error."""
    if (folder / "run.json").exists() or (folder / "predictions.jsonl").exists():
        raise EvaluationError(
            f"{folder} is a run folder, whose scorecard is its run's own: pass another --output for a combined "
            "scorecard"
        )
    if folder.is_dir():
        others = sorted(
            entry.name
            for entry in os.scandir(folder)
            if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in SCORECARD_FILES)
            and not STAGED.fullmatch(entry.name)
        )
        if others:
            raise EvaluationError(
                f"{folder} holds files that are not a scorecard's ({', '.join(others[:3])}): pass a new or empty "
                "folder, or a combined scorecard's, as --output"
            )


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Inside the block an ``OSError`` names ``path``: a write through a descriptor (a full disk) names no file,
    and a new file written to replace ``path`` is not the one the user knows."""
    try:
        yield
    except OSError as error:
        if error.errno is None or error.filename == str(path):
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A new file beside ``path`` for the block to write, synced and renamed over ``path`` when the block ends: a
    link at ``path`` is replaced, never followed, and a block that fails leaves ``path`` as it was."""
    staging = path.with_name(f".{path.stem}-{secrets.token_hex(6)}{path.suffix}")
    with naming(path):
        os.close(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        try:
            yield staging
            descriptor = os.open(staging, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(staging, path)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise


def write_atomically(path: Path, data: str | bytes) -> None:
    """``data`` (text as UTF-8) as the whole of ``path``, through ``replaced``."""
    with replaced(path) as staging:
        staging.write_bytes(data.encode() if isinstance(data, str) else data)


def append_only(path: Path) -> BinaryIO:
    """``path`` opened to append bytes, created if new; the system refuses a link there (``O_NOFOLLOW``)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            refuse_link(path)
        raise
    links = os.fstat(descriptor).st_nlink
    if links > 1:
        os.close(descriptor)
        raise hard_link(path, links)
    return os.fdopen(descriptor, "ab")
