"""Bad input, round 3 (issue 48): a press spec imports nothing but presses, and an import path only with
``--allow-import`` (never in a dry run); each spec value is checked by the type its parameter declares; every field
of every data file is checked on load. Each refusal is one line (exit status 2), before any model loads. Then a
walk of the command line with a few hundred generated malformed specs, configs and data rows: a one-line error or
a correct run, never a traceback. Dry runs and parsers, no model, but for two short runs on a tiny one."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from kvpress import KnormPress

from evaluation.catalogue.resolved import make_press, resolve_press, resolve_presses
from evaluation.catalogue.specs import PressCall, canonical, plan_spec
from evaluation.cli.main import main
from evaluation.errors import EvaluationError
from evaluation.protocols.locomo.data import load_conversations
from evaluation.protocols.longbench.data import Example, TaskConfig, load_configs, load_task
from evaluation.protocols.streaming.episodes import Conversation
from tests.helpers import saved_chat_model, without_progress
from tests.test_bad_input import one_line_error
from tests.test_locomo_protocol import CONVERSATION
from tests.test_longbench_protocol import MAX_NEW_TOKENS, PROMPTS, write_task

MODULE = "round3_side_effect"  # a module whose import leaves a file beside it
ZEN = "Beautiful is better than ugly"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", context=4096)


@pytest.fixture
def data(tmp_path) -> Path:
    """A LongBench folder: hotpotqa (3 rows) and its configs."""
    folder = tmp_path / "longbench"
    (folder / "config").mkdir(parents=True)
    (folder / "config" / "dataset2prompt.json").write_text(json.dumps(PROMPTS))
    (folder / "config" / "dataset2maxlen.json").write_text(json.dumps(MAX_NEW_TOKENS))
    write_task(folder, "hotpotqa", 3, seed=0)
    return folder


@pytest.fixture
def imported(tmp_path, monkeypatch) -> Iterator[Path]:
    """The file ``MODULE`` leaves when it is imported: it holds a press (``Own``) and a class that is not one
    (``NotAPress``, which stops the test if it is ever constructed)."""
    (tmp_path / f"{MODULE}.py").write_text(
        "import pathlib\n"
        "pathlib.Path(__file__).with_suffix('.imported').touch()\n"
        "from kvpress import KnormPress\n\n\n"
        "class Own(KnormPress):\n"
        "    pass\n\n\n"
        "class NotAPress:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise SystemExit('NotAPress was constructed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / f"{MODULE}.imported"
    sys.modules.pop(MODULE, None)


def longbench_argv(data: Path, tmp_path: Path, *extra: str) -> list[str]:
    """A LongBench run of one example on a model that is not there: any error comes before the model loads."""
    argv = ["longbench", "--data", str(data), "--tasks", "hotpotqa", "--n", "1", "--ratios", "0.5"]
    return [*argv, "--model", str(tmp_path / "absent"), "--output", str(tmp_path / "run"), *extra]


# 2. A press spec names a press before anything is imported.


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_an_import_path_is_refused_without_allow_import_and_nothing_is_imported(
    imported, data, tmp_path, capsys, dry_run
):
    for spec, path in (
        (f"{MODULE}:Own", f"{MODULE}:Own"),
        (f"adakv({MODULE}:Own)", f"{MODULE}:Own"),
        ("this:Zen",) * 2,
    ):
        assert main(longbench_argv(data, tmp_path, "--presses", spec, *dry_run)) == 2
        assert f"names the import path {path}, which imports (runs) the module" in one_line_error(capsys)
    assert not imported.exists() and MODULE not in sys.modules
    assert ZEN not in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_a_dry_run_with_allow_import_names_what_a_real_run_imports_and_imports_nothing(
    imported, data, tmp_path, capsys
):
    argv = longbench_argv(data, tmp_path, "--presses", "full", f"{MODULE}:Own", "this:Zen", "--allow-import")
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{MODULE}:Own @ keep 50% (a real run imports {MODULE}:Own and checks it; a dry run imports nothing)" in out
    assert ZEN not in out and not imported.exists() and MODULE not in sys.modules
    spec = f"composed([adakv({MODULE}:Own, alpha_safeguard='high'), knorm])"  # the rest of the spec is checked
    assert main([*longbench_argv(data, tmp_path, "--presses", spec, "--allow-import"), "--dry-run"]) == 2
    assert "AdaKVPress's alpha_safeguard is a finite number, not 'high'" in one_line_error(capsys)
    assert not imported.exists()


def test_allow_import_imports_and_checks_the_class_before_it_is_built(imported):
    with pytest.raises(EvaluationError, match=f"{MODULE}:NotAPress is not a press"):
        resolve_presses([f"{MODULE}:NotAPress(1, a=2)"], allow_import=True)
    assert imported.exists()
    press = make_press(f"{MODULE}:Own(0.25)", allow_import=True)
    assert isinstance(press, KnormPress) and type(press).__name__ == "Own" and press.compression_ratio == 0.25
    assert resolve_press(f"{MODULE}:Own(0.25)", allow_import=True).label == f"{MODULE}:Own(0.25)"
    assert resolve_presses([f"{MODULE}:Own(0.25)"], allow_import=True, dry_run=True)[0].dry  # as a dry run says
    with pytest.raises(EvaluationError, match="pass --allow-import"):
        resolve_presses([f"{MODULE}:Own(0.25)"])  # resolved before, but this run does not allow it
    with pytest.raises(EvaluationError, match="pass --allow-import"):
        resolve_press(f"{MODULE}:Own(0.25)")  # resolved before, but never remembered: this call does not allow it


def test_allow_import_is_taken_from_the_command_line_only(imported, data, tmp_path, capsys):
    """Round 4 (issue 61): consent to run a module's code is never read from a file."""
    config = tmp_path / "run.yaml"
    config.write_text(f"presses: ['{MODULE}:Own']\n")
    argv = [*longbench_argv(data, tmp_path, "--config", str(config)), "--dry-run"]
    assert main(argv) == 2
    assert "pass --allow-import" in one_line_error(capsys)
    for key in ("allow_import", "allow-import"):
        config.write_text(f"presses: ['{MODULE}:Own']\n{key}: true\n")
        assert main(argv) == 2
        assert f"'{key}' is not taken from a file" in one_line_error(capsys)
        assert main([*argv, "--allow-import"]) == 2  # the file is refused, whatever the command line allows
        assert "is not taken from a file" in one_line_error(capsys)
    config.write_text(f"presses: ['{MODULE}:Own']\n")
    assert main([*argv, "--allow-import"]) == 0
    assert f"a real run imports {MODULE}:Own" in capsys.readouterr().out
    assert not imported.exists()


