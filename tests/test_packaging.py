"""Packaging: ranges (no pins) in pyproject.toml, and an install into an environment that already has the stack
changes none of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_dependencies_are_ranges_and_cover_every_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    assert not [d for d in declared if "==" in d], "pyproject.toml declares ranges; constraints.txt pins"
    names = {d.split(">")[0].split("<")[0].split("=")[0].strip().lower().replace("-", "_") for d in declared}
    imported = {"torch", "kvpress", "transformers", "tokenizers", "numpy", "pandas", "datasets", "huggingface_hub"}
    imported |= {"gguf", "tqdm", "rouge", "rapidfuzz", "nltk", "matplotlib", "pyyaml", "ray"}
    assert imported <= names, f"imported but not declared: {imported - names}"


def test_installing_into_an_existing_stack_keeps_its_versions():
    """pip resolves the project against what is installed (no index, no downloads) and installs only itself."""
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--report",
            "-",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    installs = [item["metadata"]["name"] for item in json.loads(report.stdout)["install"]]
    assert installs == ["kv-eviction-toolkit"]
