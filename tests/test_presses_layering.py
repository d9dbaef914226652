"""The package's layers: each press imports only what its rule needs, the harness imports the package through one
public module, and the budget rule of the presses that never evict their newest positions is one function."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kvpress import KnormPress

import presses.harness
from evaluation.catalogue.resolved import resolve_presses
from presses import RecentWindowPress, RMMPress
from tests.helpers import prefill, tiny_model

ROOT = Path(__file__).resolve().parents[1]
RMM_ONLY = {
    "presses.smoother",
    "presses.teacher_forcing",
    "presses.random_weights",
    "presses.row_weights",
    "presses.following",
    "presses.prefix",
    "presses.column_sums",
    "presses.fused_attention",
}


def loaded_after(statement: str) -> set[str]:
    """The modules of this package a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {name for name in json.loads(run.stdout) if name == "presses" or name.startswith("presses.")}


@pytest.mark.parametrize(
    "statement",
    [
        "from presses import TOVAPress",
        "import presses.tova_press",
        "from presses import RecentWindowPress",
        "import presses.recent_window_press",
    ],
)
def test_tova_and_the_recent_window_import_none_of_rmms_smoother_or_teacher_forcing(statement):
    loaded = loaded_after(statement)
    assert loaded and not loaded & RMM_ONLY, sorted(loaded & RMM_ONLY)


def test_rmm_brings_its_own_and_the_package_alone_brings_no_press():
    assert loaded_after("from presses import RMMPress") >= RMM_ONLY
    assert loaded_after("import presses") == {"presses"}


def imported_from_presses(path: Path) -> list[str]:
    """The modules of this package a source file imports, wherever in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "presses":
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "presses"]
    return found


def test_the_harness_imports_the_package_only_through_its_public_module():
    sources = [*sorted((ROOT / "evaluation").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    used = {str(path.relative_to(ROOT)): imported_from_presses(path) for path in sources}
    assert any(used.values()), "the harness uses the package"
    elsewhere = {path: modules for path, modules in used.items() if set(modules) - {"presses.harness"}}
    assert not elsewhere
    names = {
        alias.name
        for path in sources
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "presses.harness"
        for alias in node.names
    }
    assert names == set(presses.harness.__all__), "the public module names exactly what the harness uses"


def test_one_budget_rule_and_one_message_for_every_press_that_protects_its_newest_positions():
    """RMM's provisional buffer refused by the press and by the catalogue, a recent window by the press: one
    sentence, naming the press, its parameter and the budget."""
    model, ids = tiny_model("llama", "sdpa"), torch.randint(3, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    words = "never evicts its {count} newest positions, but the budget keeps only 10: use a {name} below 10"
    for press, name, count in (
        (RMMPress(0.5, lag=12), "lag", 12),
        (RecentWindowPress(KnormPress(0.5), 10), "window", 10),
    ):
        message = f"{type(press).__name__}({name}={count}) " + words.format(count=count, name=name)
        with pytest.raises(ValueError) as refused:
            prefill(model, ids, press)
        assert str(refused.value).startswith(message)
    resolved = resolve_presses(["rmm(lag=12)"])[0]
    assert resolved.budget_refusal(10).startswith("RMMPress(lag=12) " + words.format(count=12, name="lag"))
    assert resolved.budget_refusal(13) == ""
