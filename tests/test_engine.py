"""The engine against a fresh prefill under each press: KVPress's own code decides what KVPress's presses keep.

Every press of KVPress's default press list (the presses its own test suite builds, at its easy and hard
settings), its wrappers, and ours, on tiny Llama and Qwen2 models with grouped-query attention: the cache the
engine builds from one uncompressed prefill, by running the press's hook on the stored inputs, equals the cache
a prefill under the press leaves, tensor for tensor (a press that masks keys instead of evicting them: the same
mask too). Presses that read the eager attention weights are compared by the positions they keep (the
reference prefill runs eager attention, the engine sdpa: the keys differ by float rounding). Presses that run
forward passes of their own are sent to a prefill of their own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kvpress import (
    AdaKVPress,
    BlockPress,
    CapPress,
    ChunkKVPress,
    ChunkPress,
    CompactorPress,
    ComposedPress,
    CriticalAdaKVPress,
    CriticalKVPress,
    CURPress,
    DuoAttentionPress,
    ExpectedAttentionPress,
    ExpectedAttentionStatsPress,
    FastKVzipPress,
    KeyDiffPress,
    KeyRerotationPress,
    KnormPress,
    KVComposePress,
    KVzapPress,
    KVzipPress,
    LagKVPress,
    LeverageScorePress,
    LUKVPress,
    NonCausalAttnPress,
    ObservedAttentionPress,
    PyramidKVPress,
    QFilterPress,
    RandomPress,
    RestoreKVPress,
    SimLayerKVPress,
    SnapKVPress,
    StreamingLLMPress,
    ThinKPress,
)
from kvpress import TOVAPress as KVPressTOVA
from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

from evaluation.catalogue.needs import needs
from evaluation.catalogue.registry import OWN_PREFILL, SHARED
from evaluation.catalogue.resolved import make_press
from evaluation.engine.history import History
from evaluation.engine.hooks import mask_of, sums_handed
from evaluation.errors import EvaluationError
from presses import RecentWindowPress, RMMPress, TOVAPress
from presses.column_sums import ColumnSums
from presses.wrapped import every_press
from tests.helpers import (
    confidence_weights,
    confident_model,
    history_kept,
    kept_positions,
    positions_of,
    prefill,
    same_sets,
    tiny_model,
)


class OfflineDuoAttention(DuoAttentionPress):
    """DuoAttention with a fixed random head pattern instead of the one its authors publish."""

    @staticmethod
    def load_attention_pattern(model):
        shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
        return 2, 2, np.random.default_rng(0).random(shape)


class OfflineQFilter(QFilterPress):
    def post_init_from_model(self, model):
        config = model.config
        shape = (config.num_hidden_layers, config.num_key_value_heads, config.hidden_size // config.num_attention_heads)
        self.q_filters = torch.randn(shape, generator=torch.Generator().manual_seed(0))


class OfflineExpectedAttentionStats(ExpectedAttentionStatsPress):
    def post_init_from_model(self, model):
        config = model.config
        head_dim = config.hidden_size // config.num_attention_heads
        generator = torch.Generator().manual_seed(0)
        self.mu = torch.randn(config.num_hidden_layers, config.num_attention_heads, head_dim, generator=generator)
        self.cov = torch.eye(head_dim).expand(config.num_hidden_layers, config.num_attention_heads, -1, -1)


class OfflineKVzap(KVzapPress):
    def post_init_from_model(self, model):
        config = model.config
        kv_heads, layers = config.num_key_value_heads, config.num_hidden_layers
        torch.manual_seed(0)
        self.kvzap_model = KVzapModel(KVzapConfig(input_dim=config.hidden_size, output_dim=kv_heads, n_modules=layers))


class OfflineLUKV(LUKVPress):
    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)
        shape = (99, model.config.num_hidden_layers, model.config.num_key_value_heads)
        self._budget_curves = np.broadcast_to(np.arange(1, 100, dtype=np.float32)[:, None, None] / 100, shape).copy()


def kvpress_defaults() -> list:
    """KVPress's default press list at its easy and hard settings (offline stand-ins for the hub-loaded ones)."""
    cases = []
    for easy, ratio in ((True, 0.2), (False, 0.8)):
        cases += [
            OfflineDuoAttention(head_compression_ratio=ratio),
            KnormPress(ratio),
            ExpectedAttentionPress(ratio),
            OfflineExpectedAttentionStats(ratio),
            RandomPress(ratio, seed=0),
            StreamingLLMPress(ratio),
            OfflineQFilter(ratio),
            SnapKVPress(ratio, window_size=2),
            KVPressTOVA(ratio),
            ThinKPress(key_channel_compression_ratio=ratio, window_size=2),
            SimLayerKVPress(lazy_threshold=1 - ratio, n_initial=1, n_recent=1, n_last=1),
            PyramidKVPress(ratio, window_size=2),
            LagKVPress(0.5 if easy else 0.8, n_sink=16, lag_size=16),
            KeyDiffPress(ratio),
            CURPress(ratio),
            OfflineKVzap(ratio),
            CompactorPress(0.5 if easy else 0.8, sink_size_start=int(easy), sink_size_end=int(easy), chunk_size=32),
            LeverageScorePress(0.8, sketch_dimension=8),
            NonCausalAttnPress(0.5, chunk_size=32),
            CapPress(0.5 if easy else 0.8),
            OfflineLUKV(compression_ratio=0.5 if easy else 0.8),
        ]
    return cases


