"""Every name of KVPress's evaluation registry builds the press that registry builds, at the ratio its
``evaluate.py`` sets; ``tova`` is the one exception (this project's TOVAPress; KVPress's is ``kvpress_tova``).

The table below is written here from KVPress's ``evaluation/evaluate_registry.py`` (``PRESS_REGISTRY``, 54 names)
and the ratio from its ``EvaluationRunner._setup_press``.
"""

from __future__ import annotations

import socket

import pytest
import torch
from kvpress import (
    AdaKVPress,
    BlockPress,
    CAMPress,
    ChunkKVPress,
    CompactorPress,
    ComposedPress,
    CriticalAdaKVPress,
    CriticalKVPress,
    CURPress,
    DecodingPress,
    DMSPress,
    DuoAttentionPress,
    ExpectedAttentionPress,
    FastKVzipPress,
    FinchPress,
    KeyDiffPress,
    KnormPress,
    KVComposePress,
    KVzapPress,
    KVzipPress,
    LagKVPress,
    LUKVPress,
    MergingPress,
    ObservedAttentionPress,
    PyramidKVPress,
    QFilterPress,
    RandomPress,
    RestoreKVPress,
    SnapKVPress,
    StreamingLLMPress,
    ThinKPress,
    TOVAPress,
)

import presses
from evaluation.catalogue.resolved import make_press, resolve_presses
from evaluation.catalogue.specs import canonical
from evaluation.errors import EvaluationError
from presses.wrapped import every_press

REGISTRY = {
    "adakv_snapkv": lambda: AdaKVPress(SnapKVPress()),
    "block_keydiff": lambda: BlockPress(press=KeyDiffPress(), block_size=128),
    "chunkkv": lambda: ChunkKVPress(press=SnapKVPress(), chunk_length=20),
    "critical_adakv_expected_attention": lambda: CriticalAdaKVPress(ExpectedAttentionPress(use_vnorm=False)),
    "critical_adakv_snapkv": lambda: CriticalAdaKVPress(SnapKVPress()),
    "critical_expected_attention": lambda: CriticalKVPress(ExpectedAttentionPress(use_vnorm=False)),
    "critical_snapkv": lambda: CriticalKVPress(SnapKVPress()),
    "cur": lambda: CURPress(),
    "duo_attention": lambda: DuoAttentionPress(),
    "duo_attention_on_the_fly": lambda: DuoAttentionPress(on_the_fly_scoring=True),
    "expected_attention": lambda: AdaKVPress(ExpectedAttentionPress(epsilon=1e-2)),
    "fastkvzip": lambda: FastKVzipPress(),
    "finch": lambda: FinchPress(),
    "keydiff": lambda: KeyDiffPress(),
    "kvcompose": lambda: KVComposePress(),
    "kvcompose_unstructured": lambda: KVComposePress(structured=False),
    "kvzip": lambda: KVzipPress(),
    "kvzip_plus": lambda: KVzipPress(kvzip_plus_normalization=True),
    "kvzap_linear": lambda: DMSPress(press=KVzapPress(model_type="linear")),
    "kvzap_mlp": lambda: DMSPress(press=KVzapPress(model_type="mlp")),
    "kvzap_mlp_head": lambda: KVzapPress(model_type="mlp"),
    "kvzap_mlp_layer": lambda: AdaKVPress(KVzapPress(model_type="mlp")),
    "lagkv": lambda: LagKVPress(),
    "lukv": lambda: LUKVPress(ExpectedAttentionPress(epsilon=2e-2), sink=4, window=1),
    "knorm": lambda: KnormPress(),
    "observed_attention": lambda: ObservedAttentionPress(),
    "pyramidkv": lambda: PyramidKVPress(),
    "qfilter": lambda: QFilterPress(),
    "random": lambda: RandomPress(),
    "RestoreKV": lambda: RestoreKVPress(),
    "RestoreKV_plus": lambda: RestoreKVPress(kvzip_plus_normalization=True),
    "snap_think": lambda: ComposedPress([SnapKVPress(), ThinKPress()]),
    "snapkv": lambda: SnapKVPress(),
    "streaming_llm": lambda: StreamingLLMPress(),
    "think": lambda: ThinKPress(),
    "tova": lambda: presses.TOVAPress(),  # the exception: this project's TOVAPress
    "compactor": lambda: CompactorPress(),
    "adakv_compactor": lambda: AdaKVPress(CompactorPress()),
    "no_press": lambda: None,
    "cam_streaming_llm": lambda: CAMPress(base_press=StreamingLLMPress()),
    "cam_knorm": lambda: CAMPress(base_press=KnormPress()),
    "cam_adakv_snapkv": lambda: CAMPress(base_press=AdaKVPress(SnapKVPress())),
    "cam_tova": lambda: CAMPress(base_press=TOVAPress()),
    "decoding_knorm": lambda: DecodingPress(base_press=KnormPress()),
    "decoding_streaming_llm": lambda: DecodingPress(base_press=StreamingLLMPress()),
    "decoding_tova": lambda: DecodingPress(base_press=TOVAPress()),
    "decoding_qfilter": lambda: DecodingPress(base_press=QFilterPress()),
    "decoding_adakv_expected_attention_e2": lambda: DecodingPress(
        base_press=AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))
    ),
    "decoding_adakv_snapkv": lambda: DecodingPress(base_press=AdaKVPress(SnapKVPress())),
    "decoding_keydiff": lambda: DecodingPress(base_press=KeyDiffPress()),
    "merging_knorm": lambda: MergingPress(KnormPress()),
    "merging_snapkv": lambda: MergingPress(SnapKVPress()),
    "merging_expected_attention": lambda: MergingPress(ExpectedAttentionPress(epsilon=1e-2)),
    "merging_kvzap_mlp": lambda: MergingPress(KVzapPress(model_type="mlp")),
}
RATIO = 0.375
SEEDED_HERE = {"random": 0}  # KVPress's registry leaves RandomPress unseeded; here it draws from seed 0


