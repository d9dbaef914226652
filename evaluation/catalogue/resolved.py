"""A press spec resolved once, at the start of a run: its name, how to build its press for a cell, and what the
press declares of itself, so that nothing after the start parses a spec or builds a press to ask it a question.

``resolve_presses`` checks a run's specs before any work: each is parsed, its names looked up, its values checked
against the types its classes declare (``evaluation.catalogue.parameters``), its press built once (at a compression
ratio of 0.5, as a cell sets it, so that whatever the press's own constructor or check refuses is reported here) and its
declarations read; a press these protocols cannot run is refused. An import path (``package.module:Press``) is imported
only when the run allows it (``--allow-import``); a dry run imports none: it checks the rest of the spec, builds each
press that holds no import path, and says what a real run would import. A resolved press is a value: a run's cells carry
theirs (``catalogue.budgets.Cell``) through its plan, its units and its backend to every process that serves them, so
that no process resolves a spec again and nothing is remembered per process.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from kvpress.presses.base_press import BasePress

from evaluation.catalogue.downloads import fetched, missing
from evaluation.catalogue.needs import NOTHING, Needs, Protected, budget_refusal, needs, protected
from evaluation.catalogue.parameters import Pending, check_arguments
from evaluation.catalogue.registry import (
    ALL,
    DECODING,
    OWN_PREFILL,
    PRESS_CLASSES,
    REFUSED,
    SHARED,
    budget_parameters,
    commit_lag,
    compresses_while_decoding,
    declared_refusal,
    given_arguments,
    press_class,
    seeded,
    set_ratio,
)
from evaluation.catalogue.specs import FULL_CACHE, PressCall, canonical, import_paths, is_import_path, plan_spec
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


def _blueprint(value: object, spec: str, allow_import: bool, dry_run: bool) -> object:
    """A value of a spec with its press calls resolved: each class looked up (an import path imported where
    allowed, or ``Pending`` in a dry run), its arguments checked against the parameters it declares."""
    if isinstance(value, (list, tuple)):
        return type(value)(_blueprint(item, spec, allow_import, dry_run) for item in value)
    if not isinstance(value, PressCall):
        return value
    pending = dry_run and allow_import and is_import_path(value.name)
    cls = None if pending else press_class(value.name, spec, allow_import)
    args = _blueprint(value.args, spec, allow_import, dry_run)
    kwargs = {name: _blueprint(item, spec, allow_import, dry_run) for name, item in value.kwargs.items()}
    if cls is None:
        return Pending(value.name)
    check_arguments(cls, _as_checked(args), {name: _as_checked(item) for name, item in kwargs.items()}, spec)
    return Blueprint(cls, args, seeded(cls, args, kwargs))


def _build_known(value: object, label: str) -> None:
    """Build once each press of a dry run's plan that holds no ``Pending`` press, so that what its constructor
    refuses is reported as a real run reports it; a press that holds one is checked through its own presses."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _build_known(item, label)
    elif isinstance(value, Blueprint):
        if _holds_pending(value):
            _build_known([*value.args, *value.kwargs.values()], label)
        else:
            value.build(label)


