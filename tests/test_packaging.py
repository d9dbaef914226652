"""Packaging: ranges (no pins) in pyproject.toml, and an install into an environment that already has the stack
changes none of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_dependencies_are_ranges_and_cover_every_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    assert not [d for d in declared if "==" in d], "pyproject.toml declares ranges; constraints.txt pins"
    names = {d.split(">")[0].split("<")[0].split("=")[0].strip().lower().replace("-", "_") for d in declared}
    imported = {"torch", "kvpress", "transformers", "tokenizers", "numpy", "pandas", "datasets", "huggingface_hub"}
    imported |= {"gguf", "tqdm", "rouge", "rapidfuzz", "nltk", "matplotlib", "pyyaml", "ray"}
    assert imported <= names, f"imported but not declared: {imported - names}"


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


def test_the_harness_without_its_extra_says_what_to_install():
    script = BLOCK_HARNESS + "import runpy\nrunpy.run_module('evaluation', run_name='__main__')\n"
    done = subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    assert "pip install 'kv-eviction-toolkit[eval]'" in done.stderr


def test_the_documented_registry_lines_add_presses_kvpress_can_set():
    """The lines docs/presses.md gives for KVPress's ``PRESS_REGISTRY`` add our presses, and the ratio KVPress's
    ``evaluate.py`` sets on a registry press takes."""
    from presses import RMMPress, TOVAPress

    text = (ROOT / "docs/presses.md").read_text().split("<!-- kvpress-registry -->")[1]
    snippet = text.split("```python")[1].split("```")[0]
    registry: dict = {"tova": object()}
    exec(snippet, {"PRESS_REGISTRY": registry})
    assert isinstance(registry["rmm"], RMMPress) and isinstance(registry["tova_toolkit"], TOVAPress)
    for name in ("rmm", "tova_toolkit"):
        registry[name].compression_ratio = 0.5
        assert registry[name].compression_ratio == 0.5
