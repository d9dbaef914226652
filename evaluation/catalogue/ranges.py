"""The ranges of KVPress's press parameters that its own constructors do not check: a spec's value outside one is
refused when the spec is resolved, before a model loads, instead of crashing mid-run or running a press that does
something else.

KVPress's constructors assert some ranges themselves (``AdaKVPress``'s ``alpha_safeguard``, ``DecodingPress``'s
``compression_interval`` and ``target_size``, ``KVzipPress``'s ``chunk_size``, every ``ScorerPress``'s
``compression_ratio``...): the resolution builds each press once (``evaluation.catalogue.resolved``), so those are
one-line errors in their own words and are not repeated here (but for one it asserts without a message); nor are this
project's presses, whose ``__post_init__`` checks every field. ``RANGES`` declares the rest, per class and parameter,
from what KVPress's code does with the value (``window_size=0`` slices ``[-0:]``, the whole prompt; an even
``kernel_size`` pads the pooled scores one longer than the keys). A subclass inherits its bases' ranges for the
parameters it keeps. The ratio a cell's budget sets is not here: a spec's ``compression_ratio`` is refused, and a budget
is checked where it is given (``catalogue.budgets``).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import kvpress as k

SEEDS = 2**64  # torch.Generator.manual_seed takes seeds below it


@dataclass(frozen=True)
class Range:
    """The values a parameter takes: from ``low`` to ``high`` (each end included unless ``*_open``), odd ones only
    where ``odd``; ``what`` says what the parameter counts."""

    what: str
    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    odd: bool = False

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below and (not self.odd or value % 2 == 1)

    def __str__(self) -> str:
        if self.high == math.inf:
            bounds = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            high = "2**64" if self.high == SEEDS else f"{self.high:g}"
            bounds = f"in {'(' if self.low_open else '['}{self.low:g}, {high}{')' if self.high_open else ']'}"
        return f"odd and {bounds}" if self.odd else bounds


SINKS = Range("the first positions never evicted", 0)
QUERY_WINDOW = Range("the newest queries that score the keys", 1)
EPSILON = Range("added to every score before it is weighed", 0)
FUTURE = Range("the future positions whose queries are estimated", 1)
CHUNK = Range("positions per chunk", 1)
FIRST_STAGE = Range("the budget's share of the first stage", 0, 1)
RANGES: dict[type, dict[str, Range]] = {
    k.SnapKVPress: {"window_size": QUERY_WINDOW, "kernel_size": Range("the width of the scores' pooling", 1, odd=True)},
    k.PyramidKVPress: {"beta": Range("the steepness of the pyramid of layer budgets", 1)},
    k.ThinKPress: {"window_size": QUERY_WINDOW},
    k.StreamingLLMPress: {"n_sink": SINKS},
    k.RandomPress: {"seed": Range("the draws of the random scores", 0, SEEDS, high_open=True)},
    k.LagKVPress: {"n_sink": SINKS, "lag_size": Range("positions per partition", 1)},
    k.ChunkPress: {"chunk_length": CHUNK},
    k.ChunkKVPress: {"chunk_length": CHUNK},
    k.BlockPress: {"block_size": CHUNK},
    k.ExpectedAttentionPress: {"n_future_positions": FUTURE, "n_sink": SINKS, "epsilon": EPSILON},
    k.ExpectedAttentionStatsPress: {
        "sample_seq_len": Range("tokens per sample of the statistics", 1),
        "num_samples": Range("samples of the statistics", 1),
    },
    k.CapPress: {"n_future_positions": FUTURE, "n_sink": SINKS, "epsilon": EPSILON},
    k.CriticalKVPress: {"epsilon": EPSILON, "first_stage_ratio": FIRST_STAGE},
    k.CriticalAdaKVPress: {"epsilon": EPSILON, "first_stage_ratio": FIRST_STAGE},
    k.CURPress: {"num_sinks": SINKS, "local_window_size": Range("positions per normalised window", 1)},
    k.DecodingPress: {"hidden_states_buffer_size": Range("the hidden states kept for scoring", 0)},
    k.FastKVzipPress: {
        "n_sink": SINKS,
        "window_size": Range("the newest positions never evicted in a long context", 1),
        "window_ratio": Range("the share of a short context never evicted", 0, 1),
    },
    k.FinchPress: {"chunk_length": CHUNK},
    k.KVComposePress: {"keep_token_lower_bound": Range("the first positions always kept", 0)},
    k.KVzipPress: {"n_sink": SINKS},
    k.SimLayerKVPress: {
        "n_last": QUERY_WINDOW,
        "n_recent": Range("the newest positions a lazy layer keeps", 1),
        "n_initial": SINKS,
    },
    k.CompactorPress: {
        "sink_size_start": SINKS,
        "sink_size_end": Range("the newest positions never evicted", 0),
        "chunk_size": CHUNK,
        "sketch_dimension": Range("the dimension of the keys' sketch", 1),
        "blending": Range("the weight of the leverage scores", 0, 1),
    },
    k.LeverageScorePress: {"sketch_dimension": Range("the dimension of the keys' sketch", 1)},
    k.NonCausalAttnPress: {"chunk_size": CHUNK},
    # KVPress asserts it without a message
    k.MergingPress: {"similarity_threshold": Range("the least similarity at which keys merge", 0, 1)},
}


def ranges(cls: type) -> dict[str, Range]:
    """The declared ranges of ``cls``'s parameters, its bases' included (a subclass's own declaration first)."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    found: dict[str, Range] = {}
    for base in reversed(cls.__mro__):
        found |= RANGES.get(base, {})
    return {name: declared for name, declared in found.items() if name in parameters}


def range_refusal(cls: type, arguments: dict[str, object]) -> str:
    """Why a value of ``arguments`` (a spec's, bound to ``cls``'s parameters) is outside its declared range ("" when
    none is)."""
    for name, declared in ranges(cls).items():
        value = arguments.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not declared.admits(value):
            return f"{cls.__name__}'s {name} ({declared.what}) must be {declared}, not {value!r}"
    return ""