def wrappers_and_ours() -> list:
    cases = []
    for ratio in (0.2, 0.8):
        cases += [
            AdaKVPress(SnapKVPress(ratio, window_size=2)),
            CriticalKVPress(SnapKVPress(ratio, window_size=2)),
            CriticalAdaKVPress(KnormPress(ratio)),
            ChunkPress(SnapKVPress(ratio, window_size=2), chunk_length=24),
            ChunkKVPress(SnapKVPress(ratio, window_size=2), chunk_length=8),
            BlockPress(KnormPress(ratio), block_size=16),
            KeyRerotationPress(KnormPress(ratio)),
            ComposedPress(
                [SnapKVPress(ratio, window_size=2), ThinKPress(key_channel_compression_ratio=0.5, window_size=2)]
            ),
            TOVAPress(ratio),
            TOVAPress(ratio, per_kv_group=True),
            RMMPress(ratio),
            RMMPress(ratio, lag=4),
            RMMPress(ratio, lag=4, correctness="uniform"),
            RMMPress(ratio, correctness="confidence"),
            RMMPress(ratio, lag=4, correctness="confidence"),
            AdaKVPress(RMMPress(ratio, lag=4)),
            CriticalKVPress(RMMPress(ratio)),
            KeyRerotationPress(TOVAPress(ratio)),
            ComposedPress([KnormPress(ratio), RMMPress(0.5)]),
            ComposedPress([KnormPress(ratio), RMMPress(0.5, lag=4, correctness="uniform")]),
            ComposedPress([KnormPress(ratio), TOVAPress(0.5)]),
            ComposedPress([RMMPress(ratio, lag=4), RMMPress(0.5)]),
            ComposedPress([RMMPress(ratio), KnormPress(0.5)]),
            RecentWindowPress(SnapKVPress(ratio, window_size=2), window=8),
        ]
    return cases


