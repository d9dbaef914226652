from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kvpress import DecodingPress, ObservedAttentionPress, SnapKVPress
from kvpress import TOVAPress as KVPressTOVAPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from presses import TOVAPress
from presses.ordered_scorer_press import gather_kept, kept_indices
from tests.helpers import kept_positions, same_sets


def test_eager_and_sdpa_keep_the_same_positions(eager_model, sdpa_model, token_ids):
    eager = kept_positions(eager_model, token_ids, TOVAPress(compression_ratio=0.6))
    sdpa = kept_positions(sdpa_model, token_ids, TOVAPress(compression_ratio=0.6))
    assert [torch.equal(a, b) for a, b in zip(eager, sdpa, strict=True)] == [True, True]


def test_one_ascending_kept_set_per_layer_that_holds_the_newest_token(sdpa_model, token_ids):
    length = token_ids.shape[1]
    for positions in kept_positions(sdpa_model, token_ids, TOVAPress(compression_ratio=0.75)):
        assert positions.shape[-1] == compute_n_kept(length, 0.75)
        assert torch.equal(positions[0, 0], positions[0, 1]), "all KV heads of a layer keep one set"
        assert (positions.diff(dim=-1) > 0).all(), "kept entries are stored in ascending position order"
        assert positions[0, 0, -1] == length - 1, "the newest token is never evicted"


def test_score_is_the_newest_rows_attention_averaged_over_all_heads(eager_model, token_ids):
    """Against the model's own attention weights: the last row, mean over the 4 query heads."""
    with torch.no_grad():
        attentions = eager_model.model(input_ids=token_ids, output_attentions=True).attentions
    length = token_ids.shape[1]
    n_kept = compute_n_kept(length, 0.5)
    kept = kept_positions(eager_model, token_ids, TOVAPress(compression_ratio=0.5))
    for layer_attention, positions in zip(attentions, kept, strict=True):
        newest = layer_attention[0, :, -1, :-1].mean(0)
        expected = newest.topk(n_kept - 1).indices.sort().values
        assert torch.equal(positions[0, 0, :-1], expected)


def test_kept_set_matches_kvpress_tova_up_to_order(sdpa_model, token_ids):
    ours = kept_positions(sdpa_model, token_ids, TOVAPress(compression_ratio=0.5))
    theirs = kept_positions(sdpa_model, token_ids, KVPressTOVAPress(compression_ratio=0.5))
    assert same_sets(ours, theirs)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_per_kv_group_is_snapkv_with_a_one_token_window(arch, attn, token_ids):
    from tests.helpers import tiny_model

    model = tiny_model(arch, attn)
    ours = kept_positions(model, token_ids, TOVAPress(compression_ratio=0.6, per_kv_group=True))
    snapkv = kept_positions(model, token_ids, SnapKVPress(compression_ratio=0.6, window_size=1, kernel_size=1))
    assert same_sets(ours, snapkv)
    assert any(not torch.equal(p[0, 0], p[0, 1]) for p in ours), "per-group sets differ between KV heads"


def test_ties_evict_the_lower_position():
    scores = torch.tensor([[[0.5, 0.1, 0.1, 0.1, 0.9]]])
    assert kept_indices(scores, 3).tolist() == [[[0, 3, 4]]]
    keys = torch.arange(5.0).view(1, 1, 5, 1)
    kept_keys, _ = gather_kept(keys, keys.clone(), kept_indices(scores, 2))
    assert kept_keys.flatten().tolist() == [0.0, 4.0]


@pytest.mark.parametrize("keep_older", [False, True])
def test_kept_indices_are_the_stable_sort_rule_on_heavily_tied_scores(keep_older):
    """Against Python's stable ``sorted`` per row: ties evict the lower position (``keep_older``: the higher)."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (2, 3, 40), generator=generator).float()
    scores[0, 1, 5], scores[1, 0, :6] = float("inf"), float("-inf")
    rows = scores.view(6, 40).tolist()
    ascending = [sorted(range(40), key=lambda k, row=row: (row[k], -k if keep_older else k)) for row in rows]
    for n_kept in (0, 1, 9, 40):
        kept = kept_indices(scores, n_kept, keep_older).view(6, n_kept).tolist()
        assert kept == [sorted(order[40 - n_kept :]) for order in ascending]


@pytest.mark.parametrize("keep_older", [False, True])
def test_a_tolerance_ties_scores_that_rounding_set_apart(keep_older):
    """The stable-sort rule on tied scores still decides them when each is moved by up to 1e-7 of itself (float32
    rounding) and ``kept_indices`` ties within 1e-6; without a tolerance the moved scores decide otherwise."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(1, 5, (2, 3, 40), generator=generator).double()
    scores[0, 1, 5], scores[1, 0, :6] = float("inf"), float("-inf")
    rows = scores.view(6, 40).tolist()
    ascending = [sorted(range(40), key=lambda k, row=row: (row[k], -k if keep_older else k)) for row in rows]
    moved = scores * (1 + 1e-7 * (2 * torch.rand(scores.shape, generator=generator, dtype=torch.double) - 1))
    for n_kept in (1, 9, 33):
        expected = [sorted(order[40 - n_kept :]) for order in ascending]
        assert kept_indices(moved, n_kept, keep_older, tolerance=1e-6).view(6, n_kept).tolist() == expected
        assert kept_indices(moved, n_kept, keep_older).view(6, n_kept).tolist() != expected


