"""RMMPress against the paper's equations (Eq. 1, section 5), hand-computed cases and references computed
here from the model's own eager attention, and against KVPress's ObservedAttentionPress (the H2O control)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from kvpress import (
    ComposedPress,
    DecodingPress,
    KnormPress,
    ObservedAttentionPress,
    PerLayerCompressionPress,
    SnapKVPress,
    StreamingLLMPress,
)
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import DynamicCache

from evaluation.catalogue.budgets import Budget
from presses import RMMPress, TOVAPress
from presses.teacher_forcing import top1_confidence, top1_predictions
from tests.helpers import (
    confidence_weights,
    confident_model,
    kept_positions,
    positions_of,
    prefill,
    same_sets,
    tiny_model,
)

STAND_IN = SimpleNamespace(layer_idx=0)

# A causal attention matrix written out by hand (row t: query t; one head), and per-row weights w(t).
ATTENTION = [
    [1.0, 0, 0, 0, 0, 0],
    [0.6, 0.4, 0, 0, 0, 0],
    [0.5, 0.2, 0.3, 0, 0, 0],
    [0.1, 0.6, 0.2, 0.1, 0, 0],
    [0.3, 0.1, 0.4, 0.1, 0.1, 0],
    [0.2, 0.2, 0.1, 0.3, 0.1, 0.1],
]
WEIGHTS = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
INF = float("inf")


def hand_scores(press: RMMPress) -> list[float]:
    """The press's score of the hand-written matrix, read as eager weights of one prefill."""
    length = len(ATTENTION)
    kwargs = {
        "hidden_states": torch.zeros(1, length, 1),
        "cache_position": torch.arange(length),
        "position_ids": torch.arange(length)[None],
    }
    keys = torch.zeros(1, 1, length, 1)
    attentions = torch.tensor(ATTENTION)[None, None]
    return press.score(STAND_IN, kwargs["hidden_states"], keys, keys, attentions, kwargs)[0, 0].tolist()


@pytest.mark.parametrize(
    ("lag", "expected"),
    [
        # H = 1: DU(k) = w(k+1) a(k+1 -> k); position 5 is the provisional buffer
        (1, [0 * 0.6, 1 * 0.2, 1 * 0.2, 0 * 0.1, 1 * 0.1, INF]),
        # H = 2: DU(k) = w(k+1) a(k+1 -> k) + w(k+2) a(k+2 -> k); positions 4 and 5 are provisional
        (2, [0 * 0.6 + 1 * 0.5, 1 * 0.2 + 1 * 0.6, 1 * 0.2 + 0 * 0.4, 0 * 0.1 + 1 * 0.3, INF, INF]),
        # H = 0: the window (t_k, t_k] is empty, every utility is 0 and nothing is provisional
        (0, [0.0] * 6),
        # lag None: the H2O sum over t >= k (diagonal included) divided by the rows counted
        (None, [1.8 / 6, (0.2 + 0.6 + 0.2) / 5, (0.3 + 0.2 + 0.1) / 4, 0.4 / 3, 0.1 / 2, 0.1 / 1]),
    ],
)
def test_eq1_window_on_a_hand_computed_attention_matrix(lag, expected):
    assert hand_scores(RMMPress(lag=lag, correctness=WEIGHTS)) == pytest.approx(expected)


@pytest.mark.parametrize(("lag", "n_kept", "kept"), [(1, 3, [1, 2, 5]), (2, 4, [0, 1, 4, 5]), (0, 2, [0, 1])])
def test_kept_set_is_the_buffer_plus_the_best_committed(lag, n_kept, kept):
    """K + H accounting: the H newest always, then the best n_kept - H by utility; a newcomer must outrank an
    incumbent, so at H = 0, where every utility is 0, the first positions stay."""
    press = RMMPress(compression_ratio=Budget("tokens", n_kept).compression_ratio(6), lag=lag, correctness=WEIGHTS)
    length = len(ATTENTION)
    kwargs = {"hidden_states": torch.zeros(1, length, 1), "cache_position": torch.arange(length)}
    keys = torch.arange(float(length)).view(1, 1, length, 1)
    attentions = torch.tensor(ATTENTION)[None, None]
    kept_keys, _ = press.compress(STAND_IN, kwargs["hidden_states"], keys, keys, attentions, kwargs)
    assert kept_keys.flatten().tolist() == kept


