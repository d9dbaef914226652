"""The probe protocol's work: the model answers each probe, then every scorer ranks its sixteen facts."""

from __future__ import annotations

from functools import partial

import torch
from kvpress import ObservedAttentionPress, SnapKVPress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.engine.decoding import answer_ids_of, decode, eos_ids, force
from evaluation.engine.history import History
from evaluation.engine.hooks import cache_of
from evaluation.errors import EvaluationError, PressCannotRun, first_line, press_cell
from evaluation.metrics.synthetic import string_match
from evaluation.protocols.probe.facts import FACTS, PLACEMENT_TEXTS, PLACEMENTS, Probe, gold_answer, probes
from evaluation.protocols.probe.positions import position_section
from evaluation.protocols.probe.prompt import final_answer, prompt_ids
from evaluation.protocols.probe.protocol import (
    BENCHMARK,
    BLOCK,
    DU,
    DU_CONFIDENCE,
    PROBE_LIKELIHOOD,
    RECENCY,
    SCORERS,
    ProbeConfig,
    ProbeRow,
    Probes,
    row_key,
    top_label,
)
from evaluation.protocols.probe.ranking import KS, both_in_top, fact_scores, gold_ranks, recency_scores
from evaluation.protocols.protocol import REFERENCE, Implementation, Plan, implement, lacks
from evaluation.reporting.scorecard import scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card
from evaluation.runs.backends import Unit
from evaluation.runs.store import ResultStore
from presses.harness import RMMPress, TOVAPress


def answer(model: PreTrainedModel, history, stop_ids: set[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """The model's greedy answer after the history's prompt, and its probability of each of those tokens."""
    probabilities: list[float] = []

    def record(logits: torch.Tensor) -> None:
        probabilities.append(float(logits.float().softmax(-1).max()))

    cache = cache_of([(layer.keys.clone(), layer.values.clone()) for layer in history.cache.layers])
    empty = torch.empty(1, 0, dtype=torch.long)
    ids = decode(model, cache, empty, history.length, max_new_tokens, stop_ids, history.newest_logits, record)
    return ids, probabilities[: len(ids)]


def answer_likelihood(model: PreTrainedModel, history, answer_ids: list[int]) -> float | None:
    """The gold answer's mean negative log-likelihood per token, teacher-forced right after the history's prompt
    where the model's answer starts, over a copy of its (full) cache, as ``answer`` decodes from one."""
    if not answer_ids:
        return None
    cache = cache_of([(layer.keys.clone(), layer.values.clone()) for layer in history.cache.layers])
    empty = torch.empty(1, 0, dtype=torch.long)
    return force(model, cache, empty, history.length, answer_ids, history.newest_logits)


def answer_weights(prompt: int, length: int, weights: list[float]) -> torch.Tensor:
    """Per position of a history of ``length``: ``weights`` on the rows that predict the answer's tokens (the
    prompt's last row onwards), 0 before."""
    full = torch.zeros(length)
    full[prompt - 1 : prompt - 1 + len(weights)] = torch.tensor(weights)
    return full


def scorers(weights: torch.Tensor, confidence: torch.Tensor) -> dict:
    return {
        DU: RMMPress(correctness=weights),
        DU_CONFIDENCE: RMMPress(correctness=confidence),
        "h2o": ObservedAttentionPress(),
        "tova": TOVAPress(),
        "snapkv": SnapKVPress(),
    }


@torch.no_grad()
def probe_rows(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], probe: Probe, config: ProbeConfig
) -> list[ProbeRow]:
    model, tokenizer = loaded
    ids, spans = prompt_ids(tokenizer, probe, config.reasoning)
    placeholder = scorers(torch.ones(1), torch.ones(1))
    history = History(model, frozenset(), placeholder.values())
    history.extend(ids, "prompt")
    likelihood = gold_likelihood(loaded, history, probe, config)
    generated, probabilities = answer(model, history, eos_ids(model), config.max_new_tokens)
    history.extend(generated, "answer")
    prediction = tokenizer.decode(generated, skip_special_tokens=True).strip()
    answered = bool(string_match(final_answer(prediction), probe.answer))
    bridge = bool(string_match(prediction, probe.bridge))
    correct = answered and (bridge or not config.reasoning)
    forced = answer_weights(len(ids), history.length, [1.0] * len(generated))  # greedy: each top-1 is the token
    confident = answer_weights(len(ids), history.length, probabilities)
    ranked, failures = {RECENCY: recency_scores(spans)}, {}
    for name, press in scorers(forced, confident).items():
        try:
            with press_cell(press):
                ranked[name] = fact_scores(history.scores(press), spans)
        except PressCannotRun as error:
            failures[name] = first_line(error)
    common = {
        "probe": probe.index,
        "correct": correct,
        "answer_correct": answered,
        "bridge_named": bridge,
        "model_answer": prediction,
        "answer": probe.answer,
        "prompt_tokens": len(ids),
        "answer_tokens": len(generated),
        "mean_confidence": sum(probabilities) / len(probabilities) if probabilities else None,
    }
    rows = []
    for name in SCORERS:
        if name in failures:  # the scorer's failure, with its reason, at every k
            failed = {"press": name, "score": None, "error": failures[name]}
            rows += [{**common, **failed, "budget": top_label(k), "budget_label": top_label(k)} for k in KS]
            continue
        ranks = gold_ranks(ranked[name], probe.gold)
        order = " ".join(str(f) for f in sorted(range(FACTS), key=lambda f: -ranked[name][f]))  # what it ranks
        for k in KS:
            label = top_label(k)
            score = float(both_in_top(ranks, k))
            rows.append({**common, "press": name, "budget": label, "budget_label": label, "score": score})
            rows[-1].update(gold_ranks=ranks, prediction=order)
            rows[-1].update(likelihood)
    return rows


def gold_likelihood(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], history: History, probe: Probe, config: ProbeConfig
) -> dict:
    """The gold answer's likelihood after the history of the probe's prompt (``PROBE_LIKELIHOOD``: its
    ``answer_tokens`` already counts the model's own answer)."""
    model, tokenizer = loaded
    gold = answer_ids_of(tokenizer, gold_answer(probe, config.reasoning), config.max_new_tokens)
    return dict(zip(PROBE_LIKELIHOOD, (answer_likelihood(model, history, gold), len(gold)), strict=True))


