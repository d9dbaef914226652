"""The likelihood-only path at its floor: a single-turn example's likelihood-only cells cost one prefill (shared by
every press's hook) and one batched forward of the question and the answer over every cell's cache; no decoding.
Their NLLs are those the generating run computes beside its generation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from evaluation.catalogue.budgets import Cell, parse_budgets
from evaluation.catalogue.resolved import resolve_press
from evaluation.protocols.longbench.cells import case_of
from evaluation.protocols.longbench.data import load_configs, load_task
from evaluation.protocols.single_turn import cells
from evaluation.runs.models import ModelSettings
from presses.model_hooks import language_model
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)

PRESSES = ["full", "snapkv", "streaming_llm", "h2o", "tova", "rmm", "rmm(lag=8)", "knorm", "random"]


@dataclass
class Settings:
    """What the cells read of a single-turn configuration."""

    model: ModelSettings
    likelihood_only: bool
    query_aware: bool = False
    path: str = "shared"

    def generation_cap(self, official: int) -> int:
        return 0 if self.likelihood_only else official


def forwards_and_nlls(model, tokenizer, case, likelihood_only: bool) -> tuple[int, dict]:
    """The decoder-stack forwards the example's cells took on the shared path, and each cell's answer NLL."""
    budget = parse_budgets([0.5], None)[0]
    grid = [Cell(resolve_press(press), None if press == "full" else budget) for press in PRESSES]
    calls = []
    hook = language_model(model).register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        rows = list(cells.run_cells(model, tokenizer, Settings(ModelSettings(), likelihood_only), case, grid))
    finally:
        hook.remove()
    assert not any(row.get("error") for row in rows)
    return len(calls), {(row["press"], row["budget"]): row["answer_nll"] for row in rows}


@pytest.mark.parametrize("task", ["hotpotqa", "trec"])
def test_likelihood_only_is_one_prefill_and_one_batched_forward(model_dir, data_dir, task):  # noqa: F811
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    example = load_task(data_dir, task, 1)[0]
    case = case_of(example, load_configs(data_dir, [task])[task], tokenizer, 200, False)
    assert len(cells.gold_answer_ids(tokenizer, case)) > 1
    forwards, only = forwards_and_nlls(model, tokenizer, case, likelihood_only=True)
    assert forwards == 2, "the prompt's prefill, then the question and answer over every cache at once"
    generating, generated = forwards_and_nlls(model, tokenizer, case, likelihood_only=False)
    assert generating > 2
    assert only.keys() == generated.keys() and len(only) == len(PRESSES)
    for cell, nll in only.items():
        assert nll == pytest.approx(generated[cell], abs=1e-5), cell
    assert len({round(nll, 6) for nll in only.values()}) > 1, "the caches differ, and so do their likelihoods"