def eq1_reference(model, input_ids: torch.Tensor, weights: torch.Tensor, lag: int | None) -> list[torch.Tensor]:
    """Per layer, (num_kv_heads, length) scores from the model's full eager attention: Eq. 1 over (k, k + lag]
    with the buffer at +inf, or for lag None the weighted sum over t >= k divided by the rows counted."""
    with torch.no_grad():
        attentions = model.model(input_ids=input_ids, output_attentions=True).attentions
    length = input_ids.shape[1]
    rows, cols = torch.arange(length)[:, None], torch.arange(length)[None, :]
    window = rows >= cols if lag is None else (rows > cols) & (rows - cols <= lag)
    per_layer = []
    for attention in attentions:
        weighted = (attention[0].double() * weights.double()[:, None] * window).sum(1)  # (heads, cols)
        score = weighted.view(model.config.num_key_value_heads, -1, length).mean(1)
        if lag is None:
            score = score / window.sum(0)
        elif lag:
            score[:, length - lag :] = INF
        per_layer.append(score)
    return per_layer


def reference_kept(score: torch.Tensor, n_kept: int) -> list[list[int]]:
    """The n_kept highest per head in ascending order; a newcomer must outrank an incumbent (section 5), so ties
    keep the older position."""
    kept = []
    for head in score.tolist():
        ranked = sorted(range(len(head)), key=lambda k, s=head: (s[k], -k))
        kept.append(sorted(ranked[-n_kept:]))
    return kept


def teacher_forced_weights(model, input_ids) -> torch.Tensor:
    """Row t weighs 1 when the full model's argmax at t is token t + 1; the last row weighs 1."""
    with torch.no_grad():
        predicted = model(input_ids=input_ids).logits.argmax(-1)[0]
    return torch.cat([(predicted[:-1] == input_ids[0, 1:]).float(), torch.ones(1)])


@pytest.mark.parametrize("lag", [None, 0, 1, 2, 7])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_kept_sets_follow_eq1_on_tiny_models(arch, token_ids, lag, attn):
    eager = tiny_model(arch, "eager")
    weights = teacher_forced_weights(eager, token_ids)
    assert 0 < weights.mean() < 1, "a random model is right on some tokens and wrong on others"
    n_kept = compute_n_kept(token_ids.shape[1], 0.5)
    kept = kept_positions(tiny_model(arch, attn), token_ids, RMMPress(compression_ratio=0.5, lag=lag), atol=1e-5)
    for positions, score in zip(kept, eq1_reference(eager, token_ids, weights, lag), strict=True):
        assert positions[0].tolist() == reference_kept(score, n_kept)


def test_uniform_without_lag_keeps_exactly_what_observed_attention_keeps(eager_model, token_ids):
    for ratio in (0.25, 0.5, 0.8):
        ours = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=ratio, correctness="uniform"))
        h2o = kept_positions(eager_model, token_ids, ObservedAttentionPress(compression_ratio=ratio))
        assert same_sets(ours, h2o), f"ratio {ratio}"


def test_a_lag_that_does_not_fit_the_budget_is_refused(sdpa_model, token_ids):
    with pytest.raises(ValueError, match=r"RMMPress\(lag=20\) .* budget keeps only 9: use a lag below 9"):
        prefill(sdpa_model, token_ids, RMMPress(compression_ratio=0.9, lag=20))


def test_correctness_weighting_changes_what_is_kept(eager_model, token_ids):
    weighted = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=0.5))
    uniform = kept_positions(eager_model, token_ids, RMMPress(compression_ratio=0.5, correctness="uniform"))
    assert not same_sets(weighted, uniform)


def test_top1_confidence_is_the_argmax_and_its_float32_softmax_probability_from_one_chunked_pass(token_ids):
    model = confident_model("llama", "sdpa").to(torch.bfloat16)
    with torch.no_grad():
        hidden = model.model(input_ids=token_ids)[0]
        logits = model.lm_head(hidden)
    predicted, probabilities = top1_confidence(model.lm_head, hidden, chunk_size=7)
    assert torch.equal(predicted, top1_predictions(model.lm_head, hidden)) and probabilities.dtype == torch.float32
    torch.testing.assert_close(probabilities, logits.float().softmax(-1).amax(-1), rtol=1e-5, atol=1e-6)


def smoother_scores(model, ids: torch.Tensor, press: RMMPress) -> list[torch.Tensor]:
    """Per layer, the press's scores of every position after ``with press(model): model(ids)`` (ratio 0)."""
    with torch.no_grad(), press(model):
        model(input_ids=ids)
    return [press._follower.smoothers[layer].scores() for layer in range(len(model.model.layers))]