def test_a_run_with_allow_import_runs_the_press_it_imports(imported, data, chat_model, tmp_path, capsys):
    argv = ["longbench", "--data", str(data), "--tasks", "hotpotqa", "--n", "1", "--ratios", "0.5", "--presses"]
    argv += ["full", f"{MODULE}:Own", "--model", str(chat_model), "--output", str(tmp_path / "run")]
    assert main([*argv, "--allow-import"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert {row["press"] for row in rows} == {"full", f"{MODULE}:Own"} and imported.exists()
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["allow_import"] is True


# 4. Press-spec values are checked by the parameter's declared type before any work.


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("snapkv(window_size=1e999)", "'1e999' is not a finite number"),
        ("snapkv(window_size=-1e999)", "'-1e999' is not a finite number"),
        ("per_layer(knorm, compression_ratios=[0.5, 1e999])", "'1e999' is not a finite number"),
        ("snapkv(window_size={'a': 1e999})", "holds a value that is not a finite number"),
        ("snapkv(window_size=2.5)", "SnapKVPress's window_size is a whole number, not 2.5"),
        ("snapkv(window_size=True)", "SnapKVPress's window_size is a whole number, not True"),
        ("snapkv(window_size='8')", "SnapKVPress's window_size is a whole number, not '8'"),
        ("rmm(lag=4.0)", "RMMPress's lag is a whole number or None, not 4.0"),
        ("duo_attention(on_the_fly_scoring=1)", "DuoAttentionPress's on_the_fly_scoring is True or False, not 1"),
        ("kvzap(model_type='cnn')", "KVzapPress's model_type is one of 'linear', 'mlp', not 'cnn'"),
        ("per_layer(knorm, compression_ratios=[0.5, 'a'])", "compression_ratios is a list, each item a finite number"),
        ("snapkv(window_size=knorm)", "SnapKVPress's window_size is a whole number, not a KnormPress"),
        ("adakv(composed([knorm]))", "AdaKVPress's press is a press (ScorerPress), not a ComposedPress"),
        ("snapkv(window_size=4,window_size=8)", "snapkv is given window_size twice; give each parameter once"),
        ("snapkv(0.5, compression_ratio=0.25)", "SnapKVPress: multiple values for argument 'compression_ratio'"),
        ("composed([])", "ComposedPress wraps presses (presses) and is given none: give it at least one"),
        ("composed(())", "ComposedPress wraps presses (presses) and is given none: give it at least one"),
        ("prefill_decoding(decoding_press=None)", "PrefillDecodingPress wraps presses (prefilling_press, decoding_"),
        ("snapkv(window_size=8j)", "'8j' is not a literal value"),
        ("snapkv(window_size=b'8')", "is not a literal value: write a number"),
        ("snapkv(window_size={8})", "'{8}' is not a literal value"),
        ('rmm(correctness="uni form")', "RMMPress: correctness must be one of"),
    ],
)
def test_spec_values_are_checked_by_their_declared_types_in_a_dry_run_and_before_the_model(
    data, tmp_path, capsys, spec, message
):
    for dry_run in (["--dry-run"], []):
        assert main(longbench_argv(data, tmp_path, "--presses", spec, *dry_run)) == 2
        assert message in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_strings_keep_their_text_in_the_label_and_the_press():
    assert canonical('rmm( lag = 4 , correctness = "uni form" )') == "rmm(lag=4,correctness='uni form')"
    assert canonical("composed([ snapkv , knorm ])  ") == "composed([snapkv,knorm])"
    with pytest.raises(EvaluationError, match="got 'uni form'"):
        make_press(canonical('rmm(correctness="uni form")'))


