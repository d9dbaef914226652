"""KVPress's evaluation settings in a ``--config`` file, so that its shipped ``evaluate_config.yaml`` runs as is.

The keys are those of the ``EvaluationConfig`` of KVPress's ``evaluation/evaluate.py``. A key with a meaning here
becomes the option that means it: ``press_name`` the presses, ``compression_ratio`` the ratios, ``model`` and
``device`` themselves, ``model_kwargs``' ``attn_implementation`` and ``dtype`` the model's, ``query_aware`` and
``needle_depth`` (the needle's depths) where a subcommand takes them, and ``dataset`` with its ``data_dir`` the
subcommand's data: ``longbench`` a LongBench task, ``ruler`` a length (RULER's data_dir is its length),
``needle_in_haystack`` nothing more, and under ``kvpress`` any registry name with its hub subset. A key with none
is accepted at KVPress's default with a one-line note, and refused at any other value, by name and with the
reason. ``dataset`` at KVPress's default (``ruler``, with its ``data_dir``) under another subcommand is noted: the
subcommand says which protocol runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evaluation.errors import EvaluationError

ALIASES = {"press_name": "presses", "compression_ratio": "ratios", "needle_depth": "depths"}
OWN_DATASET = {"longbench": "longbench", "ruler": "ruler", "needle": "needle_in_haystack"}  # subcommand: its dataset
DATA_DIR = {"longbench": "tasks", "ruler": "lengths", "kvpress": "subset"}  # what a data_dir is to a subcommand
MODEL_KWARGS = {"attn_implementation": "attn_implementation", "dtype": "dtype"}
DEFAULT_DATASET = "ruler"


@dataclass(frozen=True)
class Unmapped:
    """A KVPress key with no meaning here: KVPress's default, and why another value cannot be honoured."""

    default: object
    reason: str


UNMAPPED = {
    "output_dir": Unmapped("./results", "runs go to scratch/<protocol>/<model> (--output)"),
    "key_channel_compression_ratio": Unmapped(
        None, "the cell's ratio sets ThinKPress's, or its spec: think(key_channel_compression_ratio=0.5)"
    ),
    "head_compression_ratio": Unmapped(None, "the cell's ratio sets DuoAttentionPress's"),
    "threshold": Unmapped(None, "DMSPress's threshold sets no budget, and presses are compared at equal budgets"),
    "fraction": Unmapped(1.0, "the protocol's options choose the examples (--n, --conversations)"),
    "max_new_tokens": Unmapped(None, "each task's own answer length is used"),
    "max_context_length": Unmapped(None, "LongBench's prompt is cut in the middle at --max-length"),
    "query_aware": Unmapped(False, "the question is asked after the compression"),
    "needle_depth": Unmapped(None, "only the needle subcommand places a needle (--depths)"),
    "compression_interval": Unmapped(None, "a decoding press's spec gives it: decoding(tova,compression_interval=1)"),
    "target_size": Unmapped(None, "the budget sets a decoding press's target size"),
    "hidden_states_buffer_size": Unmapped(None, "a decoding press's spec gives it"),
    "log_level": Unmapped("INFO", "the harness writes its own progress lines"),
    "press_init_command": Unmapped(None, "KVPress writes it after a run"),
    "seed": Unmapped(42, "decoding is greedy: nothing is sampled"),
    "fp8": Unmapped(False, "FP8 quantization is not offered"),
}


def translated(values: dict, command: str, options: set[str], path: Path) -> tuple[dict, list[str]]:
    """``values`` with KVPress's keys turned into this command's options (``options``, by destination), and a note
    for each key accepted with no meaning here.

    Raises
    ------
    EvaluationError
        One line naming the key, for a value KVPress's key takes here that cannot be honoured.
    """
    given = {key: value for key, value in values.items() if key not in ("dataset", "data_dir", "model_kwargs")}
    notes = []
    given |= model_settings(values.get("model_kwargs"), path)
    dataset, data_dir = values.get("dataset"), values.get("data_dir")
    if "dataset" in values or "data_dir" in values:
        named = dataset or DEFAULT_DATASET
        if command == "kvpress":
            given["dataset"] = named
        if command == "kvpress" or named == OWN_DATASET.get(command):
            if data_dir is not None and DATA_DIR.get(command) not in options:
                raise EvaluationError(f"--config {path}: data_dir {data_dir!r}: {command} takes none; leave it out")
            if data_dir is not None:
                given[DATA_DIR[command]] = data_dir
        elif named == DEFAULT_DATASET:
            with_dir = f" (data_dir {data_dir!r} with it)" if data_dir is not None else ""
            notes.append(f"dataset {DEFAULT_DATASET!r}{with_dir} is KVPress's default; this subcommand runs {command}")
        else:
            runs = OWN_DATASET.get(command, command)
            raise EvaluationError(f"--config {path}: dataset {named!r}: this subcommand runs {runs}; give {runs}")
    for key in [key for key in given if key in UNMAPPED and ALIASES.get(key, key) not in options]:
        value, unmapped = given.pop(key), UNMAPPED[key]
        if value != unmapped.default:
            raise EvaluationError(
                f"--config {path}: {key}: {value!r} cannot be honoured ({unmapped.reason}); leave it out or at "
                f"KVPress's default {unmapped.default!r}"
            )
        notes.append(f"{key}: {value!r}, KVPress's default, has no meaning here ({unmapped.reason})")
    return given, [f"note: --config {path}: {note}" for note in notes]


def model_settings(model_kwargs: object, path: Path) -> dict:
    """KVPress's ``model_kwargs``, as the model options they set."""
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, dict):
        raise EvaluationError(f"--config {path}: model_kwargs is a mapping, not {type(model_kwargs).__name__}")
    unknown = sorted(set(model_kwargs) - set(MODEL_KWARGS))
    if unknown:
        raise EvaluationError(
            f"--config {path}: model_kwargs {', '.join(unknown)}: only {', '.join(MODEL_KWARGS)} are model options here"
        )
    return {MODEL_KWARGS[key]: value for key, value in model_kwargs.items()}