EAGER = [
    ObservedAttentionPress(0.2),
    ObservedAttentionPress(0.8),
    CriticalKVPress(ObservedAttentionPress(0.5)),
    RecentWindowPress(ObservedAttentionPress(0.8), window=8),
]
OWN = [KVzipPress(0.5), RestoreKVPress(0.2), FastKVzipPress(0.2), KVComposePress(0.5)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return tiny_model(request.param, "sdpa", head_dim=16)


IDS = torch.randint(3, 256, (1, 96), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("press", kvpress_defaults() + wrappers_and_ours(), ids=lambda press: repr(press)[:60])
def test_the_engine_leaves_exactly_the_cache_a_prefill_under_the_press_leaves(model, press):
    assert needs(press).path == SHARED
    history = History(model, frozenset({"context"}), [press])
    history.extend(IDS[0].tolist(), "context")
    torch.manual_seed(0)
    compressed = history.compress(press)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    torch.manual_seed(0)
    fresh = prefill(model, IDS, press)
    for index, (ours, theirs) in enumerate(zip(compressed.cache.layers, fresh.layers, strict=True)):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values), f"layer {index}"
        mask = mask_of(getattr(model.model.layers[index].self_attn, "masked_key_indices", None), theirs.keys)
        assert (mask is None and compressed.masks[index] is None) or torch.equal(compressed.masks[index], mask)
    assert not any(held._follower.handed for held in every_press(press) if isinstance(held, RMMPress)), "taken back"


def test_each_statistic_is_handed_to_the_first_press_that_reads_it_and_taken_back():
    first, second, other = RMMPress(0.3, correctness="uniform"), RMMPress(0.3, correctness="uniform"), RMMPress(0.3)
    sums = {first.statistic: torch.ones(1, 4, 10), ColumnSums(7): torch.zeros(1, 4, 10)}
    with sums_handed(ComposedPress([first, KnormPress(0.2), second, other]), 1, sums):
        assert list(first._follower.handed) == [1] and first._follower.handed[1] is sums[first.statistic]
        assert not second._follower.handed and not other._follower.handed
    assert not first._follower.handed


@pytest.mark.parametrize("press", EAGER, ids=repr)
def test_h2o_sums_stand_in_for_the_eager_weights(model, press):
    history = History(model, frozenset({"context"}), [press])
    history.extend(IDS[0].tolist(), "context")
    compressed = history.compress(press)
    model.set_attn_implementation("eager")
    try:
        fresh = prefill(model, IDS, press)
    finally:
        model.set_attn_implementation("sdpa")
    full = history.cache.layers
    for ours, theirs, whole in zip(compressed.cache.layers, fresh.layers, full, strict=True):
        kept, expected = positions_of(whole.keys, ours.keys), positions_of(whole.keys, theirs.keys, atol=1e-4)
        assert torch.equal(kept.sort(-1).values, expected.sort(-1).values)


@pytest.mark.parametrize("press", OWN, ids=lambda press: type(press).__name__)
def test_presses_that_run_forward_passes_of_their_own_get_their_own_prefill(press):
    assert needs(press).path == OWN_PREFILL
    history = History(tiny_model("llama", "sdpa"), frozenset({"context"}), [press])
    assert not history.can_serve(press)


def test_h2o_beside_a_press_that_reads_attention_rows_or_as_a_subclass_gets_its_own_eager_prefill():
    class MyH2O(ObservedAttentionPress):
        pass

    assert needs(ComposedPress([ObservedAttentionPress(0.5), SnapKVPress(0.5)])).path == OWN_PREFILL
    assert needs(ComposedPress([ObservedAttentionPress(0.5), KnormPress(0.5)])).path == SHARED
    assert needs(MyH2O(0.5)).path == OWN_PREFILL and needs(MyH2O(0.5)).reads_weights


def test_h2o_after_a_press_that_evicts_cannot_run_and_is_refused_before_any_work():
    from evaluation.catalogue.resolved import resolve_presses

    with pytest.raises(EvaluationError, match="ObservedAttentionPress after a press that evicts"):
        resolve_presses(["composed([knorm, h2o])"])


def test_a_press_that_edits_keys_in_place_leaves_the_history_as_it_was(model):
    history = History(model, frozenset({"context"}), [ThinKPress(key_channel_compression_ratio=0.5, window_size=2)])
    history.extend(IDS[0].tolist(), "context")
    before = [layer.keys.clone() for layer in history.cache.layers]
    compressed = history.compress(ThinKPress(key_channel_compression_ratio=0.5, window_size=2))
    assert all((layer.keys == 0).any() for layer in compressed.cache.layers), "ThinK zeroes key channels"
    assert all(torch.equal(layer.keys, kept) for layer, kept in zip(history.cache.layers, before, strict=True))


def test_the_engine_keeps_only_the_rows_its_presses_read(model):
    presses = [SnapKVPress(0.5, window_size=8), TOVAPress(0.5), ObservedAttentionPress(0.5), RMMPress(0.5, lag=4)]
    history = History(model, frozenset({"context"}), presses)
    history.extend(IDS[0].tolist(), "context")
    assert [inputs.shape[1] for inputs in history.inputs] == [8, 8], "SnapKV's window, the most any reads"
    assert all(inputs.storage_offset() == 0 and inputs.is_contiguous() for inputs in history.inputs)
    assert not history.can_serve(ExpectedAttentionPress(0.5)), "it reads every row"


@pytest.mark.parametrize("lag", [None, 4])
def test_confidence_and_teacher_forced_sums_in_one_history_over_two_turns_keep_what_fresh_prefills_keep(arch, lag):
    """One history serves RMM under both modes: each statistic weighs the rows by its own mode, the confidence
    sums by the top-1 probabilities of a plain forward over the whole history (none of them pending), and after
    each turn each press keeps, in every layer and KV head, what a prefill of the whole history under it keeps."""
    model = confident_model(arch, "sdpa", head_dim=16)
    presses = [RMMPress(0.5, lag=lag, correctness="confidence"), RMMPress(0.5, lag=lag)]
    history = History(model, frozenset({"context"}), presses)
    for turn in (IDS[:, :60], IDS[:, 60:]):
        history.extend(turn[0].tolist(), "context")
        ids = torch.tensor([history.token_ids])
        expected = confidence_weights(model, ids)[0]
        torch.testing.assert_close(torch.tensor(history.weights["confidence"]), expected, rtol=1e-5, atol=1e-6)
        assert set(history.pending) <= {presses[1].statistic}, "a confidence weight waits for no later token"
        kept = {}
        for press in presses:
            kept[press.correctness] = history_kept(history, press)
            assert same_sets(kept[press.correctness], kept_positions(model, ids, press)), press.correctness
        assert not same_sets(kept["confidence"], kept["teacher_forced"])


def test_a_confidence_spec_is_served_on_the_shared_path():
    press = make_press('rmm(correctness="confidence")', 0.5)
    assert press == RMMPress(0.5, correctness="confidence")
    need = needs(press)
    assert need.path == SHARED and need.sums == {ColumnSums(None, "confidence")} and need.rows == 0
    model = tiny_model("llama", "sdpa")
    assert History(model, frozenset({"context"}), [press]).can_serve(press)
    assert not History(model, frozenset({"context"}), [RMMPress(0.5)]).can_serve(press), "a statistic of its own"
