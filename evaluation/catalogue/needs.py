"""What each press reads of a prefill, and so how the evaluation engine serves it: the one place that knows presses.

A prefill press prunes each layer's cache after that layer's attention, from that layer's inputs: its hidden
states, the rotary embeddings, the layer's keys and values and, under eager attention, the attention weights.
So one uncompressed prefill can serve every such press: keep what its hook would have received and run its own
hook on it (``evaluation.engine``). What to keep is declared here, per press class:

- ``rows``: how many of the newest rows of each layer's input the press reads (None: all of them);
- ``sums``: the column sums of the attention weights it reads instead of the weights themselves
  (``presses.column_sums``): ``ObservedAttentionPress`` reads H2O's sums, handed to it as a one-row stand-in for
  the eager matrix; ``RMMPress`` its own statistic, handed through the attention module;
- ``path``: ``shared`` (the engine runs its hook on the stored inputs), ``own-prefill`` (it runs forward passes of
  its own, or mixes H2O's sums with presses that read attention rows: a prefill under the press per cell, per
  question on the streaming protocols), ``decoding`` (it compresses while the answer is generated) or ``refused``
  (it cannot run on these protocols at all: ``refusal`` says why).

A class not declared here is read conservatively: every row, no sums, and its own prefill if it replaces
KVPress's context manager or forward hook. Wrappers take the union of what their presses read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kvpress.presses.base_press import BasePress

from presses.column_sums import H2O_SUMS, ColumnSums
from presses.wrapped import every_press

SHARED, OWN_PREFILL, DECODING, REFUSED = "shared", "own-prefill", "decoding", "refused"


@dataclass(frozen=True)
class Needs:
    path: str
    rows: int | None  # newest rows of each layer's input it reads; None: every row
    sums: frozenset[ColumnSums] = frozenset()
    reads_weights: bool = False  # it reads the attention weights: eager in a prefill of its own; in the engine,
    # H2O's sums as a one-row stand-in for them
    refusal: str = ""  # why it cannot run at all (path REFUSED)


ALL = None  # reads every row of the layer's input


@dataclass(frozen=True)
class Declared:
    rows: object = ALL  # an int, ALL, or a function of the press
    path: str = SHARED
    blind: bool = False  # never reads the attention weights (so H2O's stand-in may reach it)
    refusal: str = ""  # why it cannot run on these protocols at all (path REFUSED)


@cache
def declarations() -> dict[type, Declared]:
    """Every press class whose inputs are known. Wrappers that hand every row to their presses read nothing
    themselves (rows 0); those that cut the input into chunks or blocks (``ChunkPress``, ``BlockPress``...) are
    undeclared: all rows."""
    import kvpress as k

    from presses import RecentWindowPress, RMMPress, TOVAPress

    def window(press: BasePress) -> int:
        return press.window_size

    keys_only = Declared(rows=0, blind=True)
    wrapper = Declared(rows=0, blind=True)
    return {
        **dict.fromkeys([k.KnormPress, k.StreamingLLMPress, k.RandomPress, k.KeyDiffPress, k.LagKVPress], keys_only),
        k.QFilterPress: keys_only,
        k.ObservedAttentionPress: Declared(rows=0),
        k.SnapKVPress: Declared(rows=window),
        k.PyramidKVPress: Declared(rows=window),
        k.ThinKPress: Declared(rows=window),
        k.TOVAPress: Declared(rows=1),
        TOVAPress: Declared(rows=1),
        RMMPress: Declared(rows=lambda press: 0 if isinstance(press.correctness, str) else ALL),
        k.ExpectedAttentionPress: Declared(blind=True),
        k.ExpectedAttentionStatsPress: Declared(blind=True),
        **dict.fromkeys(
            [k.AdaKVPress, k.CriticalKVPress, k.CriticalAdaKVPress, k.KeyRerotationPress, k.ComposedPress], wrapper
        ),
        k.PerLayerCompressionPress: wrapper,
        RecentWindowPress: wrapper,
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
    known = declarations().get(type(press))
    if known is not None:
        return known
    hooks = type(press).__call__ is not BasePress.__call__ or type(press).forward_hook is not BasePress.forward_hook
    base = next((declarations()[cls] for cls in type(press).__mro__[1:] if cls in declarations()), Declared())
    # a subclass may read more than its base: every row, and its own prefill if its base or its hooks need one
    return Declared(path=base.path if base.path != SHARED else OWN_PREFILL if hooks else SHARED, refusal=base.refusal)


def _sums(press: BasePress) -> set[ColumnSums]:
    from kvpress import ObservedAttentionPress

    from presses import RMMPress

    if type(press) is ObservedAttentionPress:
        return {H2O_SUMS}
    if type(press) is RMMPress and isinstance(press.correctness, str):
        return {press.statistic}
    return set()


def _after_eviction(press: BasePress) -> list[BasePress]:
    """The presses of a ``ComposedPress`` that run after another has evicted (they see fewer keys than rows)."""
    from kvpress import ComposedPress

    return [
        late
        for p in every_press(press)
        if type(p) is ComposedPress
        for held in p.presses[1:]
        for late in every_press(held)
    ]


def needs(press: BasePress) -> Needs:
    """What ``press`` (a wrapper with every press it holds) reads of a prefill, and its path."""
    from kvpress import ObservedAttentionPress

    from presses import RMMPress, TOVAPress

    presses = every_press(press)
    own = [declared(p) for p in presses]
    paths = {d.path for d in own}
    path = DECODING if DECODING in paths else OWN_PREFILL if OWN_PREFILL in paths else SHARED
    rows = [d.rows(p) if callable(d.rows) else d.rows for p, d in zip(presses, own, strict=True)]
    late = _after_eviction(press)
    if any(type(p) in (TOVAPress, RMMPress) for p in late):
        rows.append(ALL)  # after another press evicted, ours score the prompt's keys, recomputed from every row
    refusals = [d.refusal for d in own if d.path == REFUSED]
    if any(isinstance(p, ObservedAttentionPress) for p in late):
        refusals.append(
            "ObservedAttentionPress after a press that evicts sums attention over keys "
            "that press removed (KVPress's ComposedPress documents it fails): put it first"
        )
    if refusals:
        return Needs(REFUSED, ALL, refusal=refusals[0])
    readers = [p for p in presses if isinstance(p, ObservedAttentionPress)]
    exact = all(type(p) is ObservedAttentionPress for p in readers)
    if readers and not (exact and all(d.blind or p in readers for p, d in zip(presses, own, strict=True))):
        path = OWN_PREFILL if path == SHARED else path  # an eager prefill: beside attention rows, or a subclass
    return Needs(
        path=path,
        rows=combined(rows),
        sums=frozenset(s for p in presses for s in _sums(p)),
        reads_weights=bool(readers),
    )


def combined(rows: list[int | None]) -> int | None:
    """The rows to keep for presses that read these: every row if one reads them all, else the most any reads."""
    return ALL if ALL in rows else max(rows, default=0)


def describe(press: BasePress | None) -> str:
    """How the engine serves a press, in words, as run.json records it."""
    if press is None:
        return "the full cache"
    return {
        SHARED: "shared prefill: its own hook on the stored inputs",
        OWN_PREFILL: "its own prefill",
        DECODING: "compresses while decoding",
        REFUSED: "refused",
    }[needs(press).path]


def prefills_under(press: BasePress) -> bool:
    """Whether the context is prefilled under the press: not for KVPress's ``DecodingPress`` family, which leaves the
    prefill uncompressed (as KVPress's pipeline runs it)."""
    from kvpress import DecodingPress

    return not isinstance(press, DecodingPress)


def compresses_while_decoding(press: BasePress) -> bool:
    """Whether the press runs while the question is appended and the answer generated: as KVPress's pipeline decides
    it, by the outermost press (a ``DecodingPress``, ``CAMPress``, ``PrefillDecodingPress``)."""
    from kvpress import DecodingPress, PrefillDecodingPress

    return isinstance(press, (DecodingPress, PrefillDecodingPress))


def question_position(press: BasePress | None, context_length: int, cache_length: int) -> int:
    """Where the question starts, as KVPress's pipeline puts it: after the whole context, except after a press that
    re-rotates the kept keys to positions 0..n-1 (``KeyRerotationPress``, ``FinchPress(rerotate_keys=True)``,
    ``RestoreKVPress``): after the n kept."""
    from kvpress import FinchPress, KeyRerotationPress, RestoreKVPress

    rerotated = isinstance(press, (KeyRerotationPress, RestoreKVPress))
    return cache_length if rerotated or (isinstance(press, FinchPress) and press.rerotate_keys) else context_length


def budget_refusal(press: BasePress, kept: int) -> str:
    """Why ``press`` cannot keep ``kept`` positions at all ("" when it can): an ``RMMPress`` never evicts its
    ``lag`` newest positions, a ``RecentWindowPress`` its ``window`` newest, so a budget must hold them and one
    slot more."""
    from presses import RecentWindowPress, RMMPress

    for held in every_press(press):
        if type(held) is RMMPress and held.lag is not None and held.lag >= kept:
            return f"RMMPress(lag={held.lag}) keeps its {held.lag} newest positions provisional: use a lag below {kept}"
        if type(held) is RecentWindowPress and held.window >= kept:
            return (
                f"RecentWindowPress(window={held.window}) never evicts its {held.window} newest positions: use a "
                f"window below {kept}"
            )
    return ""


def commit_lag(press: BasePress | None) -> int | None:
    """The commit lag of the ``RMMPress`` a press holds (None: no RMMPress, or one at ``lag=None``)."""
    from presses import RMMPress

    lags = [held.lag for held in every_press(press) if type(held) is RMMPress] if press is not None else []
    return next((lag for lag in lags if lag is not None), None)