def test_a_constructor_that_python_reads_is_checked_by_its_signature():
    """``CriticalKVPress`` is a dataclass whose own ``__init__`` takes other parameters than its fields."""
    press = make_press("critical(snapkv, epsilon=1e-3, first_stage_ratio=0.25)")
    assert press.epsilon == 1e-3 and press.first_stage_ratio == 0.25
    with pytest.raises(EvaluationError, match="CriticalKVPress's epsilon is a finite number, not 'small'"):
        make_press("critical(snapkv, epsilon='small')")


# 5. Every field of every data file is checked on load, in one line naming the file, the row and the field.


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("context", 5, "row 2: context must be a string, not a number (5)"),
        ("context", True, "row 2: context must be a string, not a boolean (true)"),
        ("input", ["a"], "row 2: input must be a string, not a list"),
        ("_id", 7, "row 2: _id must be a string, not a number (7)"),
        ("answers", ["a", 1], "row 2: answers must be a list of strings, not a list"),
        ("all_classes", "Location", "row 2: all_classes must be a list of strings or null, not a string"),
        ("all_classes", [1], "row 2: all_classes must be a list of strings or null, not a list"),
        ("length", "60", "row 2: length must be a whole number, not a string"),
        ("dataset", {"name": "hotpotqa"}, "row 2: dataset must be a string, not an object"),
    ],
)
def test_a_longbench_field_of_another_kind_is_refused(data, tmp_path, capsys, field, value, message):
    path = data / "hotpotqa.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1][field] = value
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main([*longbench_argv(data, tmp_path), "--dry-run"]) == 2  # the first row alone is asked for
    assert f"{path}: {message}" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{context.__class__} {input}", "has a field other than {context} and {input} ({context.__class__})"),
        ("{context} {0}", "({0})"),
        ("{context} {}", "({})"),
        ("{context!r} {input}", "({context!r})"),
        ("{context:>5} {input}", "({context:>5})"),
        ("{context[0]} {input}", "({context[0]})"),
        ("{context} {input", "is not a format string"),
        ("{input} only", "must hold {context} exactly once"),
        (5, "must be a string, not a number (5)"),
    ],
)
def test_a_prompt_template_holds_plain_named_fields_only(data, tmp_path, capsys, template, message):
    path = data / "config" / "dataset2prompt.json"
    path.write_text(json.dumps({"hotpotqa": PROMPTS["hotpotqa"], "other": template}))  # every entry is checked
    assert main([*longbench_argv(data, tmp_path), "--dry-run"]) == 2
    error = one_line_error(capsys)
    assert f"{path}: the other prompt template " in error and message in error


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("dataset2prompt.json", [], "an object of task names to values, not a list"),
        ("dataset2maxlen.json", {"hotpotqa": 6, "other": 0}, "the other answer length must be a whole number"),
        ("dataset2maxlen.json", {"hotpotqa": 6, "other": 6.0}, "tokens >= 1, not a number (6.0)"),
    ],
)
def test_a_longbench_config_entry_of_another_kind_is_refused(data, tmp_path, capsys, name, content, message):
    path = data / "config" / name
    path.write_text(json.dumps(content))
    assert main([*longbench_argv(data, tmp_path), "--dry-run"]) == 2
    error = one_line_error(capsys)
    assert f"{path}: " in error and message in error


