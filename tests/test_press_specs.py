"""A press spec names presses only: it runs no code but a press's constructor, and each mistake is one line."""

from __future__ import annotations

import pickle
import sys

import pytest
from kvpress import ComposedPress, KnormPress

from evaluation.catalogue.resolved import make_press, resolve_press, resolve_presses
from evaluation.catalogue.specs import MAX_DEPTH
from evaluation.errors import EvaluationError

CALLS: list[str] = []


class NotAPress:
    """A class a spec may name by import path, but must not construct."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        CALLS.append("NotAPress")


def not_a_class() -> None:
    CALLS.append("not_a_class")


def refused(spec: str) -> str:
    """The one-line message ``spec`` is refused with, its import paths allowed."""
    with pytest.raises(EvaluationError) as error:
        make_press(spec, allow_import=True)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_spec_that_names_a_function_calls_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = refused("os:system('touch${IFS}pwned')")
    assert "os:system is not a press (a subclass of KVPress's BasePress)" in message
    assert not (tmp_path / "pwned").exists()
    refused("tests.test_press_specs:not_a_class()")
    assert CALLS == []


@pytest.mark.parametrize("spec", ["collections:OrderedDict()", "tests.test_press_specs:NotAPress(1, a=2)"])
def test_a_class_that_is_not_a_press_is_refused_before_it_is_constructed(spec):
    assert "is not a press" in refused(spec)
    assert CALLS == []


def test_a_module_is_imported_only_after_the_whole_spec_is_checked(tmp_path, monkeypatch):
    (tmp_path / "side_effect.py").write_text("open(__file__ + '.imported', 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("side_effect:Press(**{'a': 1})", "knorm(compression_ratio=side_effect:Press.x)"):
        refused(spec)
    assert "side_effect" not in sys.modules and not (tmp_path / "side_effect.py.imported").exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("snapkv(**{'window_size': 8})", "'**{'window_size': 8}' is not allowed; write each parameter as name=value"),
        ("snapkv(*[0.5])", "'*[0.5]' is not allowed; write each argument"),
        ("os.system('ls')", "'os.system' is not a press name; call a press by its name, or by import path"),
        ("snapkv(window_size=__import__('os').getpid())", 'getpid" is not a press name'),
        ("snapkv(window_size=lambda: 8)", "'lambda: 8' is not a literal value"),
        ("composed([p for p in [knorm]])", "'[p for p in [knorm]]' is not a literal value"),
        ("snapkv(window_size=kvpress.x)", "'kvpress.x' is not a literal value"),
        ("snapkv(window_size=4*2)", "'4*2' is not a literal value"),
        ("snapkv(window_size={'a': knorm})", "is not a literal value"),
        ("snapkv(window_size=f'{knorm}')", "is not a literal value"),
        ("[knorm]", "expected a press name or call such as rmm(lag=64), got '[knorm]'"),
        ("0.5", "expected a press name or call"),
        ("snapkv(window_size=x)", "unknown press 'x'"),
        ("composed([no_press])", "no_press is the uncompressed cache, a spec on its own"),
        ("expected_attention(epsilon=0.1)", "expected_attention is KVPress's adakv(ExpectedAttentionPress(epsilon"),
        ("knorm(" * 600 + ")" * 600, "longer than 1000 characters"),
        ("tests.test_press_specs:Missing", "cannot import tests.test_press_specs:Missing"),
    ],
)
def test_anything_but_literals_and_presses_is_a_one_line_error(spec, message):
    assert message in refused(spec)


def test_specs_nest_at_most_max_depth_and_deeper_is_refused_before_any_name_is_looked_up():
    assert MAX_DEPTH == 8
    nested = "composed([composed([composed([knorm])])])"  # 7 deep: a press, a list, a press...
    assert type(make_press(nested).presses[0].presses[0].presses[0]) is KnormPress
    assert "presses nest more than 8 deep" in refused("composed([composed([composed([composed([knorm])])])])")
    assert "nest more than 8 deep" in refused("nosuch(" * 9 + ")" * 9)
    assert "values nest more than 8 deep" in refused("per_layer(knorm, compression_ratios=" + "[" * 8 + "]" * 8 + ")")


def test_literals_strings_and_import_paths_are_what_they_look_like():
    assert make_press("rmm(lag=4, correctness=[1.0, 0.5, 0])").correctness.tolist() == [[1.0, 0.5, 0.0]]
    assert "RMMPress: correctness must be one of" in refused("rmm(correctness='pkg.mod:Name')")  # a string
    composed = make_press("composed((kvpress:KnormPress(0.25), presses:TOVAPress))", allow_import=True)
    assert type(composed) is ComposedPress and composed.presses[0] == KnormPress(0.25)
    assert make_press("no_press") is None and make_press("full") is None


def test_resolve_presses_reports_a_press_no_budget_can_set_in_one_line():
    with pytest.raises(
        EvaluationError, match="DMSPress evicts by a score threshold, so no budget sets its size"
    ) as error:
        resolve_presses(["kvzap_mlp"])
    assert "\n" not in str(error.value)


def test_a_spec_resolves_to_a_value_and_each_cell_builds_a_fresh_press_from_it():
    resolved = resolve_press("rmm(lag=4, correctness='uniform')")
    again = resolve_press("rmm(lag=4, correctness='uniform')")
    assert again is not resolved and again == resolved, "resolved anew each time: nothing remembered per process"
    assert pickle.loads(pickle.dumps(resolved)) == resolved, "a value that travels to a worker as it is"
    assert resolved.label == "rmm(lag=4,correctness='uniform')" and resolved.describe().startswith("shared prefill")
    first, second = resolved.build(0.5, 100), resolved.build(0.25, 100)
    assert first is not second and (first.compression_ratio, second.compression_ratio) == (0.5, 0.25)
    assert resolved.commit_lag == 4 and resolved.budget_refusal(5) == ""
    refusal = "RMMPress(lag=4) never evicts its 4 newest positions, but the budget keeps only 4: use a lag below 4"
    assert refusal in resolved.budget_refusal(4)
    assert resolve_press("no_press").build(0.5) is None and resolve_press("full").describe() == "the full cache"