@pytest.mark.parametrize("lag", [None, 4])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_confidence_weighs_each_row_by_the_top1_probability_of_a_plain_forward(arch, token_ids, lag, attn):
    """w(t) is softmax(logits at t).max() in float32, the last row's too (no next token needed): the press's scores
    and kept sets equal those of the same weights supplied per position, alone and inside ``ComposedPress``, and
    differ from teacher forcing's and from 1 on the last row."""
    model = confident_model(arch, attn)
    weights = confidence_weights(model, token_ids)
    assert 0.05 < weights.min() < 0.5 < weights.max() < 1, "peaked logits: the probabilities spread"
    ours = smoother_scores(model, token_ids, RMMPress(lag=lag, correctness="confidence"))
    supplied = smoother_scores(model, token_ids, RMMPress(lag=lag, correctness=weights))
    for a, b in zip(ours, supplied, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    if lag is None:  # every row reaches every older position, the last row too
        last_one = weights.clone()
        last_one[0, -1] = 1.0
        other = smoother_scores(model, token_ids, RMMPress(lag=lag, correctness=last_one))
        assert not all(torch.allclose(a, b, rtol=1e-3) for a, b in zip(ours, other, strict=True))
    kept = kept_positions(model, token_ids, RMMPress(0.5, lag=lag, correctness="confidence"), atol=1e-5)
    assert same_sets(kept, kept_positions(model, token_ids, RMMPress(0.5, lag=lag, correctness=weights), atol=1e-5))
    composed = ComposedPress([RMMPress(0.5, lag=lag, correctness="confidence")])
    assert same_sets(kept, kept_positions(model, token_ids, composed, atol=1e-5))
    assert not same_sets(kept, kept_positions(model, token_ids, RMMPress(0.5, lag=lag), atol=1e-5))


def test_pre_pass_inside_another_press_gives_the_same_weights(sdpa_model, token_ids):
    """Inside ComposedPress the deferral cannot apply; the pre-pass must reproduce the same kept set."""
    alone = kept_positions(sdpa_model, token_ids, RMMPress(compression_ratio=0.5, lag=4))
    composed = kept_positions(sdpa_model, token_ids, ComposedPress([RMMPress(compression_ratio=0.5, lag=4)]))
    assert same_sets(alone, composed)


def test_bfloat16_ranks_in_float32(token_ids):
    """A bf16 model's attention summed and ranked in float32 (the reference) keeps what the press keeps."""
    model = tiny_model("llama", "eager").to(torch.bfloat16)
    for lag in (None, 4):
        press = RMMPress(compression_ratio=0.5, lag=lag, correctness="uniform", chunk_size=128)
        kept = kept_positions(model, token_ids, press)
        reference = eq1_reference(model, token_ids, torch.ones(token_ids.shape[1]), lag)
        for positions, score in zip(kept, reference, strict=True):
            assert positions[0].tolist() == reference_kept(score, compute_n_kept(token_ids.shape[1], 0.5))


def padded_batch_kept(
    model, long_ids: torch.Tensor, short_ids: torch.Tensor, press, generate_positions: bool = False
) -> list[torch.Tensor]:
    """Per layer, the positions the press keeps of a batch [long, short left-padded to the long length];
    ``generate_positions``: position ids as ``generate`` numbers them (each sequence from 0, padding at 1)."""
    pad = long_ids.shape[1] - short_ids.shape[1]
    ids = torch.cat([long_ids, torch.cat([torch.full((1, pad), 2), short_ids], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    positions = {"position_ids": (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)} if generate_positions else {}
    caches = []
    for active in (None, press):
        cache = DynamicCache()
        with torch.no_grad(), active(model) if active else torch.no_grad():
            model.model(input_ids=ids, attention_mask=mask, past_key_values=cache, **positions)
        caches.append(cache)
    full, compressed = caches
    return [positions_of(f.keys, c.keys, 1e-4) for f, c in zip(full.layers, compressed.layers, strict=True)]


@pytest.mark.parametrize("positions", [False, True], ids=["cache-positions", "generate-positions"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("make", [lambda r: RMMPress(r, lag=4), lambda r: RMMPress(r), lambda r: TOVAPress(r)])
def test_a_left_padded_batch_keeps_what_the_unpadded_single_runs_keep(attn, make, positions):
    model = tiny_model("llama", attn)
    generator = torch.Generator().manual_seed(6)
    long_ids, short_ids = (
        torch.randint(3, 256, (1, 96), generator=generator),
        torch.randint(3, 256, (1, 70), generator=generator),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # teacher forcing sees the token ids of a padded batch too
        batch = padded_batch_kept(model, long_ids, short_ids, make(0.5), positions)
    n_kept = compute_n_kept(96, 0.5)
    alone_long = kept_positions(model, long_ids, make(0.5), atol=1e-4)
    alone_short = kept_positions(model, short_ids, make(Budget("tokens", n_kept).compression_ratio(70)), atol=1e-4)
    for layer, positions in enumerate(batch):
        assert positions[0].sort(-1).values.tolist() == alone_long[layer][0].sort(-1).values.tolist()
        assert (positions[1] >= 26).all(), "every padding slot is evicted before any token"
        assert (positions[1] - 26).sort(-1).values.tolist() == alone_short[layer][0].sort(-1).values.tolist()


@pytest.mark.parametrize("make", [lambda: RMMPress(0.5, lag=4), lambda: RMMPress(0.5), lambda: TOVAPress(0.5)])
def test_sliding_window_layers_keep_the_same_sets_under_eager_and_sdpa(token_ids, make):
    window = {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}
    kept = [
        kept_positions(tiny_model("qwen2", attn, **window), token_ids, make(), atol=1e-5) for attn in ("eager", "sdpa")
    ]
    assert same_sets(*kept)


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize(
    "presses",
    [
        lambda: [TOVAPress(0.5), RMMPress(0.5, lag=4)],
        lambda: [RMMPress(0.5, lag=4), TOVAPress(0.5)],
        lambda: [SnapKVPress(0.3, window_size=8), RMMPress(0.5), KnormPress(0.2)],
        lambda: [RMMPress(0.4, correctness="uniform"), StreamingLLMPress(0.25)],
    ],
)
def test_composes_in_any_order_holds_the_budget_and_leaves_no_hook(sdpa_model, token_ids, presses):
    composed = ComposedPress(presses())
    cache = prefill(sdpa_model, token_ids, composed)
    expected = token_ids.shape[1]
    for press in composed.presses:
        expected = compute_n_kept(expected, press.compression_ratio)
    assert [layer.keys.shape[2] for layer in cache.layers] == [expected] * 2
    assert hook_count(sdpa_model) == 0


def test_composed_rmm_ranks_the_survivors_by_their_observed_utility(eager_model, token_ids):
    """After TOVA evicts, RMM keeps, of TOVA's survivors, the best by Eq. 1 over the prefill's attention."""
    first = kept_positions(eager_model, token_ids, TOVAPress(0.5))
    composed = kept_positions(eager_model, token_ids, ComposedPress([TOVAPress(0.5), RMMPress(0.5, lag=4)]))
    weights = teacher_forced_weights(eager_model, token_ids)
    n_kept = compute_n_kept(compute_n_kept(token_ids.shape[1], 0.5), 0.5)
    for survivors, kept, score in zip(first, composed, eq1_reference(eager_model, token_ids, weights, 4), strict=True):
        for head, head_score in enumerate(score):
            survivors_score = head_score[survivors[0, head]]
            expected = survivors[0, head][reference_kept(survivors_score[None], n_kept)[0]]
            assert kept[0, head].sort().values.tolist() == expected.tolist()


def test_uniform_weights_register_no_hook_even_without_a_forward(sdpa_model):
    for wrapper in (
        ComposedPress([RMMPress(0.5, correctness="uniform")]),
        DecodingPress(RMMPress(lag=2, correctness="uniform")),
    ):
        with wrapper(sdpa_model):
            pass
    assert hook_count(sdpa_model) == 0


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


def test_per_position_weights_must_cover_the_sequence(sdpa_model, token_ids):
    press = RMMPress(compression_ratio=0.5, correctness=[1.0] * 10)
    with pytest.raises(ValueError, match="10 per-position weights but the cache reaches position 95"):
        prefill(sdpa_model, token_ids, press)


def test_teacher_forced_where_the_model_is_hidden_warns_and_keeps_what_uniform_weights_keep(sdpa_model, token_ids):
    """PerLayerCompressionPress never shows its press the model: no token ids, so no teacher forcing."""
    hidden = PerLayerCompressionPress(RMMPress(lag=4), compression_ratios=[0.5, 0.5])
    uniform = PerLayerCompressionPress(RMMPress(lag=4, correctness="uniform"), compression_ratios=[0.5, 0.5])
    with pytest.warns(UserWarning, match="cannot see the token ids"):
        kept = kept_positions(sdpa_model, token_ids, hidden)
    assert same_sets(kept, kept_positions(sdpa_model, token_ids, uniform))


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
        ({"fused_attention": True}, "before the weights of correctness='teacher_forced' exist"),
        (
            {"fused_attention": True, "correctness": "confidence"},
            "before the weights of correctness='confidence' exist",
        ),
        ({"compression_ratio": 1.0}, "compression_ratio"),
    ],
)
def test_invalid_fields_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RMMPress(**kwargs)


def test_without_a_4d_mask_rows_honour_padding_and_sliding_windows_as_the_model_does():
    """flash_attention_2 hands the layer a 2-D padding mask (or none) and applies the sliding window itself: the
    recomputed rows then build both from the layer, and equal the eager weights of a sliding-window Qwen2 on a
    left-padded batch."""
    from presses.attention import attention_rows

    window = {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}
    model = tiny_model("qwen2", "eager", **window)
    ids = torch.randint(3, 256, (2, 48), generator=torch.Generator().manual_seed(8))
    padding = torch.ones_like(ids)
    padding[1, :10] = 0
    captured = {}

    def capture(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs, output[1])

    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in model.model.layers]
    with torch.no_grad():
        model.model(input_ids=ids, attention_mask=padding, past_key_values=DynamicCache(), use_cache=True)
    for hook in hooks:
        hook.remove()
    for index, layer in enumerate(model.model.layers):
        kwargs, eager = captured[index]
        keys = kwargs["past_key_values"].layers[index].keys
        flash_style = {**kwargs, "attention_mask": padding}  # what flash_attention_2 passes instead of a 4-D mask
        rows = attention_rows(layer.self_attn, kwargs["hidden_states"], keys, None, flash_style, chunk_size=16)
        pad = keys.shape[2]
        recomputed = torch.cat([nn.functional.pad(p, (0, pad - p.shape[-1])) for _, p in rows.chunks], dim=2)
        assert rows.valid is not None and not rows.valid[1, :10].any() and rows.valid[0].all()
        real = rows.valid[:, None, :, None]
        torch.testing.assert_close(recomputed * real, eager.float() * real, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "make",
    [lambda: TOVAPress(0.5), lambda: DecodingPress(RMMPress(), compression_interval=1, target_size=24)],
    ids=["tova", "decoding-rmm"],
)
def test_a_padded_flash_forward_over_a_compressed_cache_is_refused_before_it_runs(make):
    """Once the press has compressed a left-padded batch, a flash-attention forward whose 2-D mask spans every
    position so far cannot say which kept keys are padding: refused before any layer runs; the cache is untouched.
    A mask without padding, or one that lines up with the cache, passes."""

    from presses.flash_guard import check_flash_padding

    model = tiny_model("llama", "sdpa")
    ids = torch.randint(3, 256, (2, 32), generator=torch.Generator().manual_seed(5))
    padding = torch.ones_like(ids)
    padding[1, :4] = 0
    cache, step = DynamicCache(), torch.tensor([[7], [9]])
    ran = []
    hooks = [layer.register_forward_pre_hook(lambda *args: ran.append(1)) for layer in model.model.layers]
    try:
        model.config._attn_implementation = "flash_attention_2"  # as the press meets the model
        with torch.no_grad(), make()(model):
            model.config._attn_implementation = "sdpa"  # the forwards that compress run here on the CPU
            model(input_ids=ids, attention_mask=padding, past_key_values=cache)
            if cache.get_seq_length() == ids.shape[1]:  # a decoding press compresses on the next step
                padding = torch.cat([padding, torch.ones(2, 1, dtype=padding.dtype)], dim=1)
                model(input_ids=step, attention_mask=padding, past_key_values=cache)
            assert cache.get_seq_length() < padding.shape[1], "the press compressed the cache"
            length, ran[:] = cache.get_seq_length(), []
            model.config._attn_implementation = "flash_attention_2"
            padding = torch.cat([padding, torch.ones(2, 1, dtype=padding.dtype)], dim=1)
            with pytest.raises(ValueError, match="refused before the forward"):
                model(input_ids=step, attention_mask=padding, past_key_values=cache)
            assert not ran and cache.get_seq_length() == length
            check_flash_padding(model, (), {"input_ids": step, "attention_mask": torch.ones_like(padding)})
            aligned = torch.ones(2, length + 1, dtype=padding.dtype)
            aligned[1, 0] = 0
            check_flash_padding(model, (), {"input_ids": step, "attention_mask": aligned, "past_key_values": cache})
    finally:
        model.config._attn_implementation = "sdpa"
        for hook in hooks:
            hook.remove()