def at(path: tuple, value: object) -> Callable[[dict], None]:
    """A change to a LoCoMo conversation: the value at ``path`` set (``...``: removed)."""

    def change(conversation: dict) -> None:
        *parents, last = path
        target = conversation
        for key in parents:
            target = target[key]
        if value is ...:
            del target[last]
        else:
            target[last] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (at(("sample_id",), 5), "sample_id must be a string, not a number (5)"),
        (at(("conversation",), "text"), "conv-test: conversation must be an object, not a string"),
        (at(("conversation", "speaker_a"), 5), "conv-test: conversation.speaker_a must be a string"),
        (at(("conversation", "session_1"), "hello"), "conv-test: conversation.session_1 must be a list of turns"),
        (at(("conversation", "session_2_date_time"), ...), "conversation.session_2_date_time must be a string, not"),
        (at(("conversation", "session_1", 0, "text"), 5), "conversation.session_1[0].text must be a string"),
        (at(("conversation", "session_1", 0, "speaker"), ["Ana"]), "session_1[0].speaker must be a string, not a"),
        (at(("conversation", "session_2", 1, "dia_id"), None), "session_2[1].dia_id must be a string, not null"),
        (at(("conversation", "session_1", 1, "blip_caption"), 5), "session_1[1].blip_caption must be a string"),
        (at(("qa",), []), "conv-test has no questions, so nothing to ask"),
        (at(("qa",), {"question": "?"}), "conv-test: qa must be a list of questions, not an object"),
        (at(("qa", 0), "What?"), "conv-test question 0 must be an object, not a string"),
        (at(("qa", 0, "question"), 5), "conv-test question 0: question must be a string, not a number (5)"),
        (at(("qa", 0, "category"), "4"), "conv-test question 0: category must be a whole number 1 to 5, not a"),
        (at(("qa", 0, "category"), 4.0), "category must be a whole number 1 to 5, not a number (4.0)"),
        (at(("qa", 0, "category"), True), "category must be a whole number 1 to 5, not a boolean (true)"),
        (at(("qa", 0, "category"), 0), "conv-test question 0 has category 0; LoCoMo's are 1 to 5"),
        (at(("qa", 0, "answer"), ["Miso"]), "conv-test question 0: answer must be a string or a number, not a"),
        (at(("qa", 0, "answer"), False), "answer must be a string or a number, not a boolean (false)"),
        (at(("qa", 2, "adversarial_answer"), 5), "question 2: adversarial_answer must be a string, not a number"),
        (at(("qa", 2, "adversarial_answer"), ...), "question 2 (category 5) has no answer to score against"),
        (at(("qa", 1, "evidence"), "D2:1"), "question 1: evidence must be a list of strings, not a string"),
    ],
)
def test_a_locomo_field_of_another_kind_is_refused(tmp_path, capsys, change, message):
    conversation = json.loads(json.dumps(CONVERSATION))
    change(conversation)
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([conversation]))
    argv = ["locomo", "--data", str(path), "--model", str(tmp_path / "absent"), "--output", str(tmp_path / "run")]
    assert main([*argv, "--dry-run"]) == 2
    error = one_line_error(capsys)
    assert f"{path}: conversation 0: " in error and message in error


