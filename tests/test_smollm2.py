"""On the offline SmolLM2-135M-Instruct and real multi_news texts: the tokenizer fixes, RMM's H2O control,
the TOVA seed's claims as measured on this model (cache and canonical trace), and the shared LongBench path
against the per-cell one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from kvpress import DecodingPress, ObservedAttentionPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from evaluation.catalogue.budgets import Budget, press_cells, ratio_for
from evaluation.catalogue.resolved import make_press, resolve_presses
from evaluation.catalogue.specs import DEFAULT_PRESSES, FULL_CACHE
from evaluation.engine.decoding import decode, decode_batch, eos_ids
from evaluation.engine.history import History
from evaluation.protocols.longbench.data import load_configs, load_task
from evaluation.protocols.longbench.prompts import build_prompt
from evaluation.protocols.traces.policies import LayerTrace, default_policies
from evaluation.protocols.traces.record import load_or_record
from evaluation.protocols.traces.replay import recent_share, replay
from evaluation.protocols.traces.work import held_counts, per_layer
from evaluation.runs.models import SMOLLM2_ALIAS
from presses import RMMPress, TOVAPress
from presses.ordered_scorer_press import kept_indices
from tests.helpers import (
    NEAR_TIE,
    SHARED_DATA,
    first_difference,
    history_kept,
    implementation,
    kept_positions,
    positions_of,
    prefill,
    same_sets,
    top2_gap,
)

pytestmark = pytest.mark.slow
BUDGET = 256


def test_tokenizer_fixes(smollm2):
    model, tokenizer = smollm2()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 2 and model.generation_config.eos_token_id == 2
    assert len(tokenizer) == model.config.vocab_size == 49152, "no fill-in-the-middle tokens beyond the vocabulary"
    assert tokenizer.encode("Hello")[0] != tokenizer.bos_token_id, "no BOS prepended"
    assert tokenizer.encode("Hello") == tokenizer.encode("Hello", add_special_tokens=False)
    assert tokenizer.tokenize("in 2024") == ["in", "Ġ", "2", "0", "2", "4"], "digits are split one by one"
    assert tokenizer.tokenize("x  123") == ["x", "ĠĠ", "1", "2", "3"]
    assert tokenizer.model_max_length == 8192
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(tokenizer.encode("Paris, 1889 — déjà vu.")) == "Paris, 1889 — déjà vu."


def test_rmm_uniform_keeps_exactly_what_observed_attention_keeps(smollm2, real_text_ids):
    """The paper's control: every layer and KV head, eager (the weights read), sdpa (recomputed in chunks) and
    fused (summed while the chunked pass computes the attention; its keys then differ from sdpa's by rounding)."""
    eager, _ = smollm2("eager")
    sdpa, _ = smollm2("sdpa")
    h2o = kept_positions(eager, real_text_ids, ObservedAttentionPress(compression_ratio=0.75))
    assert same_sets(kept_positions(eager, real_text_ids, RMMPress(compression_ratio=0.75, correctness="uniform")), h2o)
    assert same_sets(kept_positions(sdpa, real_text_ids, RMMPress(compression_ratio=0.75, correctness="uniform")), h2o)
    fused = RMMPress(compression_ratio=0.75, correctness="uniform", fused_attention=True)
    assert same_sets(kept_positions(sdpa, real_text_ids, fused, atol=1e-3), h2o)


def held_per_layer(positions: list[torch.Tensor], length: int) -> tuple[list[int], list[int]]:
    """Per layer, how many of the 64 most recent and of the first 4 positions are held."""
    held = torch.zeros(len(positions), length, dtype=torch.bool)
    for layer, kept in enumerate(positions):
        held[layer, kept[0, 0]] = True
    recent, first = held_counts(held)
    return recent.int().tolist(), first.int().tolist()


def test_tova_prefill_at_budget_256_measured(smollm2, real_text_ids):
    """The seed claims that at budget 256 every layer holds the 64 most recent and the 4 first positions.

    On SmolLM2 with one prefill compression (the newest prompt token's attention decides), neither holds.
    """
    model, _ = smollm2()
    length = real_text_ids.shape[1]
    press = TOVAPress(compression_ratio=1 - (BUDGET + 0.5) / length)
    positions = kept_positions(model, real_text_ids, press)
    assert {p.shape[-1] for p in positions} == {BUDGET}
    recent, first = held_per_layer(positions, length)
    # fmt: off
    assert recent == [61, 59, 62, 54, 40, 52, 49, 40, 54, 63, 60, 55, 64, 60, 54,
                      63, 62, 62, 52, 62, 42, 55, 53, 44, 47, 63, 52, 53, 59, 55]
    assert first == [0, 1, 2, 3, 3, 2, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]
    # fmt: on


class PositionTrackingTOVA(TOVAPress):
    """TOVAPress that also records which original positions each layer holds (decoding, batch 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.held = {}

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        kept = kept_indices(scores, compute_n_kept(keys.shape[2], self.compression_ratio))[0, 0]
        held = torch.cat([self.held.get(module.layer_idx, torch.arange(BUDGET)), kwargs["position_ids"][0, -1:]])
        self.held[module.layer_idx] = held[kept]
        return super().compress(module, hidden_states, keys, values, attentions, kwargs)


def test_tova_as_a_multi_state_rnn_at_budget_256_measured(smollm2, real_text_ids):
    """TOVA's own setting: the text is read token by token and every step drops one of B + 1 states.

    Measured on SmolLM2: the 64 most recent positions are nearly all held (all 64 in 14 of 30 layers, at
    least 57 everywhere), but the 4 first positions are not (all 4 in one layer only).
    """
    model, _ = smollm2()
    length = real_text_ids.shape[1]
    tracker = PositionTrackingTOVA()
    cache = DynamicCache()
    with torch.no_grad():
        model.model(input_ids=real_text_ids[:, :BUDGET], past_key_values=cache)
        with DecodingPress(base_press=tracker, compression_interval=1, target_size=BUDGET)(model):
            for position in range(BUDGET, length):
                model.model(
                    input_ids=real_text_ids[:, position : position + 1],
                    past_key_values=cache,
                    position_ids=torch.tensor([[position]]),
                )
    assert {layer.keys.shape[2] for layer in cache.layers} == {BUDGET}
    recent, first = held_per_layer([held.view(1, 1, -1) for _, held in sorted(tracker.held.items())], length)
    # fmt: off
    assert recent == [64, 64, 63, 62, 61, 62, 61, 57, 64, 64, 64, 64, 64, 64, 61,
                      63, 64, 64, 64, 64, 63, 61, 62, 61, 60, 64, 64, 63, 63, 63]
    assert first == [0, 1, 2, 2, 3, 4, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 3, 1, 2, 1, 1, 1, 1, 1, 2, 3, 2, 3]
    # fmt: on


def test_readme_usage_snippet_runs_as_written():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    snippet = re.search(r"<!-- usage -->\s*```python\n(.*?)```", readme, re.DOTALL)
    assert snippet, "README.md has a python block right after <!-- usage -->"
    namespace: dict = {}
    exec(compile(snippet.group(1), "README.md", "exec"), namespace)
    assert isinstance(namespace["answer"], str) and namespace["answer"].strip()


def test_shared_path_equals_per_cell_path_on_three_multi_news_examples(smollm2):
    """The default LongBench grid on 3 real prompts (truncated to 512 tokens, 16 new tokens): the shared path's
    kept positions equal the per-cell path's for every press and budget, and its predictions are identical,
    or part only at a near-tie of the per-cell path (per-cell H2O runs eager attention, the shared path sdpa)."""
    sdpa, tokenizer = smollm2("sdpa")
    eager, _ = smollm2("eager")
    data_dir = SHARED_DATA / "longbench"
    task = load_configs(data_dir, ["multi_news"])["multi_news"]
    presses = [*DEFAULT_PRESSES[1:], "rmm(lag=16)"]
    budgets = [Budget("ratio", 0.5), Budget("ratio", 0.75)]
    cells = [
        (FULL_CACHE, None),
        *((cell.label, cell.budget) for cell in press_cells(resolve_presses(presses), budgets, "")),
    ]
    stop = eos_ids(sdpa)
    for example in load_task(data_dir, "multi_news", 3):
        prompt = build_prompt(example, task, tokenizer, 512, query_aware=False)
        context, length = prompt.context_ids, prompt.context_ids.shape[1]
        presses = [make_press(name, ratio_for(budget, length)) for name, budget in cells]
        history = History(sdpa, frozenset({"context"}), presses)
        history.extend(context[0].tolist(), "context")
        derived = [history.compress(press) for press in presses]
        shared = decode_batch(sdpa, derived, prompt.question_ids, length, 16, stop, None)
        full = prefill(sdpa, context)
        for (name, budget), press, tokens in zip(cells, presses, shared, strict=True):
            kept = history_kept(history, press)
            model = eager if implementation(name) == "eager" else sdpa
            reference = prefill(model, context, make_press(name, ratio_for(budget, length)))
            for layer, indices in enumerate(kept):
                expected = positions_of(full.layers[layer].keys, reference.layers[layer].keys, atol=1e-4)
                assert torch.equal(indices.sort(-1).values, expected.sort(-1).values), f"{name} {budget} {layer}"
            per_cell = decode(model, reference, prompt.question_ids, length, 16, stop)
            part = first_difference(per_cell, tokens)
            if part is not None:
                again = prefill(model, context, make_press(name, ratio_for(budget, length)))
                gap = top2_gap(model, again, prompt.question_ids[0].tolist() + per_cell[:part], length)
                assert gap < NEAR_TIE, f"{example.id} {name} {budget}: parts at token {part} with top-2 gap {gap}"


@pytest.fixture(scope="module")
def canonical_trace(smollm2):
    """The canonical trace: SmolLM2 reading the first 2,048 tokens of multi_news context 0, head-averaged rows
    (recorded once and cached, as ``make eval-traces`` does)."""
    trace = load_or_record(smollm2, SMOLLM2_ALIAS, "multi_news:0", 2048, False, SHARED_DATA)
    return trace, LayerTrace(torch.cat(trace.layers), trace.correct)


def test_tova_seed_claims_on_the_canonical_trace(canonical_trace):
    """The seed's claims against the project's one H2O (KVPress's ``ObservedAttentionPress``, a mean over rows,
    where the seed's H2O sums with a recent window of 32), measured on this trace and pinned: H2O recalls at
    least TOVA's heavy hitters at every budget (holds); TOVA retains at least H2O's attention mass only at 64 and
    128, by under 0.004, and less at 256 and 512 (the seed's margin of about 0.13 is not reproduced). At budget
    256 TOVA does not hold the 64 most recent positions in most layers, nor the first 4 in any."""
    trace, stacked = canonical_trace
    tova, h2o = default_policies()[:2]
    for budget in (64, 128, 256, 512):
        ours, theirs = replay(stacked, tova, budget), replay(stacked, h2o, budget)
        margin = float(ours.retained_mass.mean() - theirs.retained_mass.mean())
        assert (0 <= margin < 0.004) if budget <= 128 else margin < 0, budget
        assert theirs.heavy_hitter_recall.mean() >= ours.heavy_hitter_recall.mean(), budget
        if budget == 256:
            recent, first = held_counts(ours.held)
            # fmt: off
            assert recent.int().tolist() == [63, 64, 64, 62, 60, 61, 59, 56, 60, 64, 62, 62, 63, 64, 59,
                                             61, 61, 62, 63, 61, 59, 55, 60, 53, 52, 60, 58, 58, 56, 56]
            assert first.int().tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 2, 1, 1, 1]
            # fmt: on
    share = per_layer(recent_share(stacked), len(trace.layers))
    assert round(sum(share) / len(share), 3) == 0.373, "the mean share of attention on the 64 most recent positions"


def test_query_agnostic_prompts_are_the_query_aware_tokens_and_predict_as_generate(smollm2):
    """The prompt is tokenized once and split at a token boundary: context + question are exactly the query-aware
    tokens, and the full-cache query-agnostic prediction equals plain transformers ``generate()`` on them."""
    model, tokenizer = smollm2("sdpa")
    data_dir = SHARED_DATA / "longbench"
    task = load_configs(data_dir, ["multi_news"])["multi_news"]
    stop = eos_ids(model)
    for example in load_task(data_dir, "multi_news", 4):
        agnostic = build_prompt(example, task, tokenizer, 512, query_aware=False)
        aware = build_prompt(example, task, tokenizer, 512, query_aware=True)
        assert agnostic.question_ids.shape[1] > 0
        assert torch.cat([agnostic.context_ids, agnostic.question_ids], dim=1).tolist() == aware.context_ids.tolist()
        cache = prefill(model, agnostic.context_ids)
        ours = decode(model, cache, agnostic.question_ids, agnostic.context_ids.shape[1], 16, stop)
        with torch.no_grad():
            generated = model.generate(aware.context_ids, max_new_tokens=16, do_sample=False)
        reference = generated[0, aware.context_ids.shape[1] :].tolist()
        assert ours == [token for token in reference[: len(ours)]] and (len(ours) == 16 or reference[len(ours)] in stop)


def test_decoding_press_alone_keeps_the_sink_of_the_prompt_it_never_saw(smollm2, multi_news_contexts):
    """``DecodingPress(RMMPress(lag=4))`` in KVPress's pipeline, 96 greedy steps at a budget of 64: RMM replays the
    prompt the pipeline prefilled outside the press, so the attention sink (position 0) competes by its utility
    and stays in most (layer, KV head) slots."""
    from transformers import pipeline

    model, tokenizer = smollm2("sdpa")
    generator = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    context, question = multi_news_contexts[0][:1500], "\nQuestion: What is this about?\nAnswer:"
    cache = DynamicCache()
    press = DecodingPress(RMMPress(lag=4), compression_interval=1, target_size=64)
    generator(context, question=question, press=press, max_new_tokens=96, cache=cache)
    ids = generator.preprocess(context, questions=[question], answer_prefix="", max_context_length=8192)
    sink = prefill(model, ids["context_ids"][:, :1])
    held = sum(
        bool((cached.keys[0, head] - first.keys[0, head, 0]).abs().amax(-1).lt(1e-4).any())
        for cached, first in zip(cache.layers, sink.layers, strict=True)
        for head in range(cached.keys.shape[1])
    )
    assert cache.get_seq_length() == 64
    assert held > 45, f"the sink is held in {held} of 90 slots"


@pytest.mark.parametrize(
    ("task", "extra"),
    [
        ("locomo", ["--conversations", "conv-26", "--placement", "evidence", "--data", "LOCOMO"]),
        ("reuse", ["--episodes", "1"]),
        ("multiquery", ["--episodes", "1", "--lengths", "1024"]),
    ],
)
def test_kvpress_presses_stream_on_every_streamed_task(task, extra, tmp_path):
    """KNorm, ExpectedAttention, AdaKV(SnapKV) and PyramidKV, each served by its own hook on the shared history,
    answer two questions of each streamed task."""
    from evaluation.cli.main import main

    extra = [str(SHARED_DATA / "locomo" / "locomo10.json") if arg == "LOCOMO" else arg for arg in extra]
    presses = ["knorm", "expected_attention", "adakv(snapkv)", "pyramidkv"]
    output = tmp_path / task
    argv = [task, "--presses", *presses, "--budgets", "256", "--max-turns", "2", "--output", str(output), *extra]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * len(presses)
    assert {row["path"] for row in rows} == {"shared"}
    # the keys each layer and head may attend to, on average: PyramidKV's per-layer budgets round to within one
    assert all(abs(row["kept_tokens"] - min(256, row["history_tokens"])) <= 1 for row in rows)
    assert any(row["history_tokens"] > 256 for row in rows), "the presses evicted"


def test_bfloat16_recomputed_attention_keeps_what_float32_logits_of_the_same_tensors_keep(multi_news_contexts):
    """SmolLM2 in bf16: the chunked recomputation of H2O's sums (``RMMPress(correctness="uniform")``) keeps, in every
    layer and KV head, what the full float32 attention matrix keeps, computed here from the layer's own bf16 queries
    and keys."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    from evaluation.runs.models import load_model
    from presses.prefix import forward_capturing

    model, tokenizer = load_model(dtype="bfloat16")
    ids = tokenizer(multi_news_contexts[1], return_tensors="pt").input_ids[:, :512]
    cache = DynamicCache()
    with torch.no_grad():
        _, captured = forward_capturing(model, ids, cache, 0)
    n_kept = compute_n_kept(ids.shape[1], 0.5)
    kept = kept_positions(model, ids, RMMPress(compression_ratio=0.5, correctness="uniform"))
    for index, layer in enumerate(model.model.layers):
        attention, (hidden, (cos, sin)) = layer.self_attn, captured[index]
        queries = attention.q_proj(hidden).view(1, ids.shape[1], -1, attention.head_dim).transpose(1, 2)
        queries, _ = apply_rotary_pos_emb(queries, queries, cos, sin)
        keys = repeat_kv(cache.layers[index].keys, attention.num_key_value_groups)
        assert queries.dtype == keys.dtype == torch.bfloat16
        logits = queries.float() @ keys.float().transpose(2, 3) * attention.scaling
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
        scores = probs.sum(2) / torch.arange(ids.shape[1], 0, -1)
        scores = scores.view(1, cache.layers[index].keys.shape[1], -1, ids.shape[1]).mean(2)
        expected = kept_indices(scores, n_kept, keep_older=True)
        assert torch.equal(kept[index].sort(-1).values, expected), f"layer {index}"
