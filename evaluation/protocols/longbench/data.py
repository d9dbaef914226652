"""LongBench v1 data in the official layout: ``<task>.jsonl`` plus ``config/dataset2prompt.json`` and
``config/dataset2maxlen.json``. From a folder (``--data``, else ``longbench/`` of the shared data:
``evaluation.runs.data_location``), or with the network from the
hub's parquet copy of ``THUDM/LongBench`` (the official rows, converted by the hub) and the configs of the
official repository, downloaded once per task into that layout and cached."""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from string import Formatter

from evaluation.errors import EvaluationError
from evaluation.metrics.longbench import TASK_METRICS
from evaluation.runs.data_location import VARIABLE, located
from evaluation.runs.files import write_atomically
from evaluation.runs.json_rows import json_kind, load_json_rows, parse_json, text_list_kind
from evaluation.runs.models import cache_root

HUB_DATASET = "THUDM/LongBench"
PARQUET_REVISION = "refs/convert/parquet"
CONFIG_URL = "https://raw.githubusercontent.com/THUDM/LongBench/main/LongBench/config/{}"
CONFIG_FILES = ("dataset2prompt.json", "dataset2maxlen.json")
FIELDS = ("input", "context", "answers", "all_classes", "_id")
PROMPT_FIELDS = ("context", "input")  # the named fields a prompt template may hold
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


def resolve_data_dir(data_dir: str | None, tasks: list[str]) -> Path:
    """The folder to read: ``local_data_dir``, else the hub download of ``tasks``, written once into the cache."""
    return local_data_dir(data_dir, tasks) or download(tasks)


def local_data_dir(data_dir: str | None, tasks: list[str]) -> Path | None:
    """The folder a run reads without the network: the one given (``--data`` or ``$KVET_SHARED_DATA``), else
    ``longbench/`` of the checkout's shared data where it holds ``tasks`` and the configs
    (``data_location.located``), else the cache where it does; None when a run would download them."""
    path = located(data_dir, "longbench")
    if path is not None and (data_dir is not None or os.environ.get(VARIABLE) or holds(path, tasks)):
        if not all((path / "config" / name).is_file() for name in CONFIG_FILES):
            raise EvaluationError(f"LongBench data dir {path} is missing or incomplete: pass --data {LAYOUT}.")
        return path
    target = cache_root() / "data" / "longbench"
    return target if holds(target, tasks) else None


def holds(folder: Path, tasks: list[str]) -> bool:
    """Whether ``folder`` holds each of ``tasks`` and the two configs."""
    needed = [folder / f"{task}.jsonl" for task in tasks] + [folder / "config" / name for name in CONFIG_FILES]
    return all(path.is_file() for path in needed)


def what_a_run_downloads(tasks: list[str]) -> str:
    configs = CONFIG_URL.rsplit("/", 1)[0]
    return f"{', '.join(tasks)} from the hub's {HUB_DATASET} (parquet), and {', '.join(CONFIG_FILES)} from {configs}"


def download(tasks: list[str]) -> Path:
    """Fetch the configs and each task's rows once into the cache (needs the network)."""
    target = cache_root() / "data" / "longbench"
    try:
        (target / "config").mkdir(parents=True, exist_ok=True)
        for task in tasks:
            if not (target / f"{task}.jsonl").is_file():
                write_jsonl(target / f"{task}.jsonl", parquet_rows(HUB_DATASET, task, PARQUET_REVISION))
        for name in CONFIG_FILES:
            if not (target / "config" / name).is_file():
                with urllib.request.urlopen(CONFIG_URL.format(name), timeout=60) as response:
                    write_atomically(target / "config" / name, response.read())
    except Exception as error:
        raise EvaluationError(
            f"no LongBench data: no --data, KVET_SHARED_DATA or shared/data was found, and downloading {HUB_DATASET} "
            f"failed ({type(error).__name__}: {error}). Pass --data {LAYOUT}."
        ) from error
    return target


def parquet_rows(source: str, task: str, revision: str | None) -> list[dict]:
    """A task's test rows, in order, from a parquet copy laid out as the hub's conversion is
    (``<task>/test/*.parquet`` or ``<task>/*-test.parquet``): a hub dataset id or a local folder."""
    import datasets  # only a download reads parquet: a run from a folder never loads it

    return datasets.load_dataset(source, data_dir=task, split="test", revision=revision).to_list()


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """The official file layout: one JSON object per line, fields and order as given."""
    write_atomically(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())


