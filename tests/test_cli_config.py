"""``--config``: a file's values go through the same flags' types as the command line (evaluation.cli.config_file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.cli.config_file import with_config
from evaluation.cli.main import main, parser_for_every_command
from evaluation.errors import EvaluationError
from tests.helpers import SHARED_DATA


def parsed(tmp_path, text: str, command: str = "longbench", *argv: str):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    return with_config(parser_for_every_command(), [command, "--config", str(config), *argv])


@pytest.mark.parametrize(
    ("text", "option", "value"),
    [
        ("presses: snapkv\n", "presses", ["snapkv"]),
        ('presses: "composed([snapkv, knorm])"\n', "presses", ["composed([snapkv,knorm])"]),
        ("presses: [full, 'rmm(lag=4)']\n", "presses", ["full", "rmm(lag=4)"]),
        ("ratios: 0.5\n", "ratios", [0.5]),
        ("compression_ratio: 0.25\n", "ratios", [0.25]),
        ("press_name: rmm\n", "presses", ["rmm"]),
        ("query_aware: true\n", "query_aware", True),
        ("query_aware: false\n", "query_aware", False),
        ("n: 3\n", "n", 3),
        ("attn-implementation: eager\n", "attn_implementation", "eager"),
        ("budgets: null\n", "budgets", None),
        ("ratios: []\n", "ratios", []),
        ("output: some/where\n", "output", Path("some/where")),
        ("dry_run: false\n", "dry_run", False),
        ("model: --dry-run\n", "model", "--dry-run"),
        ("n: !!int 3\n", "n", 3),
    ],
)
def test_a_value_means_what_the_same_flag_means(tmp_path, text, option, value):
    assert getattr(parsed(tmp_path, text), option) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n: -1\n", "argument --n: -1 is below 1"),
        ("ratios: [1.5]\n", "outside [0, 1)"),
        ("dtype: float64\n", "invalid choice: 'float64'"),
        ("query_aware: 'false'\n", "query_aware is true or false, not 'false'"),
        ("n: [1, 2]\n", "n takes one value, not a list"),
        ("presses: [{snapkv: 1}]\n", "presses takes values like --presses"),
        ("nn: 3\n", "unknown key 'nn'; did you mean --n?"),
        ("press_name: rmm\npresses: [h2o]\n", "'press_name' and 'presses' both set --presses"),
        ("- n\n", "a mapping of option names to values, not list"),
        ("n: 1\nn: 7\n", "the key 'n' is given twice (lines 1 and 2)"),
        ("n: 2.5\n", "argument --n: '2.5' is not a whole number"),
        ("budgets: [64, 0]\n", "argument --budgets: 0 is below 1"),
        ("presses: []\n", "argument --presses: expected at least one argument"),
        ("path: [shared]\n", "path takes one value, not a list"),
        ("presses: [full, null]\n", "presses takes values like --presses"),
        ("n: !!python/object/apply:os.getpid []\n", "not a readable YAML file (could not determine a constructor"),
    ],
)
def test_a_bad_value_is_a_one_line_error_naming_the_file(tmp_path, text, message):
    with pytest.raises(EvaluationError, match=r"--config .*run\.yaml") as error:
        parsed(tmp_path, text)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_unknown_key_names_the_nearest_flag_of_its_protocol(tmp_path):
    with pytest.raises(EvaluationError, match="did you mean --max-history-tokens"):
        parsed(tmp_path, "max_histroy_tokens: 100\n", "locomo")


def test_the_command_line_overrides_the_file(tmp_path):
    args = parsed(tmp_path, "n: 3\npresses: [snapkv, rmm]\nquery_aware: true\n", "longbench", "--n", "2")
    assert (args.n, args.presses, args.query_aware) == (2, ["snapkv", "rmm"], True)


@pytest.mark.parametrize(
    ("text", "argv", "option", "value"),
    [
        ("press_name: rmm\n", ["--presses", "snapkv"], "presses", ["snapkv"]),
        ("ratios: [0.5]\n", ["--ratios"], "ratios", []),
        ("model: from-file\n", ["--model", "smollm2-135m"], "model", "smollm2-135m"),
        ("n: 3\n", ["--n=4"], "n", 4),
    ],
)
def test_a_value_the_command_line_gives_wins_even_the_default(tmp_path, text, argv, option, value):
    assert getattr(parsed(tmp_path, text, "longbench", *argv), option) == value


def test_a_value_that_reads_like_a_flag_is_a_press_spec_not_an_option(tmp_path, capsys):
    args = parsed(tmp_path, "presses: [full, --dry-run]\n")
    assert (args.presses, args.dry_run) == (["full", "--dry-run"], False)
    data = str(SHARED_DATA / "longbench")
    argv = ["longbench", "--config", str(tmp_path / "run.yaml"), "--model", data, "--data", data]
    argv += ["--output", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "press spec '--dry-run'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_abbreviated_flag_is_refused(capsys):
    assert main(["longbench", "--pres", "rmm", "--dry-run"]) == 2
    assert "unrecognized arguments: --pres" in capsys.readouterr().err


@pytest.fixture
def offline_machine(tmp_path, monkeypatch, no_shared_data):
    """No network (every connection attempt is recorded and refused), an empty hub cache and project cache, no
    shared data, and an empty working directory: what a dry run reaches for shows."""
    import socket

    import datasets.config
    import huggingface_hub.constants

    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("the network is unreachable in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path, attempts


@pytest.mark.parametrize(
    ("command", "table", "fetched"),
    [
        ("longbench", "paper_table2", "hotpotqa, trec from the hub's THUDM/LongBench (parquet)"),
        ("locomo", "paper_table3", "locomo10.json from https://raw.githubusercontent.com/snap-research/locomo"),
    ],
)
def test_a_paper_dry_run_plans_offline_says_what_a_run_fetches_and_writes_nothing(
    offline_machine, capsys, command, table, fetched
):
    root, attempts = offline_machine
    config = Path(__file__).resolve().parents[1] / "configs" / f"{table}.yaml"
    assert main([command, "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "model Qwen/Qwen2.5-7B-Instruct (bfloat16, sdpa, cuda)" in out
    assert f"a real run first fetches: {fetched}" in out
    assert "a real run first fetches: Qwen/Qwen2.5-7B-Instruct: its weights and tokenizer from the hub" in out
    assert "rmm @" in out and "snapkv @" in out
    assert attempts == [], "no connection attempted"
    assert [path for path in root.rglob("*") if path.is_file()] == [], "nothing written"


def test_a_dry_run_with_local_data_counts_the_work_and_says_everything_is_local(offline_machine, capsys):
    data = str(SHARED_DATA / "longbench")
    argv = ["longbench", "--model", data, "--data", data, "--presses", "full", "rmm", "--n", "2", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "LongBench: 2 examples (multi_news) x 3 cells = 6 cells" in out and "at most 3072 answer tokens" in out
    assert "everything it reads is local" in out
    root, attempts = offline_machine
    assert attempts == [] and [path for path in root.rglob("*") if path.is_file()] == []


KVPRESS_CONFIG = Path(__file__).resolve().parent / "data" / "kvpress_evaluate_config.yaml"  # KVPress's, as shipped


def test_kvpress_shipped_evaluate_config_runs_as_is(offline_machine, capsys):
    """KVPress's ``evaluation/evaluate_config.yaml``: its model, press, ratio and model_kwargs become options; each
    key with no meaning here is at KVPress's default, noted on one line."""
    assert main(["longbench", "--config", str(KVPRESS_CONFIG), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "model meta-llama/Meta-Llama-3.1-8B-Instruct (auto, sdpa, cpu)" in captured.out
    assert "  knorm @ keep 50%" in captured.out
    notes = captured.err.splitlines()
    assert all(line.startswith(f"note: --config {KVPRESS_CONFIG}: ") for line in notes)
    assert any("dataset 'ruler' (data_dir '4096' with it) is KVPress's default" in line for line in notes)
    assert any("fraction: 1.0, KVPress's default, has no meaning here" in line for line in notes)


@pytest.mark.parametrize(
    ("lines", "refusal"),
    [
        ("fraction: 0.25", "fraction: 0.25 cannot be honoured (the protocol's options choose the examples"),
        ("fp8: true", "fp8: True cannot be honoured (FP8 quantization is not offered); leave it out or at"),
        ("threshold: 0.1", "threshold: 0.1 cannot be honoured (DMSPress's threshold sets no budget"),
        ("dataset: loogle", "dataset 'loogle': this subcommand runs longbench; give longbench"),
        ("model_kwargs: {quantization_config: x}", "model_kwargs quantization_config: only attn_implementation"),
    ],
)
def test_a_kvpress_key_at_a_value_it_cannot_honour_is_refused_by_name(tmp_path, capsys, lines, refusal):
    (tmp_path / "run.yaml").write_text(f"press_name: knorm\n{lines}\n")
    assert main(["longbench", "--config", str(tmp_path / "run.yaml"), "--dry-run"]) == 2
    assert refusal in capsys.readouterr().err


def test_kvpress_longbench_dataset_and_data_dir_choose_the_task(offline_machine, capsys):
    (offline_machine[0] / "run.yaml").write_text(
        "dataset: longbench\ndata_dir: hotpotqa\npress_name: snapkv\ncompression_ratio: 0.25\n"
        "model_kwargs: {attn_implementation: eager, dtype: bfloat16}\ndevice: null\n"
    )
    assert main(["longbench", "--config", str(offline_machine[0] / "run.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(hotpotqa) x 1 cells" in out and "snapkv @ keep 75%" in out and "(bfloat16, eager, cpu)" in out