def kvpress_registry(name: str) -> object:
    """What KVPress's registry builds for ``name``, with the seed this project gives a press that draws unseeded."""
    press = REGISTRY[name]()
    if name in SEEDED_HERE:
        press.seed = SEEDED_HERE[name]
    return press


def kvpress_setup(press: object, ratio: float) -> object:
    """KVPress's ``_setup_press``, with its other ratio flags (``--head_compression_ratio``,
    ``--key_channel_compression_ratio``) given the cell's one ratio: a DecodingPress keeps its own target size,
    a DMSPress needs ``--threshold``, a ComposedPress sets each of its presses."""
    if isinstance(press, DuoAttentionPress):
        press.head_compression_ratio = ratio
    elif isinstance(press, DMSPress):
        raise AssertionError("threshold must be set for DMSPress")
    elif isinstance(press, ComposedPress):
        for held in press.presses:
            if isinstance(held, ThinKPress):
                held.key_channel_compression_ratio = ratio
            else:
                held.compression_ratio = ratio
    elif isinstance(press, ThinKPress):
        press.key_channel_compression_ratio = ratio
    elif press is not None and not isinstance(press, DecodingPress):
        press.compression_ratio = ratio
    return press


def same_press(ours: object, theirs: object) -> bool:
    """The same classes, nested the same way, with the same parameters."""
    if theirs is None:
        return ours is None
    return repr(ours) == repr(theirs) and [type(p) for p in every_press(ours)] == [type(p) for p in every_press(theirs)]


@pytest.fixture
def offline(monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_the_table_has_every_name_of_kvpress_registry():
    assert len(REGISTRY) == 54


@pytest.mark.parametrize("name", REGISTRY)
def test_each_registry_name_builds_what_kvpress_registry_builds_offline(name, offline):
    assert same_press(make_press(name), kvpress_registry(name))


@pytest.mark.parametrize("name", [name for name in REGISTRY if not name.startswith("kvzap_") or "mlp_" in name])
def test_each_registry_name_takes_the_ratio_kvpress_evaluation_sets(name):
    assert same_press(make_press(name, RATIO), kvpress_setup(kvpress_registry(name), RATIO))


@pytest.mark.parametrize("name", ["kvzap_linear", "kvzap_mlp"])
def test_a_threshold_press_kvpress_asks_a_threshold_for_is_refused_here(name):
    with pytest.raises(AssertionError, match="threshold"):
        kvpress_setup(REGISTRY[name](), RATIO)
    with pytest.raises(EvaluationError, match="DMSPress evicts by a score threshold, so no budget sets its size"):
        resolve_presses([name])
    built = make_press(f"dms(kvzap(model_type='{name.split('_')[1]}'), threshold=-4.0)", RATIO)
    assert same_press(built, DMSPress(KVzapPress(model_type=name.split("_")[1]), threshold=-4.0))


@pytest.mark.parametrize("name", REGISTRY)
def test_no_registry_name_is_a_traceback_before_a_run(name):
    try:
        resolve_presses([name])
    except EvaluationError as error:
        assert "\n" not in str(error) and "unknown press" not in str(error)


def test_tova_is_ours_and_kvpress_tova_theirs_and_no_press_is_the_full_cache():
    assert type(make_press("tova")) is presses.TOVAPress
    assert type(make_press("kvpress_tova")) is TOVAPress
    assert canonical("no_press") == "full" and make_press("no_press", RATIO) is None


def test_a_class_name_takes_parameters_where_the_registry_name_is_a_construction():
    assert same_press(make_press("ExpectedAttentionPress(epsilon=0.1)"), ExpectedAttentionPress(epsilon=0.1))
    assert same_press(make_press("ChunkKVPress(knorm, chunk_length=8)"), ChunkKVPress(KnormPress(), chunk_length=8))
    assert same_press(make_press("duo_attention(on_the_fly_scoring=True)"), REGISTRY["duo_attention_on_the_fly"]())


def test_random_draws_from_its_own_seed_not_the_process_generator():
    keys = torch.randn(1, 2, 16, 4)
    drawn = []
    for state in (0, 1):
        torch.manual_seed(state)  # what ran before the cell in its process
        drawn.append(make_press("random", RATIO).score(None, None, keys, keys, None, {}))
    assert torch.equal(drawn[0], drawn[1])
    assert torch.equal(drawn[0], RandomPress(RATIO, seed=0).score(None, None, keys, keys, None, {}))
    assert not torch.equal(drawn[0], make_press("random(seed=1)", RATIO).score(None, None, keys, keys, None, {}))
    assert make_press("adakv(random)").press.seed == 0 and make_press("RandomPress(0.0, 3)").seed == 3
    with pytest.raises(EvaluationError, match="build the same press"):
        resolve_presses(["random", "random(seed=0)"])
