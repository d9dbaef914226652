"""A press class's parameters and their declared types: a spec's values checked against them before any press is
built.

The types are what the class declares: its constructor's annotations (``typing.get_type_hints``; a dataclass's are its
fields'). A value fits its parameter's type as Python reads the annotation: a whole number for ``int`` (a bool is not
one), any finite number for ``float``, ``True`` or ``False`` for ``bool``, a string for ``str``, one of the values of a
``Literal``, ``None`` where the type allows it, a list or tuple for a sequence type (each item checked) and a press of
the declared class (or a subclass) for a press parameter; a number within the range ``evaluation.catalogue.ranges``
declares for it, where KVPress's constructor does not check one. An annotation these rules do not read (a ``Callable``,
a name the module cannot resolve) is left to the constructor, which the resolution calls once
(``evaluation.catalogue.resolved``). A wrapper (a class whose public parameters take presses) holds at least one press,
given or its own default: ``composed([])`` or ``prefill_decoding()`` would keep every token under any budget.

A nested press is given here by its class; a press a dry run names by import path, and does not import, is
``Pending``: it fits any press parameter.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from dataclasses import dataclass

from kvpress.presses.base_press import BasePress

from evaluation.catalogue.ranges import range_refusal
from evaluation.errors import EvaluationError

SEQUENCES = (
    list,
    tuple,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Collection,
    collections.abc.Iterable,
)
MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
VAR_POSITIONAL, VAR_KEYWORD = inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
SCALARS = {bool: "True or False", int: "a whole number", float: "a finite number", str: "a string"}


@dataclass(frozen=True)
class Pending:
    """A press a dry run names by import path without importing it."""

    path: str


def check_arguments(cls: type, args: tuple, kwargs: dict, spec: str) -> None:
    """Check a spec's arguments for ``cls`` (nested presses given by their class, or ``Pending``) against the
    parameters ``cls`` declares: each named one exists, the call binds, and each value fits its declared type and
    range.

    Raises
    ------
    EvaluationError
        One line naming the spec, the class, the parameter and what it takes.
    """
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a constructor Python cannot describe: the constructor itself decides
        return
    kinds = {name: parameter.kind for name, parameter in signature.parameters.items()}
    named = [name for name, kind in kinds.items() if kind not in (VAR_POSITIONAL, VAR_KEYWORD)]
    unknown = [name for name in kwargs if name not in named]
    if unknown and VAR_KEYWORD not in kinds.values():
        raise EvaluationError(
            f"press spec {spec!r}: {cls.__name__} has no parameter {', '.join(unknown)}; "
            f"its parameters: {', '.join(named) or 'none'}"
        )
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise EvaluationError(f"press spec {spec!r}: {cls.__name__}: {error}") from None
    hints = declared_types(cls)
    for name, value in bound.arguments.items():
        if kinds[name] == VAR_KEYWORD:
            given = list(value.items())
        else:
            given = [(name, item) for item in value] if kinds[name] == VAR_POSITIONAL else [(name, value)]
        for parameter, item in given:
            if not fits(item, hints.get(name, typing.Any)):
                raise EvaluationError(
                    f"press spec {spec!r}: {cls.__name__}'s {parameter} is {described(hints[name])}, not {shown(item)}"
                )
    refusal = range_refusal(cls, bound.arguments)
    if refusal:
        raise EvaluationError(f"press spec {spec!r}: {refusal}")

    def holds(name: str) -> bool:
        if name in bound.arguments:
            return holds_a_press(bound.arguments[name])
        return signature.parameters[name].default is not None  # the constructor's own press (LUKVPress's)

    wrapped = [name for name in named if not name.startswith("_") and takes_presses(hints.get(name))]
    if wrapped and not any(map(holds, wrapped)):
        raise EvaluationError(
            f"press spec {spec!r}: {cls.__name__} wraps presses ({', '.join(wrapped)}) and is given none: give it "
            "at least one"
        )


def declared_types(cls: type) -> dict[str, object]:
    """The types ``cls``'s constructor declares for its parameters; none where its annotations cannot be resolved."""
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation naming what its module cannot resolve: the constructor decides
        return {}


def fits(value: object, hint: object) -> bool:
    """Whether ``value`` fits the declared type ``hint``; an annotation these rules do not read fits anything."""
    if hint is typing.Any:
        return True
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arm) for arm in arguments)
    if origin is typing.Literal:
        return any(type(value) is type(allowed) and value == allowed for allowed in arguments)
    if hint is None or hint is type(None):
        return value is None
    if is_press_type(hint):
        return isinstance(value, Pending) or (isinstance(value, type) and issubclass(value, hint))
    if isinstance(value, (type, Pending)):  # a press where the type is not one: only an annotation not read here
        return origin is None and not isinstance(hint, type)
    if hint in SCALARS:
        return type(value) is hint or (hint is float and type(value) is int)
    container = origin or hint
    if container in SEQUENCES:
        if not isinstance(value, (list, tuple)):
            return False
        if container is tuple and arguments and arguments[-1] is not Ellipsis:
            return len(value) == len(arguments) and all(map(fits, value, arguments))
        return all(fits(item, arguments[0]) for item in value) if arguments else True
    if container in MAPPINGS:
        key, item = arguments or (typing.Any, typing.Any)
        return isinstance(value, dict) and all(fits(k, key) and fits(v, item) for k, v in value.items())
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def is_press_type(hint: object) -> bool:
    return isinstance(hint, type) and issubclass(hint, BasePress)


def takes_presses(hint: object) -> bool:
    """Whether the declared type ``hint`` takes a press: a press class, or one among its arms or items."""
    return is_press_type(hint) or any(takes_presses(argument) for argument in typing.get_args(hint))


def holds_a_press(value: object) -> bool:
    """Whether a value (as ``check_arguments`` reads it) is a press or holds one."""
    if isinstance(value, (list, tuple)):
        return any(holds_a_press(item) for item in value)
    return isinstance(value, (type, Pending))


def described(hint: object) -> str:
    """A declared type in words."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(described(arm) for arm in arguments))
    if origin is typing.Literal:
        return f"one of {', '.join(map(repr, arguments))}"
    if hint is None or hint is type(None):
        return "None"
    if is_press_type(hint):
        return f"a press ({hint.__name__})"
    if hint in SCALARS:
        return SCALARS[hint]
    container = origin or hint
    if container in SEQUENCES:
        return f"a list, each item {described(arguments[0])}" if arguments else "a list"
    if container in MAPPINGS:
        return "a dict"
    return f"a {hint.__name__}" if isinstance(hint, type) else str(hint)


def shown(value: object) -> str:
    """A spec's value in a message: a press by its class, a literal as written."""
    if isinstance(value, Pending):
        return value.path
    return f"a {value.__name__}" if isinstance(value, type) else repr(value)
