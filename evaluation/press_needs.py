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
  question on the streaming protocols) or ``decoding`` (it compresses while the answer is generated).

A class not declared here is read conservatively: every row, no sums, and its own prefill if it replaces
KVPress's context manager or forward hook. Wrappers take the union of what their presses read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kvpress.presses.base_press import BasePress

from presses.column_sums import H2O_SUMS, ColumnSums

SHARED, OWN_PREFILL, DECODING = "shared", "own-prefill", "decoding"


@dataclass(frozen=True)
class Needs:
    path: str
    rows: int | None  # newest rows of each layer's input it reads; None: every row
    sums: frozenset[ColumnSums] = frozenset()
    stand_in: bool = False  # whether its attention weights are H2O's sums as a one-row stand-in (else None)
    eager: bool = False  # whether a prefill under the press needs eager attention weights


ALL = None  # reads every row of the layer's input


@dataclass(frozen=True)
class Declared:
    rows: object = ALL  # an int, ALL, or a function of the press
    path: str = SHARED
    blind: bool = False  # never reads the attention weights (so H2O's stand-in may reach it)


@cache
def declarations() -> dict[type, Declared]:
    """Every press class whose inputs are known. Wrappers that hand every row to their presses read nothing
    themselves (rows 0); those that cut the input into chunks or blocks (``ChunkPress``, ``BlockPress``...) are
    undeclared: all rows."""
    import kvpress as k

    from presses import RMMPress, TOVAPress

    def window(press: BasePress) -> int:
        return press.window_size + 1  # SnapKV asserts more rows than its window

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
        **dict.fromkeys([k.DecodingPress, k.CAMPress, k.CompressionRatioDecodingPress], Declared(path=DECODING)),
        k.PrefillDecodingPress: Declared(path=DECODING),
        k.DMSPress: Declared(path=DECODING),
        **dict.fromkeys(
            [k.KVzipPress, k.FastKVzipPress, k.KVComposePress, k.KVgradPress, k.RestoreKVPress, k.FinchPress],
            Declared(path=OWN_PREFILL),
        ),
    }


def inner_presses(press: BasePress) -> list[BasePress]:
    """The presses ``press`` holds, through any attribute (``press``, ``presses``, ``base_press``...)."""
    found = []
    for value in vars(press).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found += [item for item in items if isinstance(item, BasePress)]
    return found


def every_press(press: BasePress) -> list[BasePress]:
    """The press and every press it holds, depth first."""
    return [press] + [inner for held in inner_presses(press) for inner in every_press(held)]


def declared(press: BasePress) -> Declared:
    """The press's own declaration; an undeclared class reads every row, and takes its own prefill if it
    replaces KVPress's context manager or forward hook (it may run anything)."""
    known = declarations().get(type(press))
    if known is not None:
        return known
    hooks = type(press).__call__ is not BasePress.__call__ or type(press).forward_hook is not BasePress.forward_hook
    return Declared(path=OWN_PREFILL if hooks else SHARED)


def _sums(press: BasePress) -> set[ColumnSums]:
    from kvpress import ObservedAttentionPress

    from presses import RMMPress

    if type(press) is ObservedAttentionPress:
        return {H2O_SUMS}
    if type(press) is RMMPress and isinstance(press.correctness, str):
        return {press.statistic}
    return set()


def needs(press: BasePress) -> Needs:
    """What ``press`` (a wrapper with every press it holds) reads of a prefill, and its path."""
    from kvpress import ObservedAttentionPress

    presses = every_press(press)
    own = [declared(p) for p in presses]
    paths = {d.path for d in own}
    path = DECODING if DECODING in paths else OWN_PREFILL if OWN_PREFILL in paths else SHARED
    rows = [d.rows(p) if callable(d.rows) else d.rows for p, d in zip(presses, own, strict=True)]
    readers = [p for p in presses if type(p) is ObservedAttentionPress]
    if readers and not all(d.blind or type(p) is ObservedAttentionPress for p, d in zip(presses, own, strict=True)):
        path = OWN_PREFILL if path == SHARED else path  # H2O's sums beside a press that reads attention rows
    return Needs(
        path=path,
        rows=ALL if ALL in rows else max(rows, default=0),
        sums=frozenset(s for p in presses for s in _sums(p)),
        stand_in=bool(readers),
        eager=bool(readers),
    )


def describe(press: BasePress | None) -> str:
    """How the engine serves a press, in words, as run.json records it."""
    if press is None:
        return "the full cache"
    return {
        SHARED: "shared prefill: its own hook on the stored inputs",
        OWN_PREFILL: "its own prefill",
        DECODING: "compresses while decoding",
    }[needs(press).path]
