"""KVPress's evaluation datasets by their registry names (KVPress's ``evaluation/evaluate_registry.py``:
``DATASET_REGISTRY`` and ``SCORER_REGISTRY``): the hub id each name loads (``split="test"``, a ``data_dir`` for the
datasets stored as one hub folder per task or length), the scoring rule of ``evaluation.metrics.kvpress`` that
reproduces its scorer, and the hub rows converted to ``KVPressExample``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.metrics.kvpress import score
from evaluation.protocols.kvpress.columns import COLUMNS, KVPressExample, example_of

SPLIT = "test"


@dataclass(frozen=True)
class KVPressDataset:
    """One KVPress dataset: ``hub_id`` is loaded as ``load_dataset(hub_id, data_dir=..., split="test")``;
    ``data_dirs`` are the hub folders KVPress's scripts wrote (empty where there is one); ``scorer`` names the rule
    in ``evaluation.metrics.kvpress.RULES``; ``answer_column`` is the hub column that holds the gold answer(s)."""

    name: str
    hub_id: str
    scorer: str
    notes: str
    data_dirs: tuple[str, ...] = ()
    answer_column: str = "answer"
    split: str = SPLIT


LONGBENCH_TASKS = (
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "gov_report",
    "qmsum",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)
LONGBENCH_E_TASKS = tuple(task for task in LONGBENCH_TASKS if task not in ("narrativeqa", "musique", "qmsum"))
INFINITEBENCH_TASKS = (
    "passkey",
    "kv_retrieval",
    "number_string",
    "longdialogue_qa_eng",
    "longbook_qa_eng",
    "longbook_choice_eng",
    "code_run",
    "code_debug",
    "math_find",
    "math_calc",
    "longbook_sum_eng",
    "longbook_qa_chn",
)

KVPRESS_DATASETS: dict[str, KVPressDataset] = {
    dataset.name: dataset
    for dataset in (
        KVPressDataset(
            "loogle",
            "simonjegou/loogle",
            "loogle",
            "per task: cloze exact/partial match of the masked entities; QA and summaries BLEU, ROUGE recall",
            data_dirs=("shortdep_qa", "longdep_qa", "shortdep_cloze", "longdep_summarization"),
        ),
        KVPressDataset(
            "ruler",
            "simonjegou/ruler",
            "string_match",
            "data_dir is the context length in tokens; per task 100 x mean string match (qa: any answer, else all)",
            data_dirs=("4096", "8192", "16384"),
        ),
        KVPressDataset(
            "zero_scrolls",
            "simonjegou/zero_scrolls",
            "hidden_answers",
            "test answers are hidden: KVPress's scorer returns no metric (the ZeroSCROLLS site scores submissions)",
        ),
        KVPressDataset(
            "infinitebench",
            "MaxJeblick/InfiniteBench",
            "infinitebench",
            "one data_dir per task; the mean of InfiniteBench's per-task rule, in [0, 1]",
            data_dirs=INFINITEBENCH_TASKS,
        ),
        KVPressDataset(
            "longbench",
            "Xnhyacinth/LongBench",
            "longbench",
            "one data_dir per task; LongBench's per-task metric, 100 x mean; trec needs the rows' all_classes",
            data_dirs=LONGBENCH_TASKS,
            answer_column="answers",
        ),
        KVPressDataset(
            "longbench-e",
            "Xnhyacinth/LongBench",
            "longbench_e",
            "data_dir TASK_e; LongBench's metric, 100 x mean per length bucket (0-4k, 4-8k, 8k+ words)",
            data_dirs=tuple(f"{task}_e" for task in LONGBENCH_E_TASKS),
            answer_column="answers",
        ),
        KVPressDataset(
            "longbench-v2",
            "simonjegou/LongBench-v2",
            "multiple_choice",
            "'The correct answer is (X)' in the prediction; mean overall, by difficulty and by length",
            data_dirs=("0shot",),
        ),
        KVPressDataset(
            "needle_in_haystack",
            "alessiodevoto/paul_graham_essays",
            "needle_rouge",
            "the haystack only: the needle is inserted at --needle-depth by the protocol; ROUGE against the needle",
            answer_column="needle",
        ),
        KVPressDataset(
            "aime25",
            "alessiodevoto/aime25",
            "boxed_last",
            "decoding compression: the last \\boxed{...} equals the answer; accuracy",
        ),
        KVPressDataset(
            "math500",
            "alessiodevoto/math500",
            "boxed_first",
            "decoding compression: the first \\boxed{...} equals the answer; accuracy",
        ),
    )
}


def kvpress_dataset(name: str) -> KVPressDataset:
    """The dataset KVPress's registry names ``name``; an unknown name is one line listing the known ones."""
    if name not in KVPRESS_DATASETS:
        raise EvaluationError(f"unknown KVPress dataset {name!r}: known are {', '.join(KVPRESS_DATASETS)}")
    return KVPRESS_DATASETS[name]


def offline_hint(name: str) -> str:
    """The one line to show when ``--dataset name`` has no ``--data`` file and the hub cannot be reached."""
    dataset = kvpress_dataset(name)
    return (
        f"--dataset {name} reads the hub dataset {dataset.hub_id}, which cannot be reached: "
        f"pass --data FILE.parquet (or .jsonl) in KVPress's columns ({', '.join(COLUMNS)})"
    )


def load_hub(dataset: KVPressDataset, data_dir: str | None = None) -> list[KVPressExample]:
    """The hub rows of ``dataset`` (KVPress's ``load_dataset(hub_id, data_dir=data_dir, split="test")``) as
    examples, in order; needs the network (or the hub cache)."""
    from datasets import load_dataset

    rows = load_dataset(dataset.hub_id, data_dir=data_dir, split=dataset.split)
    source = Path(dataset.hub_id if data_dir is None else f"{dataset.hub_id}/{data_dir}")
    return [example_of_hub_row(dataset, dict(row), number, source) for number, row in enumerate(rows, start=1)]


def example_of_hub_row(dataset: KVPressDataset, row: dict, number: int, source: Path) -> KVPressExample:
    """Hub row ``number`` as an example: the gold answers from ``dataset.answer_column``, numbers as their text (as
    KVPress's scorers compare ``str(answer)``), ``task`` the dataset's name where the hub has none; LongBench-E's
    ``length`` (words) is kept for its length buckets. A missing column is one line naming it."""
    columns = {"task": dataset.name, **row}
    if dataset.answer_column in row:
        columns["answer"] = as_text(row[dataset.answer_column])
    missing = [column for column in COLUMNS if column not in columns]
    if missing:
        raise EvaluationError(f"{source}: the hub rows lack KVPress's column(s) {missing}; pass --data FILE.parquet")
    example = example_of(columns, number, source)
    if dataset.name == "longbench-e" and isinstance(row.get("length"), int):
        return replace(example, length=row["length"])
    return example


def as_text(answer: object) -> str | list[str]:
    """A gold answer as a string or a list of strings: numbers become their text, lists keep their order."""
    if isinstance(answer, (list, tuple)):
        return [item if isinstance(item, str) else str(item) for item in answer]
    return answer if isinstance(answer, str) else str(answer)


def score_example(
    dataset_name: str, prediction: str, example: KVPressExample, *, all_classes: list[str] | None = None
) -> float:
    """The example's score in [0, 1] by the rule of KVPress's dataset ``dataset_name``."""
    return score(kvpress_dataset(dataset_name).scorer, prediction, example, all_classes=all_classes)
