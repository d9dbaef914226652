"""Section 8's press contrasts (RMM against SnapKV and StreamingLLM), the combined scorecard's table per benchmark,
and the benchmark reports' commit."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np

from evaluation.cli.main import main
from evaluation.cli.reproduce import configured
from evaluation.protocols.longbench.protocol import LongBench
from evaluation.reporting.conditions import RANDOM_CONTROL
from evaluation.reporting.scorecard import press_contrast_table, scores_frame

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(1)
BASE = RNG.uniform(0.2, 0.6, size=40)
NOISE = np.where(np.arange(40) % 2, 0.05, -0.05)  # mean 0: a tie
SHIFTS = {"snapkv": 0.0, "streaming_llm": 0.2, "h2o": 0.1, "rmm": 0.2, "rmm(lag=64)": 0.2}


def longbench_rows(budget: str = "keep 25%") -> list[dict]:
    """rmm = snapkv + 0.2 on every example (a win) and streaming_llm + noise of mean 0 (a tie); its answer NLL
    0.5 below snapkv's (lower is better: a win) and streaming_llm's plus noise (a tie)."""
    rows = []
    for press, shift in SHIFTS.items():
        for i in range(40):
            noise = NOISE[i] if press.startswith("rmm") else 0.0
            rows.append(
                {
                    "task": "hotpotqa",
                    "id": f"q{i}",
                    "press": press,
                    "budget": "ratio=0.75",
                    "budget_label": budget,
                    "score": BASE[i] + shift + noise,
                    "prediction": f"{press} {i}",
                    "answer_nll": 2.0 - BASE[i] - shift - noise,
                }
            )
    return rows


def test_rmm_against_snapkv_is_a_win_and_against_streaming_llm_a_tie_on_both_metrics():
    benchmark = LongBench.benchmark
    table = press_contrast_table(scores_frame(benchmark, longbench_rows()), benchmark.press_contrasts, 2_000, 0)
    lines = {(line["metric"].name, line["press"], line["baseline"]): line for line in table.to_dict("records")}
    assert len(lines) == 8, "both rmm specs against both baselines, on the score and the answer NLL"
    for metric in ("score", "answer NLL"):
        for press in ("rmm", "rmm(lag=64)"):
            win, tie = lines[metric, press, "snapkv"], lines[metric, press, "streaming_llm"]
            assert (win["verdict"], win["holm_verdict"], win["n"]) == ("win", "win", 40)
            assert (tie["verdict"], tie["holm_verdict"]) == ("tie", "tie")
            assert tie["diff_low"] < 0 < tie["diff_high"] and abs(tie["diff"]) < 0.01 * (
                100 if metric == "score" else 1
            )
            assert win["mde"] > 0 and win["diff_low"] <= win["diff"] <= win["diff_high"]
    assert abs(lines["score", "rmm", "snapkv"]["diff"] - 20.0) < 1.0, "100 x mean: +0.2 is 20 points"
    assert abs(lines["answer NLL", "rmm", "snapkv"]["diff"] + 0.2) < 0.01, "a lower NLL, and a win"
    assert not {press for _, press, _ in lines} & {"h2o", "snapkv", "streaming_llm"}, "only rmm specs are set against"


def test_rmm_against_its_random_weight_control_is_a_contrast_and_the_control_not_set_against_itself():
    benchmark = LongBench.benchmark
    control = [
        row | {"press": RANDOM_CONTROL, "score": row["score"] - 0.2, "answer_nll": row["answer_nll"] + 0.2}
        for row in longbench_rows()
        if row["press"] == "snapkv"
    ]
    table = press_contrast_table(
        scores_frame(benchmark, longbench_rows() + control), benchmark.press_contrasts, 2_000, 0
    )
    lines = {(line["metric"].name, line["press"], line["baseline"]): line for line in table.to_dict("records")}
    assert len(lines) == 12, "both rmm specs against snapkv, streaming_llm and the control, on both metrics"
    assert not [key for key in lines if key[1] == RANDOM_CONTROL], "the control is the baseline, never the press"
    for metric in ("score", "answer NLL"):
        line = lines[metric, "rmm", RANDOM_CONTROL]
        assert (line["verdict"], line["n"]) == ("win", 40), "rmm = control + 0.4 on every example"


def write_run(folder: Path, rows: list[dict], protocol: str, config: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    record = {"config": config or {}, "sessions": [{"finished": True}], "protocol": protocol}
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def perplexity_rows(presses: tuple[str, ...]) -> list[dict]:
    return [
        {"press": press, "budget": "tokens=64", "budget_label": "64 tokens", "text": f"t{i}", "score": 3.0 + i / 10}
        for press in presses
        for i in range(12)
    ]


def test_the_combined_scorecard_has_a_table_per_benchmark_with_only_its_presses(tmp_path):
    longbench = write_run(tmp_path / "lb", longbench_rows(), "longbench")
    perplexity = write_run(tmp_path / "pp", perplexity_rows(("h2o", "tova")), "perplexity")
    assert main(["scorecard", str(longbench), str(perplexity), "--output", str(tmp_path / "card")]) == 0
    markdown = (tmp_path / "card" / "scorecard.md").read_text()
    sections = markdown.split("\n## ")
    tables = {
        s.splitlines()[0]: [line for line in s.splitlines() if line.startswith("| condition |")] for s in sections
    }
    assert tables["LongBench"] == ["| condition | budget | snapkv | streaming_llm | h2o | rmm | rmm(lag=64) |"] * 2
    assert tables["Perplexity"] == ["| condition | budget | h2o | tova |"]
    assert "## Presses against baselines, paired" in markdown
    assert "| LongBench hotpotqa | keep 25% | rmm | snapkv |" in markdown
    assert (tmp_path / "card" / "press_contrasts.csv").read_text().count("\n") == 9, "a header and 8 contrasts"


def test_runs_of_one_benchmark_that_differ_in_how_scores_are_computed_get_a_table_each(tmp_path):
    ids = ({"max_new_tokens": 8}, {"max_new_tokens": 16})
    runs = [
        write_run(tmp_path / f"run{i}", [dict(r, id=f"{r['id']}-{i}") for r in longbench_rows()], "longbench", c)
        for i, c in enumerate(ids)
    ]
    same = write_run(tmp_path / "run2", [dict(r, id=f"{r['id']}-2") for r in longbench_rows()], "longbench", ids[0])
    assert main(["scorecard", *map(str, [*runs, same]), "--output", str(tmp_path / "card")]) == 0
    headings = [
        line for line in (tmp_path / "card" / "scorecard.md").read_text().splitlines() if line.startswith("## ")
    ]
    assert headings[:2] == [f"## LongBench ({runs[0]}, {same})", f"## LongBench ({runs[1]})"]


def test_every_benchmark_report_records_its_commit_and_date(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from report import write_report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from evaluation.runs.record import git_commit

    returned = write_report(tmp_path / "a" / "r.json", {"x": 1})
    written = json.loads((tmp_path / "a" / "r.json").read_text())
    assert written == returned and written["x"] == 1
    assert written["commit"] == git_commit() and written["date"].startswith("20")
    bench = ROOT / "results" / "bench"
    before, earlier = git_commit(), bench / f"unfinished-{tmp_path.name}.json"
    earlier.write_text("{}\n")
    try:
        assert git_commit().endswith("-dirty"), "a report make bench wrote earlier is uncommitted"
        assert write_report(bench / f"unfinished-{tmp_path.name}-next.json", {"x": 2})["commit"] == before
    finally:
        earlier.unlink()
        (bench / f"unfinished-{tmp_path.name}-next.json").unlink(missing_ok=True)
    writers = []
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        source = script.read_text()
        if "results/bench" not in source and '"bench"' not in source:
            continue
        calls = [node.func for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
        names = {call.id for call in calls if isinstance(call, ast.Name)}
        methods = {call.attr for call in calls if isinstance(call, ast.Attribute)}
        assert "write_report" in names and "write_text" not in methods, f"{script.name} writes its report itself"
        writers.append(script.name)
    assert {"engine_memory.py", "grid.py", "likelihood.py", "memory.py", "protocols.py", "scoring.py"} <= set(writers)


def test_streamed_scorecards_set_rmm_against_its_random_weight_control(tmp_path):
    """Every benchmark where RMM runs declares section 8's contrasts: the committed reuse run with RMM's random-weight
    control, its scorecard rewritten from its rows, sets RMM against the control on both metrics at both budgets."""
    run = ROOT / "results" / "reuse" / "smollm2-135m-random"
    protocol, config = configured(run, json.loads((run / "run.json").read_text()), tmp_path)
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    protocol.write_scorecard(config, rows)
    lines = (tmp_path / "press_contrasts.csv").read_text().splitlines()
    cells = [
        f"{metric},overall,{budget} tokens,rmm,{RANDOM_CONTROL},"
        for metric in ("score", "answer NLL")
        for budget in (256, 512)
    ]
    assert all(any(line.startswith(cell) for line in lines) for cell in cells), lines[:3]
    assert "## Presses against baselines, paired" in (tmp_path / "scorecard.md").read_text()
