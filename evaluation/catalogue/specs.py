"""Press specs: how a string names a press, and nothing but a press.

A spec is a call expression whose values are Python literals or other specs:

- a name: ``snapkv``, ``h2o``, ``rmm``, any name of KVPress's evaluation registry (``expected_attention``,
  ``kvzap_mlp``...), or any press class KVPress exports (``KnormPress``); the names are in
  ``evaluation.catalogue.registry``, with how they follow KVPress's;
- a name with constructor parameters: ``rmm(lag=64, correctness="uniform")``, ``snapkv(window_size=32)``;
- a KVPress wrapper around specs: ``adakv(snapkv)``, ``key_rerotation(tova)``, ``composed([snapkv, knorm])``;
- a press of your own by import path: ``my_pkg.presses:MyPress(alpha=0.3)``.

A spec runs no code but a press's constructor. It is checked whole before anything is imported: a value is a
literal (``1``, ``0.5``, ``"text"``, ``None``, a list, tuple or dict of them) or a list or tuple of specs; names,
attributes, operators, ``*``, ``**``, lambdas and comprehensions are refused, and specs nest at most
``MAX_DEPTH`` deep. Only a module the spec names by import path is imported, and what it names is called only if
it is a class that subclasses KVPress's ``BasePress``. Each mistake is a one-line ``EvaluationError``.

``full`` (or KVPress's ``no_press``) is the uncompressed cache. The spec, without spaces, is the press's name in
every row, table and scorecard.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass, fields, is_dataclass

from evaluation.catalogue.registry import COMPOSITES, FULL_CACHE, NO_PRESS, known_names, press_classes, set_ratio
from evaluation.errors import EvaluationError, first_line

DEFAULT_PRESSES = (FULL_CACHE, "snapkv", "h2o", "streaming_llm", "tova", "rmm")
MAX_DEPTH = 8  # presses, lists and tuples nested in one another
MAX_LENGTH = 1000  # characters
# a string literal (kept as it is), or an import path ``package.module:Name``
TOKENS = re.compile(
    r"""('''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
    r"|(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*)",
    re.DOTALL,
)


@dataclass(frozen=True)
class PressCall:
    """A press a spec names, checked but not yet resolved: ``name`` is a press name or an import path."""

    name: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True)
class Rules:
    """What a spec's nodes are checked against: the spec (for messages) and its import paths' placeholders."""

    spec: str
    imports: dict[str, str]

    def text(self, node: ast.AST) -> str:
        """The node as the user wrote it."""
        return re.sub(r"_import_path_\d+", lambda match: self.imports[match.group()], ast.unparse(node))

    def error(self, message: str) -> EvaluationError:
        return EvaluationError(f"press spec {self.spec!r}: {message}")


def parse_spec(spec: str) -> object:
    """Build the press a spec names (None for the full cache).

    Raises
    ------
    EvaluationError
        One line, for any spec that is not a press: what is wrong and what to write instead.
    """
    if canonical(spec) == FULL_CACHE:
        return None
    return _build(_plan_spec(spec), spec)


def _plan_spec(spec: str) -> PressCall:
    """The spec's press calls and literal values, every rule checked; nothing imported, nothing called."""
    if len(spec) > MAX_LENGTH:
        raise EvaluationError(
            f"press spec {spec[:40]!r}...: longer than {MAX_LENGTH} characters; write a shorter one, "
            "or a press class of your own (package.module:Press)"
        )
    imports: dict[str, str] = {}

    def placeholder(match: re.Match) -> str:
        if match.group(1):
            return match.group(1)
        imports[f"_import_path_{len(imports)}"] = match.group(2)
        return f"_import_path_{len(imports) - 1}"

    try:
        tree = ast.parse(TOKENS.sub(placeholder, spec.strip()), mode="eval").body
    except SyntaxError as error:
        raise EvaluationError(
            f"press spec {spec!r} is not a call expression such as rmm(lag=64): {error.msg}"
        ) from error
    return _plan(tree, Rules(spec, imports), 1)


def _plan(node: ast.expr, rules: Rules, depth: int) -> PressCall:
    if depth > MAX_DEPTH:
        raise rules.error(f"presses nest more than {MAX_DEPTH} deep; write a shallower spec")
    if isinstance(node, ast.Name):
        name, args, keywords = node.id, [], []
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name, args, keywords = node.func.id, node.args, node.keywords
    elif isinstance(node, ast.Call):
        raise rules.error(
            f"{rules.text(node.func)!r} is not a press name; call a press by its name, or by import path "
            "(package.module:Press)"
        )
    else:
        raise rules.error(f"expected a press name or call such as rmm(lag=64), got {rules.text(node)!r}")
    name = rules.imports.get(name, name)
    if name in COMPOSITES:
        if args or keywords:
            raise rules.error(
                f"{name} is KVPress's {COMPOSITES[name]} and takes no parameters; write that spec with them"
            )
        return _plan(ast.parse(COMPOSITES[name], mode="eval").body, Rules(rules.spec, {}), depth)
    for keyword in keywords:
        if keyword.arg is None:
            raise rules.error(f"'**{rules.text(keyword.value)}' is not allowed; write each parameter as name=value")
    return PressCall(
        name,
        tuple(_value(arg, rules, depth + 1) for arg in args),
        {keyword.arg: _value(keyword.value, rules, depth + 1) for keyword in keywords},
    )


def _value(node: ast.expr, rules: Rules, depth: int) -> object:
    """A constructor argument: a spec, a list or tuple of values, or a literal."""
    if isinstance(node, ast.Starred):
        raise rules.error(f"'{rules.text(node)}' is not allowed; write each argument")
    if isinstance(node, (ast.Name, ast.Call)):
        return _plan(node, rules, depth)
    if isinstance(node, (ast.List, ast.Tuple)):
        if depth > MAX_DEPTH:
            raise rules.error(f"values nest more than {MAX_DEPTH} deep; write a shallower spec")
        items = [_value(item, rules, depth + 1) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError) as error:
        raise rules.error(
            f"{rules.text(node)!r} is not a literal value: write a number, string, True, False, None, a list, "
            "tuple or dict of them, or a press"
        ) from error


def _press_class(name: str, spec: str) -> type:
    """The class a press name or import path names, checked to be a press; an import path is imported here."""
    from kvpress.presses.base_press import BasePress

    if ":" not in name:
        if name in (FULL_CACHE, NO_PRESS):
            raise EvaluationError(f"press spec {spec!r}: {name} is the uncompressed cache, a spec on its own")
        if name not in press_classes():
            raise EvaluationError(f"press spec {spec!r}: unknown press {name!r}; known: {known_names()}")
        return press_classes()[name]
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


def _build(call: PressCall, spec: str) -> object:
    cls = _press_class(call.name, spec)
    parameters = (
        [f.name for f in fields(cls) if f.init] if is_dataclass(cls) else list(inspect.signature(cls).parameters)
    )
    unknown = [name for name in call.kwargs if name not in parameters]
    if unknown:
        raise EvaluationError(
            f"press spec {spec!r}: {cls.__name__} has no parameter {', '.join(unknown)}; "
            f"its parameters: {', '.join(parameters) or 'none'}"
        )
    args = [_built(arg, spec) for arg in call.args]
    kwargs = {name: _built(value, spec) for name, value in call.kwargs.items()}
    try:
        return cls(*args, **kwargs)
    except Exception as error:  # a press refusing its parameters, in its own words, on one line
        raise EvaluationError(f"press spec {spec!r}: {cls.__name__}: {first_line(error)}") from error


def _built(value: object, spec: str) -> object:
    if isinstance(value, PressCall):
        return _build(value, spec)
    if isinstance(value, (list, tuple)):
        return type(value)(_built(item, spec) for item in value)
    return value


def canonical(spec: str) -> str:
    """The name of a spec in rows and tables: the spec without whitespace (``no_press`` is ``full``)."""
    name = re.sub(r"\s+", "", spec)
    return FULL_CACHE if name == NO_PRESS else name


def check_presses(specs: list[str]) -> None:
    """Build every spec once before any work, so a mistake is reported before the model loads."""
    from evaluation.catalogue.needs import REFUSED, needs

    for spec in specs:
        press = make_press(spec, 0.5)
        if press is not None and needs(press).path == REFUSED:
            raise EvaluationError(f"press spec {spec!r}: {needs(press).refusal}")


def make_press(spec: str, compression_ratio: float, length: int | None = None) -> object:
    """A fresh press at ``compression_ratio`` of a ``length``-token context, set as KVPress's evaluation sets it;
    None for the full cache."""
    press = parse_spec(spec)
    if press is not None:
        try:
            set_ratio(press, compression_ratio, length)
        except EvaluationError as error:
            raise EvaluationError(f"press spec {spec!r}: {error}") from None
    return press