def _holds_pending(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return any(map(_holds_pending, value))
    if isinstance(value, Blueprint):
        return _holds_pending([*value.args, *value.kwargs.values()])
    return isinstance(value, Pending)


def _budget_set(value: object) -> str:
    """The parameter a cell's budget sets (``registry.budget_parameters``) that a blueprint, or a press it holds, is
    given (by name or by position); "" when none."""
    if isinstance(value, (list, tuple)):
        return next((name for name in map(_budget_set, value) if name), "")
    if not isinstance(value, Blueprint):
        return ""
    given = given_arguments(value.cls, value.args, value.kwargs) or {}
    own = next((name for name in budget_parameters(value.cls) if name in given), "")
    return own or _budget_set(value.args) or _budget_set(list(value.kwargs.values()))


def _as_checked(value: object) -> object:
    """A resolved value as ``check_arguments`` reads it: each press by its class."""
    if isinstance(value, Blueprint):
        return value.cls
    if isinstance(value, (list, tuple)):
        return type(value)(_as_checked(item) for item in value)
    return value


@dataclass(frozen=True)
class ResolvedPress:
    """A press spec, resolved: its ``label`` (the canonical spec, its name in every row and table), the
    ``blueprint`` its presses are built from (None for the full cache) and what its press declares: what it reads
    of a prefill and its path (``needs``), whether it compresses while the answer is generated (``decodes``), the
    newest positions it never evicts (``protected``) and the commit lag of the ``RMMPress`` it holds; the import
    paths its spec names (``imports``), what its presses fetch when applied to a model (``fetches``,
    ``evaluation.catalogue.downloads``), and whether it is a dry run's (``dry``: its import paths not imported, no
    press built, its needs unknown and read as a press on its own prefill)."""

    label: str
    blueprint: Blueprint | None
    needs: Needs
    decodes: bool = False
    protected: tuple[Protected, ...] = ()
    commit_lag: int | None = None
    imports: tuple[str, ...] = ()
    dry: bool = False
    fetches: tuple[str, ...] = ()

    def __hash__(self) -> int:  # its label names it (its blueprint's values may be lists)
        return hash(self.label)

    def build(self, compression_ratio: float | None = None, length: int | None = None) -> BasePress | None:
        """A fresh press (``Blueprint.build``); None for the full cache.

        Raises
        ------
        EvaluationError
            One line, for a press that refuses its parameters or the ratio, or a dry run's (nothing imported).
        """
        if self.dry:
            raise EvaluationError(f"press spec {self.label!r}: a dry run imports nothing, so it builds no press")
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
        if self.dry:
            return f"a real run imports {', '.join(self.imports)} and checks it; a dry run imports nothing"
        return "the full cache" if self.blueprint is None else DESCRIPTIONS[self.needs.path]

    def budget_refusal(self, kept: int) -> str:
        """Why it cannot keep ``kept`` positions at all ("" when it can)."""
        return budget_refusal(self.protected, kept)

    def missing_for(self, model: str) -> str:
        """Why what it fetches does not exist for ``model`` ("" when it may, or it fetches nothing)."""
        return missing(self.build(CHECKED_RATIO), model) if self.fetches else ""


UNKNOWN = Needs(OWN_PREFILL, ALL)  # a press no dry run imports: read as one that may run anything


def resolve_press(spec: str, allow_import: bool = False, dry_run: bool = False) -> ResolvedPress:
    """The press ``spec`` names, resolved: its spec parsed and checked, its press built once and its declarations
    read; ``allow_import`` allows its import paths (``--allow-import``), which a ``dry_run`` names without importing
    them.

    Raises
    ------
    EvaluationError
        One line, for a spec that is not a press, an import path not allowed, or a press that refuses its
        parameters or a ratio.
    """
    label = canonical(spec)
    if label == FULL_CACHE:
        return ResolvedPress(label, None, NOTHING)
    call = plan_spec(spec)
    plan = _blueprint(call, spec, allow_import, dry_run)
    paths = import_paths(call)
    if dry_run and paths:
        _build_known(plan, spec)
        return ResolvedPress(label, None, UNKNOWN, imports=paths, dry=True)
    press = plan.build(spec, CHECKED_RATIO)
    return ResolvedPress(
        label,
        plan,
        needs(press),
        compresses_while_decoding(press),
        protected(press),
        commit_lag(press),
        paths,
        fetches=fetched(press),
    )


def resolve_presses(
    specs: Iterable[str], allow_import: bool = False, dry_run: bool = False, model: str | None = None
) -> list[ResolvedPress]:
    """A run's presses, each spec resolved and checked before any work, so that a mistake is reported before the
    model loads; ``allow_import`` allows its import paths (``--allow-import``), which a ``dry_run`` names without
    importing them. With a ``model``, a real run refuses a press whose files do not exist for it.

    Raises
    ------
    EvaluationError
        One line, for a spec that is not a press, an import path not allowed, a spec that sets a parameter a
        run's budget sets (``registry.budget_parameters``), a press these protocols cannot run, one whose files do
        not exist for ``model``, or two specs that build the same press.
    """
    resolved = []
    for spec in specs:
        refusal = _declared_refusal(plan_spec(spec))
        if refusal:
            raise EvaluationError(f"press spec {spec!r}: {refusal}")
        press = resolve_press(spec, allow_import, dry_run)
        budget_set = _budget_set(press.blueprint)
        if budget_set:
            raise EvaluationError(
                f"press spec {press.label!r}: {budget_set} is the budget's to set (a run sets it per cell from "
                "--ratios or --budgets, as KVPress's evaluation does, or holds its budget in tokens), so the spec's "
                "would not be the one run: leave it out"
            )
        if press.needs.path == REFUSED:
            raise EvaluationError(f"press spec {press.label!r}: {press.needs.refusal}")
        why = press.missing_for(model) if model is not None and not dry_run else ""
        if why:
            raise EvaluationError(f"press spec {press.label!r} needs {press.fetches[0]}: {why}")
        resolved.append(press)
    refuse_same_press(resolved)
    return resolved


def refuse_same_press(presses: list[ResolvedPress]) -> None:
    """Two names of one press (``knorm`` and ``KnormPress``, ``snapkv`` and ``snapkv(window_size=64)`` where 64 is
    its default, ``adakv(snapkv)`` and ``adakv(press=snapkv)``: one class with the same parameters) are an error:
    a press is tallied once, under one name."""
    built = [(p.label, p.blueprint.cls.__name__, _identity(p.blueprint)) for p in presses if p.blueprint is not None]
    for index, (label, name, identity) in enumerate(built):
        for other, _, other_identity in built[:index]:
            if other != label and other_identity == identity:
                raise EvaluationError(
                    f"press specs {other!r} and {label!r} build the same press ({name} with the same parameters, "
                    "defaults included): give it once, under one name"
                )


def _identity(value: object) -> object:
    """What a blueprint builds, comparable with ``==``: its class and every argument by name, defaults included
    (``inspect.Signature.bind``), a press among them by its own identity."""
    if isinstance(value, (list, tuple)):
        return type(value)(_identity(item) for item in value)
    if not isinstance(value, Blueprint):
        return value
    try:
        bound = inspect.signature(value.cls).bind(*value.args, **value.kwargs)
    except (TypeError, ValueError):  # a signature that hides its parameters: compared as given
        return value.cls, _identity(value.args), {name: _identity(item) for name, item in value.kwargs.items()}
    bound.apply_defaults()
    return value.cls, {name: _identity(item) for name, item in bound.arguments.items()}


def _declared_refusal(value: object) -> str:
    """Why a press class a spec names cannot run on these protocols, before any is built ("" when none)."""
    if isinstance(value, (list, tuple)):
        return next((why for why in map(_declared_refusal, value) if why), "")
    if not isinstance(value, PressCall) or value.name not in PRESS_CLASSES:
        return ""
    held = [*value.args, *value.kwargs.values()]
    return declared_refusal(PRESS_CLASSES[value.name]) or _declared_refusal(held)


def fetch_notes(presses: Iterable[ResolvedPress], model: str) -> list[str]:
    """A dry run's words for each press that fetches files when applied to ``model``: what, and where they do not
    exist for it, that a real run refuses it before the model loads."""
    notes = []
    for press in {press.label: press for press in presses}.values():
        why = press.missing_for(model)
        refused = f" (not for this model: {why}; a real run refuses it before the model loads)" if why else ""
        notes += [f"for {press.label}, {what}{refused}" for what in press.fetches]
    return notes


def make_press(
    spec: str, compression_ratio: float | None = None, length: int | None = None, allow_import: bool = False
) -> BasePress | None:
    """A fresh press of ``spec`` (``ResolvedPress.build``): for a caller that holds a spec, not a run's presses;
    ``allow_import`` allows its import paths."""
    return resolve_press(spec, allow_import).build(compression_ratio, length)


def commit_lag_of(spec: str) -> int | None:
    """The commit lag of the ``RMMPress`` a row's press label names, for a scorecard; None for a label that names an
    import path, which a scorecard never imports (it would run the module)."""
    return None if import_paths(plan_spec(spec)) else resolve_press(spec).commit_lag
