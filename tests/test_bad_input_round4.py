"""Bad input, round 4 (issue 61): nothing runs code a user did not ask for, no write reaches a file the run does
not own, no silent wrong result. One test per case of the round-4 battery, then a seeded walk of malformed run
folders, configs and spec spellings through the command line: exit 0 with a correct result, or exit 2 with one
``error:`` line, and no file outside the run folder changed. Dry runs, parsers and runs stopped before their model
loads, but for one short perplexity run on a tiny model."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvpress import KnormPress

from evaluation.catalogue.specs import canonical
from evaluation.cli.main import main
from evaluation.errors import EvaluationError
from evaluation.protocols.perplexity.work import BYTES_PER_TOKEN, text_file
from evaluation.protocols.texts import text_tokens
from evaluation.runs.models import load_model
from evaluation.runs.store import ResultStore
from tests.helpers import saved_chat_model, without_progress
from tests.test_bad_input import one_line_error
from tests.test_longbench_protocol import MAX_NEW_TOKENS, PROMPTS, write_task

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
    assert main(longbench_argv(data, tmp_path / "run", model=str(folder))) == 2
    assert "exist only as the folder's own Python code (auto_map)" in one_line_error(capsys)
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
    for pair in (("knorm", "KnormPress"), ("snapkv(window_size=64)", "SnapKVPress(window_size=64)")):
        assert main([*longbench_argv(data, tmp_path / "run", "--presses", *pair), "--dry-run"]) == 2
        assert f"press specs {pair[0]!r} and {pair[1]!r} build the same press" in one_line_error(capsys)


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


# 5. Text a user gives, large inputs, bounds, perplexity's failed cells.


def test_a_text_file_that_is_not_utf8_is_one_line_naming_it(chat_model, tmp_path, capsys):
    text = tmp_path / "latin1.txt"
    text.write_bytes("caf\u00e9 ".encode("latin-1") * 50)
    argv = ["perplexity", "--texts", "--text-file", str(text), "--presses", "full", "--length", "16"]
    assert main([*argv, "--model", str(chat_model), "--output", str(tmp_path / "run")]) == 2
    assert f"--text-file {text}: not UTF-8 (byte 3): save it as UTF-8" in one_line_error(capsys)


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


# 6. A seeded walk: malformed run folders, configs and spec spellings through the command line.

FOLDER_DAMAGES = (
    "hard link predictions",
    "hard link progress",
    "hard link scorecard",
    "symlink run.json",
    "foreign file",
    "torn line",
    "truncated run.json",
    "output is a file",
    "cp -al copy",
    "empty",
)
CONFIG_DAMAGES = ("allow_import", "not utf-8", "duplicate presses", "duplicate key", "huge number", "null", "list")
SPELLINGS = ("knorm", "knorm()", " knorm ", "\uff4b\uff4e\uff4f\uff52\uff4d", "knorm # c", "knorm(\t)", "knorm\n")


def damaged_folder(rng: random.Random, root: Path, outside: Path) -> tuple[Path, str]:
    """A run folder damaged one way, linked to files of ``outside`` where the damage says so."""
    damage = rng.choice(FOLDER_DAMAGES)
    run = root / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {}, "sessions": []}))
    (run / "predictions.jsonl").write_text("")
    links = {"predictions": "predictions.jsonl", "progress": "progress.log", "scorecard": "scorecard.md"}
    if damage.startswith("hard link"):
        name = links[damage.split()[-1]]
        (run / name).unlink(missing_ok=True)
        os.link(outside / "lines.jsonl", run / name)
    elif damage == "symlink run.json":
        (run / "run.json").unlink()
        (run / "run.json").symlink_to(outside / "record.json")
    elif damage == "foreign file":
        (run / "run.json").unlink()
        (run / "thesis.tex").write_text("mine")
    elif damage == "torn line":
        (run / "predictions.jsonl").write_text('{"task": "hotpotqa", "id": "0"')
    elif damage == "truncated run.json":
        (run / "run.json").write_text('{"config": {')
    elif damage == "output is a file":
        shutil.rmtree(run)
        run.write_text("a file")
    elif damage == "cp -al copy":
        shutil.rmtree(run)
        subprocess.run(["cp", "-al", str(outside / "run"), str(run)], check=True)
    elif damage == "empty":
        shutil.rmtree(run)
        run.mkdir()
    return run, damage


def damaged_config(rng: random.Random, path: Path) -> str:
    damage = rng.choice(CONFIG_DAMAGES)
    text = {
        "allow_import": "presses: [full, knorm]\nallow_import: true\n",
        "duplicate presses": "presses: [full, knorm, 'knorm()', 'knorm ( )']\n",
        "duplicate key": "n: 1\nn: 2\n",
        "huge number": f"max_length: {rng.choice([10**7, 10**30, -5])}\n",
        "null": "presses: null\n",
        "list": "n: [1, 2]\n",
    }.get(damage)
    if text is None:
        path.write_bytes(b"presses: [kn\xf6rm]\n")
    else:
        path.write_text(text)
    return damage


def test_a_seeded_walk_is_exit_0_with_a_correct_result_or_one_line_and_touches_nothing_outside(data, tmp_path, capsys):
    rng = random.Random(61)
    outside = tmp_path / "outside"
    (outside / "run").mkdir(parents=True)
    (outside / "lines.jsonl").write_bytes(b'{"kept": 1}\n{"torn": ')
    (outside / "record.json").write_text(json.dumps({"config": {}, "sessions": []}))
    (outside / "run" / "run.json").write_text(json.dumps({"config": {}, "sessions": []}))
    (outside / "run" / "predictions.jsonl").write_text('{"task": "hotpotqa"}\n')
    before = snapshot(outside)
    for case in range(45):
        root = tmp_path / f"case{case}"
        root.mkdir()
        kind = rng.choice(("folder", "config", "spelling"))
        if kind == "folder":
            run, damage = damaged_folder(rng, root, outside)
            code = main(longbench_argv(data, run))
            expected = "cannot load model" if damage == "empty" else ""
        elif kind == "config":
            config = root / "run.yaml"
            damage = damaged_config(rng, config)
            code = main([*longbench_argv(data, root / "run", "--config", str(config)), "--dry-run"])
            expected = ""
        else:
            spellings = rng.sample(SPELLINGS, rng.randint(1, 4))
            damage = f"spellings {spellings}"
            code = main([*longbench_argv(data, root / "run", "--presses", "full", *spellings), "--dry-run"])
        out, err = capsys.readouterr()
        err = without_progress(err)
        errors = [line for line in err.splitlines() if not line.startswith("note: ")]
        assert code in (0, 2), damage
        if code == 2:
            assert len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in err, (damage, err)
            assert expected in errors[0], (damage, err)
        else:
            presses = [line.split(" @ ")[0].strip() for line in out.splitlines() if " @ " in line]
            assert presses and len(presses) == len(set(presses)), (damage, out)
        assert snapshot(outside) == before, damage
