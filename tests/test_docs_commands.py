"""Every protocol command the README and docs/*.md show runs as written on the shipped data, as a dry run: each
``python -m evaluation PROTOCOL ...`` line of a fenced code block (a line ending in a backslash joined with the
next) and each such inline code span, with ``--dry-run`` appended, exits 0 in this process (the offline default
model, the shared data found by the one rule). A span that names its arguments by placeholder (``FILE``, ``NAME``,
``...``, ``a | b``) is a synopsis, not a command; the reporting commands (``scorecard``, ``score``, ``reproduce``)
have no dry run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.protocols.shipped import protocols

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIX = "python -m evaluation "
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`(python -m evaluation [^`\n]*)`")
PLACEHOLDER = re.compile(r"\.\.\.|\||\[|\b[A-Z][A-Z_:\[\]]{2,}\b")


def fenced_commands(text: str) -> list[str]:
    """The lines of ``text``'s fenced code blocks that start with the harness's command, continuations joined."""
    lines = []
    for block in FENCED.findall(text):
        lines += [line.strip() for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    return [line for line in lines if line.startswith(PREFIX)]


def span_commands(text: str) -> list[str]:
    """The inline code spans of ``text`` outside fenced blocks that are whole commands, not synopses."""
    return [span for span in SPAN.findall(FENCED.sub("", text)) if not PLACEHOLDER.search(span)]


def documented() -> list[tuple[str, str]]:
    """(page, command) for every protocol command of the README and docs."""
    names = set(protocols())
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for command in dict.fromkeys(fenced_commands(text) + span_commands(text)):
            if shlex.split(command, comments=True)[3] in names:
                found.append((page.relative_to(ROOT).as_posix(), command))
    return found


def test_the_docs_show_commands_of_every_page_that_names_one():
    pages = {page for page, _ in documented()}
    assert {"README.md", "docs/ray.md", "docs/synthetic.md", "docs/eviction-lab.md"} <= pages
    assert any("configs/paper_table2.yaml" in command for _, command in documented())


@pytest.mark.parametrize(("page", "command"), documented(), ids=[command for _, command in documented()])
def test_a_documented_command_runs_as_written(page, command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # a command's paths (configs/...) are the checkout's
    status = main([*shlex.split(command, comments=True)[3:], "--dry-run"])
    out, err = capsys.readouterr()
    assert status == 0, f"{page}: {command}\n{err}"
    assert "output: " in out.splitlines()[-1]


def test_a_dry_run_says_where_a_real_run_writes_and_what_it_finds_there(capsys, monkeypatch):
    """The default folder is under scratch/; a committed folder (with --committed, as its make target passes it) is
    named with what a real run would do to it."""
    monkeypatch.chdir(ROOT)
    committed = ["--committed", "--output", "results/longbench/smollm2-135m"]
    grid = ["--n", "24", "--max-length", "2048", "--presses", "full", "snapkv", "h2o", "streaming_llm", "tova"]
    grid += ["rmm", "rmm(lag=64)"]
    last = []
    for argv in ([], committed, [*committed, *grid]):
        assert main(["longbench", *argv, "--dry-run"]) == 0
        last.append(capsys.readouterr().out.splitlines()[-1])
    assert last[0].startswith("output: scratch/longbench/smollm2-135m")
    assert last[1] == (
        "output: results/longbench/smollm2-135m holds a run with other settings (max_length): a real run is refused "
        "there; pass another --output"
    )
    assert last[2].endswith("of these settings: a real run adds its missing cells and rewrites its scorecard")


def committed_refusal(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --output "), lines
    return lines[0]


def test_an_output_under_results_needs_the_flag_only_the_committed_make_targets_pass(capsys, monkeypatch, tmp_path):
    """results/ is written by the Makefile's committed targets alone: any other command naming a folder there, by
    its path, a path from elsewhere or a link, is one line naming --committed, before anything is read or written;
    a --config file cannot pass the flag."""
    monkeypatch.chdir(ROOT)
    before = {path: path.stat().st_mtime_ns for path in (ROOT / "results").rglob("*")}
    (tmp_path / "link").symlink_to(ROOT / "results" / "longbench")
    outputs = ["results/longbench/smollm2-135m", "results/longbench/new", str(ROOT / "results"), "results/../results/x"]
    for output in [*outputs, str(tmp_path / "link" / "smollm2-135m")]:
        error = committed_refusal(["longbench", "--n", "1", "--output", output, "--dry-run"], capsys)
        assert "which only the Makefile's committed targets write (they pass --committed)" in error
    committed_refusal(["scorecard", "results/longbench/smollm2-135m", "--output", "results/scorecard/x"], capsys)
    config = tmp_path / "committed.yaml"
    config.write_text("committed: true\noutput: results/longbench/smollm2-135m\n")
    assert main(["longbench", "--config", str(config), "--dry-run"]) == 2
    assert "'committed' is not taken from a file" in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in (ROOT / "results").rglob("*")} == before
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    commands = [line for line in makefile.splitlines() if "-m evaluation " in line]
    writing = [line for line in commands if re.search(r"--output results/", line)]
    assert writing and all("--committed --output results/" in line for line in writing)
    assert all("--committed" not in line for line in commands if line not in writing)
