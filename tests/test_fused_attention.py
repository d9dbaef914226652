"""``fused_sdpa``: the attention output and its column sums from one chunked pass, against sdpa and the
definition, and ``RMMPress(fused_attention=True)`` against KVPress's ``ObservedAttentionPress``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from kvpress import ObservedAttentionPress
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import presses.following
from evaluation.engine.fused_rows import RowsRequest
from presses import RMMPress
from presses.column_sums import ColumnSumReader, ColumnSums
from presses.fused_attention import FUSED_SDPA, REQUEST, ColumnSumRequest, fused_sdpa
from tests.helpers import kept_positions, prefill, same_sets, tiny_model

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
FUSED_ATOL = 1e-5  # a fused prefill's keys differ from an sdpa prefill's by float rounding only


def attention_inputs(q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(1, HEADS, q_len, HEAD_DIM, generator=generator) * 2
    key = torch.randn(1, KV_HEADS, k_len, HEAD_DIM, generator=generator)
    value = torch.randn(1, KV_HEADS, k_len, HEAD_DIM, generator=generator)
    return query, key, value


def column_sums_by_definition(
    query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor | None, lag: int | None
) -> torch.Tensor:
    """sum over rows t of w(t) a(t -> k) from the full causal attention matrix; rows are the last q_len keys;
    with a lag, only Eq. 1's window t_k < t <= t_k + lag."""
    q_len, k_len = query.shape[2], key.shape[2]
    keys = key.repeat_interleave(HEADS // KV_HEADS, dim=1)
    rows = torch.arange(k_len - q_len, k_len)[:, None]
    distance = rows - torch.arange(k_len)[None, :]
    logits = (query @ keys.transpose(2, 3)) * HEAD_DIM**-0.5
    probs = logits.masked_fill(distance < 0, float("-inf")).softmax(-1)
    if lag is not None:
        probs = probs * ((distance > 0) & (distance <= lag))
    if weights is not None:
        probs = probs * weights[:, None, k_len - q_len :, None]
    return probs.sum(2)


@dataclass
class Reader:
    """A ``ColumnSumReader`` that keeps what it is handed, per layer."""

    statistic: ColumnSums
    handed: dict[int, torch.Tensor] = field(default_factory=dict)

    def hand_column_sums(self, layer_idx: int, sums: torch.Tensor | None) -> None:
        if sums is None:
            self.handed.pop(layer_idx, None)
        else:
            self.handed[layer_idx] = sums


def attention_module() -> nn.Module:
    module = nn.Module()
    module.is_causal = True
    module.num_key_value_groups = HEADS // KV_HEADS
    return module


def test_rmm_press_and_the_test_reader_take_handed_sums():
    assert isinstance(RMMPress(), ColumnSumReader) and isinstance(Reader(ColumnSums()), ColumnSumReader)


@pytest.mark.parametrize(("q_len", "k_len"), [(37, 37), (20, 45)])
@pytest.mark.parametrize("lag", [None, 6])
@pytest.mark.parametrize("weighted", [False, True])
def test_output_equals_sdpa_and_sums_follow_the_definition(q_len, k_len, lag, weighted):
    query, key, value = attention_inputs(q_len, k_len)
    weights = torch.rand(1, k_len, generator=torch.Generator().manual_seed(1)) if weighted else None
    module = attention_module()
    reader = Reader(ColumnSums(lag, "supplied" if weighted else "uniform"))
    setattr(module, REQUEST, ColumnSumRequest(reader, 3, weights, chunk_size=8))
    output, _ = fused_sdpa(module, query, key, value, None, scaling=HEAD_DIM**-0.5)
    mask = None if q_len == k_len else torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    expected, _ = sdpa_attention_forward(attention_module(), query, key, value, mask, scaling=HEAD_DIM**-0.5)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)
    sums = reader.handed[3]
    torch.testing.assert_close(sums, column_sums_by_definition(query, key, weights, lag), atol=1e-5, rtol=0)


