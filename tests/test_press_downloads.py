"""Presses that fetch files when applied to a model: a dry run names what, a real run refuses one whose files do not
exist for the model before the model loads; DMSPress is refused with its reason."""

from __future__ import annotations

import kvpress as k
from kvpress.presses.duo_attention_press import PATTERNS_DICT

from evaluation.catalogue.downloads import fetched, missing
from evaluation.cli.main import main


def test_what_each_press_fetches_and_where_it_is_missing():
    duo = k.DuoAttentionPress()
    assert fetched(k.AdaKVPress(k.SnapKVPress())) == ()
    assert fetched(duo) == ("DuoAttention's head patterns for the model from github.com/mit-han-lab/duo-attention",)
    assert missing(duo, next(iter(PATTERNS_DICT))) == ""
    assert "use duo_attention(on_the_fly_scoring=True)" in missing(duo, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert missing(k.DuoAttentionPress(on_the_fly_scoring=True), "any/model") == ""
    assert fetched(k.ComposedPress([k.QFilterPress(), k.SnapKVPress()])) == (
        "the model's Q-filters from the hub (nthngdy/<model>_qfilt)",
    )


def test_a_dry_run_flags_a_press_that_fetches_and_a_real_run_refuses_it_before_the_model_loads(tmp_path, capsys):
    argv = ["longbench", "--presses", "duo_attention", "qfilter", "--n", "1", "--output", str(tmp_path / "out")]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "a real run first fetches: for qfilter, the model's Q-filters from the hub" in out
    assert "for duo_attention, DuoAttention's head patterns" in out and "a real run refuses it before the model" in out
    assert main([*argv, "--model", str(tmp_path / "no-such-model")]) == 2
    assert "press spec 'duo_attention' needs DuoAttention's head patterns" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dms_is_refused_with_its_reason_not_its_constructor_s(capsys):
    for spec in ("dms", "dms(press=knorm)"):
        assert main(["longbench", "--presses", spec, "--dry-run"]) == 2
        assert "DMSPress evicts by a score threshold, so no budget sets its size" in capsys.readouterr().err
