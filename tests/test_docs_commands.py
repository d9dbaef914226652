def test_a_dry_run_says_where_a_real_run_writes_and_what_it_finds_there(capsys, monkeypatch):
    """The default folder is under scratch/; a committed folder is named with what a real run would do to it."""
    monkeypatch.chdir(ROOT)
    committed = ["--output", "results/longbench/smollm2-135m"]
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
    assert last[2].endswith(
        "holds a run of these settings: a real run adds its missing cells and rewrites its scorecard"
    )