def test_a_conversation_with_nothing_to_ask_stops_the_run_with_no_scorecard(chat_model, tmp_path, capsys):
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([{**CONVERSATION, "qa": []}]))
    output = tmp_path / "run"
    assert main(["locomo", "--data", str(path), "--model", str(chat_model), "--output", str(output)]) == 2
    assert "conv-test has no questions, so nothing to ask" in one_line_error(capsys)
    assert "scorecard" not in capsys.readouterr().out and not (output / "scorecard.md").exists()


def test_a_task_that_asks_nothing_is_an_error_not_an_exit_0(tmp_path, capsys):
    """The memory family only tells its first questions: asked one, a conversation answers nothing."""
    argv = ["memory", "--max-turns", "1", "--model", str(tmp_path / "absent"), "--output", str(tmp_path / "run")]
    assert main([*argv, "--dry-run"]) == 2
    assert "memory-0: this run asks it nothing" in one_line_error(capsys)


# 8. A walk of the command line with generated malformed specs, configs and rows.

SPECS = (
    "rmm(lag=64)",
    "adakv(snapkv(window_size=4))",
    "composed([snapkv, knorm])",
    "rmm(lag=4,correctness='uniform')",
    "per_layer(knorm, compression_ratios=[0.1, 0.2])",
    "kvzap(model_type='mlp')",
    "recent_window(h2o, window=16)",
    "decoding(knorm, compression_interval=2)",
)
SPEC_PIECES = (
    *"()[],=:'\". _-*\\{}0e",
    "1e999",
    "2.5",
    "True",
    "None",
    "[]",
    "()",
    "lambda: 1",
    "this:Zen",
    "os:system",
    "full",
    "knorm",
    "window_size=8",
    "window_size=",
    "**{}",
    "'a b'",
    "composed([])",
)
CONFIG = "presses: [full, snapkv, 'rmm(lag=4)']\nratios: [0.5]\nn: 1\ntasks: [hotpotqa]\npath: shared\n"
CONFIG_KEYS = ("presses", "ratios", "budgets", "n", "tasks", "path", "max_length", "query_aware", "dtype", "device")
CONFIG_KEYS += ("workers", "retries", "press_name", "compression_ratio", "nn", "config", "allow_import", "dry_run")
CONFIG_VALUES = ("-1", "0", "1e999", ".nan", ".inf", "[]", "{}", "null", "true", "'--dry-run'", "[--dry-run]")
CONFIG_VALUES += ("!!python/object/apply:os.system ['true']", "'rmm(lag=1e999)'", "'composed([])'", "x", "2.5")
CONFIG_VALUES += ("'this:Zen'", "&a [1]", "*a", "[[1]]", "{a: 1}", "[0.5, 0.5]", "'snapkv(window_size=2.5)'")
CONFIG_PIECES = (*":-[]{}'\"!&*#|>\n\t ,", "  ", "\n  - x", ": :")
JSON_VALUES = (None, 0, -1, 2.5, 1e308, True, False, "", "x", "{context}", [], ["a"], [1], [None], {}, {"a": 1})
TEMPLATES = ("{context}", "{context.__class__}", "{0}", "{}", "{context!r}", "{context:>3}", "{context[0]}", "{")
TEMPLATES += ("}", "{input}", "{context}{context}", "{ context }", "{context}{input}{other}")


