"""The press names a spec may use, and how a cell's compression ratio reaches the press: the one place that
knows them.

Every name of ``PRESS_REGISTRY`` in KVPress's ``evaluation/evaluate_registry.py`` builds what that registry
builds, the same class with the same parameters (so the ``repr`` is equal), with one exception: ``tova`` is this
project's ``presses.TOVAPress``; KVPress's ``TOVAPress`` is ``kvpress_tova`` (and ``cam_tova`` and
``decoding_tova`` hold KVPress's, as its registry builds them). ``no_press`` is the full cache, ``full``.

- ``CLASSES``: a name for one press class; it takes parameters (``snapkv(window_size=32)``) and wraps other specs
  (``adakv(snapkv)``). Every class KVPress exports is a name too (``KnormPress``).
- ``COMPOSITES``: a name for one of the registry's constructions, written as a spec (``expected_attention`` is
  ``adakv(ExpectedAttentionPress(epsilon=1e-2))``, as in KVPress's registry). It takes no parameters: write its
  spec with them.

The cell's compression ratio is set as KVPress's ``evaluate.py`` sets its ``--compression_ratio`` (``set_ratio``).
KVPress's evaluation has further flags where a press takes no compression ratio; the cell's one ratio takes
their place: ``ThinKPress``'s ``key_channel_compression_ratio`` and ``DuoAttentionPress``'s
``head_compression_ratio``. A ``DMSPress`` evicts by a score threshold, which no ratio sets: it is left as built. A
decoding press (``DecodingPress``, ``CAMPress``, ``PrefillDecodingPress``) gets the budget as its target size.

Every class here is in kvpress 0.5.5, the oldest release the project accepts. Presses that read data from the
network (DuoAttention's head patterns, KVzap's and Q-Filters' models, LU-KV's budget curves, Fast-KVzip's gates,
RestoreKV's embeddings) read it when they are applied to a model, not when they are built: a spec builds them
offline.
"""

from __future__ import annotations

import inspect
from functools import cache

from evaluation.errors import EvaluationError

FULL_CACHE = "full"
NO_PRESS = "no_press"  # KVPress's name for the full cache
CLASSES = {
    "adakv": "AdaKVPress",
    "block": "BlockPress",
    "cam": "CAMPress",
    "chunk": "ChunkPress",
    "compactor": "CompactorPress",
    "composed": "ComposedPress",
    "critical": "CriticalKVPress",
    "critical_adakv": "CriticalAdaKVPress",
    "cur": "CURPress",
    "decoding": "DecodingPress",
    "dms": "DMSPress",
    "duo_attention": "DuoAttentionPress",
    "fastkvzip": "FastKVzipPress",
    "finch": "FinchPress",
    "h2o": "ObservedAttentionPress",
    "key_rerotation": "KeyRerotationPress",
    "keydiff": "KeyDiffPress",
    "knorm": "KnormPress",
    "kvcompose": "KVComposePress",
    "kvpress_tova": "TOVAPress",
    "kvzap": "KVzapPress",
    "kvzip": "KVzipPress",
    "lagkv": "LagKVPress",
    "lukv": "LUKVPress",
    "merging": "MergingPress",
    "observed_attention": "ObservedAttentionPress",
    "per_layer": "PerLayerCompressionPress",
    "prefill_decoding": "PrefillDecodingPress",
    "pyramidkv": "PyramidKVPress",
    "qfilter": "QFilterPress",
    "random": "RandomPress",
    "RestoreKV": "RestoreKVPress",
    "snapkv": "SnapKVPress",
    "streaming_llm": "StreamingLLMPress",
    "think": "ThinKPress",
}
OURS = {"tova": "TOVAPress", "rmm": "RMMPress", "recent_window": "RecentWindowPress"}
COMPOSITES = {
    "adakv_compactor": "adakv(compactor)",
    "adakv_expected_attention": "adakv(ExpectedAttentionPress)",  # KVPress's registry before kvpress 0.5
    "adakv_snapkv": "adakv(snapkv)",
    "block_keydiff": "block(keydiff, block_size=128)",
    "cam_adakv_snapkv": "cam(adakv(snapkv))",
    "cam_knorm": "cam(knorm)",
    "cam_streaming_llm": "cam(streaming_llm)",
    "cam_tova": "cam(kvpress_tova)",
    "chunkkv": "ChunkKVPress(snapkv, chunk_length=20)",
    "critical_adakv_expected_attention": "critical_adakv(ExpectedAttentionPress(use_vnorm=False))",
    "critical_adakv_snapkv": "critical_adakv(snapkv)",
    "critical_expected_attention": "critical(ExpectedAttentionPress(use_vnorm=False))",
    "critical_snapkv": "critical(snapkv)",
    "decoding_adakv_expected_attention_e2": "decoding(adakv(ExpectedAttentionPress(epsilon=1e-2)))",
    "decoding_adakv_snapkv": "decoding(adakv(snapkv))",
    "decoding_keydiff": "decoding(keydiff)",
    "decoding_knorm": "decoding(knorm)",
    "decoding_qfilter": "decoding(qfilter)",
    "decoding_streaming_llm": "decoding(streaming_llm)",
    "decoding_tova": "decoding(kvpress_tova)",
    "duo_attention_on_the_fly": "duo_attention(on_the_fly_scoring=True)",
    "expected_attention": "adakv(ExpectedAttentionPress(epsilon=1e-2))",
    "kvcompose_unstructured": "kvcompose(structured=False)",
    "kvzap_linear": "dms(kvzap(model_type='linear'))",
    "kvzap_mlp": "dms(kvzap(model_type='mlp'))",
    "kvzap_mlp_head": "kvzap(model_type='mlp')",
    "kvzap_mlp_layer": "adakv(kvzap(model_type='mlp'))",
    "kvzip_plus": "kvzip(kvzip_plus_normalization=True)",
    "merging_expected_attention": "merging(ExpectedAttentionPress(epsilon=1e-2))",
    "merging_kvzap_mlp": "merging(kvzap(model_type='mlp'))",
    "merging_knorm": "merging(knorm)",
    "merging_snapkv": "merging(snapkv)",
    "RestoreKV_plus": "RestoreKV(kvzip_plus_normalization=True)",
    "snap_think": "composed([snapkv, think])",
}


