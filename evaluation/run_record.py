"""``run.json``: the configuration, package versions, git commit, model, device and wall times of a run."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from evaluation.errors import EvaluationError

PACKAGES = ("torch", "transformers", "kvpress", "kv-eviction-toolkit")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit() -> str | None:
    """The commit of this checkout, with ``-dirty`` when it has uncommitted changes; None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


class RunRecord:
    """Creates or resumes ``run.json``; refuses to resume a run whose results-defining settings differ."""

    def __init__(self, output: Path, config: dict, defining: tuple[str, ...]) -> None:
        self.path = output / "run.json"
        self.record = json.loads(self.path.read_text()) if self.path.exists() else {"config": config, "sessions": []}
        changed = {key: (self.record["config"].get(key), config.get(key)) for key in defining}
        changed = {key: pair for key, pair in changed.items() if pair[0] != pair[1]}
        if changed:
            details = ", ".join(f"{key}: stored {old!r}, asked {new!r}" for key, (old, new) in changed.items())
            raise EvaluationError(f"{output} holds a run with other settings ({details}); pass another --output.")
        self.record["config"] = config
        self.started = time.time()
        self.commit = git_commit()

    def finish(self, units_run: int, **extra: object) -> None:
        """Append this session (versions, commit, device, wall time) and write the file atomically."""
        self.record["sessions"].append(
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
                "wall_seconds": round(time.time() - self.started, 1),
                "units_run": units_run,
                "versions": package_versions(),
                "git_commit": self.commit,
                **extra,
            }
        )
        self.record["total_wall_seconds"] = round(sum(s["wall_seconds"] for s in self.record["sessions"]), 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_suffix(".json.tmp")
        staging.write_text(json.dumps(self.record, indent=2) + "\n")
        staging.replace(self.path)