def mutated(text: str, rng: random.Random, pieces: tuple[str, ...]) -> str:
    """``text`` with one to three random edits: a character deleted, a piece inserted, a stretch doubled."""
    for _ in range(rng.randint(1, 3)):
        start = rng.randrange(len(text) + 1)
        end = rng.randrange(start, len(text) + 1)
        edit = rng.randrange(3)
        if edit == 0:
            text = text[:start] + text[start + 1 :]
        elif edit == 1:
            text = text[:start] + rng.choice(pieces) + text[start:]
        else:
            text = text[:start] + text[start:end] * 2 + text[end:]
    return text


def paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside nested lists and objects."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [path for key, child in children for path in [(*prefix, key), *paths(child, (*prefix, key))]]


def changed_json(value: dict, rng: random.Random) -> dict:
    """A copy of ``value`` with one to three of its values, at any depth, replaced by others or removed."""
    copy = json.loads(json.dumps(value))
    for _ in range(rng.randint(1, 3)):
        *parents, last = rng.choice(paths(copy))
        target = copy
        for key in parents:
            target = target[key]
        if isinstance(target, dict) and rng.random() < 0.2:
            del target[last]
        else:
            target[last] = rng.choice(JSON_VALUES)
    return copy


def outcome(capsys, argv: list[str]) -> str:
    """What ``main(argv)`` did that it may not (empty when it exited 0, or 2 with one line on stderr that starts
    "error: ", or with argparse's own usage and error lines)."""
    try:
        code = main(argv)
    except (Exception, SystemExit) as error:  # anything out of main is a traceback on the command line
        capsys.readouterr()
        return f"{type(error).__name__}: {error}"
    err = without_progress(capsys.readouterr().err)
    lines = err.splitlines()
    if "Traceback" in err or code not in (0, 2):
        return f"exit {code}: {err[-300:]}"
    one_line = len(lines) == 1 and lines[0].startswith("error: ")
    usage = len(lines) > 1 and lines[0].startswith("usage:") and ": error: " in lines[-1]
    if code == 2 and not (one_line or usage):
        return f"exit 2 with {len(lines)} lines: {err[-300:]}"
    return ""


def parsed(parse: Callable[[], object], sound: Callable[[object], bool]) -> str:
    """What a parser did that it may not (empty when it refused in one line, or returned what is ``sound``)."""
    try:
        result = parse()
    except EvaluationError as error:
        return "" if "\n" not in str(error) else f"several lines: {error}"
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "" if sound(result) else f"accepted: {result!r}"[:300]


def texts(*values: object) -> bool:
    return all(isinstance(value, str) for value in values)


def sound_examples(examples: list[Example]) -> bool:
    """Examples whose every field is of its kind."""
    return all(
        texts(e.id, e.input, e.context, *e.answers)
        and e.answers
        and isinstance(e.answers, list)
        and (e.all_classes is None or (isinstance(e.all_classes, list) and texts(*e.all_classes)))
        for e in examples
    )


def sound_configs(configs: dict[str, TaskConfig]) -> bool:
    """Task configs whose template takes the plain fields only and whose answer length is a whole number."""
    return all(
        texts(c.prompt)
        and isinstance(c.prompt.format(context="", input=""), str)
        and type(c.max_new_tokens) is int
        and c.max_new_tokens >= 1
        for c in configs.values()
    )


def sound_conversations(conversations: list[Conversation]) -> bool:
    """Conversations whose every field is of its kind, with something to ask."""
    return all(
        texts(c.sample_id, c.speaker_a, c.speaker_b)
        and c.questions
        and all(texts(s.date, *(v for t in s.turns for v in (t.speaker, t.dia_id, t.text))) for s in c.sessions)
        and all(
            texts(q.question, *q.evidence)
            and type(q.category) is int
            and 1 <= q.category <= 5
            and (q.answer is not None or q.category == 5)
            and (q.answer is None or type(q.answer) in (str, int, float))
            and (q.adversarial_answer is None or texts(q.adversarial_answer))
            for q in c.questions
        )
        for c in conversations
    )


