"""A press spec resolved once, at the start of a run: its name, how to build its press for a cell, and what the
press declares of itself, so that nothing after the start parses a spec or builds a press to ask it a question.

``resolve_presses`` checks a run's specs before any work: each is parsed, its names looked up, its press built
once (at a compression ratio of 0.5, as a cell sets it) and its declarations read; a press these protocols cannot
run is refused. ``resolve_press`` is also the lookup by label: it resolves each spec once per process.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from dataclasses import dataclass, fields, is_dataclass
from functools import cache

from kvpress.presses.base_press import BasePress

from evaluation.catalogue.needs import NOTHING, Needs, Protected, budget_refusal, needs, protected
from evaluation.catalogue.registry import (
    DECODING,
    OWN_PREFILL,
    REFUSED,
    SHARED,
    commit_lag,
    compresses_while_decoding,
    press_class,
    set_ratio,
)
from evaluation.catalogue.specs import FULL_CACHE, PressCall, canonical, plan_spec
from evaluation.errors import EvaluationError, first_line

CHECKED_RATIO = 0.5  # the compression ratio a spec's press is built at when it is resolved
DESCRIPTIONS = {
    SHARED: "shared prefill: its own hook on the stored inputs",
    OWN_PREFILL: "its own prefill",
    DECODING: "compresses while decoding",
    REFUSED: "refused",
}


@dataclass(frozen=True)
class Blueprint:
    """A press a spec names, its class found and its parameters checked: each ``build`` constructs it anew."""

    cls: type
    args: tuple
    kwargs: dict

    def build(self, label: str, compression_ratio: float | None = None, length: int | None = None) -> BasePress:
        """A fresh press, at ``compression_ratio`` of a ``length``-token context as KVPress's evaluation sets it
        (``set_ratio``), or as its constructor builds it when no ratio is given; ``label`` names the spec in a
        refusal's message."""
        args = [_built(arg, label) for arg in self.args]
        kwargs = {name: _built(value, label) for name, value in self.kwargs.items()}
        try:
            press = self.cls(*args, **kwargs)
        except Exception as error:  # a press refusing its parameters, in its own words, on one line
            raise EvaluationError(f"press spec {label!r}: {self.cls.__name__}: {first_line(error)}") from error
        if compression_ratio is not None:
            try:
                set_ratio(press, compression_ratio, length)
            except EvaluationError as error:
                raise EvaluationError(f"press spec {label!r}: {error}") from None
        return press


def _built(value: object, label: str) -> object:
    if isinstance(value, Blueprint):
        return value.build(label)
    if isinstance(value, (list, tuple)):
        return type(value)(_built(item, label) for item in value)
    return copy.deepcopy(value)  # a literal: no press shares a dict with another


def _blueprint(value: object, spec: str) -> object:
    """A value of a spec with its press calls resolved: each class looked up (an import path imported), its
    parameters checked against its constructor."""
    if isinstance(value, (list, tuple)):
        return type(value)(_blueprint(item, spec) for item in value)
    if not isinstance(value, PressCall):
        return value
    cls = press_class(value.name, spec)
    parameters = (
        [f.name for f in fields(cls) if f.init] if is_dataclass(cls) else list(inspect.signature(cls).parameters)
    )
    unknown = [name for name in value.kwargs if name not in parameters]
    if unknown:
        raise EvaluationError(
            f"press spec {spec!r}: {cls.__name__} has no parameter {', '.join(unknown)}; "
            f"its parameters: {', '.join(parameters) or 'none'}"
        )
    return Blueprint(cls, _blueprint(value.args, spec), {name: _blueprint(v, spec) for name, v in value.kwargs.items()})


@dataclass(frozen=True)
class ResolvedPress:
    """A press spec, resolved: its ``label`` (the canonical spec, its name in every row and table), the
    ``blueprint`` its presses are built from (None for the full cache) and what its press declares: what it reads
    of a prefill and its path (``needs``), whether it compresses while the answer is generated (``decodes``), the
    newest positions it never evicts (``protected``) and the commit lag of the ``RMMPress`` it holds."""

    label: str
    blueprint: Blueprint | None
    needs: Needs
    decodes: bool = False
    protected: tuple[Protected, ...] = ()
    commit_lag: int | None = None

    def build(self, compression_ratio: float | None = None, length: int | None = None) -> BasePress | None:
        """A fresh press (``Blueprint.build``); None for the full cache.

        Raises
        ------
        EvaluationError
            One line, for a press that refuses its parameters or the ratio.
        """
        return None if self.blueprint is None else self.blueprint.build(self.label, compression_ratio, length)

    @property
    def shares_prefill(self) -> bool:
        """Whether the engine serves it from a shared prefill (the full cache too)."""
        return self.needs.path == SHARED

    @property
    def reads_weights(self) -> bool:
        """Whether it reads the attention weights (so its own prefill runs eager attention)."""
        return self.needs.reads_weights

    def describe(self) -> str:
        """How the engine serves it, in words, as run.json records it."""
        return "the full cache" if self.blueprint is None else DESCRIPTIONS[self.needs.path]

    def budget_refusal(self, kept: int) -> str:
        """Why it cannot keep ``kept`` positions at all ("" when it can)."""
        return budget_refusal(self.protected, kept)


@cache
def resolve_press(spec: str) -> ResolvedPress:
    """The press ``spec`` names, resolved once per process (a label looks up its resolved press here).

    Raises
    ------
    EvaluationError
        One line, for any spec that is not a press, or whose press refuses its parameters or a ratio.
    """
    label = canonical(spec)
    if label == FULL_CACHE:
        return ResolvedPress(label, None, NOTHING)
    plan = _blueprint(plan_spec(spec), spec)
    press = plan.build(spec, CHECKED_RATIO)
    decodes = compresses_while_decoding(press)
    return ResolvedPress(label, plan, needs(press), decodes, protected(press), commit_lag(press))


def resolve_presses(specs: Iterable[str]) -> list[ResolvedPress]:
    """A run's presses, each spec resolved and checked before any work, so that a mistake is reported before the
    model loads.

    Raises
    ------
    EvaluationError
        One line, for a spec that is not a press, or a press these protocols cannot run.
    """
    resolved = []
    for spec in specs:
        press = resolve_press(spec)
        if press.needs.path == REFUSED:
            raise EvaluationError(f"press spec {press.label!r}: {press.needs.refusal}")
        resolved.append(press)
    return resolved


def make_press(spec: str, compression_ratio: float | None = None, length: int | None = None) -> BasePress | None:
    """A fresh press of ``spec`` (``ResolvedPress.build``): for a caller that holds a spec, not a run's presses."""
    return resolve_press(spec).build(compression_ratio, length)
