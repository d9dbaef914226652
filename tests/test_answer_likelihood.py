"""The gold answer's likelihood under every cell's cache (``answer_nll``, ``answer_tokens``): the full cache's equals
a plain forward of prompt + question + answer, a press's the same forward over its own prefill's cache, on both
LongBench paths and in the streamed protocols; computing it leaves every greedy prediction as it was."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from evaluation.catalogue.budgets import Budget, Cell, parse_budgets, ratio_for
from evaluation.catalogue.resolved import resolve_press
from evaluation.cli.main import main
from evaluation.engine.decoding import answer_ids_of
from evaluation.protocols.locomo.render import ABSTAIN
from evaluation.protocols.longbench.cells import case_of
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import TaskConfig, load_configs, load_task
from evaluation.protocols.probe.facts import gold_answer, probes
from evaluation.protocols.probe.prompt import prompt_ids
from evaluation.protocols.probe.protocol import ProbeConfig
from evaluation.protocols.probe.work import probe_rows
from evaluation.protocols.single_turn import cells
from evaluation.protocols.streaming import conversation as streamed
from evaluation.runs.models import ModelSettings
from tests.helpers import SHARED_DATA, byte_tokenizer, tiny_model
from tests.test_locomo_protocol import CONVERSATION
from tests.test_locomo_protocol import locomo as run_locomo
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)

MAX_LENGTH = 200  # prompt truncation: the prompts of the generated data are longer
DECODING = "decoding(knorm,compression_interval=3)"
PRESSES = ["full", "snapkv", "knorm", "tova", DECODING]
TOLERANCE = 1e-4


def longbench(model: Path, data: Path, output: Path, *extra: str) -> list[dict]:
    argv = ["longbench", "--model", str(model), "--data", str(data), "--tasks", "hotpotqa", "trec"]
    argv += ["--presses", *PRESSES, "--ratios", "0.5", "--n", "2", "--max-length", str(MAX_LENGTH)]
    assert main([*argv, "--output", str(output), *extra]) == 0
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def plain_nll(model, cache: DynamicCache | None, start: int, ids: list[int], answer: list[int], first=None) -> float:
    """The answer's mean NLL after ``ids`` (then ``answer``) appended to ``cache`` at ``start`` onwards, by a plain
    transformers forward; ``cache`` None: a forward of ``ids`` + ``answer`` alone. Without ``ids``, ``first`` (the
    prefill's last logits, (1, vocab)) predicts the answer's first token."""
    tokens = torch.tensor([ids + answer[:-1]], dtype=torch.long)
    positions = torch.arange(start, start + tokens.shape[1])[None]
    with torch.no_grad():
        logits = model(input_ids=tokens, past_key_values=cache, position_ids=positions).logits[0]
    predicting = logits[len(ids) - 1 :] if ids else torch.cat([first, logits])
    return torch.nn.functional.cross_entropy(predicting.float(), torch.tensor(answer)).item()


@torch.no_grad()
def own_prefill_nll(model, press_name: str, context: torch.Tensor, question: list[int], answer: list[int]) -> float:
    """KVPress's pipeline path: the context prefilled under the press, then the question and answer forced after it
    (token by token under a decoding press, which compresses as they arrive)."""
    length = context.shape[1]
    resolved = resolve_press(press_name)
    press = resolved.build(ratio_for(parse_budgets([0.5], None)[0], length), length)
    model.set_attn_implementation("eager" if resolved.reads_weights else "sdpa")
    cache = DynamicCache()
    if "decoding" in press_name:
        first = model(input_ids=context, past_key_values=cache).logits[0, -1:]
        position, predicted = length, [] if question else [first]
        with press(model):
            if question:
                positions = torch.arange(length, length + len(question))[None]
                logits = model(input_ids=torch.tensor([question]), past_key_values=cache, position_ids=positions)
                predicted.append(logits.logits[0, -1:])
                position += len(question)
            for token in answer[:-1]:
                logits = model(
                    input_ids=torch.tensor([[token]]), past_key_values=cache, position_ids=torch.tensor([[position]])
                ).logits
                predicted.append(logits[0, -1:])
                position += 1
        return torch.nn.functional.cross_entropy(torch.cat(predicted).float(), torch.tensor(answer)).item()
    with press(model):
        first = model(input_ids=context, past_key_values=cache).logits[0, -1:]
    return plain_nll(model, cache, length, question, answer, first)


@pytest.fixture
def reference(model_dir, data_dir):  # noqa: F811
    """Each example's prompt and gold answer ids, and the tiny model and its tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    configs = load_configs(data_dir, ["hotpotqa", "trec"])
    prompts = {}
    for task in ("hotpotqa", "trec"):
        for example in load_task(data_dir, task, 2):
            for aware in (False, True):
                case = case_of(example, configs[task], tokenizer, MAX_LENGTH, aware)
                prompts[task, example.id, aware] = (case.prompt, cells.gold_answer_ids(tokenizer, case))
    return model, tokenizer, prompts, configs


@pytest.mark.parametrize(("path", "aware"), [("shared", ()), ("per-cell", ()), ("shared", ("--query-aware",))])
def test_longbench_rows_hold_the_answer_likelihood_of_their_own_cache(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    reference,
    path,
    aware,
):
    rows = longbench(model_dir, data_dir, tmp_path / path, "--path", path, *aware)
    model, tokenizer, prompts, configs = reference
    assert len(rows) == 4 * len(PRESSES) and not any(row.get("error") for row in rows)
    for row in rows:
        prompt, answer = prompts[row["task"], row["id"], bool(aware)]
        assert row["question_tokens"] == prompt.question_ids.shape[1]
        assert list(row)[-2:] == ["answer_nll", "answer_tokens"], "appended after the existing keys"
        assert (
            row["answer_tokens"]
            == len(answer)
            == min(
                len(tokenizer.encode(row["answers"][0], add_special_tokens=False)), configs[row["task"]].max_new_tokens
            )
        )
        context, question = prompt.context_ids, prompt.question_ids[0].tolist()
        if row["press"] == "full":
            expected = plain_nll(model, None, 0, prompt.context_ids[0].tolist() + question, answer)
        else:
            expected = own_prefill_nll(model, row["press"], context, question, answer)
        assert row["answer_nll"] == pytest.approx(expected, abs=TOLERANCE), (row["press"], row["path"])
    by_press = {row["press"]: row["answer_nll"] for row in rows if row["task"] == "hotpotqa"}
    assert len(set(by_press.values())) > 1, "the caches differ, and so do their likelihoods"


def test_an_answer_cut_to_the_official_length_and_none_without_answers(model_dir):  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert answer_ids_of(tokenizer, "lantern river", 4) == tokenizer.encode("lant", add_special_tokens=False)
    assert answer_ids_of(tokenizer, None, 4) == [] and answer_ids_of(tokenizer, 2, 4) == tokenizer.encode(
        "2", add_special_tokens=False
    )


@pytest.mark.parametrize("path", ["shared", "per-cell"])
def test_longbench_predictions_are_the_same_without_the_likelihood(model_dir, data_dir, tmp_path, monkeypatch, path):  # noqa: F811
    forced = longbench(model_dir, data_dir, tmp_path / "forced", "--path", path)
    monkeypatch.setattr(cells, "gold_answer_ids", lambda tokenizer, case: [])
    plain = longbench(model_dir, data_dir, tmp_path / "plain", "--path", path)
    assert all(row["answer_nll"] is None and row["answer_tokens"] == 0 for row in plain)

    def key(row: dict) -> tuple:
        return row["task"], row["id"], row["press"], row["budget"]

    predictions = {key(row): (row["prediction"], row["generated_tokens"], row["score"]) for row in plain}
    assert {key(row): (row["prediction"], row["generated_tokens"], row["score"]) for row in forced} == predictions


@pytest.fixture
def locomo_model_dir(tmp_path_factory) -> Path:
    from tests.helpers import saved_chat_model

    return saved_chat_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", context=4096)


@pytest.fixture
def locomo_data(tmp_path) -> Path:
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([CONVERSATION]))
    return path