def test_generated_malformed_inputs_are_one_line_errors_or_correct_runs_never_tracebacks(data, tmp_path, capsys):
    rng = random.Random(48)
    absent = ["--model", str(tmp_path / "absent"), "--output", str(tmp_path / "run"), "--dry-run"]
    locomo_path = tmp_path / "locomo10.json"
    locomo_path.write_text(json.dumps([CONVERSATION]))
    longbench = ["longbench", "--data", str(data), "--tasks", "hotpotqa", "--n", "2", *absent]
    locomo = ["locomo", "--data", str(locomo_path), *absent]
    failures: dict[str, str] = {}
    cases = 0

    def check(case: str, problem: str) -> None:
        nonlocal cases
        cases += 1
        if problem:
            failures[case] = problem

    for i in range(160):
        spec = mutated(SPECS[i % len(SPECS)], rng, SPEC_PIECES)
        allow = ["--allow-import"] if i % 3 == 0 else []
        command = longbench if i % 2 else locomo
        check(f"spec {spec!r}", outcome(capsys, [*command, *allow, "--presses", spec]))
        check(f"plan_spec({spec!r})", parsed(partial(plan_spec, spec), lambda call: isinstance(call, PressCall)))
    config = tmp_path / "run.yaml"
    for _ in range(70):
        lines = CONFIG.splitlines()
        line = rng.randrange(len(lines))
        key, _, value = lines[line].partition(": ")
        edit = rng.randrange(4)
        if edit == 0:
            lines[line] = f"{key}: {rng.choice(CONFIG_VALUES)}"
        elif edit == 1:
            lines[line] = f"{rng.choice(CONFIG_KEYS)}: {value}"
        elif edit == 2:
            lines.insert(line, lines[line])
        text = "\n".join(lines) + "\n"
        text = mutated(text, rng, CONFIG_PIECES) if edit == 3 else text
        config.write_text(text)
        check(f"config {text!r}", outcome(capsys, [*longbench, "--config", str(config)]))
    rows = data / "hotpotqa.jsonl"
    valid = [json.loads(line) for line in rows.read_text().splitlines()]
    for _ in range(60):
        lines = [json.dumps(row) for row in valid[:1]]
        row = json.dumps(changed_json(valid[1], rng))
        lines.append(row if rng.random() < 0.8 else mutated(row, rng, tuple('{}[]",:\\ \x00\xff')))
        rows.write_text("\n".join(lines) + "\n")
        check(f"longbench row {lines[1]!r}", outcome(capsys, longbench))
        check(f"load_task on {lines[1]!r}", parsed(lambda: load_task(data, "hotpotqa"), sound_examples))
    rows.write_text("".join(json.dumps(row) + "\n" for row in valid))
    prompts, lengths = data / "config" / "dataset2prompt.json", data / "config" / "dataset2maxlen.json"
    for _ in range(40):
        template = rng.choice([rng.choice(TEMPLATES), mutated(PROMPTS["hotpotqa"], rng, tuple("{}!:.[]0 "))])
        prompts.write_text(json.dumps({**PROMPTS, "hotpotqa": template}))
        lengths.write_text(json.dumps({**MAX_NEW_TOKENS, "hotpotqa": rng.choice([6, *JSON_VALUES, 10**30])}))
        check(f"config files {template!r}", outcome(capsys, longbench))
        check(f"load_configs on {template!r}", parsed(lambda: load_configs(data, ["hotpotqa"]), sound_configs))
    for _ in range(80):
        conversation = changed_json(CONVERSATION, rng)
        locomo_path.write_text(json.dumps([conversation]))
        placement = ["--placement", rng.choice(["file", "evidence"])]
        check(f"locomo {conversation!r}", outcome(capsys, [*locomo, *placement, "--presses", "full", "knorm"]))
        check(
            f"load_conversations on {conversation!r}",
            parsed(lambda: load_conversations(locomo_path), sound_conversations),
        )
    assert cases >= 700
    assert not failures, f"{len(failures)} of {cases} cases: " + " | ".join(f"{k} -> {v}" for k, v in failures.items())
    assert ZEN not in capsys.readouterr().out
