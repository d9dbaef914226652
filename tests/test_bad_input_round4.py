"""Bad input, round 4 (issue 61): nothing runs code a user did not ask for, no write reaches a file the run does
not own, no silent wrong result. One test per case of the round-4 battery, then a seeded walk of malformed run
folders, configs and spec spellings through the command line: exit 0 with a correct result, or exit 2 with one
``error:`` line, and no file outside the run folder changed. Dry runs, parsers and runs stopped before their model
loads, but for one short perplexity run on a tiny model."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvpress import KnormPress, SnapKVPress

from evaluation.catalogue.specs import canonical
from evaluation.cli.main import main
from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample, export_parquet, read_examples
from evaluation.protocols.perplexity.work import BYTES_PER_TOKEN, text_file
from evaluation.protocols.ruler.needle import MAX_NEW_TOKENS as NEEDLE_ANSWER
from evaluation.protocols.ruler.tasks import ruler_task
from evaluation.protocols.shipped import protocols
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.examples import case_of, first_answer
from evaluation.protocols.texts import text_tokens
from evaluation.runs import record
from evaluation.runs.models import ModelSettings, byte_tokenizer, load_model
from evaluation.runs.store import ResultStore
from tests.helpers import CHAT_TEMPLATE, saved_chat_model, without_progress
from tests.test_bad_input import one_line_error
from tests.test_longbench_protocol import MAX_NEW_TOKENS, PROMPTS, write_task

ROOT = Path(__file__).resolve().parents[1]
MODULE = "round4_side_effect"  # a module whose import leaves a file beside it


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", context=1024)


def longbench_data(folder: Path, max_new_tokens: dict[str, int] = MAX_NEW_TOKENS) -> Path:
    (folder / "config").mkdir(parents=True)
    (folder / "config" / "dataset2prompt.json").write_text(json.dumps(PROMPTS))
    (folder / "config" / "dataset2maxlen.json").write_text(json.dumps(max_new_tokens))
    write_task(folder, "hotpotqa", 3, seed=0)
    return folder


@pytest.fixture
def data(tmp_path) -> Path:
    return longbench_data(tmp_path / "longbench")


@pytest.fixture
def imported(tmp_path, monkeypatch) -> Iterator[Path]:
    """The file ``MODULE`` leaves when it is imported (it holds a press, ``Own``)."""
    (tmp_path / f"{MODULE}.py").write_text(
        "import pathlib\n"
        "pathlib.Path(__file__).with_suffix('.imported').touch()\n"
        "from kvpress import KnormPress\n\n\n"
        "class Own(KnormPress):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / f"{MODULE}.imported"
    sys.modules.pop(MODULE, None)


def longbench_argv(data: Path, output: Path, *extra: str, model: str | None = None) -> list[str]:
    """A LongBench run of one example on a model that is not there (unless ``model``): any error comes before a
    model loads."""
    argv = ["longbench", "--data", str(data), "--tasks", "hotpotqa", "--n", "1", "--ratios", "0.5"]
    return [*argv, "--model", model or str(output.parent / "absent"), "--output", str(output), *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# 1. Consent to run code comes from the command line only.


def recorded_run(folder: Path, presses: list[str], allow_import: bool, data: Path | None = None) -> Path:
    """A run folder whose run.json records LongBench presses and ``allow_import`` (as an edited one may)."""
    folder.mkdir(parents=True)
    config = {"presses": presses, "allow_import": allow_import, "model": str(folder / "absent"), "tasks": ["hotpotqa"]}
    config |= {"data_dir": str(data), "budgets": ["ratio=0.5"]} if data is not None else {}
    record = {"protocol": "longbench", "config": config, "sessions": []}
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "predictions.jsonl").write_text("")
    return folder


def test_reproduce_never_takes_allow_import_from_a_recorded_run(imported, tmp_path, capsys):
    run = recorded_run(tmp_path / "run", ["full", f"{MODULE}:Own"], allow_import=True)
    assert main(["reproduce", str(run)]) == 2
    error = one_line_error(capsys)
    assert f"its presses import {MODULE}:Own, which runs the module {MODULE}" in error
    assert "pass --allow-import to reproduce" in error
    assert not imported.exists() and MODULE not in sys.modules


def test_reproduce_with_allow_import_on_its_command_line_passes_consent(imported, data, tmp_path, capsys):
    run = recorded_run(tmp_path / "run", ["full", f"{MODULE}:Own"], allow_import=False, data=data)
    assert main(["reproduce", str(run), "--allow-import"]) == 1  # imported, planned, and its bare record differs
    assert f"differs: {run}: " in capsys.readouterr().out and imported.exists()


def test_a_config_file_grants_no_import(imported, data, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"presses: ['{MODULE}:Own']\nallow_import: true\n")
    assert main([*longbench_argv(data, tmp_path / "run", "--config", str(config))]) == 2
    assert "'allow_import' is not taken from a file" in one_line_error(capsys)
    assert not imported.exists() and not (tmp_path / "run").exists()


@pytest.fixture
def remote_code_model(tmp_path) -> tuple[Path, Path]:
    """A model folder whose config names its own Python (``auto_map``): importing it leaves a marker."""
    folder = tmp_path / "custom-model"
    folder.mkdir()
    marker = tmp_path / "custom-code-ran"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (folder / "configuration_custom.py").write_text(
        code + "from transformers import PretrainedConfig\n\n\n"
        "class CustomConfig(PretrainedConfig):\n    model_type = 'kvet_custom'\n"
    )
    (folder / "modeling_custom.py").write_text(code)
    auto_map = {"AutoConfig": "configuration_custom.CustomConfig", "AutoModelForCausalLM": "modeling_custom.Model"}
    (folder / "config.json").write_text(json.dumps({"model_type": "kvet_custom", "auto_map": auto_map}))
    return folder, marker


def test_a_model_folder_that_needs_its_own_code_is_one_line_and_no_prompt(
    remote_code_model, data, tmp_path, capsys, monkeypatch
):
    folder, marker = remote_code_model
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # `echo y |`: nothing asks, so nothing reads it
    for dry_run in ([], ["--dry-run"]):
        assert main([*longbench_argv(data, tmp_path / "run", model=str(folder)), *dry_run]) == 2
        assert "only as the folder's own Python code (auto_map)" in one_line_error(capsys)
    tokenizer_only = tmp_path / "tokenizer-only"
    tokenizer_only.mkdir()
    (tokenizer_only / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tokenizer_only / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "KvetTokenizer", "auto_map": {"AutoTokenizer": ["tok.KvetTokenizer", None]}})
    )
    assert main([*longbench_argv(data, tmp_path / "run", model=str(tokenizer_only)), "--dry-run"]) == 2
    assert "tokenizer_class 'KvetTokenizer' exists only" in one_line_error(capsys)
    with pytest.raises(EvaluationError, match="never runs"):
        load_model(str(folder))
    assert not marker.exists() and sys.stdin.read() == "y\n"


def calls(source: str, name: str) -> Iterator[str]:
    """Each call of ``name`` in ``source``, its arguments included (parentheses matched)."""
    for match in re.finditer(rf"\b{name}\(", source):
        depth, index = 0, match.end() - 1
        for index in range(match.end() - 1, len(source)):
            depth += {"(": 1, ")": -1}.get(source[index], 0)
            if depth == 0:
                break
        yield source[match.start() : index + 1]


def test_every_model_and_tokenizer_load_refuses_remote_code():
    root = Path(__file__).resolve().parents[1] / "evaluation"
    loads = [call for path in root.rglob("*.py") for call in calls(path.read_text(), "from_pretrained")]
    assert len(loads) >= 8
    assert all("trust_remote_code=False" in call for call in loads), [c for c in loads if "trust_remote" not in c]


# 2. A run owns its files.


def test_a_hard_link_where_predictions_belong_is_refused_before_its_torn_line_is_cut(data, tmp_path, capsys):
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"a": 1}\n{"torn": ')
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / "predictions.jsonl")
    assert main(longbench_argv(data, run)) == 2
    assert "has 2 names (a hard link" in one_line_error(capsys)
    with pytest.raises(EvaluationError, match="has 2 names"):
        ResultStore(run / "predictions.jsonl", lambda row: row)
    assert outside.read_bytes() == b'{"a": 1}\n{"torn": ' and sorted(os.listdir(run)) == ["predictions.jsonl"]


def test_a_copy_made_with_cp_al_is_refused_and_the_original_keeps_its_rows(data, tmp_path, capsys):
    original = tmp_path / "original"
    original.mkdir()
    (original / "run.json").write_text(json.dumps({"config": {}, "sessions": []}))
    (original / "predictions.jsonl").write_text('{"task": "hotpotqa"}\n')
    (original / "progress.log").write_text("a line\n")
    before = snapshot(original)
    subprocess.run(["cp", "-al", str(original), str(tmp_path / "copy")], check=True)
    assert main(longbench_argv(data, tmp_path / "copy")) == 2
    assert "has 2 names" in one_line_error(capsys)
    assert snapshot(original) == before


@pytest.mark.parametrize("held", [["notes.txt"], ["scorecard.md", "progress.log"], ["predictions.jsonl"]])
def test_an_output_folder_that_is_no_run_is_refused_and_left_as_it_was(data, tmp_path, capsys, held):
    folder = tmp_path / "ordinary"
    folder.mkdir()
    for name in held:
        (folder / name).write_text(f"{name} of the user\n")
    before = snapshot(folder)
    assert main(longbench_argv(data, folder)) == 2
    assert f"{folder} is a folder that holds no run of this harness" in one_line_error(capsys)
    assert snapshot(folder) == before


def test_a_folder_whose_run_json_is_no_run_of_this_harness_is_refused_before_its_lock_is_made(data, tmp_path, capsys):
    folder = tmp_path / "other-tool"
    folder.mkdir()
    (folder / "run.json").write_text('{"name": "another tool\'s run"}')
    (folder / "progress.log").write_text("the user's log\n")
    before = snapshot(folder)
    assert main(longbench_argv(data, folder)) == 2
    assert f"{folder / 'run.json'} is damaged (no settings)" in one_line_error(capsys)
    assert snapshot(folder) == before


def test_an_empty_folder_or_one_a_crash_left_before_its_run_json_is_a_run_folder(data, tmp_path, capsys):
    for name, held in (("empty", []), ("crashed", [".lock", ".run-0123456789ab.json"])):
        folder = tmp_path / name
        folder.mkdir()
        for entry in held:
            (folder / entry).write_text("")
        assert main(longbench_argv(data, folder)) == 2
        assert "cannot load model" in one_line_error(capsys)  # past the folder's checks: it is the run's now
        assert (folder / "run.json").exists()


def test_scorecard_output_refuses_a_run_folder_and_a_folder_of_other_files(tmp_path, capsys):
    run = recorded_run(tmp_path / "run", ["full"], allow_import=False)
    before = snapshot(run)
    assert main(["scorecard", str(run), "--output", str(run)]) == 2
    assert "is a run folder, whose scorecard is its run's own" in one_line_error(capsys)
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    assert main(["scorecard", str(run), "--output", str(other)]) == 2
    assert "holds files that are not a scorecard's (thesis.tex)" in one_line_error(capsys)
    assert snapshot(run) == before and snapshot(other) == {"thesis.tex": b"mine"}


def test_an_export_is_written_beside_its_path_and_renamed_never_through_a_link(tmp_path):
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(b"the user's own file")
    example = KVPressExample("e", "t", "a context", "a question", "Answer:", ("a",), 4)
    for name, link in (("hard.parquet", os.link), ("soft.parquet", os.symlink)):
        link(outside, tmp_path / name)
        export_parquet([example], tmp_path / name)
        assert read_examples(tmp_path / name) == [example] and not (tmp_path / name).is_symlink()
    assert outside.read_bytes() == b"the user's own file" and outside.stat().st_nlink == 1


def test_an_export_into_results_needs_the_committed_flag(tmp_path, capsys):
    argv = ["ruler", "--tasks", "niah_single_1", "--lengths", "1024", "--n", "1", "--output", str(tmp_path / "r")]
    assert main([*argv, "--export", str(ROOT / "results" / "ruler" / "examples.parquet"), "--dry-run"]) == 2
    assert "--export " in one_line_error(capsys) and not (ROOT / "results" / "ruler" / "examples.parquet").exists()


def test_a_committed_run_from_a_checkout_with_changes_is_refused_before_anything_runs(data, capsys, monkeypatch):
    """A committed run records the clean commit it was made from: changes outside its own folder (another run's
    uncommitted output among them) are one line before any work, so a run is never made to be thrown away."""
    asked = []
    monkeypatch.setattr(record, "git_commit", lambda own: asked.append(own) or "0123abc-dirty")
    output = ROOT / "results" / "longbench" / "kvet-test-unclean"
    try:
        assert main(longbench_argv(data, output, "--committed")) == 2
        assert "has changes outside that folder" in one_line_error(capsys)
        assert asked == [output] and not output.exists()
        monkeypatch.setattr(record, "git_commit", lambda own: "0123abc")
        assert main(longbench_argv(data, output, "--committed", "--tasks", "nope")) == 2
        assert "has changes outside" not in one_line_error(capsys) and not output.exists()
    finally:  # a refusal that failed must leave nothing among the committed runs
        shutil.rmtree(output, ignore_errors=True)


# 3. The prompt budget.


@pytest.fixture(scope="module")
def short_model(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-short"), "qwen2", context=329)


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_a_context_that_cannot_hold_the_answer_and_a_prompt_is_refused_before_loading(
    short_model, tmp_path, capsys, dry_run
):
    data = longbench_data(tmp_path / "longbench", {"hotpotqa": 300, "trec": 4})
    assert main([*longbench_argv(data, tmp_path / "run", model=str(short_model)), *dry_run]) == 2
    error = one_line_error(capsys)
    assert "its context of 329 tokens cannot hold a prompt of at least 64 plus hotpotqa's answer length of 300" in error
    assert "(428 tokens)" in error and not (tmp_path / "run").exists()
    argv = [*longbench_argv(data, tmp_path / "run", "--max-length", "200", model=str(short_model)), *dry_run]
    assert main(argv) == 2
    assert "cannot hold --max-length 200 plus hotpotqa's answer length of 300" in one_line_error(capsys)


def test_a_context_that_holds_them_plans_as_before(short_model, tmp_path, capsys):
    data = longbench_data(tmp_path / "longbench", {"hotpotqa": 200, "trec": 4})
    assert main([*longbench_argv(data, tmp_path / "run", model=str(short_model)), "--dry-run"]) == 0


QUESTION, PREFIX = "What is the code?", "Answer:"


def kvpress_file(path: Path, answer_length: int, rows: int = 2) -> Path:
    row = {"context": "amber river stone " * 40, "question": QUESTION, "answer_prefix": PREFIX, "answer": "a"}
    lines = [json.dumps({**row, "task": "t", "max_new_tokens": answer_length}) for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def after_context_bytes() -> int:
    """What follows a context in the byte tokenizer's chat prompt (a token per byte, one per special token): the
    question, the template's closing ``</s><s>assistant: `` and the answer prefix."""
    return len(QUESTION) + 2 + len("assistant: ") + len(PREFIX)


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_every_single_turn_protocol_refuses_a_context_too_short_before_loading(short_model, tmp_path, capsys, dry_run):
    """KVPress's datasets (--data), RULER and the needle go through LongBench's check: one line naming the numbers,
    before any model loads (so no run folder is made), in a dry run as in a real one."""
    model = ["--model", str(short_model), "--presses", "full", "knorm", *dry_run]
    after = after_context_bytes()
    data = kvpress_file(tmp_path / "long-answer.jsonl", 300)
    assert main(["kvpress", "--dataset", "ruler", "--data", str(data), *model, "--output", str(tmp_path / "k")]) == 2
    assert (
        f"--model {short_model}: its context of 329 tokens cannot hold a prompt of at least 64 plus t's answer length "
        f"of 300 and the {after} tokens after its context ({64 + 300 + after} tokens): use a model with a longer "
        "context" in one_line_error(capsys)
    )
    answer = ruler_task("niah_single_1").tokens_to_generate
    argv = ["ruler", "--tasks", "niah_single_1", "--lengths", "128", "1024", "--n", "1", *model]
    assert main([*argv, "--output", str(tmp_path / "r")]) == 2
    assert (
        f"cannot hold a prompt of up to {1024 - answer} tokens generated for --lengths 1024 plus niah_single_1's "
        f"answer length of {answer} (1024 tokens): use a model with a longer context, or shorter --lengths"
    ) in one_line_error(capsys)
    argv = ["needle", "--lengths", "290", "--depths", "50", *model, "--output", str(tmp_path / "n")]
    assert main(argv) == 2
    assert (
        f"cannot hold a haystack prompt of up to 290 tokens (--lengths 290) plus needle_in_haystack's answer length "
        f"of {NEEDLE_ANSWER} ({290 + NEEDLE_ANSWER} tokens)"
    ) in one_line_error(capsys)
    assert not any((tmp_path / name).exists() for name in "krn")


