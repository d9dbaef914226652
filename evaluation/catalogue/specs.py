"""Press specs: how a string names a press, and nothing but a press.

A spec is a call expression whose values are Python literals or other specs:

- a name: ``snapkv``, ``h2o``, ``rmm``, any name of KVPress's evaluation registry (``expected_attention``,
  ``kvzap_mlp``...), or any press class KVPress exports (``KnormPress``); the class names are in
  ``evaluation.catalogue.registry``, with how they follow KVPress's;
- a name with constructor parameters: ``rmm(lag=64, correctness="uniform")``, ``snapkv(window_size=32)``;
- a KVPress wrapper around specs: ``adakv(snapkv)``, ``key_rerotation(tova)``, ``composed([snapkv, knorm])``;
- a press of your own by import path: ``my_pkg.presses:MyPress(alpha=0.3)``, imported only when the run allows it
  (``--allow-import``: importing runs the module), and never by a dry run.

A spec runs no code but a press's constructor. It is checked whole here (``plan_spec``) before anything is
imported: a value is a literal (``1``, ``0.5``, ``"text"``, ``None``, a list, tuple or dict of them, every number
finite) or a list or tuple of specs; each keyword is given once; names, attributes, operators, ``*``, ``**``,
lambdas and comprehensions are refused, and specs nest at most ``MAX_DEPTH`` deep. Only then are its names looked
up, its values checked against the types its classes declare and its presses built
(``evaluation.catalogue.resolved``). Each mistake is a one-line ``EvaluationError``.

``COMPOSITES`` names each of KVPress's registry constructions that is not one class, written as a spec
(``expected_attention`` is ``adakv(ExpectedAttentionPress(epsilon=1e-2))``, as in KVPress's registry). It takes no
parameters: write its spec with them.

``full`` (or KVPress's ``no_press``) is the uncompressed cache. The spec as it parses, printed again (names
NFKC-normalised as Python reads them, no whitespace, comments or empty parentheses, each literal as Python writes
it), is the press's name in every row, table and scorecard (``canonical``): two spellings of one press are one name.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from evaluation.errors import EvaluationError

FULL_CACHE = "full"
NO_PRESS = "no_press"  # KVPress's name for the full cache
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
DEFAULT_PRESSES = (FULL_CACHE, "snapkv", "h2o", "streaming_llm", "tova", "rmm")
MAX_DEPTH = 8  # presses, lists and tuples nested in one another
MAX_LENGTH = 1000  # characters
STRING = r"""'''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*\""""  # a string literal
STRINGS = re.compile(f"({STRING})", re.DOTALL)
# a string literal (kept as it is), or an import path ``package.module:Name``
TOKENS = re.compile(rf"({STRING})|(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*)", re.DOTALL)
LITERALS = (bool, int, float, str, type(None))  # and lists, tuples and dicts of them


@dataclass(frozen=True)
class PressCall:
    """A press a spec names, checked but not yet resolved: ``name`` is a press name or an import path."""

    name: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True)
class Rules:
    """What a spec's nodes are checked against: the spec (for messages), the source parsed (the spec with its
    import paths replaced by placeholders, or a composite's spec) and the placeholders' import paths."""

    spec: str
    source: str
    imports: dict[str, str]

    def text(self, node: ast.AST) -> str:
        """The node as the user wrote it."""
        written = ast.get_source_segment(self.source, node) or ast.unparse(node)
        return re.sub(r"_import_path_\d+", lambda match: self.imports[match.group()], written)

    def error(self, message: str) -> EvaluationError:
        return EvaluationError(f"press spec {self.spec!r}: {message}")


def plan_spec(spec: str) -> PressCall:
    """The press calls and literal values of a spec (not the full cache), every rule checked; nothing imported,
    nothing called.

    Raises
    ------
    EvaluationError
        One line, for any spec that is not a press: what is wrong and what to write instead.
    """
    if len(spec) > MAX_LENGTH:
        raise EvaluationError(
            f"press spec {spec[:40]!r}...: longer than {MAX_LENGTH} characters; write a shorter one, "
            "or a press class of your own (package.module:Press)"
        )
    source, imports = with_placeholders(spec)
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as error:
        raise EvaluationError(
            f"press spec {spec!r} is not a call expression such as rmm(lag=64): {error.msg}"
        ) from error
    return _plan(tree, Rules(spec, source, imports), 1)


def with_placeholders(spec: str) -> tuple[str, dict[str, str]]:
    """The spec with each import path replaced by a placeholder name Python parses, and the placeholders' paths."""
    imports: dict[str, str] = {}

    def placeholder(match: re.Match) -> str:
        if match.group(1):
            return match.group(1)
        imports[f"_import_path_{len(imports)}"] = match.group(2)
        return f"_import_path_{len(imports) - 1}"

    return TOKENS.sub(placeholder, spec.strip()), imports


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
        return _plan(ast.parse(COMPOSITES[name], mode="eval").body, Rules(rules.spec, COMPOSITES[name], {}), depth)
    given: set[str] = set()
    for keyword in keywords:
        if keyword.arg is None:
            raise rules.error(f"'**{rules.text(keyword.value)}' is not allowed; write each parameter as name=value")
        if keyword.arg in rules.imports:
            raise rules.error(f"{rules.imports[keyword.arg]!r} is not a parameter name; write name=value")
        if keyword.arg in given:
            raise rules.error(f"{name} is given {keyword.arg} twice; give each parameter once")
        given.add(keyword.arg)
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
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError) as error:
        raise rules.error(
            f"{rules.text(node)!r} is not a literal value: write a number, string, True, False, None, a list, "
            "tuple or dict of them, or a press"
        ) from error
    problem = _literal_problem(value)
    if problem:
        raise rules.error(f"{rules.text(node)!r} {problem}")
    return value


def _literal_problem(value: object) -> str:
    """Why a literal is not a value a spec may give ("" when it is): a number not finite, or a kind of literal no
    press takes (bytes, a complex number, a set, ``...``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number; write one that is"
    if isinstance(value, (list, tuple, dict)):
        items = [*value, *value.values()] if isinstance(value, dict) else value
        problem = next(filter(None, map(_literal_problem, items)), "")
        return f"holds a value that {problem}" if problem else ""
    if not isinstance(value, LITERALS):
        return "is not a literal value: write a number, string, True, False, None, a list, tuple or dict of them"
    return ""


def is_import_path(name: str) -> bool:
    """Whether a press name of a spec is an import path (``package.module:Press``)."""
    return ":" in name


def import_paths(value: object) -> tuple[str, ...]:
    """The import paths a planned spec (``plan_spec``) names, each once, in the order written."""
    if isinstance(value, (list, tuple)):
        return tuple(dict.fromkeys(path for item in value for path in import_paths(item)))
    if not isinstance(value, PressCall):
        return ()
    own = (value.name,) if is_import_path(value.name) else ()
    return tuple(dict.fromkeys([*own, *import_paths(value.args), *import_paths(list(value.kwargs.values()))]))


def canonical(spec: str) -> str:
    """The name of a spec in rows and tables: the spec as it parses, printed again (``printed``), so that every
    spelling of one press is one name (``knorm``, ``knorm()``, ``knorm ( )``, its fullwidth spelling, a comment,
    ``1e-2`` or ``0.01``); ``no_press`` is ``full``. A spec that does not parse keeps its text, stripped, for its
    error to quote (without its inner whitespace, ``kn orm`` or ``window_size=6 4`` would parse as another spec)."""
    name = printed(spec)
    name = spec.strip() if name is None else name
    return FULL_CACHE if name == NO_PRESS else name


def printed(spec: str) -> str | None:
    """The spec as Python parses it, printed with no whitespace or comments: names NFKC-normalised (as Python reads
    them), a call without arguments as its bare name, each literal as Python writes it (``1e-2`` is ``0.01``,
    ``0x40`` is ``64``, a string in Python's quotes), keywords in the order given; None when it does not parse."""
    if len(spec) > MAX_LENGTH:
        return None
    source, imports = with_placeholders(spec)
    try:
        return _printed(ast.parse(source, mode="eval").body, imports)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def _printed(node: ast.expr, imports: dict[str, str]) -> str:
    if isinstance(node, ast.Name):
        return imports.get(node.id, node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if any(keyword.arg is None for keyword in node.keywords):
            raise ValueError("** in a spec")
        items = [_printed(arg, imports) for arg in node.args]
        items += [f"{keyword.arg}={_printed(keyword.value, imports)}" for keyword in node.keywords]
        name = _printed(node.func, imports)
        return f"{name}({','.join(items)})" if items else name
    if isinstance(node, ast.List):
        return f"[{','.join(_printed(item, imports) for item in node.elts)}]"
    if isinstance(node, ast.Tuple):
        items = [_printed(item, imports) for item in node.elts]
        return f"({','.join(items)}{',' if len(items) == 1 else ''})"
    value = ast.literal_eval(node)
    if _literal_problem(value):
        raise ValueError(_literal_problem(value))
    return _unspaced(repr(value))


def _unspaced(text: str) -> str:
    """``text`` without whitespace outside its string literals."""
    return "".join(part if index % 2 else re.sub(r"\s+", "", part) for index, part in enumerate(STRINGS.split(text)))