def read_config(path: Path) -> dict:
    """A config file's object of task names to values."""
    values = parse_json(path.read_bytes(), path)
    if not isinstance(values, dict):
        raise EvaluationError(f"{path}: an object of task names to values, not {json_kind(values)}")
    return values


def load_configs(data_dir: Path, tasks: list[str]) -> dict[str, TaskConfig]:
    """The prompt template and answer length of each of ``tasks``; every entry of both files is checked."""
    prompts_path, lengths_path = (data_dir / "config" / name for name in CONFIG_FILES)
    prompts, max_lengths = read_config(prompts_path), read_config(lengths_path)
    missing = [task for task in tasks if task not in prompts or task not in max_lengths]
    if missing:
        raise EvaluationError(f"{data_dir / 'config'} has no prompt or max length for {missing}")
    for task, template in prompts.items():
        problem = template_problem(template)
        if problem:
            raise EvaluationError(f"{prompts_path}: the {task} prompt template {problem}")
    for task, length in max_lengths.items():
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise EvaluationError(
                f"{lengths_path}: the {task} answer length must be a whole number of tokens >= 1, not "
                f"{json_kind(length)}"
            )
    return {task: TaskConfig(prompts[task], max_lengths[task]) for task in tasks}


def template_problem(template: object) -> str:
    """Why a prompt template is not one ("" when it is): a string with ``{context}`` once and ``{input}`` at most,
    each a plain named field (no attribute, index, conversion or format: ``{context.__class__}``, ``{0}``)."""
    if not isinstance(template, str):
        return f"must be a string, not {json_kind(template)}"
    try:
        fields = [
            (name, spec, conversion) for _, name, spec, conversion in Formatter().parse(template) if name is not None
        ]
    except ValueError as error:
        return f"is not a format string ({error}): write {{{{ and }}}} for a literal brace"
    for name, spec, conversion in fields:
        if name not in PROMPT_FIELDS or spec or conversion:
            written = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            return f"has a field other than {{context}} and {{input}} ({written}): use those plain named fields only"
    if [name for name, _, _ in fields].count("context") != 1:
        return "must hold {context} exactly once"
    return ""


def load_task(data_dir: Path, task: str, n: int | None = None) -> list[Example]:
    """The first ``n`` examples of a task in file order (all when ``n`` is None); every row of the file is checked."""
    path = data_dir / f"{task}.jsonl"
    if not path.is_file():
        present = sorted(p.stem for p in data_dir.glob("*.jsonl"))
        raise EvaluationError(f"{path} not found; this data dir holds the tasks {present}")
    rows, seen = load_json_rows(path), set()
    for number, row in enumerate(rows, start=1):
        missing = [name for name in FIELDS if name not in row or (row[name] is None and name != "all_classes")]
        if missing:
            raise EvaluationError(f"{path}: row {number} lacks the field(s) {missing}")
        problem = row_problem(row)
        if problem:
            raise EvaluationError(f"{path}: row {number}: {problem}")
        if not row["answers"]:
            raise EvaluationError(f"{path}: row {number} ({row['_id']}): no gold answers, so any prediction scores 0")
        if row["_id"] in seen:
            raise EvaluationError(f"{path}: row {number} repeats the _id {row['_id']}: every example needs its own")
        seen.add(row["_id"])
    return [Example(task, r["_id"], r["input"], r["context"], r["answers"], r["all_classes"]) for r in rows[:n]]


def row_problem(row: dict) -> str:
    """The first field of a LongBench row whose value is not of its kind, and why ("" when none): the texts and
    ``_id`` strings, ``answers`` a list of strings, ``all_classes`` one or null, and the official file's
    ``length`` (a whole number), ``dataset`` and ``language`` (strings) where given."""
    for name in ("input", "context", "_id", "dataset", "language"):  # the first three present, not null
        if row.get(name) is not None and not isinstance(row[name], str):
            return f"{name} must be a string, not {json_kind(row[name])}"
    if text_list_kind(row["answers"]):
        return f"answers must be a list of strings, not {text_list_kind(row['answers'])}"
    if row["all_classes"] is not None and text_list_kind(row["all_classes"]):
        return f"all_classes must be a list of strings or null, not {text_list_kind(row['all_classes'])}"
    length = row.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
        return f"length must be a whole number, not {json_kind(length)}"
    return ""