@cache
def press_classes() -> dict[str, type]:
    """Every press class a spec can name: this project's, KVPress's names, and every class KVPress exports."""
    import kvpress
    from kvpress.presses.base_press import BasePress

    import presses

    exported = {name: getattr(kvpress, name) for name in kvpress.__all__}
    exported = {name: cls for name, cls in exported.items() if inspect.isclass(cls) and issubclass(cls, BasePress)}
    known = {name: exported[cls] for name, cls in CLASSES.items()}
    known |= {name: getattr(presses, cls) for name, cls in OURS.items()}
    return known | {name: cls for name, cls in exported.items() if name not in ("BasePress", "ScorerPress")}


def known_names() -> str:
    """Every name a spec may use, for messages."""
    return ", ".join(sorted({*press_classes(), *COMPOSITES}))


def set_ratio(press: object, compression_ratio: float, length: int | None = None) -> None:
    """Set ``press`` to evict ``compression_ratio`` of a ``length``-token context, as KVPress's evaluation sets it.

    A decoding press keeps what the budget keeps of the context while the answer is generated: a
    ``DecodingPress`` (``CAMPress``) compresses to ``target_size`` = int(length x (1 - ratio)) positions (left as
    built while ``length`` is unknown), a ``CompressionRatioDecodingPress`` to the ratio itself, and a
    ``PrefillDecodingPress`` gives the budget to both its presses.

    Raises
    ------
    EvaluationError
        One line, for a press no ratio can set: a press with no ``compression_ratio`` or one it refuses.
    """
    import kvpress

    if isinstance(press, kvpress.ComposedPress):
        for held in press.presses:
            set_ratio(held, compression_ratio, length)
    elif isinstance(press, kvpress.PrefillDecodingPress):
        for part in (press.prefilling_press, press.decoding_press):
            if part is not None:
                set_ratio(part, compression_ratio, length)
    elif isinstance(press, kvpress.CompressionRatioDecodingPress):
        press.target_compression_ratio = compression_ratio
    elif isinstance(press, kvpress.DecodingPress):
        if length is not None:
            press.target_size = max(1, int(length * (1 - compression_ratio)))
    elif isinstance(press, kvpress.ThinKPress):
        press.key_channel_compression_ratio = compression_ratio
    elif isinstance(press, kvpress.DuoAttentionPress):
        press.head_compression_ratio = compression_ratio
    elif not isinstance(press, kvpress.DMSPress):  # a threshold, not a ratio, sets its size: left as built
        if "compression_ratio" not in dir(press):  # dir, not hasattr: some getters assert a forward has run
            raise EvaluationError(f"{type(press).__name__} has no compression_ratio for the budget to set")
        try:
            press.compression_ratio = compression_ratio
        except (AttributeError, AssertionError, ValueError) as error:
            raise EvaluationError(f"{type(press).__name__} refuses a compression ratio: {error}") from error