@torch.no_grad()
def completed_likelihood(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], probe: Probe, config: ProbeConfig
) -> dict:
    """The likelihood older code did not store, without answering the probe again: the prompt's prefill alone."""
    history = History(loaded[0], frozenset())
    history.extend(prompt_ids(loaded[1], probe, config.reasoning)[0], "prompt")
    return gold_likelihood(loaded, history, probe, config)


def run_block(loaded, unit: Unit, store: ResultStore, config: ProbeConfig) -> None:
    for probe in unit.payload:
        keys = unit_keys([probe])
        if any(key not in store for key in keys):
            for row in probe_rows(loaded, probe, config):
                if row_key(row) not in store:
                    store.append(row)
        unfilled = [store.get(key) for key in keys if lacks(store.get(key), PROBE_LIKELIHOOD)]
        if unfilled:
            likelihood = completed_likelihood(loaded, probe, config)
            store.amend([{**row, **likelihood} for row in unfilled])


def unit_keys(block: list[Probe]) -> frozenset:
    return frozenset((probe.index, name, top_label(k)) for probe in block for name in SCORERS for k in KS)


def probes_of(config: ProbeConfig) -> list[Probe]:
    if config.probes < 1:
        raise EvaluationError(f"--probes {config.probes} must be at least 1")
    if config.max_new_tokens < 1:
        raise EvaluationError(f"--max-new-tokens {config.max_new_tokens} must be at least 1")
    if config.gold_positions not in PLACEMENTS:
        raise EvaluationError(f"--gold-positions {config.gold_positions!r}: choose one of {', '.join(PLACEMENTS)}")
    return probes(config.seed, config.probes, config.gold_positions)


def dry_run(protocol: Probes, config: ProbeConfig) -> str:
    generated = probes_of(config)
    placement = PLACEMENT_TEXTS[config.gold_positions]
    return "\n".join(
        [
            f"Probe: {len(generated)} probes (seed {config.seed}, {FACTS} facts each, {placement}, "
            f"reasoning {'on' if config.reasoning else 'off'}), model {config.model.name}",
            f"scorers: {', '.join(SCORERS)}; both gold facts in the top {' / '.join(map(str, KS))} of {FACTS}",
            f"prefills: {len(generated)} (one per probe, serving every scorer); decodes: {len(generated)} answers "
            f"of at most {config.max_new_tokens} tokens",
        ]
    )


def plan(protocol: Probes, config: ProbeConfig) -> Plan:
    generated = probes_of(config)
    blocks = [generated[start : start + BLOCK] for start in range(0, len(generated), BLOCK)]
    units = [Unit(f"probes {b[0].index}-{b[-1].index}", b, unit_keys(b)) for b in blocks]
    return Plan(units, partial(run_block, config=config))


def write_scorecard(protocol: Probes, config: ProbeConfig, rows: list[dict]) -> None:
    summary = summarize(scores_frame(BENCHMARK, rows), REFERENCE)
    placement = PLACEMENT_TEXTS[config.gold_positions]
    note = (
        f"Share of probes (%) whose two gold facts both rank in a scorer's top k of {FACTS} "
        f"({placement}); each cell: mean [95% bootstrap interval over probes] (n probes), split by "
        "whether the model answered correctly (the right colour, and with reasoning the bridge city named). "
        "Scorers rank by their own press's score averaged over each fact's tokens, layers and KV heads; ties count "
        "against the scorer. Demonstrated utility weighs only the rows of the model's own answer, each by 1 (a "
        "greedy answer's every token is the model's top-1, so Eq. 1's correctness is 1 on each: "
        "evaluation/protocols/probe/work.py)."
    )
    labels = [top_label(k) for k in KS]
    output = config.output
    appendix = position_section(rows, list(SCORERS), labels)
    write_card(output, summary, f"Probe: {output.name}", note, REFERENCE, list(SCORERS), labels, appendix)


class ProbeWork(Implementation[ProbeConfig]):
    def dry_run(self, protocol: Probes, config: ProbeConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Probes, config: ProbeConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Probes, config: ProbeConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


PROBE_WORK = ProbeWork()
implement(Probes, PROBE_WORK)
