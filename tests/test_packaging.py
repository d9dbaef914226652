"""Packaging: ranges (no pins) in pyproject.toml, the core dependencies exactly what the presses import and the
extras what the harness adds, an import of the presses that adds nothing to what KVPress imported and registered,
and an install into an environment that already has the stack that changes none of it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import tomllib

from presses import RMMPress, TOVAPress

ROOT = Path(__file__).resolve().parents[1]


DISTRIBUTIONS = {"yaml": "pyyaml"}  # import name -> distribution name, where they differ


def imported_packages(folder: str) -> set[str]:
    """The distributions whose modules the files under ``folder`` import: every import, at any depth, of a
    top-level module neither in the standard library nor in this project."""
    names = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    names -= set(sys.stdlib_module_names) | {"__future__", "presses", "evaluation"}
    return {DISTRIBUTIONS.get(name, name) for name in names}


def distribution_names(requirements: list[str]) -> set[str]:
    return {re.split("[<>=!~ ;\\[]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}


def test_dependencies_are_ranges_the_presses_need_the_core_and_the_harness_its_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = project["dependencies"] + [d for extra in extras.values() for d in extra]
    assert not [d for d in declared if "==" in d], "pyproject.toml declares ranges; constraints.txt pins"
    core = distribution_names(project["dependencies"])
    assert core == imported_packages("presses"), "the core dependencies are exactly what the presses import"
    harness = imported_packages("evaluation")
    served = core | distribution_names(extras["eval"]) | distribution_names(extras["ray"])
    assert harness <= served, f"imported by the harness but in neither the core nor its extras: {harness - served}"


def test_installing_into_an_existing_stack_keeps_its_versions():
    """pip resolves the project against what is installed (no index, no downloads) and installs only itself."""
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--report",
            "-",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    installs = [item["metadata"]["name"] for item in json.loads(report.stdout)["install"]]
    assert installs == ["kv-eviction-toolkit"]


# the eval extra's own packages; tqdm and pyyaml are in it too, but transformers itself needs them
BLOCK_HARNESS = """
import sys
for name in ("gguf", "rouge", "rapidfuzz", "nltk", "matplotlib"):
    sys.modules[name] = None  # import raises ImportError and find_spec answers None, as for an absent package
"""


def test_the_presses_need_no_harness_dependency():
    """``import presses`` and a press in KVPress's pipeline work with every package of the ``eval`` extra absent."""
    script = BLOCK_HARNESS + (
        "import torch\n"
        "from kvpress import DecodingPress\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from presses import RMMPress, TOVAPress\n"
        "config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
        "                     num_attention_heads=4, num_key_value_heads=2)\n"
        "model = LlamaForCausalLM(config).eval()\n"
        "ids = torch.arange(40).unsqueeze(0)\n"
        "for press in (TOVAPress(compression_ratio=0.5), RMMPress(compression_ratio=0.5, lag=4)):\n"
        "    with torch.no_grad(), press(model):\n"
        "        cache = model(ids, use_cache=True).past_key_values\n"
        "    assert cache.get_seq_length() == 20, cache.get_seq_length()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


# a fresh interpreter imports KVPress, then our presses: what the second import adds to sys.modules and to
# transformers' attention registries
IMPORT_AFTER_KVPRESS = """
import json, sys
import kvpress
from transformers import AttentionInterface, AttentionMaskInterface

def registries():
    return {name: sorted(f"{key}={value!r}" for key, value in interface._global_mapping.items())
            for name, interface in (("attention", AttentionInterface), ("mask", AttentionMaskInterface))}

modules, before = set(sys.modules), registries()
from presses import RMMPress, TOVAPress
print(json.dumps({"modules": sorted(set(sys.modules) - modules), "before": before, "after": registries()}))
"""


def test_importing_the_presses_after_kvpress_imports_no_other_package_and_registers_nothing():
    done = subprocess.run([sys.executable, "-c", IMPORT_AFTER_KVPRESS], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout)
    tops = {name.split(".")[0] for name in imported["modules"]}
    assert "presses" in tops
    assert "evaluation" not in tops, [name for name in imported["modules"] if name.startswith("evaluation")]
    packages = tops - set(sys.stdlib_module_names) - {"presses"}
    assert not packages, f"importing the presses imports what KVPress did not: {sorted(packages)}"
    before, after = imported["before"], imported["after"]
    changed = {name: sorted(set(entries) ^ set(after[name])) for name, entries in before.items()}
    assert after == before, f"importing the presses changes transformers' registries: {changed}"


def test_the_harness_without_its_extra_says_what_to_install():
    script = BLOCK_HARNESS + "import runpy\nrunpy.run_module('evaluation', run_name='__main__')\n"
    done = subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    assert "pip install -e '.[eval]' in the checkout" in done.stderr


def test_the_documented_registry_lines_add_presses_kvpress_can_set():
    """The lines docs/presses.md gives for KVPress's ``PRESS_REGISTRY`` add our presses, and the ratio KVPress's
    ``evaluate.py`` sets on a registry press takes."""
    text = (ROOT / "docs/presses.md").read_text().split("<!-- kvpress-registry -->")[1]
    snippet = text.split("```python")[1].split("```")[0]
    registry: dict = {"tova": object()}
    exec(snippet, {"PRESS_REGISTRY": registry})
    assert isinstance(registry["rmm"], RMMPress) and isinstance(registry["tova_toolkit"], TOVAPress)
    for name in ("rmm", "tova_toolkit"):
        registry[name].compression_ratio = 0.5
        assert registry[name].compression_ratio == 0.5