def test_a_single_turn_context_that_holds_them_plans(short_model, tmp_path, capsys):
    model = ["--model", str(short_model), "--presses", "full", "knorm", "--dry-run"]
    data = kvpress_file(tmp_path / "short-answer.jsonl", 329 - 64 - after_context_bytes())
    assert main(["kvpress", "--dataset", "ruler", "--data", str(data), *model, "--output", str(tmp_path / "k")]) == 0
    length = 329 - NEEDLE_ANSWER
    assert main(["needle", "--lengths", str(length), "--depths", "50", *model, "--output", str(tmp_path / "n")]) == 0


def test_a_model_whose_context_is_known_only_once_loaded_is_checked_where_the_prompt_is_built():
    """The prompt fills the context exactly, with what follows the context counted (the template's closing and
    the answer prefix, not the question alone); a context that cannot hold a minimal prompt is refused."""
    tokenizer = byte_tokenizer(CHAT_TEMPLATE)
    example = KVPressExample("e", "t", "word " * 400, QUESTION, PREFIX, ("a",), 50)
    config = SingleTurnConfig(model=ModelSettings("remote/model"), presses=["full"], budgets=[], output=Path("unused"))
    case = case_of(example, tokenizer, 300, config, lambda prediction, example: 0.0, first_answer)
    prompt = case.prompt
    assert prompt.truncated and prompt.context_ids.shape[1] + prompt.question_ids.shape[1] + 50 == 300
    with pytest.raises(EvaluationError, match=r"remote/model: its context of 150 tokens cannot hold a prompt of at"):
        case_of(example, tokenizer, 150, config, lambda prediction, example: 0.0, first_answer)