def fake_layer(num_heads: int = 1, num_kv_heads: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(num_attention_heads=num_heads, num_key_value_heads=num_kv_heads), head_dim=1
    )


def test_distinguishing_case_tova_evicts_what_an_accumulated_score_keeps():
    """Position 1 takes almost all attention on three consecutive steps, then goes quiet.

    Rows are query steps, columns positions (a causal attention matrix, one head). The final step gives
    position 1 the lowest weight, so TOVA (the current step alone) evicts it, while H2O-style accumulation
    (ObservedAttentionPress: the mean of its column) ranks it first and keeps it.
    """
    steps = torch.tensor(
        [
            [1.00, 0.00, 0.00, 0.00, 0.00, 0.00],
            [0.05, 0.95, 0.00, 0.00, 0.00, 0.00],
            [0.02, 0.94, 0.04, 0.00, 0.00, 0.00],
            [0.02, 0.93, 0.02, 0.03, 0.00, 0.00],
            [0.30, 0.01, 0.20, 0.20, 0.29, 0.00],
            [0.25, 0.01, 0.20, 0.20, 0.14, 0.20],
        ]
    ).view(1, 1, 6, 6)
    keys = torch.arange(6.0).view(1, 1, 6, 1)
    layer, kwargs = fake_layer(), {}
    tova_keys, _ = TOVAPress(compression_ratio=0.5).compress(layer, None, keys, keys.clone(), steps, kwargs)
    h2o_keys, _ = ObservedAttentionPress(compression_ratio=0.5).compress(layer, None, keys, keys, steps, kwargs)
    assert 1.0 not in tova_keys.flatten().tolist()
    assert 1.0 in h2o_keys.flatten().tolist()
    assert steps[0, 0].sum(0).argmax() == 1, "position 1 has by far the largest accumulated attention"


def test_as_decoding_press_the_cache_holds_exactly_the_budget_after_every_step(sdpa_model, token_ids):
    budget = 40
    lengths: list[int] = []

    def record(module, args, kwargs, output):
        lengths.append(kwargs["past_key_values"].get_seq_length())

    cache = DynamicCache()
    with torch.no_grad():
        sdpa_model.model(input_ids=token_ids[:, :64], past_key_values=cache)
        press = DecodingPress(base_press=TOVAPress(), compression_interval=1, target_size=budget)
        handle = sdpa_model.model.register_forward_hook(record, with_kwargs=True)
        try:
            with press(sdpa_model):
                for position in range(64, 96):
                    sdpa_model.model(
                        input_ids=token_ids[:, position : position + 1],
                        past_key_values=cache,
                        position_ids=torch.tensor([[position]]),
                    )
        finally:
            handle.remove()
    assert lengths == [budget] * 32


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_invalid_compression_ratio_is_refused(ratio):
    with pytest.raises(ValueError, match=r"compression_ratio must be in \[0, 1\)"):
        TOVAPress(compression_ratio=ratio)


def test_compression_ratio_is_settable_and_checked_when_used(sdpa_model, token_ids):
    press = TOVAPress()
    press.compression_ratio = 0.5
    assert press.compression_ratio == 0.5
    assert kept_positions(sdpa_model, token_ids, press)[0].shape[-1] == 48
    press.compression_ratio = 2.0
    with pytest.raises(ValueError, match="compression_ratio"):
        kept_positions(sdpa_model, token_ids, press)


def test_per_kv_group_must_be_a_bool():
    with pytest.raises(TypeError, match="per_kv_group"):
        TOVAPress(per_kv_group="yes")
