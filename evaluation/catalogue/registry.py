"""The press classes: the one module that names and imports them, and what each declares of itself.

Names. Every name of ``PRESS_REGISTRY`` in KVPress's ``evaluation/evaluate_registry.py`` builds what that registry
builds, the same class with the same parameters (so the ``repr`` is equal), with two exceptions. ``tova`` is this
project's ``presses.TOVAPress``; KVPress's ``TOVAPress`` is ``kvpress_tova`` (and ``cam_tova`` and ``decoding_tova``
hold KVPress's, as its registry builds them). And a press that draws from torch's process generator unless it is
given a seed (``SEEDED``: ``RandomPress``) is given ``PRESS_SEED`` where its spec gives none (``seeded``), so that a
cell's draws do not depend on what ran before it in the process (other cells, a resumed run's order): ``random`` is
``RandomPress(seed=0)``, and ``random(seed=1)`` another draw. ``CLASSES`` names one press class; it takes parameters
(``snapkv(window_size=32)``) and wraps other specs (``adakv(snapkv)``). Every class KVPress exports is a name too
(``KnormPress``). The registry's constructions of several classes are specs (``specs.COMPOSITES``).

Declarations. A prefill press prunes each layer's cache after that layer's attention, from that layer's inputs:
its hidden states, the rotary embeddings, the layer's keys and values and, under eager attention, the attention
weights. So one uncompressed prefill can serve every such press: keep what its hook would have received and run
its own hook on it (``evaluation.engine``). What to keep is declared here, per press class (``Declared``), and
``evaluation.catalogue.needs`` combines it over the presses a wrapper holds:

- ``rows``: how many of the newest rows of each layer's input the press reads (``ALL``: every one);
- ``sums``: the column sums of the attention weights it reads instead of the weights themselves
  (``presses.column_sums``): ``ObservedAttentionPress`` reads H2O's sums, handed to it as a one-row stand-in for
  the eager matrix; ``RMMPress`` its own statistic, handed through its ``hand_column_sums``;
- ``path``: ``shared`` (the engine runs its hook on the stored inputs), ``own-prefill`` (it runs forward passes of
  its own, or mixes H2O's sums with presses that read attention rows: a prefill under the press per cell, per
  question on the streaming protocols), ``decoding`` (it compresses while the answer is generated) or ``refused``
  (it cannot run on these protocols at all: ``refusal`` says why).

A class not declared here is read conservatively: every row, no sums, and its own prefill if it replaces KVPress's
context manager or forward hook.

Budgets. The cell's compression ratio is set as KVPress's ``evaluate.py`` sets its ``--compression_ratio``
(``set_ratio``). KVPress's evaluation has further flags where a press takes no compression ratio; the cell's one
ratio takes their place: ``ThinKPress``'s ``key_channel_compression_ratio`` and ``DuoAttentionPress``'s
``head_compression_ratio``. A ``DMSPress`` evicts by a score threshold, which no ratio sets: it is left as built. A
decoding press (``DecodingPress``, ``CAMPress``, ``PrefillDecodingPress``) gets the budget as its target size.

Every class here is in kvpress 0.5.5, the oldest release the project accepts. Presses that read data from the
network (DuoAttention's head patterns, KVzap's and Q-Filters' models, LU-KV's budget curves, Fast-KVzip's gates,
RestoreKV's embeddings) read it when they are applied to a model, not when they are built: a spec builds them
offline.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import kvpress as k
from kvpress.presses.base_press import BasePress

from evaluation.catalogue.specs import COMPOSITES, FULL_CACHE, NO_PRESS, is_import_path
from evaluation.errors import EvaluationError, first_line
from presses.harness import H2O_SUMS, ColumnSums, RecentWindowPress, RMMPress, TOVAPress, every_press

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
OURS = {"tova": TOVAPress, "rmm": RMMPress, "recent_window": RecentWindowPress}
EXPORTED = {
    name: cls
    for name, cls in ((name, getattr(k, name)) for name in k.__all__)
    if inspect.isclass(cls) and issubclass(cls, BasePress)
}
# every press class a spec can name: this project's, KVPress's names, and every class KVPress exports
PRESS_CLASSES = (
    {name: EXPORTED[cls] for name, cls in CLASSES.items()}
    | OURS
    | {name: cls for name, cls in EXPORTED.items() if name not in ("BasePress", "ScorerPress")}
)


def known_names() -> str:
    """Every name a spec may use, for messages."""
    return ", ".join(sorted({*PRESS_CLASSES, *COMPOSITES}))


def press_class(name: str, spec: str, allow_import: bool = False) -> type:
    """The class a press name or import path of ``spec`` names, checked to be a press. An import path is imported
    here, and only when ``allow_import`` (the command line's ``--allow-import``): importing runs the module.

    Raises
    ------
    EvaluationError
        One line, for an unknown name, an import path not allowed or not importable, or a class that is not a press.
    """
    if not is_import_path(name):
        if name in (FULL_CACHE, NO_PRESS):
            raise EvaluationError(f"press spec {spec!r}: {name} is the uncompressed cache, a spec on its own")
        if name not in PRESS_CLASSES:
            raise EvaluationError(f"press spec {spec!r}: unknown press {name!r}; known: {known_names()}")
        return PRESS_CLASSES[name]
    if not allow_import:
        raise import_refusal(spec, name)
    module, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except Exception as error:  # importing runs the module: whatever it raises is reported in one line
        raise EvaluationError(f"press spec {spec!r}: cannot import {name} ({first_line(error)})") from error
    if not (inspect.isclass(found) and issubclass(found, BasePress)):
        raise EvaluationError(
            f"press spec {spec!r}: {name} is not a press (a subclass of KVPress's BasePress); a spec names presses only"
        )
    return found


def import_refusal(spec: str, path: str) -> EvaluationError:
    """The error for an import path the user has not allowed to be imported."""
    return EvaluationError(
        f"press spec {spec!r} names the import path {path}, which imports (runs) the module "
        f"{path.partition(':')[0]}: pass --allow-import to allow it, or name a press by its name (such as snapkv)"
    )


SHARED, OWN_PREFILL, DECODING, REFUSED = "shared", "own-prefill", "decoding", "refused"
ALL = None  # reads every row of the layer's input


@dataclass(frozen=True)
class Declared:
    """What a press class reads of a prefill, and how the engine may serve it (see the module's docstring)."""

    rows: int | Callable[[BasePress], int | None] | None = ALL  # a number, ALL, or a function of the press
    path: str = SHARED
    blind: bool = False  # never reads the attention weights (so H2O's stand-in may reach it)
    weights: bool = False  # reads the attention weights: eager in a prefill of its own, else H2O's sums' stand-in
    sums: Callable[[BasePress], frozenset[ColumnSums]] | None = None  # the column sums it reads instead
    rescores: bool = False  # after another press evicted, it scores the prompt's keys recomputed from every row
    protects: str = ""  # the parameter that counts the newest positions it never evicts
    refusal: str = ""  # why it cannot run on these protocols at all (path REFUSED)


def _window(press: BasePress) -> int:
    return press.window_size


def _rmm_rows(press: RMMPress) -> int | None:
    return 0 if isinstance(press.correctness, str) else ALL


def _rmm_sums(press: RMMPress) -> frozenset[ColumnSums]:
    return frozenset({press.statistic}) if isinstance(press.correctness, str) else frozenset()


def _h2o_sums(press: BasePress) -> frozenset[ColumnSums]:
    return frozenset({H2O_SUMS})


KEYS_ONLY = Declared(rows=0, blind=True)
# a wrapper that hands every row to its presses reads nothing itself; those that cut the input into chunks or
# blocks (``ChunkPress``, ``BlockPress``...) are undeclared: all rows
WRAPPER = Declared(rows=0, blind=True)
DECLARATIONS: dict[type, Declared] = {
    **dict.fromkeys([k.KnormPress, k.StreamingLLMPress, k.RandomPress, k.KeyDiffPress, k.LagKVPress], KEYS_ONLY),
    k.QFilterPress: KEYS_ONLY,
    k.ObservedAttentionPress: Declared(rows=0, weights=True, sums=_h2o_sums),
    k.SnapKVPress: Declared(rows=_window),
    k.PyramidKVPress: Declared(rows=_window),
    k.ThinKPress: Declared(rows=_window),
    k.TOVAPress: Declared(rows=1),
    TOVAPress: Declared(rows=1, rescores=True),
    RMMPress: Declared(rows=_rmm_rows, sums=_rmm_sums, rescores=True, protects="lag"),
    k.ExpectedAttentionPress: Declared(blind=True),
    k.ExpectedAttentionStatsPress: Declared(blind=True),
    **dict.fromkeys(
        [k.AdaKVPress, k.CriticalKVPress, k.CriticalAdaKVPress, k.KeyRerotationPress, k.ComposedPress], WRAPPER
    ),
    k.PerLayerCompressionPress: WRAPPER,
    RecentWindowPress: Declared(rows=0, blind=True, protects="window"),
    **dict.fromkeys([k.DecodingPress, k.CAMPress, k.CompressionRatioDecodingPress], Declared(path=DECODING)),
    k.PrefillDecodingPress: Declared(path=DECODING),
    k.DMSPress: Declared(
        path=REFUSED,
        refusal="DMSPress evicts by a score threshold, so no budget sets its size, and these protocols compare "
        "presses at equal budgets: give its scorer alone, e.g. kvzap(model_type='mlp')",
    ),
    **dict.fromkeys(
        [k.KVzipPress, k.FastKVzipPress, k.KVComposePress, k.KVgradPress, k.RestoreKVPress, k.FinchPress],
        Declared(path=OWN_PREFILL),
    ),
}


def declared(press: BasePress) -> Declared:
    """The press's own declaration; an undeclared class reads every row, and takes its own prefill if it
    replaces KVPress's context manager or forward hook (it may run anything)."""
    known = DECLARATIONS.get(type(press))
    if known is not None:
        return known
    hooks = type(press).__call__ is not BasePress.__call__ or type(press).forward_hook is not BasePress.forward_hook
    base = next((DECLARATIONS[cls] for cls in type(press).__mro__[1:] if cls in DECLARATIONS), Declared())
    # a subclass may read more than its base: every row, and its own prefill if its base or its hooks need one
    path = base.path if base.path != SHARED else OWN_PREFILL if hooks else SHARED
    return Declared(path=path, weights=base.weights, refusal=base.refusal)


SEEDED: dict[type, str] = {k.RandomPress: "seed"}  # each press class that draws unless seeded, and its seed's name
PRESS_SEED = 0


def given_arguments(cls: type, args: tuple, kwargs: dict) -> dict | None:
    """The parameters of ``cls`` that ``args`` and ``kwargs`` give, by name (positions bound to their names); None
    for arguments its constructor refuses (in its own words, when it is built) or a signature it hides."""
    try:
        return dict(inspect.signature(cls).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return None


def seeded(cls: type, args: tuple, kwargs: dict) -> dict:
    """``kwargs``, with ``PRESS_SEED`` as the seed of a ``SEEDED`` press class whose arguments give none (or None)."""
    name = next((name for seeded_class, name in SEEDED.items() if issubclass(cls, seeded_class)), None)
    given = None if name is None else given_arguments(cls, args, kwargs)
    if given is None or given.get(name) is not None:
        return kwargs
    return {**kwargs, name: PRESS_SEED}


def declared_refusal(cls: type) -> str:
    """Why a press class cannot run on these protocols at all, as declared ("" when it can)."""
    declaration = DECLARATIONS.get(cls)
    return declaration.refusal if declaration is not None else ""


def after_eviction(press: BasePress) -> list[BasePress]:
    """The presses of a ``ComposedPress`` that run after another has evicted (they see fewer keys than rows)."""
    return [
        late
        for p in every_press(press)
        if type(p) is k.ComposedPress
        for held in p.presses[1:]
        for late in every_press(held)
    ]


def commit_lag(press: BasePress | None) -> int | None:
    """The commit lag of the ``RMMPress`` a press holds (None: no RMMPress, or one at ``lag=None``)."""
    lags = [held.lag for held in every_press(press) if type(held) is RMMPress] if press is not None else []
    return next((lag for lag in lags if lag is not None), None)


BUDGET_PARAMETERS: dict[type, str] = {  # where a cell's budget goes, in place of ``compression_ratio``
    k.CompressionRatioDecodingPress: "target_compression_ratio",
    k.DecodingPress: "target_size",
    k.ThinKPress: "key_channel_compression_ratio",
    k.DuoAttentionPress: "head_compression_ratio",
}


def budget_parameters(cls: type) -> tuple[str, ...]:
    """The parameters of ``cls`` that a cell's budget sets (``set_ratio``), so that no spec may give them."""
    own = next((name for held, name in BUDGET_PARAMETERS.items() if issubclass(cls, held)), None)
    return ("compression_ratio",) if own is None else ("compression_ratio", own)


def set_ratio(press: BasePress, compression_ratio: float, length: int | None = None) -> None:
    """Set ``press`` to evict ``compression_ratio`` of a ``length``-token context, as KVPress's evaluation sets it.

    A decoding press keeps what the budget keeps of the context while the answer is generated: a
    ``DecodingPress`` (``CAMPress``) compresses to ``target_size`` = int(length x (1 - ratio)) positions (left as
    built while ``length`` is unknown), a ``CompressionRatioDecodingPress`` to the ratio itself, and a
    ``PrefillDecodingPress`` gives the budget to both its presses. ``ThinKPress`` and ``DuoAttentionPress`` take it
    as the ratio they have instead (``BUDGET_PARAMETERS``).

    Raises
    ------
    EvaluationError
        One line, for a press no ratio can set: a press with no ``compression_ratio`` or one it refuses.
    """
    own = budget_parameters(type(press))[-1]
    if isinstance(press, k.ComposedPress):
        for held in press.presses:
            set_ratio(held, compression_ratio, length)
    elif isinstance(press, k.PrefillDecodingPress):
        for part in (press.prefilling_press, press.decoding_press):
            if part is not None:
                set_ratio(part, compression_ratio, length)
    elif own == "target_size":
        if length is not None:
            press.target_size = max(1, int(length * (1 - compression_ratio)))
    elif own != "compression_ratio":
        setattr(press, own, compression_ratio)
    elif not isinstance(press, k.DMSPress):  # a threshold, not a ratio, sets its size: left as built
        if "compression_ratio" not in dir(press):  # dir, not hasattr: some getters assert a forward has run
            raise EvaluationError(f"{type(press).__name__} has no compression_ratio for the budget to set")
        try:
            press.compression_ratio = compression_ratio
        except (AttributeError, AssertionError, ValueError) as error:
            raise EvaluationError(f"{type(press).__name__} refuses a compression ratio: {error}") from error


def prefills_under(press: BasePress) -> bool:
    """Whether the context is prefilled under the press: not for KVPress's ``DecodingPress`` family, which leaves the
    prefill uncompressed (as KVPress's pipeline runs it)."""
    return not isinstance(press, k.DecodingPress)


def compresses_while_decoding(press: BasePress) -> bool:
    """Whether the press runs while the question is appended and the answer generated: as KVPress's pipeline decides
    it, by the outermost press (a ``DecodingPress``, ``CAMPress``, ``PrefillDecodingPress``)."""
    return isinstance(press, (k.DecodingPress, k.PrefillDecodingPress))


def question_position(press: BasePress | None, context_length: int, cache_length: int) -> int:
    """Where the question starts, as KVPress's pipeline puts it: after the whole context, except after a press that
    re-rotates the kept keys to positions 0..n-1 (``KeyRerotationPress``, ``FinchPress(rerotate_keys=True)``,
    ``RestoreKVPress``): after the n kept."""
    rerotated = isinstance(press, (k.KeyRerotationPress, k.RestoreKVPress))
    return cache_length if rerotated or (isinstance(press, k.FinchPress) and press.rerotate_keys) else context_length
