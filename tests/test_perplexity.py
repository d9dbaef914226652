"""The perplexity protocol: a streamed full cache is a plain forward, a budget at or above the length is the full
cache, TOVA's streamed kept set is the multi-state RNN's, one forward per streamed token or chunk, and the protocol
runs, records its form and refuses what it cannot stream."""

from __future__ import annotations

import json
import re

import pytest
import torch
from kvpress import AdaKVPress, KnormPress
from transformers import DynamicCache

from evaluation.catalogue.resolved import resolve_press
from evaluation.cli.main import main
from evaluation.protocols.perplexity.batched import batchable, batched_nll
from evaluation.protocols.perplexity.stream import base_press, decoding_press, pieces, streamed_nll
from presses import RMMPress, TOVAPress
from tests.helpers import SHARED_DATA, tiny_model
from tests.test_longbench_protocol import model_dir  # noqa: F401

LENGTH = 40


def token_ids(batch: int = 2, length: int = LENGTH, tokens: int = 253) -> torch.Tensor:
    """Random ids from ``tokens`` distinct tokens (3 onwards: no special token)."""
    return torch.randint(3, 3 + tokens, (batch, length), generator=torch.Generator().manual_seed(1))


def streamed(model, ids, spec: str | None, budget: int = 0, chunk: int = 1) -> torch.Tensor:
    press = None if spec is None else decoding_press(base_press(resolve_press(spec), chunk)[0], budget)
    return streamed_nll(model, ids, press, chunk)


@pytest.mark.parametrize("chunk", [1, 7])
def test_the_streamed_full_cache_is_a_plain_forward(chunk):
    model, ids = tiny_model("llama", "sdpa"), token_ids()
    logits = model(input_ids=ids).logits[:, :-1].float()
    plain = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    nll = streamed(model, ids, None, chunk=chunk)
    assert nll.shape == (2, LENGTH - 1)
    torch.testing.assert_close(nll, plain, atol=1e-4, rtol=0)
    torch.testing.assert_close(nll.mean(1), plain.mean(1), atol=1e-4, rtol=0)


@pytest.mark.parametrize("spec", ["tova", "h2o", "rmm", "rmm(lag=8)", "streaming_llm", "knorm"])
def test_a_budget_at_or_above_the_length_is_the_full_cache(spec):
    model, ids = tiny_model("qwen2", "sdpa"), token_ids()
    full = streamed(model, ids, None)
    for budget in (LENGTH, LENGTH + 5):
        torch.testing.assert_close(streamed(model, ids, spec, budget), full, atol=1e-5, rtol=0)
    assert not torch.allclose(streamed(model, ids, spec, 12), full, atol=1e-3), "a smaller budget evicts"


class Counted:
    """``model.forward`` wrapped: the calls counted, each layer's cached keys kept after each."""

    def __init__(self, model) -> None:
        self.calls, self.keys, self.forward = 0, [], model.forward
        model.forward = self

    def __call__(self, *args, **kwargs):
        output = self.forward(*args, **kwargs)
        self.calls += 1
        self.keys.append([layer.keys.clone() for layer in kwargs["past_key_values"].layers])
        return output