# 4. A press has one name; a name given twice runs once.


@pytest.mark.parametrize(
    "spellings",
    [
        ("knorm", "knorm()", "knorm ( )", "\uff4b\uff4e\uff4f\uff52\uff4d", "knorm # the keys' norm", "knorm(\n)"),
        ("snapkv(window_size=64)", "snapkv(window_size=0x40)", "snapkv(window_size=6_4)", "snapkv( window_size = 64 )"),
        ("ExpectedAttentionPress(epsilon=0.01)", "ExpectedAttentionPress(epsilon=1e-2)"),
        ("rmm(correctness='confidence')", 'rmm(correctness="confidence")'),
    ],
)
def test_every_spelling_of_a_press_is_one_name_and_one_cell(data, tmp_path, capsys, spellings):
    assert len({canonical(spec) for spec in spellings}) == 1
    assert main([*longbench_argv(data, tmp_path / "run", "--presses", "full", *spellings), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    name = canonical(spellings[0])
    assert f"note: --presses names {name} more than once: each runs once" in err
    assert sum(line.strip().startswith(f"{name} @") for line in out.splitlines()) == 1


def test_two_names_of_one_press_are_refused(data, tmp_path, capsys):
    window = SnapKVPress().window_size  # KVPress's default
    pairs = [("knorm", "KnormPress"), ("snapkv(window_size=64)", "SnapKVPress(window_size=64)")]
    pairs += [("snapkv", f"snapkv(window_size={window})"), ("adakv(snapkv)", "adakv(press=snapkv)")]
    pairs += [("snapkv(window_size=8,kernel_size=3)", "snapkv(kernel_size=3,window_size=8)")]
    for pair in pairs:
        assert main([*longbench_argv(data, tmp_path / "run", "--presses", *pair), "--dry-run"]) == 2
        assert f"press specs {pair[0]!r} and {pair[1]!r} build the same press" in one_line_error(capsys)


@pytest.mark.parametrize("spec", ["kn orm", "snapkv(window_size=6 4)", "rmm(lag=6 4)"])
def test_a_spec_that_does_not_parse_is_refused_not_read_without_its_spaces(data, tmp_path, capsys, spec):
    assert main([*longbench_argv(data, tmp_path / "run", "--presses", "full", spec), "--dry-run"]) == 2
    assert f"press spec {spec!r}" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("spec", "parameter"),
    [
        ("snapkv(compression_ratio=0.3)", "compression_ratio"),
        ("snapkv(0.3)", "compression_ratio"),
        ("adakv(snapkv(compression_ratio=0))", "compression_ratio"),
        ("think(key_channel_compression_ratio=0.5)", "key_channel_compression_ratio"),
        ("think(0.5)", "key_channel_compression_ratio"),
        ("composed([snapkv, think(key_channel_compression_ratio=0.2)])", "key_channel_compression_ratio"),
        ("duo_attention(head_compression_ratio=0.3)", "head_compression_ratio"),
        ("decoding(knorm, target_size=100)", "target_size"),
        ("prefill_decoding(knorm, decoding(knorm, target_size=100))", "target_size"),
        ("CompressionRatioDecodingPress(knorm, target_compression_ratio=0.5)", "target_compression_ratio"),
    ],
)
def test_a_spec_that_sets_what_the_budget_sets_is_refused(data, tmp_path, capsys, spec, parameter):
    """Every cell sets the ratio (or a press's own ratio, or a decoding press's target) from its budget: the spec's
    would be overwritten under a name that states it."""
    assert main([*longbench_argv(data, tmp_path / "run", "--presses", "full", spec), "--dry-run"]) == 2
    assert f"{parameter} is the budget's to set" in one_line_error(capsys)


def test_duplicates_in_a_config_file_and_on_the_command_line_run_once(data, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("presses: [full, knorm, 'knorm()', snapkv]\n")
    argv = longbench_argv(data, tmp_path / "run", "--config", str(config), "--tasks", "hotpotqa", "hotpotqa")
    assert main([*argv, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "--presses names knorm more than once" in err and "--tasks names hotpotqa more than once" in err
    assert "LongBench: 1 examples (hotpotqa) x 3 cells" in out


def test_texts_named_twice_stream_once(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("words " * 100)
    argv = ["perplexity", "--texts", "--text-file", str(text), str(text), "--presses", "full", "--length", "16"]
    assert main([*argv, "--output", str(tmp_path / "run"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert f"--text-file names {text} more than once" in err and "Perplexity: 1 texts x 16 tokens" in out


def test_lengths_and_depths_named_twice_run_once(tmp_path, capsys):
    argv = ["needle", "--lengths", "1024", "1024", "--depths", "50", "50", "--presses", "full"]
    assert main([*argv, "--output", str(tmp_path / "r"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "--lengths names 1024 more than once" in err and "--depths names 50 more than once" in err
    assert "1 examples x 1 cells" in out


def test_one_text_file_under_two_names_is_refused(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("words " * 100)
    for name, link in (("soft.txt", os.symlink), ("hard.txt", os.link)):
        link(text, tmp_path / name)
        argv = ["perplexity", "--texts", "--text-file", str(text), str(tmp_path / name), "--presses", "full"]
        assert main([*argv, "--length", "16", "--output", str(tmp_path / "run"), "--dry-run"]) == 2
        assert f"--text-file {tmp_path / name} is {text}, given before" in one_line_error(capsys)


# 5. Text a user gives, large inputs, bounds, perplexity's failed cells.


def test_a_text_file_that_is_not_utf8_is_one_line_naming_it(chat_model, tmp_path, capsys):
    text = tmp_path / "latin1.txt"
    text.write_bytes("caf\u00e9 ".encode("latin-1") * 50)
    argv = ["perplexity", "--texts", "--text-file", str(text), "--presses", "full", "--length", "16"]
    assert main([*argv, "--model", str(chat_model), "--output", str(tmp_path / "run")]) == 2
    assert f"--text-file {text}: not UTF-8 (byte 3): save it as UTF-8" in one_line_error(capsys)


def test_a_dataset_file_that_is_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(json.dumps({"context": "caf\u00e9"}, ensure_ascii=False).encode("latin-1") + b"\n")
    argv = ["kvpress", "--dataset", "ruler", "--data", str(data), "--output", str(tmp_path / "run"), "--dry-run"]
    assert main(argv) == 2
    assert f"{data}: not UTF-8 (byte 16): save it as UTF-8" in one_line_error(capsys)


def test_a_config_file_that_is_not_utf8_or_too_large_is_one_line(data, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"presses: [caf\xe9]\n")
    assert main(longbench_argv(data, tmp_path / "run", "--config", str(config))) == 2
    assert "not UTF-8 (byte 13)" in one_line_error(capsys)
    config.write_text("# " + "x" * (1 << 20) + "\n")
    assert main(longbench_argv(data, tmp_path / "run", "--config", str(config))) == 2
    assert "a file of option values may hold" in one_line_error(capsys)


class CountingTokenizer:
    """One token per word; counts the characters it is given."""

    def __init__(self) -> None:
        self.longest = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.longest = max(self.longest, len(text))
        return [len(word) for word in text.split()]


def test_a_large_text_is_cut_before_it_is_read_whole_or_tokenized(tmp_path):
    large = tmp_path / "large.txt"
    words = [f"w{i % 97}" for i in range(2_000_000)]
    large.write_text(" ".join(words))
    text = text_file(large, 100)
    assert len(text.encode()) <= 100 * BYTES_PER_TOKEN
    tokenizer = CountingTokenizer()
    ids = text_tokens(tokenizer, text, 100, "file:large.txt")
    assert ids == [len(word) for word in words[:100]] and tokenizer.longest <= 100 * 8 * 4
    large.write_bytes(b"a" * (100 * BYTES_PER_TOKEN - 1) + "\u00e9 more".encode())  # the limit cuts the \u00e9
    assert text_file(large, 100) == "a" * (100 * BYTES_PER_TOKEN - 1)
    with pytest.raises(EvaluationError, match="fewer than --length 100"):
        text_tokens(CountingTokenizer(), "a b c", 100, "file:short.txt")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["perplexity", "--length", "2000000"], "argument --length: 2000000 is above 1048576"),
        (["scorecard", "run", "--resamples", "10000000"], "argument --resamples: 10000000 is above 100000"),
        (["longbench", "--max-length", "9999999"], "argument --max-length: 9999999 is above 1048576"),
        (["locomo", "--max-new-tokens", "100000"], "argument --max-new-tokens: 100000 is above 65536"),
        (["ruler", "--lengths", "4096", "2000000"], "argument --lengths: 2000000 is above 1048576"),
        (["reuse", "--episodes", "1000000000"], "argument --episodes: 1000000000 is above 1000"),
        (["memory", "--episodes", "20000"], "argument --episodes: 20000 is above 1000"),
        (["probe", "--probes", "1000000"], "argument --probes: 1000000 is above 1000"),
        (["ruler", "--n", "100000"], "argument --n: 100000 is above 1000"),
    ],
)
def test_numbers_that_size_memory_have_upper_bounds(argv, message, capsys):
    assert main([*argv, "--dry-run"] if argv[0] != "scorecard" else argv) == 2
    assert message in capsys.readouterr().err


def test_a_press_error_in_a_perplexity_cell_is_a_failed_cell(chat_model, tmp_path, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom in its score")

    monkeypatch.setattr(KnormPress, "score", boom)
    text = tmp_path / "words.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    argv = ["perplexity", "--texts", "--text-file", str(text), "--length", "48", "--budgets", "24", "--chunk", "8"]
    argv += ["--presses", "full", "knorm", "streaming_llm", "--model", str(chat_model)]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    rows = {row["press"]: row for row in map(json.loads, (tmp_path / "run" / "predictions.jsonl").open())}
    assert rows["knorm"]["error"] == "knorm: boom in its score" and rows["knorm"]["score"] is None
    assert rows["full"]["score"] > 0 and rows["streaming_llm"]["score"] > 0 and "error" not in rows["streaming_llm"]
    assert "failed" in (tmp_path / "run" / "scorecard.md").read_text()


# 6. A seeded walk: malformed run folders, configs, spec spellings and files through the command line. Each case runs
# in a sandbox whose every entry but the case's run folder is recorded before and after it (bytes, links, modes,
# link counts, times): exit 0 with a correct result, or exit 2 with one line, and nothing outside the run folder
# changed. Folder cases are real runs of one LongBench example on a tiny model; the rest are dry runs.

WALK_CASES = 160
WALK_PRESSES = ["full", "knorm"]


def sandbox_state(root: Path, skip: Path) -> dict[str, tuple]:
    """Every entry under ``root`` but ``skip`` and what it holds: a file by the sha256 of its bytes, its mode, link
    count and modification time, a link by its target, anything else by its mode."""
    state: dict[str, tuple] = {}
    for folder, folders, files in os.walk(root):
        base = Path(folder)
        folders[:] = [name for name in folders if base / name != skip]
        for name in [*folders, *files]:
            path = base / name
            if path == skip:
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                held: tuple = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                held = ("file", digest, info.st_mode, info.st_nlink, info.st_mtime_ns)
            else:
                held = ("other", info.st_mode)
            state[str(path.relative_to(root))] = held
    return state


def row_results(run: Path) -> dict[tuple, tuple]:
    """Each row of a run by its key: what it predicted and scored."""
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    return {(r["task"], r["id"], r["press"], r["budget"]): (r["prediction"], r["score"]) for r in rows}


@dataclass(frozen=True)
class Case:
    """A case of the walk: its command line, the line an error must hold ("" for any; None: it must succeed),
    and what a success must show (``check(out, run)``)."""

    argv: list[str]
    error: str | None
    check: Callable[[str, Path], None] | None = None


class Deck:
    """Items dealt in a seeded random order, each once before any is dealt again."""

    def __init__(self, rng: random.Random, items: Sequence) -> None:
        self.rng, self.items, self.left, self.rounds = rng, list(items), [], 0

    def deal(self):
        if not self.left:
            self.left, self.rounds = self.rng.sample(self.items, len(self.items)), self.rounds + 1
        return self.left.pop()

    @property
    def every_one_dealt(self) -> bool:
        return self.rounds > 1 or (self.rounds == 1 and not self.left)


class Walk:
    """The walk's sandbox: LongBench data, files outside any run (which damaged folders link to), a finished run
    of the walk's grid (the correct result), and the tiny model; a deck of each kind of damage."""

    def __init__(self, root: Path, model: Path, rng: random.Random) -> None:
        self.root, self.model = root, model
        self.folder_damages, self.config_damages = Deck(rng, FOLDER_DAMAGES), Deck(rng, CONFIG_DAMAGES)
        self.bad_specs, self.spec_kinds = Deck(rng, BAD_SPECS), Deck(rng, ("bad", "spellings"))
        self.data = longbench_data(root / "longbench")
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "lines.jsonl").write_bytes(b'{"kept": 1}\n{"torn": ')
        (self.outside / "record.json").write_text(json.dumps({"config": {}, "sessions": []}))
        self.finished = root / "finished"
        assert main(self.run_argv(self.finished)) == 0
        self.expected = row_results(self.finished)

    def run_argv(self, run: Path, *extra: str) -> list[str]:
        return [*longbench_argv(self.data, run, "--presses", *WALK_PRESSES, *extra, model=str(self.model))]

    def same_rows(self, out: str, run: Path) -> None:
        assert row_results(run) == self.expected and (run / "scorecard.md").is_file()

    def folder_case(self, rng: random.Random, case: Path) -> Case:
        """A run folder damaged one way, then a real run into it."""
        run = case / "run"
        damage = self.folder_damages.deal()
        if damage != "none":
            shutil.copytree(self.finished, run, symlinks=True)
        error = FOLDER_DAMAGES[damage](run, self.outside, rng)
        return Case(self.run_argv(run), error, self.same_rows if error is None else None)

    def config_case(self, rng: random.Random, case: Path) -> Case:
        """A --config file malformed one way, then a dry run (its --output from the file where the file sets one)."""
        config = case / "run.yaml"
        text, error, presses = self.config_damages.deal()
        filled = text if isinstance(text, bytes) else text.replace("{case}", str(case)).replace("{root}", str(ROOT))
        config.write_bytes(filled if isinstance(filled, bytes) else filled.encode())
        argv = [*longbench_argv(self.data, case / "run", "--config", str(config), model=str(self.model)), "--dry-run"]
        if "{root}" in str(text):
            argv = [item for item in argv if item not in ("--output", str(case / "run"))]
        return Case(argv, error, None if presses is None else grid_of(presses))

    def spec_case(self, rng: random.Random, case: Path) -> Case:
        """Press specs: spellings of presses, each spelling with the name it runs under, or a spec that is none."""
        if self.spec_kinds.deal() == "bad":
            bad = self.bad_specs.deal()
            spec = bad(rng) if callable(bad) else bad
            argv = [*longbench_argv(self.data, case / "run", "--presses", "full", spec), "--dry-run"]
            return Case(argv, "press spec")
        chosen = [rng.choice(SPELLINGS) for _ in range(rng.randint(1, 5))]
        argv = [*longbench_argv(self.data, case / "run", "--presses", "full", *(s for s, _ in chosen)), "--dry-run"]
        names = list(dict.fromkeys(["full", *(name for _, name in chosen)]))
        same = {SAME_PRESS.get(name, name) for name in names}
        if len(same) < len(names):
            return Case(argv, "build the same press")
        return Case(argv, None, grid_of(names))

    def file_case(self, rng: random.Random, case: Path) -> Case:
        """A --text-file or --config that is no readable text: a folder, a pipe, a device, bytes not UTF-8."""
        path = case / "input"
        kind = rng.choice(("folder", "pipe", "device", "latin-1"))
        if kind == "folder":
            path.mkdir()
        elif kind == "pipe":
            os.mkfifo(path)
        elif kind == "latin-1":
            path.write_bytes("caf\u00e9 ".encode("latin-1") * 20)
        source = Path("/dev/zero") if kind == "device" else path
        if rng.random() < 0.5:
            argv = ["perplexity", "--texts", "--text-file", str(source), "--presses", "full", "--length", "16"]
            argv += ["--model", str(self.model), "--output", str(case / "run")]
            return Case(argv, f"--text-file {source}" + (": not UTF-8" if kind == "latin-1" else " is not a file"))
        argv = [*longbench_argv(self.data, case / "run", "--config", str(source), model=str(self.model))]
        return Case([*argv, "--dry-run"], f"--config {source}: not " + ("UTF-8" if kind == "latin-1" else "a file"))


def grid_of(presses: list[str]) -> Callable[[str, Path], None]:
    """A dry run's check: its grid holds each of ``presses`` once, and no other."""

    def check(out: str, run: Path) -> None:
        listed = [line.split(" @ ")[0].strip() for line in out.splitlines() if " @ " in line]
        assert sorted(set(listed)) == sorted(presses) and len(listed) == len(set(listed)), (listed, presses)

    return check


def linked(name: str, symbolic: bool) -> Callable[[Path, Path, random.Random], str]:
    def damage(run: Path, outside: Path, rng: random.Random) -> str:
        (run / name).unlink(missing_ok=True)
        target = outside / ("record.json" if name == "run.json" else "lines.jsonl")
        (run / name).symlink_to(target) if symbolic else os.link(target, run / name)
        return "is a link" if symbolic else "names (a hard link, or a copy made with cp -al)"

    return damage


def rewritten(name: str, text: str, error: str | None) -> Callable[[Path, Path, random.Random], str | None]:
    def damage(run: Path, outside: Path, rng: random.Random) -> str | None:
        (run / name).write_text(text)
        return error

    return damage


def cut_rows(keep: int, tail: str = "") -> Callable[[Path, Path, random.Random], None]:
    """The first ``keep`` rows of predictions.jsonl kept, ``tail`` after them (a line a crash cut short)."""

    def damage(run: Path, outside: Path, rng: random.Random) -> None:
        rows = (run / "predictions.jsonl").read_text().splitlines(keepends=True)
        (run / "predictions.jsonl").write_text("".join(rows[:keep]) + tail)

    return damage


def left_by_a_crash(run: Path, outside: Path, rng: random.Random) -> None:
    (run / ".lock").write_text("")
    (run / f".run-{rng.getrandbits(48):012x}.json").write_text('{"config"')
    (run / f".scorecard-{rng.getrandbits(48):012x}.md").write_text("half a scorecard")


def foreign(run: Path, outside: Path, rng: random.Random) -> str:
    shutil.rmtree(run)
    run.mkdir()
    (run / rng.choice(["thesis.tex", "scorecard.md", "predictions.jsonl", "notes"])).write_text("mine")
    return "holds no run of this harness"


def a_file(run: Path, outside: Path, rng: random.Random) -> str:
    shutil.rmtree(run)
    run.write_text("a file")
    return "it is a file, not a folder"


def hard_linked_copy(run: Path, outside: Path, rng: random.Random) -> str:
    shutil.rmtree(run)
    original = outside / f"original-{rng.getrandbits(32):08x}"
    shutil.copytree(run.parent.parent / "finished", original)
    subprocess.run(["cp", "-al", str(original), str(run)], check=True)
    return "names (a hard link, or a copy made with cp -al)"


def special(name: str, kind: str) -> Callable[[Path, Path, random.Random], str]:
    def damage(run: Path, outside: Path, rng: random.Random) -> str:
        (run / name).unlink(missing_ok=True)
        (run / name).mkdir() if kind == "folder" else os.mkfifo(run / name)
        return "is not a file"

    return damage


def other_settings(run: Path, outside: Path, rng: random.Random) -> str:
    record = json.loads((run / "run.json").read_text())
    record["config"]["query_aware"] = not record["config"]["query_aware"]
    (run / "run.json").write_text(json.dumps(record))
    return "query_aware"


def duplicated_row(run: Path, outside: Path, rng: random.Random) -> str:
    rows = (run / "predictions.jsonl").read_text().splitlines(keepends=True)
    (run / "predictions.jsonl").write_text("".join(rows + rows[:1]))
    return "a second result"


FOLDER_DAMAGES: dict[str, Callable[[Path, Path, random.Random], str | None]] = {
    "none": lambda run, outside, rng: None,
    "finished": lambda run, outside, rng: None,
    "left by a crash": left_by_a_crash,
    "torn last line": cut_rows(1, '{"task": "hotpotqa", "id": '),
    "a row lost": cut_rows(1),
    "no rows": cut_rows(0),
    "hard link predictions": linked("predictions.jsonl", symbolic=False),
    "hard link progress": linked("progress.log", symbolic=False),
    "hard link scorecard": linked("scorecard.md", symbolic=False),
    "hard link run.json": linked("run.json", symbolic=False),
    "hard link forest.png": linked("forest.png", symbolic=False),
    "hard link contrasts.csv": linked("contrasts.csv", symbolic=False),
    "symlink run.json": linked("run.json", symbolic=True),
    "symlink predictions": linked("predictions.jsonl", symbolic=True),
    "symlink progress": linked("progress.log", symbolic=True),
    "cp -al copy": hard_linked_copy,
    "foreign folder": foreign,
    "output is a file": a_file,
    "predictions is a folder": special("predictions.jsonl", "folder"),
    "progress is a pipe": special("progress.log", "pipe"),
    "truncated run.json": rewritten("run.json", '{"config": {', ""),
    "run.json a list": rewritten("run.json", "[]", ""),
    "a line not JSON": rewritten("predictions.jsonl", "not json\n", ""),
    "a row without its key": rewritten("predictions.jsonl", '{"score": 1}\n', "not a result row"),
    "a duplicated row": duplicated_row,
    "other settings": other_settings,
}

CONFIG_DAMAGES: list[tuple[str | bytes, str | None, list[str] | None]] = [
    ("presses: [full, knorm]\nallow_import: true\n", "'allow_import' is not taken from a file", None),
    ("committed: true\n", "'committed' is not taken from a file", None),
    ("output: {root}/results/longbench/x\n", "(they pass --committed)", None),
    (b"presses: [kn\xf6rm]\n", "not UTF-8 (byte 12)", None),
    ("presses: [full, knorm, 'knorm()', 'knorm ( )', '\uff4b\uff4e\uff4f\uff52\uff4d']\n", None, ["full", "knorm"]),
    ("tasks: [hotpotqa, hotpotqa]\npresses: [full, snapkv]\n", None, ["full", "snapkv"]),
    ("n: 1\nn: 2\n", "the key 'n' is given twice", None),
    ("max_length: 10000000\n", "is above", None),
    ("max_length: 1000000000000000000000000000000\n", "is above", None),
    ("n: -5\n", "is below 1", None),
    ("presses: null\n", None, list(protocols()["longbench"].presses or ())),
    ("n: [1, 2]\n", "takes one value, not a list", None),
    ("presses: [{full: 1}]\n", "takes values like --presses", None),
    ("nn: 1\n", "unknown key 'nn'", None),
    ("presses: !!python/object/apply:os.system ['touch {case}/ran']\n", "not a readable YAML file", None),
    ("- full\n- knorm\n", "a mapping of option names to values, not list", None),
    ("", None, None),
    (
        "presses: [&a [x, x, x, x], &b [*a, *a, *a, *a], [*b, *b, *b, *b], [*b, *b, *b, *b]]\n",
        "takes values like",
        None,
    ),
    ("presses: 'knorm # --allow-import'\n", None, ["knorm"]),
    ("dry_run: false\n", None, None),
]

SPELLINGS = [  # a spelling and the name its press runs under
    ("knorm", "knorm"),
    ("knorm()", "knorm"),
    (" knorm ", "knorm"),
    ("\uff4b\uff4e\uff4f\uff52\uff4d", "knorm"),
    ("knorm # the keys' norm", "knorm"),
    ("knorm(\t)", "knorm"),
    ("knorm\n", "knorm"),
    ("KnormPress", "KnormPress"),
    ("snapkv(window_size=64)", "snapkv(window_size=64)"),
    ("snapkv(window_size=0x40)", "snapkv(window_size=64)"),
    ("snapkv(window_size=6_4)", "snapkv(window_size=64)"),
    ("snapkv( window_size = 64 )", "snapkv(window_size=64)"),
    ("snapkv", "snapkv"),
    ("snapkv()", "snapkv"),
    ("snapkv(window_size=8)", "snapkv(window_size=8)"),
    ("rmm(lag=64)", "rmm(lag=64)"),
    ("rmm(lag=+64)", "rmm(lag=64)"),
    ("rmm", "rmm"),
    ("adakv(snapkv)", "adakv(snapkv)"),
    ("adakv(snapkv())", "adakv(snapkv)"),
    ("adakv(press=snapkv)", "adakv(press=snapkv)"),
]
SAME_PRESS = {  # names that build one press: KVPress's class name, its defaults spelled out, a keyword
    "KnormPress": "knorm",
    "snapkv(window_size=64)": "snapkv",
    "adakv(press=snapkv)": "adakv(snapkv)",
}
BAD_SPECS: list[str | Callable[[random.Random], str]] = [
    "knorm(",
    "knorm)",
    "kn orm",
    "snapkv(window_size=6 4)",
    "snapkv(compression_ratio=0.3)",
    "knorm(no_such_parameter=1)",
    "__import__('os').system('touch ran')",
    "snapkv(window_size=10**100)",
    "snapkv(window_size=True)",
    "snapkv(window_size=1e309)",
    "knorm.__class__",
    "lambda: knorm",
    "",
    "#",
    "os:system",
    "rmm(lag='64')",
    lambda rng: "(" * rng.randint(100, 400) + "knorm" + ")" * rng.randint(100, 400),
    lambda rng: "adakv(" * rng.randint(30, 300) + "snapkv" + ")" * rng.randint(30, 300),
    lambda rng: "snapkv(window_size=" + "9" * rng.randint(20, 5000) + ")",
]


def test_a_seeded_walk_is_exit_0_with_a_correct_result_or_one_line_and_touches_nothing_outside(
    chat_model, tmp_path, capsys
):
    rng = random.Random(61)
    walk = Walk(tmp_path / "sandbox", chat_model, rng)
    capsys.readouterr()
    makers = Deck(rng, (walk.folder_case, walk.config_case, walk.spec_case, walk.file_case))
    for number in range(WALK_CASES):
        case = walk.root / f"case{number}"
        case.mkdir()
        made = makers.deal()(rng, case)
        before = sandbox_state(walk.root, case / "run")
        code = main(made.argv)
        out, err = capsys.readouterr()
        err = without_progress(err)
        errors = [line for line in err.splitlines() if "error: " in line]  # ours, or argparse's after its usage
        where = (number, made.argv[-6:], made.error, err)
        if made.error is None:
            assert code == 0 and not errors, where
            if made.check is not None:
                made.check(out, case / "run")
        else:
            assert code == 2 and len(errors) == 1 and made.error in errors[0] and "Traceback" not in err, where
        assert sandbox_state(walk.root, case / "run") == before, where
    assert all(deck.every_one_dealt for deck in (walk.folder_damages, walk.config_damages, walk.bad_specs))