STREAMED = (
    "--presses",
    "full",
    "knorm",
    "tova",
    "tests.helpers:OwnPrefillKnorm",
    "decoding(knorm,compression_interval=2)",
    "adakv(snapkv(window_size=4))",  # keys masked in the batch
    "pyramidkv(window_size=4)",  # a length per layer
    "--allow-import",
)


def test_streamed_rows_hold_the_gold_answer_likelihood(locomo_model_dir, locomo_data, tmp_path, monkeypatch):
    asked: dict[int, tuple[list[int], list[int], list[int]]] = {}
    answer = streamed.ConversationRun.answer

    def spy(self, history, question_ids, question, cells, turn, visible):
        asked[question.index] = (list(history.token_ids), list(question_ids), self.answer_ids(question))
        return answer(self, history, question_ids, question, cells, turn, visible)

    monkeypatch.setattr(streamed.ConversationRun, "answer", spy)
    output = tmp_path / "run"
    assert run_locomo(locomo_model_dir, locomo_data, output, *STREAMED) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(locomo_model_dir, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(locomo_model_dir)
    golds = {0: "Miso", 1: "May 2023", 2: ABSTAIN, 3: "2"}  # the adversarial question: what it is scored against
    for row in rows:
        history, question, gold = asked[row["question_index"]]
        assert gold == tokenizer.encode(golds[row["question_index"]], add_special_tokens=False)[:4]
        assert row["answer_tokens"] == len(gold) and list(row)[-2:] == ["answer_nll", "answer_tokens"]
        if row["press"] == "full":
            expected = plain_nll(model, None, 0, history + question, gold)
            assert row["answer_nll"] == pytest.approx(expected, abs=TOLERANCE)
        assert row["answer_nll"] > 0
    nlls = {row["press"]: row["answer_nll"] for row in rows if row["question_index"] == 0}
    assert nlls["knorm"] == pytest.approx(nlls["tests.helpers:OwnPrefillKnorm"], abs=TOLERANCE), "own prefill = hook"


def test_streamed_predictions_are_the_same_without_the_likelihood(locomo_model_dir, locomo_data, tmp_path, monkeypatch):
    assert run_locomo(locomo_model_dir, locomo_data, tmp_path / "forced", *STREAMED) == 0
    monkeypatch.setattr(streamed.ConversationRun, "answer_ids", lambda self, question: [])
    assert run_locomo(locomo_model_dir, locomo_data, tmp_path / "plain", *STREAMED) == 0

    def predictions(output: Path) -> dict:
        rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
        return {(r["question_index"], r["press"], r["budget"]): (r["prediction"], r["score"]) for r in rows}

    assert predictions(tmp_path / "forced") == predictions(tmp_path / "plain")


@pytest.mark.parametrize("path", ["shared", "per-cell"])
def test_likelihood_only_scores_the_answer_without_generating(model_dir, data_dir, tmp_path, path, capsys):  # noqa: F811
    generated = longbench(model_dir, data_dir, tmp_path / "generated", "--path", path)
    only = longbench(model_dir, data_dir, tmp_path / "only", "--path", path, "--likelihood-only")

    def key(row: dict) -> tuple:
        return row["task"], row["id"], row["press"], row["budget"]

    expected = {key(row): row["answer_nll"] for row in generated}
    assert len(only) == len(generated)
    for row in only:
        assert "prediction" not in row and "generated_tokens" not in row
        assert row["score"] == row["answer_nll"] == pytest.approx(expected[key(row)], abs=1e-5)
        assert row["kept_tokens"] == next(g["kept_tokens"] for g in generated if key(g) == key(row))
    card = (tmp_path / "only" / "scorecard.md").read_text()
    assert "Likelihood only" in card and "Metric: answer NLL (nats per token; lower is better)." in card
    assert "Metric: score" not in card, "the NLL alone, never as a higher-is-better score"
    card = (tmp_path / "generated" / "scorecard.md").read_text()
    assert "## score" in card and "## answer NLL" in card and "### answer NLL" in card, "both metrics, each paired"
    argv = ["longbench", "--model", str(model_dir), "--data", str(data_dir), "--output", str(tmp_path / "only")]
    assert main([*argv, "--tasks", "hotpotqa", "--presses", "full", "--n", "1", "--path", path]) == 2
    assert "likelihood_only: stored True, asked False" in capsys.readouterr().err


def test_streamed_likelihood_only_scores_the_gold_answer_without_generating(
    locomo_model_dir, locomo_data, tmp_path, capsys
):
    assert run_locomo(locomo_model_dir, locomo_data, tmp_path / "generated", *STREAMED) == 0
    assert run_locomo(locomo_model_dir, locomo_data, tmp_path / "only", *STREAMED, "--likelihood-only") == 0

    def rows(output: Path) -> dict:
        lines = (output / "predictions.jsonl").read_text().splitlines()
        return {(r["question_index"], r["press"], r["budget"]): r for r in map(json.loads, lines)}

    generated, only = rows(tmp_path / "generated"), rows(tmp_path / "only")
    assert only.keys() == generated.keys()
    for key, row in only.items():
        assert "prediction" not in row and row["score"] == row["answer_nll"]
        assert row["answer_nll"] == pytest.approx(generated[key]["answer_nll"], abs=1e-5)
    card = (tmp_path / "only" / "scorecard.md").read_text()
    assert "Likelihood only" in card and "Metric: answer NLL (nats per token; lower is better)." in card
    assert "## answer NLL" in (tmp_path / "generated" / "scorecard.md").read_text()
    output = tmp_path / "model"
    assert run_locomo(locomo_model_dir, locomo_data, output, "--likelihood-only", "--history", "model") == 2
    assert "--likelihood-only generates no answers for the history" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_answer_likelihood_on_a_multi_news_prompt(smollm2, monkeypatch):
    """On SmolLM2 and a real prompt (1,024 tokens, the answer and the generation cut to 16 tokens): the full cache's
    likelihood equals a plain forward's, a press's on either path the same forward over its own prefill's cache, and
    the shared path's generations are those of a run without it."""
    model, tokenizer = smollm2("sdpa")
    shared_data = SHARED_DATA / "longbench"
    official = load_configs(shared_data, ["multi_news"])["multi_news"]
    task = TaskConfig(official.prompt, 16)
    example = load_task(shared_data, "multi_news", 1)[0]
    case = case_of(example, task, tokenizer, 1024, False)
    prompt = case.prompt
    half = Budget("ratio", 0.5)
    snapkv, tova = Cell(resolve_press("snapkv"), half), Cell(resolve_press("tova"), half)
    config = LongBenchConfig(
        model=ModelSettings(), tasks=["multi_news"], presses=["snapkv", "tova"], budgets=[half], n=1, output=Path("-")
    )
    shared = list(cells.run_cells(model, tokenizer, config, case, [Cell(resolve_press("full"), None), snapkv]))
    [per_cell] = cells.run_cells(model, tokenizer, replace(config, path="per-cell"), case, [tova])
    model.set_attn_implementation("sdpa")
    answer = cells.gold_answer_ids(tokenizer, case)
    context, question = prompt.context_ids, prompt.question_ids[0].tolist()
    assert all(row["answer_tokens"] == len(answer) == 16 for row in [*shared, per_cell])
    expected = plain_nll(model, None, 0, context[0].tolist() + question, answer)
    assert shared[0]["answer_nll"] == pytest.approx(expected, abs=TOLERANCE)
    for row in (shared[1], per_cell):
        expected = own_prefill_nll(model, row["press"], context, question, answer)
        model.set_attn_implementation("sdpa")
        assert row["answer_nll"] == pytest.approx(expected, abs=TOLERANCE), row["press"]
    assert shared[0]["answer_nll"] != shared[1]["answer_nll"]
    monkeypatch.setattr(cells, "gold_answer_ids", lambda tokenizer, case: [])
    plain = list(cells.run_cells(model, tokenizer, config, case, [Cell(resolve_press("full"), None), snapkv]))
    assert [row["prediction"] for row in plain] == [row["prediction"] for row in shared], "the same generations"


@pytest.mark.parametrize("reasoning", [True, False])
def test_a_probe_row_holds_its_gold_answer_likelihood(tmp_path, reasoning):
    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    probe = probes(5, 1)[0]
    config = ProbeConfig(
        model=ModelSettings(), seed=5, probes=1, reasoning=reasoning, output=tmp_path, max_new_tokens=40
    )
    rows = probe_rows((model, tokenizer), probe, config)
    ids, _ = prompt_ids(tokenizer, probe, reasoning)
    text = f"{probe.answer}." if not reasoning else gold_answer(probe, True)
    assert text.endswith(f"the answer is {probe.answer}.") or not reasoning
    gold = tokenizer.encode(text, add_special_tokens=False)[:40]
    expected = plain_nll(model, None, 0, ids, gold)
    for row in rows:
        assert list(row)[-2:] == ["answer_nll", "gold_answer_tokens"] and row["gold_answer_tokens"] == len(gold)
        assert row["answer_nll"] == pytest.approx(expected, abs=TOLERANCE)
    assert rows[0]["answer_tokens"] == 40, "the model's own answer, counted as before"