@torch.no_grad()
def msrnn_tova(model, ids: torch.Tensor, budget: int) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """TOVA's multi-state RNN by hand from eager attention: after each token, each layer whose cache exceeds the
    budget drops the position the newest query's attention, averaged over all heads, gives least (never the newest
    itself; ties drop the lower position). Returns each step's cached keys and kept positions per layer."""
    cache, held, keys, kept = DynamicCache(), None, [], []
    for t in range(ids.shape[1]):
        out = model(
            input_ids=ids[:, t : t + 1], past_key_values=cache, position_ids=torch.tensor([[t]]), output_attentions=True
        )
        if held is None:
            held = [torch.zeros(ids.shape[0], 1, dtype=torch.long) for _ in cache.layers]
        else:
            held = [torch.cat([h, torch.full((ids.shape[0], 1), t)], 1) for h in held]
        for index, (layer, attention) in enumerate(zip(cache.layers, out.attentions, strict=True)):
            if layer.keys.shape[2] <= budget:
                continue
            scores = attention[:, :, -1].float().mean(1)[:, :-1]  # (batch, k_len - 1): the newest is never dropped
            drop = scores.argmin(-1)  # the first minimum: ties drop the lower position
            keep = torch.stack([torch.cat([torch.arange(d), torch.arange(d + 1, layer.keys.shape[2])]) for d in drop])
            gather = keep[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
            held[index] = held[index].gather(1, keep)
        keys.append([layer.keys.clone() for layer in cache.layers])
        kept.append([h.clone() for h in held])
    return keys, kept


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tovas_streamed_kept_set_is_the_multi_state_rnn(arch):
    model, ids, budget = tiny_model(arch, "eager"), token_ids(length=30), 6
    hand_keys, hand_kept = msrnn_tova(model, ids, budget)
    counted = Counted(model)
    press = decoding_press(TOVAPress(), budget)
    streamed_nll(model, ids, press, 1)
    assert counted.calls == 30
    for step, (ours, theirs) in enumerate(zip(counted.keys, hand_keys, strict=True)):
        for layer, (mine, hand) in enumerate(zip(ours, theirs, strict=True)):
            assert mine.shape[2] == min(step + 1, budget)
            torch.testing.assert_close(mine, hand, atol=1e-5, rtol=0, msg=f"step {step}, layer {layer}")
    assert any(not torch.equal(k[0], torch.arange(budget)) for k in hand_kept[-1]), "TOVA evicted some early token"
    assert all(int(k[:, -1].min()) == 29 for k in hand_kept[-1]), "the newest stays on its step"


@pytest.mark.parametrize("chunk", [1, 3])
def test_streaming_llm_streamed_keeps_its_sinks_and_the_newest_tokens_at_every_step(chunk):
    """StreamingLLM's rule by hand: after every forward the cache holds the 4 sinks and the newest tokens, in
    position order: the first layer's keys (which depend on a token and its position alone) are a plain full-cache
    stream's at those positions, and every layer holds the budget."""
    model, ids, budget = tiny_model("llama", "sdpa"), token_ids(length=30), 10
    counted = Counted(model)
    streamed_nll(model, ids, None, chunk)
    full = counted.keys[-1]
    counted.keys.clear()
    streamed(model, ids, "streaming_llm", budget, chunk)
    for (_, end), step in zip(pieces(30, chunk), counted.keys, strict=True):
        held = list(range(end)) if end <= budget else [0, 1, 2, 3, *range(end - budget + 4, end)]
        torch.testing.assert_close(step[0], full[0][:, :, held], atol=1e-5, rtol=0, msg=f"{end} tokens")
        assert all(layer.shape[2] == len(held) for layer in step)


@torch.no_grad()
def test_streamed_knorm_evicts_the_older_occurrence_of_a_repeated_tokens_equal_layer_0_norms():
    """KNorm's rule by hand at layer 0, whose key norms are the tokens' own (the rotary embedding only rotates a
    key): after every step each KV head holds the budget's smallest norms, a repeated token's occurrences tie and the
    older goes first. Float32 rounds the rotated keys' norms up to an ulp apart; they still tie."""
    model, budget = tiny_model("llama", "sdpa"), 8
    ids = token_ids(length=30, tokens=4)  # each token repeated
    layer = model.model.layers[0]
    tokens = torch.arange(7)
    unrotated = layer.self_attn.k_proj(layer.input_layernorm(model.get_input_embeddings()(tokens)))
    norms = unrotated.view(7, 2, -1).norm(dim=-1).double()  # (token, KV head)
    assert (norms[3:, None] - norms[None, 3:]).abs().add(torch.eye(4)[..., None]).min() > 1e-3, "tokens apart"
    counted = Counted(model)
    streamed_nll(model, ids, None, 1)
    full = counted.keys[-1][0]
    counted.keys.clear()
    streamed(model, ids, "knorm", budget)
    for row, head in [(row, head) for row in range(2) for head in range(2)]:
        held = []
        for position, step in enumerate(counted.keys):
            held.append(position)
            if len(held) > budget:  # the largest norm goes; of equal ones, the older
                held.remove(max(held, key=lambda p: (norms[ids[row, p], head], -p)))
            torch.testing.assert_close(step[0][row, head], full[row, head, held], atol=1e-6, rtol=0)


@pytest.mark.parametrize(("spec", "chunk"), [("tova", 1), ("rmm(lag=4)", 1), ("h2o", 5), ("snapkv(window_size=4)", 6)])
def test_one_forward_per_streamed_token_or_chunk(spec, chunk):
    model, ids = tiny_model("llama", "sdpa"), token_ids(batch=3)
    counted = Counted(model)
    streamed(model, ids, spec, 10, chunk)
    assert counted.calls == len(pieces(LENGTH, chunk)) == 1 + (LENGTH - 1) // chunk
    assert all(layer.shape[2] <= 10 for step in counted.keys[1:] for layer in step), "held at the budget"


def test_window_presses_and_decoding_presses_are_refused_by_name():
    with pytest.raises(Exception, match=r"'snapkv' scores from its 64 newest queries.*--chunk 65"):
        base_press(resolve_press("snapkv"), 1)
    with pytest.raises(Exception, match=r"'decoding_knorm'.*DecodingPress around it"):
        base_press(resolve_press("decoding_knorm"), 1)
    assert base_press(resolve_press("h2o"), 1)[1] == "rmm(correctness='uniform')"
    assert base_press(resolve_press("snapkv"), 65)[1] == ""
    assert pieces(10, 4) == [(0, 1), (1, 5), (5, 10)] and pieces(9, 4) == [(0, 1), (1, 5), (5, 9)]


def test_the_protocol_runs_resumes_and_refuses(model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("evaluation.runs.progress.EVERY", 0.0)  # a line at every step of every bar
    own = tmp_path / "mine.txt"
    own.write_text("a text of my own, long enough to stream through the tiny model. " * 4)
    output = tmp_path / "ppl"
    argv = ["perplexity", "--model", str(model_dir), "--texts", "multi_news:0", "locomo:conv-26"]
    argv += ["--text-file", str(own), "--length", "48", "--budgets", "16", "64", "--data", str(SHARED_DATA)]
    argv += ["--presses", "full", "tova", "h2o", "rmm(lag=16)", "--output", str(output)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * (1 + 3 * 2)
    full = {r["text"]: r["nll"] for r in rows if r["press"] == "full"}
    assert set(full) == {"multi_news:0", "locomo:conv-26", "file:mine.txt"}
    for row in rows:
        if row["press"] == "rmm(lag=16)" and row["budget"] == "tokens=16":
            assert row["score"] is None and "lag" in row["error"]
            continue
        assert row["tokens"] == 48 and row["form"] == "exact" and len(row["nll_by_position"]) == 2
        if row["budget"] == "tokens=64":
            assert row["budget_label"].startswith("64 tokens (>=") and abs(row["nll"] - full[row["text"]]) < 1e-5
    assert {r["streamed_as"] for r in rows if r["press"] == "h2o"} == {"rmm(correctness='uniform')"}
    assert {r["path"] for r in rows if r["press"] != "full" and not r.get("error")} == {"batched"}
    assert {r["path"] for r in rows if r["press"] == "full"} == {"per-cell"}, "the full cache streams once, alone"
    record = json.loads((output / "run.json").read_text())
    assert record["config"]["form"] == "exact" and record["config"]["chunk"] == 1
    assert record["config"]["path"] == "batched"
    card = (output / "scorecard.md").read_text()
    assert "## Perplexity" in card and "ratio to the full cache" in card
    assert (output / "nll_by_position.png").stat().st_size > 0
    log = (output / "progress.log").read_text()
    streaming = r"\d presses @ tokens=16: streaming 3 texts: 47/48 forwards, \d+ s, about \d+ s left"
    assert re.search(streaming, log), "progress inside a stream"
    assert main(argv) == 0, "a finished run reruns nothing"
    assert json.loads((output / "run.json").read_text())["sessions"][1]["units_run"] == 0

    capsys.readouterr()
    short = [*argv[:-1], str(tmp_path / "short"), "--length", "100000"]
    assert main(short) == 2
    assert "fewer than --length 100000" in capsys.readouterr().err
    window = [*argv[:-1], str(tmp_path / "snap"), "--presses", "snapkv"]
    assert main(window) == 2
    assert "--chunk 65" in capsys.readouterr().err


def cell_by_cell_and_batched(model, ids, specs: list[str], budget: int, chunk: int):
    """Each press's NLLs streamed cell by cell (KVPress's ``DecodingPress`` alone, the reference) and in one batch of
    them all (``batched_nll``), from fresh presses."""
    reference = [streamed(model, ids, spec, budget, chunk) for spec in specs]
    presses = [decoding_press(base_press(resolve_press(spec), chunk)[0], budget) for spec in specs]
    return reference, batched_nll(model, ids, presses, chunk)


STREAMED = ["streaming_llm", "tova", "h2o", "rmm", "rmm(lag=4)", "rmm(correctness='random')", "knorm"]


@pytest.mark.parametrize(("arch", "chunk", "tokens"), [("llama", 1, 253), ("qwen2", 5, 253), ("qwen2", 1, 4)])
def test_streaming_batched_across_presses_equals_cell_by_cell(arch, chunk, tokens):
    """Every press the protocol streams (H2O as RMM with uniform weights, RMM teacher-forced with its smoother, a
    window press in chunks longer than its window), each evicting its own rows of one batch, gives each text the
    NLLs its cell streamed alone gives (float32, 1e-5); texts of 4 tokens repeat them, whose layer-0 key norms the
    batch of 12 rows and the cell of 2 round apart differently (KNorm's ties)."""
    model, ids, budget = tiny_model(arch, "sdpa"), token_ids(length=26, tokens=tokens), 8
    specs = STREAMED + (["snapkv(window_size=4)"] if chunk > 4 else [])
    reference, batched = cell_by_cell_and_batched(model, ids, specs, budget, chunk)
    for spec, alone, together in zip(specs, reference, batched, strict=True):
        assert together.shape == alone.shape == (2, 25)
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=0, msg=spec)
    full = streamed(model, ids, None, chunk=chunk)
    assert all(not torch.allclose(nll, full, atol=1e-3) for nll in batched), "every press evicts"
    by_spec = dict(zip(specs, batched, strict=True))
    assert not torch.allclose(by_spec["rmm"], by_spec["h2o"], atol=1e-4), "RMM's teacher-forced weights are its own"


def test_a_batched_stream_is_one_forward_per_token_for_every_press():
    model, ids, budget = tiny_model("llama", "sdpa"), token_ids(batch=3, length=20), 8
    presses = [decoding_press(base_press(resolve_press(spec), 1)[0], budget) for spec in ("tova", "rmm", "knorm")]
    counted = Counted(model)
    batched_nll(model, ids, presses, 1)
    assert counted.calls == 20
    assert all(
        layer.shape[:3] == (9, 2, min(step + 1, budget)) for step, keys in enumerate(counted.keys) for layer in keys
    )


def test_adakv_and_fused_rmm_stream_one_cell_at_a_time():
    assert batchable(decoding_press(TOVAPress(), 8)) and batchable(decoding_press(RMMPress(), 8))
    assert not batchable(decoding_press(AdaKVPress(KnormPress()), 8))
    assert not batchable(decoding_press(RMMPress(correctness="uniform", fused_attention=True), 8))


def test_cells_one_at_a_time_streams_each_cell_alone_with_the_same_nlls(model_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    argv = ["perplexity", "--model", str(model_dir), "--texts", "multi_news:0", "--length", "40", "--budgets", "12"]
    argv += ["--data", str(SHARED_DATA), "--presses", "tova", "rmm(lag=4)", "--output"]
    rows = {}
    for path, extra in (("batched", []), ("per-cell", ["--cells-one-at-a-time"])):
        assert main([*argv, str(tmp_path / path), *extra]) == 0
        lines = (tmp_path / path / "predictions.jsonl").read_text().splitlines()
        rows[path] = {row["press"]: row for row in map(json.loads, lines)}
        assert {row["path"] for row in rows[path].values()} == {path}
        assert json.loads((tmp_path / path / "run.json").read_text())["config"]["path"] == path
    for press, row in rows["batched"].items():
        assert row["nll"] == pytest.approx(rows["per-cell"][press]["nll"], abs=1e-5)
        assert row["nll_by_position"] == pytest.approx(rows["per-cell"][press]["nll_by_position"], abs=1e-5)
