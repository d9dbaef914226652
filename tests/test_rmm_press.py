from __future__ import annotations

import pytest
import torch
from kvpress import ComposedPress, ObservedAttentionPress, PerLayerCompressionPress
from kvpress.utils import compute_n_kept

from presses import RMMPress
from presses.attention import attention_column_sums
from tests.helpers import kept_positions, prefill, same_sets, tiny_model


def reference_scores(model, input_ids, weights: torch.Tensor, lag: int | None) -> list[torch.Tensor]:
    """Demonstrated utility straight from the definition, on the model's full eager attention matrices."""
    with torch.no_grad():
        attentions = model.model(input_ids=input_ids, output_attentions=True).attentions
    length = input_ids.shape[1]
    rows, cols = torch.arange(length)[:, None], torch.arange(length)[None, :]
    counts = (rows >= cols) & ((rows - cols <= lag) if lag is not None else True)
    per_layer = []
    for attention in attentions:
        weighted = attention[0] * weights[:, None] * counts  # (heads, rows, cols)
        score = weighted.sum(1) / counts.sum(0)  # (heads, cols)
        num_kv = model.config.num_key_value_heads
        per_layer.append(score.view(num_kv, -1, length).mean(1))
    return per_layer


def teacher_forced_weights(model, input_ids) -> torch.Tensor:
    """Row t weighs 1 when the full model's argmax at t is token t + 1; the last row weighs 1."""
    with torch.no_grad():
        predicted = model(input_ids=input_ids).logits.argmax(-1)[0]
    return torch.cat([(predicted[:-1] == input_ids[0, 1:]).float(), torch.ones(1)])


def test_uniform_without_lag_keeps_exactly_what_observed_attention_keeps(eager_model, token_ids):
    for ratio in (0.25, 0.5, 0.8):
        ours = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=ratio, correctness="uniform"))
        h2o = kept_positions(eager_model, token_ids, ObservedAttentionPress(compression_ratio=ratio))
        assert same_sets(ours, h2o), f"ratio {ratio}"


@pytest.mark.parametrize("lag", [None, 0, 5, 30])
def test_scores_follow_the_definition(eager_model, token_ids, lag):
    weights = teacher_forced_weights(eager_model, token_ids)
    assert 0 < weights.mean() < 1, "a random model is right on some tokens and wrong on others"
    n_kept = compute_n_kept(token_ids.shape[1], 0.5)
    kept = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=0.5, lag=lag))
    for positions, score in zip(kept, reference_scores(eager_model, token_ids, weights, lag), strict=True):
        if lag:
            score[:, -lag:] = float("inf")
        for head, head_score in enumerate(score.tolist()):
            # highest scores kept; among equal scores the higher position is kept (ties evict the lower)
            ranked = sorted(range(len(head_score)), key=lambda k, s=head_score: (s[k], k))
            assert positions[0, head].tolist() == sorted(ranked[-n_kept:])


def test_lag_keeps_the_provisional_buffer(sdpa_model, token_ids):
    length, lag = token_ids.shape[1], 20
    for positions in kept_positions(sdpa_model, token_ids, RMMPress(compression_ratio=0.7, lag=lag)):
        assert (positions[..., -lag:] == torch.arange(length - lag, length)).all()


def test_correctness_weighting_changes_what_is_kept(eager_model, token_ids):
    weighted = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=0.5))
    uniform = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=0.5, correctness="uniform"))
    assert not same_sets(weighted, uniform)


def test_single_pass_weights_equal_explicit_teacher_forced_weights(sdpa_model, token_ids):
    weights = teacher_forced_weights(sdpa_model, token_ids)
    deferred = kept_positions(sdpa_model, token_ids, RMMPress(compression_ratio=0.5))
    explicit = kept_positions(sdpa_model, token_ids, RMMPress(compression_ratio=0.5, correctness=weights))
    assert same_sets(deferred, explicit)


def test_pre_pass_inside_another_press_gives_the_same_weights(sdpa_model, token_ids):
    """Inside ComposedPress the deferral cannot apply; the pre-pass must reproduce the same kept set."""
    alone = kept_positions(sdpa_model, token_ids, RMMPress(compression_ratio=0.5))
    composed = kept_positions(sdpa_model, token_ids, ComposedPress([RMMPress(compression_ratio=0.5)]))
    assert same_sets(alone, composed)


@pytest.mark.parametrize("correctness", ["uniform", "teacher_forced"])
@pytest.mark.parametrize("lag", [None, 7])
def test_sdpa_chunked_sums_keep_the_same_set_as_eager(arch, token_ids, correctness, lag):
    press = RMMPress(compression_ratio=0.6, lag=lag, correctness=correctness, chunk_size=16)
    eager = kept_positions(tiny_model(arch, "eager"), token_ids, press)
    sdpa = kept_positions(tiny_model(arch, "sdpa"), token_ids, press)
    assert same_sets(eager, sdpa)


def test_chunked_sums_equal_eager_sums_within_1e_5(eager_model, token_ids):
    captured = {}

    def capture(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs, output[1])

    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in eager_model.model.layers]
    cache = prefill(eager_model, token_ids)
    for hook in hooks:
        hook.remove()
    weights = torch.rand(1, token_ids.shape[1], generator=torch.Generator().manual_seed(3))
    for layer_idx, (kwargs, attentions) in captured.items():
        module, keys = eager_model.model.layers[layer_idx].self_attn, cache.layers[layer_idx].keys
        for lag in (None, 9):
            eager = attention_column_sums(module, None, keys, attentions, kwargs, row_weights=weights, lag=lag)
            chunked = attention_column_sums(
                module,
                kwargs["hidden_states"],
                keys,
                None,
                kwargs,
                row_weights=weights,
                lag=lag,
                chunk_size=10,
            )
            torch.testing.assert_close(chunked, eager, atol=1e-5, rtol=0)


def test_no_state_leaks_between_samples(sdpa_model):
    generator = torch.Generator().manual_seed(5)
    first, second = (
        torch.randint(3, 256, (1, 80), generator=generator),
        torch.randint(3, 256, (1, 64), generator=generator),
    )
    reused = RMMPress(compression_ratio=0.5, lag=4)
    kept_positions(sdpa_model, first, reused)
    assert same_sets(
        kept_positions(sdpa_model, second, reused),
        kept_positions(sdpa_model, second, RMMPress(compression_ratio=0.5, lag=4)),
    )


def test_per_position_weights_must_cover_the_cache(sdpa_model, token_ids):
    press = RMMPress(compression_ratio=0.5, correctness=[1.0] * 10)
    with pytest.raises(ValueError, match="10 per-position weights but the cache holds 96"):
        prefill(sdpa_model, token_ids, press)


def test_teacher_forced_inside_per_layer_compression_says_what_to_do(sdpa_model, token_ids):
    press = PerLayerCompressionPress(RMMPress(), compression_ratios=[0.5, 0.5])
    with pytest.raises(RuntimeError, match="correctness='uniform'"):
        prefill(sdpa_model, token_ids, press)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lag": -1}, "lag must be None or an integer >= 0"),
        ({"lag": 2.5}, "lag must be None or an integer >= 0"),
        ({"correctness": "oracle"}, "correctness must be one of"),
        ({"correctness": [1.0, -0.5]}, "non-negative"),
        ({"correctness": [[[1.0]]]}, "shape"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"fused_attention": "yes"}, "fused_attention must be True or False"),
        ({"fused_attention": True}, "before teacher-forced weights exist"),
        ({"compression_ratio": 1.0}, "compression_ratio"),
    ],
)
def test_invalid_fields_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RMMPress(**kwargs)
