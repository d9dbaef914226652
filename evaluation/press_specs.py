"""Press specs: how a string names a press.

A spec is a call expression whose values are Python literals or other specs:

- a name: ``snapkv``, ``h2o``, ``rmm``, or any press class KVPress exports (``KnormPress``);
- a name with constructor parameters: ``rmm(lag=64, correctness="uniform")``, ``snapkv(window_size=32)``;
- a KVPress wrapper around specs: ``adakv(snapkv)``, ``key_rerotation(tova)``, ``composed([snapkv, knorm])``;
- a press of your own by import path: ``my_pkg.presses:MyPress(alpha=0.3)``.

``full`` is the uncompressed cache. The spec, without spaces, is the press's name in every row, table and
scorecard. The names follow KVPress's evaluation where it has one (its ``tova`` is ``kvpress_tova`` here, since
``tova`` is this project's press; ``h2o`` and ``observed_attention`` are both ``ObservedAttentionPress``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import fields, is_dataclass
from functools import cache

from evaluation.errors import EvaluationError

FULL_CACHE = "full"
DEFAULT_PRESSES = (FULL_CACHE, "snapkv", "h2o", "streaming_llm", "tova", "rmm")
# KVPress class names under the names KVPress's evaluation uses (its composites are specs below)
KVPRESS_NAMES = {
    "adakv": "AdaKVPress",
    "block": "BlockPress",
    "chunk": "ChunkPress",
    "chunkkv": "ChunkKVPress",
    "composed": "ComposedPress",
    "critical": "CriticalKVPress",
    "critical_adakv": "CriticalAdaKVPress",
    "decoding": "DecodingPress",
    "duo_attention": "DuoAttentionPress",
    "expected_attention": "ExpectedAttentionPress",
    "finch": "FinchPress",
    "h2o": "ObservedAttentionPress",
    "key_rerotation": "KeyRerotationPress",
    "keydiff": "KeyDiffPress",
    "knorm": "KnormPress",
    "kvpress_tova": "TOVAPress",
    "kvzip": "KVzipPress",
    "lagkv": "LagKVPress",
    "observed_attention": "ObservedAttentionPress",
    "per_layer": "PerLayerCompressionPress",
    "prefill_decoding": "PrefillDecodingPress",
    "pyramidkv": "PyramidKVPress",
    "qfilter": "QFilterPress",
    "random": "RandomPress",
    "snapkv": "SnapKVPress",
    "streaming_llm": "StreamingLLMPress",
    "think": "ThinKPress",
}
COMPOSITES = {
    "adakv_snapkv": "adakv(snapkv)",
    "adakv_expected_attention": "adakv(expected_attention)",
    "critical_snapkv": "critical(snapkv)",
    "critical_adakv_snapkv": "critical_adakv(snapkv)",
    "critical_expected_attention": "critical(expected_attention(use_vnorm=False))",
    "snap_think": "composed([snapkv, think])",
}
OURS = {"tova": "TOVAPress", "rmm": "RMMPress"}
IMPORT_PATH = re.compile(r"([A-Za-z_][\w.]*):([A-Za-z_]\w*)")


@cache
def press_classes() -> dict[str, type]:
    """Every press a spec can name: this project's, KVPress's names, and every class KVPress exports."""
    import kvpress
    from kvpress.presses.base_press import BasePress

    import presses

    exported = {name: getattr(kvpress, name) for name in kvpress.__all__}
    exported = {name: cls for name, cls in exported.items() if inspect.isclass(cls) and issubclass(cls, BasePress)}
    known = {name: exported[cls] for name, cls in KVPRESS_NAMES.items() if cls in exported}
    known |= {name: getattr(presses, cls) for name, cls in OURS.items()}
    return known | {name: cls for name, cls in exported.items() if name not in ("BasePress", "ScorerPress")}


def known_names() -> str:
    return ", ".join(sorted({*press_classes(), *COMPOSITES}))


def parse_spec(spec: str) -> object:
    """Build the press a spec names (None for ``full``); any mistake is a one-line ``EvaluationError``."""
    if spec == FULL_CACHE:
        return None
    imports: dict[str, str] = {}

    def placeholder(match: re.Match) -> str:
        imports[f"_import{len(imports)}"] = match.group(0)
        return f"_import{len(imports) - 1}"

    try:
        tree = ast.parse(IMPORT_PATH.sub(placeholder, spec.strip()), mode="eval").body
    except SyntaxError as error:
        raise EvaluationError(
            f"press spec {spec!r} is not a call expression such as rmm(lag=64): {error.msg}"
        ) from error
    return _build(tree, spec, imports)


def _press_class(name: str, spec: str, imports: dict[str, str]) -> type:
    if name in imports:
        module, _, attribute = imports[name].partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise EvaluationError(f"press spec {spec!r}: cannot import {imports[name]} ({error})") from error
    if name not in press_classes():
        raise EvaluationError(f"press spec {spec!r}: unknown press {name!r}; known: {known_names()}")
    return press_classes()[name]


def _build(node: ast.expr, spec: str, imports: dict[str, str]) -> object:
    if isinstance(node, ast.Name) and node.id in COMPOSITES:
        return _build(ast.parse(COMPOSITES[node.id], mode="eval").body, spec, imports)
    if isinstance(node, ast.Name):
        return _construct(_press_class(node.id, spec, imports), [], {}, spec)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        cls = _press_class(node.func.id, spec, imports)
        args = [_value(arg, spec, imports) for arg in node.args]
        kwargs = {keyword.arg: _value(keyword.value, spec, imports) for keyword in node.keywords}
        return _construct(cls, args, kwargs, spec)
    raise EvaluationError(f"press spec {spec!r}: expected a press name or call, got {ast.unparse(node)!r}")


def _value(node: ast.expr, spec: str, imports: dict[str, str]) -> object:
    if isinstance(node, (ast.Name, ast.Call)) and not (
        isinstance(node, ast.Name) and node.id in ("None", "True", "False")
    ):
        return _build(node, spec, imports)
    if isinstance(node, ast.List):
        return [_value(item, spec, imports) for item in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError as error:
        raise EvaluationError(f"press spec {spec!r}: {ast.unparse(node)!r} is not a literal value") from error


def _construct(cls: type, args: list, kwargs: dict, spec: str) -> object:
    parameters = (
        [f.name for f in fields(cls) if f.init] if is_dataclass(cls) else list(inspect.signature(cls).parameters)
    )
    unknown = [name for name in kwargs if name not in parameters]
    if unknown:
        raise EvaluationError(
            f"press spec {spec!r}: {cls.__name__} has no parameter {', '.join(unknown)}; "
            f"its parameters: {', '.join(parameters) or 'none'}"
        )
    try:
        return cls(*args, **kwargs)
    except (TypeError, ValueError, AssertionError) as error:
        raise EvaluationError(f"press spec {spec!r}: {cls.__name__}: {error}") from error


def canonical(spec: str) -> str:
    """The name of a spec in rows and tables: the spec without whitespace."""
    return re.sub(r"\s+", "", spec)


def check_presses(specs: list[str]) -> None:
    """Parse every spec once before any work, so a mistake is reported before the model loads."""
    from evaluation.press_needs import DECODING, REFUSED, needs

    for spec in specs:
        press = parse_spec(spec)
        if press is not None and not hasattr(press, "compression_ratio"):
            raise EvaluationError(
                f"press spec {spec!r}: {type(press).__name__} has no compression_ratio for the budget to set"
            )
        if press is not None and needs(press).path == REFUSED:
            raise EvaluationError(f"press spec {spec!r}: {needs(press).refusal}")
        if press is not None and needs(press).path == DECODING:
            raise EvaluationError(
                f"press spec {spec!r}: {type(press).__name__} compresses while decoding, which these protocols do "
                "not run yet; use a prefill press"
            )


def make_press(spec: str, compression_ratio: float) -> object:
    """A fresh press at ``compression_ratio``; None for the full cache."""
    press = parse_spec(spec)
    if press is not None:
        press.compression_ratio = compression_ratio
    return press
