"""No function of the harness or the presses is over 60 lines (issue 60): each function of ``evaluation/`` and
``presses/``, read with ``ast``, from its ``def`` to its last line, docstring included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60


def lengths(source: str) -> dict[str, int]:
    """Each function's name (qualified by its classes and functions) and its lines, ``def`` to its last."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_lengths_counts_each_function_from_its_def_to_its_last_line():
    source = "class A:\n    def f(self):\n        x = 1\n\n        return x\n\n\ndef g():\n    def h():\n        pass\n"
    assert lengths(source) == {"A.f": 4, "g": 3, "g.h": 2}


def test_no_function_is_over_60_lines():
    over = {
        (path.relative_to(ROOT).as_posix(), name): count
        for folder in ("evaluation", "presses")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, count in lengths(path.read_text()).items()
        if count > LIMIT
    }
    assert over == {}
