"""LongBench v1 data in the official layout: ``<task>.jsonl`` plus ``config/dataset2prompt.json`` and
``config/dataset2maxlen.json``. From a folder (``--data-dir`` or ``LONGBENCH_DIR``), or with the network from
the hub dataset ``THUDM/LongBench`` and the official repository, downloaded once and cached."""

from __future__ import annotations

import json
import os
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_download

from evaluation.errors import EvaluationError
from evaluation.json_data import load_json_rows
from evaluation.metrics.longbench import TASK_METRICS
from evaluation.models import cache_root

HUB_DATASET = "THUDM/LongBench"
CONFIG_URL = "https://raw.githubusercontent.com/THUDM/LongBench/main/LongBench/config/{}"
CONFIG_FILES = ("dataset2prompt.json", "dataset2maxlen.json")
FIELDS = ("input", "context", "answers", "all_classes", "_id")
LAYOUT = "a folder holding <task>.jsonl and config/dataset2prompt.json, config/dataset2maxlen.json"


@dataclass(frozen=True)
class Example:
    task: str
    id: str
    input: str
    context: str
    answers: list[str]
    all_classes: list[str] | None


@dataclass(frozen=True)
class TaskConfig:
    prompt: str
    max_new_tokens: int


def check_tasks(tasks: list[str]) -> None:
    unknown = [task for task in tasks if task not in TASK_METRICS]
    if unknown:
        raise EvaluationError(f"unknown LongBench task(s) {unknown}; known tasks: {', '.join(TASK_METRICS)}")


def resolve_data_dir(data_dir: str | None) -> Path:
    """The folder to read: the one given, else ``$LONGBENCH_DIR``, else the cached hub download."""
    given = data_dir or os.environ.get("LONGBENCH_DIR")
    if given is None:
        return download()
    path = Path(given)
    if not (path / "config" / CONFIG_FILES[0]).is_file() or not (path / "config" / CONFIG_FILES[1]).is_file():
        raise EvaluationError(f"LongBench data dir {path} is missing or incomplete: pass --data-dir {LAYOUT}.")
    return path


def download() -> Path:
    """Fetch the official data and configs once into the cache (needs the network)."""
    target = cache_root() / "data" / "longbench"
    if all((target / "config" / name).is_file() for name in CONFIG_FILES):
        return target
    try:
        archive = hf_hub_download(repo_id=HUB_DATASET, filename="data.zip", repo_type="dataset")
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.namelist():
                if member.endswith(".jsonl"):
                    (target / Path(member).name).parent.mkdir(parents=True, exist_ok=True)
                    (target / Path(member).name).write_bytes(bundle.read(member))
        (target / "config").mkdir(parents=True, exist_ok=True)
        for name in CONFIG_FILES:
            with urllib.request.urlopen(CONFIG_URL.format(name), timeout=60) as response:
                (target / "config" / name).write_bytes(response.read())
    except Exception as error:
        raise EvaluationError(
            f"no LongBench data: no --data-dir or LONGBENCH_DIR was given, and downloading {HUB_DATASET} failed "
            f"({type(error).__name__}: {error}). Pass --data-dir {LAYOUT}."
        ) from error
    return target


def read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EvaluationError(f"{path}: not a readable JSON file ({error})") from error


def load_configs(data_dir: Path, tasks: list[str]) -> dict[str, TaskConfig]:
    prompts = read_config(data_dir / "config" / CONFIG_FILES[0])
    max_lengths = read_config(data_dir / "config" / CONFIG_FILES[1])
    missing = [task for task in tasks if task not in prompts or task not in max_lengths]
    if missing:
        raise EvaluationError(f"{data_dir / 'config'} has no prompt or max length for {missing}")
    for task in tasks:
        template, length = prompts[task], max_lengths[task]
        if not isinstance(template, str) or template.count("{context}") != 1:
            raise EvaluationError(f"the {task} prompt template must be a string with {{context}} exactly once")
        try:
            template.format(context="", input="")
        except (KeyError, IndexError, ValueError) as error:
            raise EvaluationError(
                f"the {task} prompt template has a field other than {{context}} and {{input}} ({error}): "
                f"fix {data_dir / 'config' / CONFIG_FILES[0]}"
            ) from error
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise EvaluationError(
                f"the {task} answer length in {data_dir / 'config' / CONFIG_FILES[1]} must be a whole number of "
                f"tokens >= 1, got {length!r}"
            )
    return {task: TaskConfig(prompts[task], max_lengths[task]) for task in tasks}


def load_task(data_dir: Path, task: str, n: int | None = None) -> list[Example]:
    """The first ``n`` examples of a task in file order (all when ``n`` is None), read through ``datasets``."""
    path = data_dir / f"{task}.jsonl"
    if not path.is_file():
        present = sorted(p.stem for p in data_dir.glob("*.jsonl"))
        raise EvaluationError(f"{path} not found; this data dir holds the tasks {present}")
    examples, seen = [], set()
    for number, row in enumerate(load_json_rows(path)[:n], start=1):
        missing = [name for name in FIELDS if name not in row or (row[name] is None and name != "all_classes")]
        if missing:
            raise EvaluationError(f"{path}: row {number} lacks the field(s) {missing}")
        answers = row["answers"]
        if not isinstance(answers, list) or not all(isinstance(answer, str) for answer in answers):
            raise EvaluationError(f"{path}: row {number} ({row['_id']}): answers must be a list of strings")
        if row["_id"] in seen:
            raise EvaluationError(f"{path}: row {number} repeats the _id {row['_id']}: every example needs its own")
        seen.add(row["_id"])
        examples.append(Example(task, str(row["_id"]), row["input"], row["context"], answers, row["all_classes"]))
    return examples