@pytest.mark.parametrize("unpadded", [False, True])
def test_kept_rows_are_the_attention_under_the_mask_per_kv_head(unpadded):
    query, key, value = attention_inputs(20, 45)
    module = attention_module()
    request = RowsRequest(chunk_size=8, unpadded=unpadded)
    setattr(module, REQUEST, request)
    mask = torch.ones(20, 45, dtype=torch.bool).tril(25)[None, None]
    output, _ = fused_sdpa(module, query, key, value, mask, scaling=HEAD_DIM**-0.5)
    expected, _ = sdpa_attention_forward(attention_module(), query, key, value, mask, scaling=HEAD_DIM**-0.5)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)
    keys = key.repeat_interleave(HEADS // KV_HEADS, dim=1)
    probs = ((query @ keys.transpose(2, 3)) * HEAD_DIM**-0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    rows = torch.zeros(1, KV_HEADS, 20, 45)
    for first, chunk in request.chunks:
        rows[:, :, first : first + chunk.shape[2], : chunk.shape[-1]] = chunk
    torch.testing.assert_close(rows, probs.unflatten(1, (KV_HEADS, -1)).mean(2), atol=1e-6, rtol=0)


def test_what_it_cannot_sum_goes_to_sdpa_and_records_nothing():
    query, key, value = attention_inputs(12, 12)
    module = attention_module()
    reader = Reader(ColumnSums(), {0: torch.zeros(1, HEADS, 12)})
    setattr(module, REQUEST, ColumnSumRequest(reader, 0, None, chunk_size=4))
    padding = torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()
    output, _ = fused_sdpa(module, query, key, value, padding, scaling=0.25)
    expected, _ = sdpa_attention_forward(attention_module(), query, key, value, padding, scaling=0.25)
    assert torch.equal(output, expected)
    assert not reader.handed, "an earlier forward's sums must not survive one that could not fuse"


@pytest.mark.parametrize("ratio", [0.25, 0.6])
def test_fused_press_keeps_what_observed_attention_keeps(arch, token_ids, ratio):
    h2o = kept_positions(tiny_model(arch, "eager"), token_ids, ObservedAttentionPress(compression_ratio=ratio))
    press = RMMPress(compression_ratio=ratio, correctness="uniform", fused_attention=True, chunk_size=16)
    fused = kept_positions(tiny_model(arch, "sdpa"), token_ids, press, atol=FUSED_ATOL)
    assert same_sets(fused, h2o)


def test_fused_press_with_lag_and_weights_keeps_what_the_recomputing_press_keeps(sdpa_model, token_ids):
    weights = torch.rand(token_ids.shape[1], generator=torch.Generator().manual_seed(2))
    settings = {"compression_ratio": 0.5, "lag": 9, "correctness": weights, "chunk_size": 16}
    recomputed = kept_positions(sdpa_model, token_ids, RMMPress(**settings))
    fused = kept_positions(sdpa_model, token_ids, RMMPress(**settings, fused_attention=True), atol=FUSED_ATOL)
    assert same_sets(fused, recomputed)


def test_fused_press_scores_from_the_fused_sums_and_restores_the_model(sdpa_model, token_ids, monkeypatch):
    def no_recomputation(*args, **kwargs):
        raise AssertionError("the sums were recomputed instead of taken from fused_sdpa")

    monkeypatch.setattr(presses.following, "attention_rows", no_recomputation)
    seen = []
    hook = sdpa_model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(sdpa_model.config._attn_implementation)
    )
    press = RMMPress(compression_ratio=0.5, correctness="uniform", fused_attention=True)
    cache = prefill(sdpa_model, token_ids, press)
    hook.remove()
    assert seen == [FUSED_SDPA]
    assert cache.get_seq_length() == token_ids.shape[1] // 2
    assert sdpa_model.config._attn_implementation == "sdpa"
    assert not any(hasattr(layer.self_attn, REQUEST) for layer in sdpa_model.model.layers)
    assert not press._follower.handed, "every layer's sums were read, or taken back"


def test_fused_press_under_eager_reads_the_eager_weights(eager_model, token_ids):
    press = RMMPress(compression_ratio=0.5, correctness="uniform", fused_attention=True)
    h2o = ObservedAttentionPress(compression_ratio=0.5)
    assert same_sets(kept_positions(eager_model, token_ids, press), kept_positions(eager_model, token_ids, h2o))
    assert eager_model.config._attn_implementation == "eager"
