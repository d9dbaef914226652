"""Every figure README.md and results/README.md quote, recomputed from the committed files.

Each claim is the text a document must hold, rebuilt here from a run's scorecard.csv, predictions.jsonl or
run.json (or a benchmark's json): a mean or paired difference with its interval, a verdict, a count of verdicts,
a wall time or a ratio. A second test finds every interval the two documents quote and requires a claim for it,
so no interval stands on no file.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from evaluation.reporting.intervals import paired

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
INTERVAL = re.compile(r"[+-]?\d+\.\d+%? \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]")


@cache
def card(run: str, metric: str = "") -> dict[tuple[str, str, str], dict]:
    """The scorecard's cells of ``metric``, or of every metric with the first one's cell where two share a key (the
    task's own score before the answer's likelihood)."""
    cells: dict[tuple[str, str, str], dict] = {}
    with (RESULTS / run / "scorecard.csv").open() as handle:
        for r in csv.DictReader(handle):
            if not metric or r.get("metric") == metric:
                cells.setdefault((r["condition"], r["budget"], r["press"]), r)
    return cells


@cache
def rows(run: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / run / "predictions.jsonl").read_text().splitlines()]


@cache
def record(run: str) -> dict:
    return json.loads((RESULTS / run / "run.json").read_text())


def number(value: float, digits: int, signed: bool = False) -> str:
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def mean(run: str, condition: str, budget: str, press: str, digits: int) -> str:
    line = card(run)[condition, budget, press]
    low, high = (number(float(line[k]), digits) for k in ("low", "high"))
    return f"{number(float(line['mean']), digits)} [{low}, {high}]"


def diff(run: str, condition: str, budget: str, press: str, digits: int, against: str = "") -> str:
    """The paired difference against h2o (``against`` "full_": against the full cache), with its interval."""
    line = card(run)[condition, budget, press]
    d, low, high = (number(float(line[f"{against}{k}"]), digits, True) for k in ("diff", "diff_low", "diff_high"))
    return f"{d} [{low}, {high}]"


def percent(interval: str) -> str:
    """A mean with its interval as the documents write a share: the % after the mean."""
    return interval.replace(" [", "% [", 1)


def verdict(run: str, condition: str, budget: str, press: str, against: str = "") -> str:
    return card(run)[condition, budget, press][f"{against}verdict"]


def verdicts(run: str, presses: tuple[str, ...], against: str = "", condition: str | None = None) -> Counter:
    return Counter(
        line[f"{against}verdict"]
        for (c, _, press), line in card(run).items()
        if press in presses and (condition is None or c == condition)
    )


def work_seconds(run: str) -> float:
    """The wall time of the sessions that ran units."""
    return sum(s["wall_seconds"] for s in record(run)["sessions"] if s.get("units_run"))


def wall(run: str) -> str:
    seconds = work_seconds(run)
    return f"{round(seconds):,} s ({seconds / 60:.1f} min)"


def questions(run: str) -> dict[tuple, dict]:
    """One row per asked question (its history is the same for every press)."""
    return {(r["conversation"], r["question_index"]): r for r in rows(run)}


def tokens(value: float) -> str:
    return f"{round(value):,}"


def degeneracy(run: str, budget: str, press: str) -> tuple[str, str]:
    """The shares at the cap and repeating, from the scorecard's degeneracy table."""
    text = (RESULTS / run / "scorecard.md").read_text()
    found = re.search(
        rf"^\| multi_news \| {re.escape(budget)} \| {re.escape(press)} \| \d+ \| (\d+%) \| (\d+%) \|$", text, re.M
    )
    assert found, f"{run}: no degeneracy line for {budget} {press}"
    return found.group(1), found.group(2)


LB, LOCOMO, REUSE = "longbench/smollm2-135m", "locomo/smollm2-135m", "reuse/smollm2-135m"
MQ, MQ_LONG, MQ_32K = "multiquery/smollm2-135m", "multiquery/smollm2-135m-long", "multiquery/smollm2-135m-32k"
TRACES, LAGS = "traces/smollm2-135m", (1, 4, 16, 64, 256)
RMMS = ("rmm", "rmm(lag=16)", "rmm(lag=64)", "rmm(lag=128)")
PRESSES = ("snapkv", "streaming_llm", "tova", *RMMS)


def longbench_claims() -> list[str]:
    per_example = work_seconds(LB) / 24
    fits = int(90 * 60 // per_example)
    claims = [
        wall(LB),
        f"the committed run cost {per_example:.0f} s per example",
        f"n=40 takes about {40 * per_example / 60:.0f} minutes",
        f"n={fits} would fit in 90 minutes ({fits * per_example / 60:.0f}",
        f"Every press loses to the full cache** ({mean(LB, 'multi_news', 'full', 'full', 2)})",
        f"from {diff(LB, 'multi_news', 'keep 25%', 'h2o', 2, 'full_')}",
        f"(h2o) to {diff(LB, 'multi_news', 'keep 25%', 'streaming_llm', 2, 'full_')} (streaming_llm)",
        f"streaming_llm ({diff(LB, 'multi_news', 'keep 50%', 'streaming_llm', 2, 'full_')}, a",
        f"h2o by {diff(LB, 'multi_news', 'keep 50%', 'h2o', 2, 'full_')}",
        "{} of the full cache's generations run to the 512-token cap and {} say one".format(
            *degeneracy(LB, "full", "full")
        ),
        f"h2o {float(card(LB)['multi_news', 'keep 50%', 'h2o']['mean']):.2f} at keep 50% and "
        f"{float(card(LB)['multi_news', 'keep 25%', 'h2o']['mean']):.2f} at keep 25%",
        f"(`rmm(lag=64)`: {diff(LB, 'multi_news', 'keep 50%', 'rmm(lag=64)', 2)} and "
        f"{diff(LB, 'multi_news', 'keep 25%', 'rmm(lag=64)', 2)})",
        "TOVA ties too ({}, {})".format(*(diff(LB, "multi_news", b, "tova", 2) for b in ("keep 50%", "keep 25%"))),
    ]
    assert all(verdict(LB, "multi_news", b, "tova") == "tie" for b in ("keep 50%", "keep 25%"))
    assert {verdict(LB, "multi_news", b, p) for b in ("keep 50%", "keep 25%") for p in PRESSES[:4]} == {"tie"}
    assert verdict(LB, "multi_news", "keep 50%", "streaming_llm", "full_") == "tie"
    assert verdicts(LB, ("snapkv", "h2o", "tova", "rmm", "rmm(lag=64)"), "full_") == Counter(loss=10)
    for budget in ("keep 50%", "keep 25%"):
        for press in ("rmm", "snapkv", "streaming_llm"):
            claims.append(
                f"| {budget} | {press}: {diff(LB, 'multi_news', budget, press, 2)} | "
                f"{verdict(LB, 'multi_news', budget, press)} |"
            )
    return claims


def locomo_claims() -> list[str]:
    asked = questions(LOCOMO)
    lengths = [r["history_tokens"] for r in asked.values()]
    over_1800 = sum(length > 1800 for length in lengths)
    per_question = work_seconds(LOCOMO) / len(asked)
    later = "later turns"
    claims = [
        wall(LOCOMO),
        f"the committed run cost {per_question:.1f} s per question",
        f"mean history\n  {tokens(statistics.mean(lengths))} tokens",
        f"300 questions take about {300 * per_question / 60:.0f} minutes",
        f"({tokens(min(lengths))} to {tokens(max(lengths))} tokens, median\n{tokens(statistics.median(lengths))})",
        f"{sum(length > 512 for length in lengths)} of {len(asked)} questions at 512 tokens and {over_1800} of "
        f"{len(asked)} at\n1,800 tokens (the other {len(asked) - over_1800} are",
        f"{len(asked) - over_1800} of the 200 histories never exceeded 1,800 tokens",
        f"on later turns, and on categories 1-4\n  overall, {diff(LOCOMO, 'overall (1-4)', '512 tokens', 'rmm', 3)})",
        f"RMM loses to H2O ({diff(LOCOMO, later, '512 tokens', 'rmm', 3)}",
        "TOVA also loses to H2O at 512 tokens (" + diff(LOCOMO, later, "512 tokens", "tova", 3).replace(", ", ",\n  "),
        f"**Against the full cache** ({mean(LOCOMO, later, 'full', 'full', 3)} on later turns) at 512 tokens: h2o "
        f"{diff(LOCOMO, later, '512 tokens', 'h2o', 3, 'full_')}",
        f"rmm {diff(LOCOMO, later, '512 tokens', 'rmm', 3, 'full_')}, tova "
        f"{diff(LOCOMO, later, '512 tokens', 'tova', 3, 'full_')} and snapkv "
        f"{diff(LOCOMO, later, '512 tokens', 'snapkv', 3, 'full_')}",
        f"itself scores {mean(LOCOMO, later, 'full', 'full', 3)} on later turns",
        "near every press at 1,800 tokens ({:.3f} to {:.3f})".format(
            *(
                f(
                    float(card(LOCOMO)[later, "1800 tokens", p]["mean"])
                    for p in ("snapkv", "h2o", "streaming_llm", "tova", "rmm")
                )
                for f in (min, max)
            )
        ),
        f"Later turns (n={card(LOCOMO)[later, 'full', 'full']['n']} questions",
        f"Adversarial questions (category 5, n={card(LOCOMO)['adversarial (5)', 'full', 'full']['n']})",
    ]
    assert verdict(LOCOMO, later, "512 tokens", "h2o", "full_") == "tie"
    assert {verdict(LOCOMO, later, "512 tokens", p, "full_") for p in ("rmm", "tova", "snapkv")} == {"loss"}
    assert {
        verdict(LOCOMO, later, "1800 tokens", p, "full_") for p in ("snapkv", "h2o", "streaming_llm", "tova", "rmm")
    } == {"tie"}
    assert {verdict(LOCOMO, "first turn", "1800 tokens", p, "full_") for p in ("snapkv", "h2o", "tova", "rmm")} == {
        "identical"
    }
    assert verdict(LOCOMO, "first turn", "512 tokens", "rmm") == "identical"
    adversarial = {p: line["verdict"] for (c, _, p), line in card(LOCOMO).items() if c == "adversarial (5)"}
    assert adversarial.pop("rmm") == "no signal" and set(adversarial.values()) == {"tie", "reference", "-"}
    assert all(r["evidence_visible"] for r in asked.values())
    for budget, paper in (("1800 tokens", "1,800 tokens"), ("512 tokens", "512 tokens")):
        for press in ("rmm", "snapkv", "streaming_llm"):
            claims.append(
                f"| {paper} | {press}: {diff(LOCOMO, later, budget, press, 3)} | "
                f"{verdict(LOCOMO, later, budget, press)} |"
            )
    return claims


def contrast(run: str, budget: str, press: str) -> dict:
    with (RESULTS / run / "contrasts.csv").open() as handle:
        return next(r for r in csv.DictReader(handle) if (r["budget"], r["press"]) == (budget, press))


def contrast_diff(run: str, budget: str, press: str) -> str:
    line = contrast(run, budget, press)
    d, low, high = (number(float(line[k]), 1, True) for k in ("diff", "diff_low", "diff_high"))
    return f"{d} [{low}, {high}]"


def reuse_claims() -> list[str]:
    kinds = Counter(r["kind"] for r in questions(REUSE).values())
    first, again, control = "first ask", "asked again", "never asked (control)"
    reach, miss = "the lag's window reaches the first use", "the lag's window misses the first use"
    distances = {
        kind: [r["first_use_distance"] for r in rows(REUSE) if r["press"] == "full" and r["kind"] == kind]
        for kind in ("reuse", "fresh")
    }
    b256, b512 = "256 tokens", "512 tokens"

    def n(condition: str, budget: str, press: str) -> str:
        return card(REUSE)[condition, budget, press]["n"]

    claims = [
        wall(REUSE),
        f"{sum(kinds.values())} questions ({kinds['first']} first asks, {kinds['reuse']} asked again, "
        f"{kinds['fresh']} controls)",
        f"full cache answers {percent(mean(REUSE, 'overall', 'full', 'full', 1))} overall ("
        f"{float(card(REUSE)[first, 'full', 'full']['mean']):.1f}% of first asks, "
        f"{percent(mean(REUSE, again, 'full', 'full', 1))} asked again, "
        f"{percent(mean(REUSE, control, 'full', 'full', 1))} controls)",
        f"Paired over the {contrast(REUSE, 'full', 'full')['n']} pairs, the reused code minus its control is "
        f"{contrast_diff(REUSE, 'full', 'full')} with the full cache, a {contrast(REUSE, 'full', 'full')['verdict']}",
        f"h2o ({contrast_diff(REUSE, b256, 'h2o')} at 256 tokens, {contrast_diff(REUSE, b512, 'h2o')} at 512), rmm "
        f"({contrast_diff(REUSE, b256, 'rmm')}, {contrast_diff(REUSE, b512, 'rmm')})",
        f"snapkv ({contrast_diff(REUSE, b512, 'snapkv')}) and tova ({contrast_diff(REUSE, b512, 'tova')}) at 512",
        f"a control asked second scores {mean(REUSE, control + ', asked second', 'full', 'full', 1)}, asked first "
        f"{mean(REUSE, control + ', asked first', 'full', 'full', 1)}; a reused code "
        f"{float(card(REUSE)[again + ', asked first', 'full', 'full']['mean']):.1f} either way",
        "comes {} to {} positions after its statement (median {:g}), a control's (its own answer line) {} to {} "
        "(median {:g})".format(
            *(f(distances[kind]) for kind in ("reuse", "fresh") for f in (min, max, statistics.median))
        ),
        f"answers {mean(REUSE, f'{again}, {reach}', b512, 'rmm(lag=128)', 1)} of the reused codes whose window "
        f"reaches that use (n={n(f'{again}, {reach}', b512, 'rmm(lag=128)')}) and "
        f"{mean(REUSE, f'{again}, {miss}', b512, 'rmm(lag=128)', 1)} of those it misses "
        f"(n={n(f'{again}, {miss}', b512, 'rmm(lag=128)')}); controls "
        f"{mean(REUSE, f'{control}, {reach}', b512, 'rmm(lag=128)', 1)} "
        f"(n={n(f'{control}, {reach}', b512, 'rmm(lag=128)')}) against "
        f"{float(card(REUSE)[f'{control}, {miss}', b512, 'rmm(lag=128)']['mean']):.1f} "
        f"(n={n(f'{control}, {miss}', b512, 'rmm(lag=128)')})",
        "both lose to h2o on reused codes at both budgets ({}, {})".format(
            *(
                " and ".join(diff(REUSE, again, b, p, 1).split(" [")[0] for b in (b256, b512))
                for p in ("rmm(lag=16)", "rmm(lag=64)")
            )
        ),
        "against h2o it has {tie} ties, {identical} identical pairs and {no_signal} with no signal".format(
            **{k.replace(" ", "_"): v for k, v in verdicts(REUSE, ("rmm",)).items()}
        ),
        f"(overall {diff(REUSE, 'overall', b256, 'rmm', 1)} at 256 tokens, {diff(REUSE, 'overall', b512, 'rmm', 1)} "
        "at 512)",
        f"at lag 128 ({diff(REUSE, first, b256, 'rmm(lag=128)', 1)} at 256 tokens, "
        f"{diff(REUSE, first, b512, 'rmm(lag=128)', 1)} at 512)",
        "wins there by more ({}, {})".format(
            *(diff(REUSE, first, b, "streaming_llm", 1).split(" [")[0] for b in (b256, b512))
        ),
        f"**Against the full cache** ({float(card(REUSE)['overall', 'full', 'full']['mean']):.1f} overall)",
        f"at 512 streaming_llm ties it ({diff(REUSE, 'overall', b512, 'streaming_llm', 1, 'full_')})",
        f"h2o by {diff(REUSE, 'overall', b512, 'h2o', 1, 'full_')}",
    ]
    reused = [r for r in rows(REUSE) if r["kind"] == "reuse" and r["press"] in ("rmm(lag=16)", "rmm(lag=64)")]
    reached = [r for r in reused if r["first_use_distance"] <= int(r["press"][8:-1])]
    assert len(reached) <= 0.05 * len(reused), "almost no window of lags 16 and 64 reaches a reused code's use"
    assert set(verdicts(REUSE, ("rmm",))) == {"tie", "identical", "no signal"}
    assert {contrast(REUSE, b, p)["verdict"] for b in (b256, b512) for p in RMMS} == {"tie"}
    assert contrast(REUSE, b256, "h2o")["verdict"] == contrast(REUSE, b512, "h2o")["verdict"] == "tie"
    assert contrast(REUSE, b512, "snapkv")["verdict"] == contrast(REUSE, b512, "tova")["verdict"] == "win"
    assert {verdict(REUSE, "overall", b256, p, "full_") for p in (*PRESSES, "h2o")} == {"loss"}
    assert verdict(REUSE, "overall", b512, "streaming_llm", "full_") == "tie"
    assert {verdict(REUSE, "overall", b512, p, "full_") for p in PRESSES if p != "streaming_llm"} == {"loss"}
    assert {verdict(REUSE, again, b, p) for b in (b256, b512) for p in ("rmm(lag=16)", "rmm(lag=64)")} == {"loss"}
    assert {verdict(REUSE, first, b, p) for b in (b256, b512) for p in ("rmm(lag=128)", "streaming_llm")} == {"win"}
    return claims


def unit_seconds(run: str) -> dict[str, float]:
    return {k: v for s in record(run)["sessions"] for k, v in (s.get("unit_seconds") or {}).items()}


def multiquery_claims() -> list[str]:
    asked = questions(MQ)
    by_length = {n: [r["history_tokens"] for r in asked.values() if r["length"] == n] for n in ("1k", "2k")}
    seconds = unit_seconds(MQ)
    long_seconds = unit_seconds(MQ_LONG)
    mean_of = {n: statistics.mean(v for k, v in long_seconds.items() if f"-{n}-" in k) for n in ("8k", "16k")}
    four_k = min(v for k, v in long_seconds.items() if "-4k-" in k)
    long_verdicts = verdicts(MQ_LONG, PRESSES)
    floor = verdicts(MQ, RMMS)
    h2o_256 = [r for r in rows(MQ) if r["press"] == "h2o" and r["budget_label"] == "256 tokens"]
    claims = [
        wall(MQ),
        wall(MQ_LONG),
        wall(MQ_32K),
        f"| 1k tokens ({tokens(min(by_length['1k']))} to {tokens(max(by_length['1k']))} history tokens) | 32 | "
        f"{mean(MQ, '1k context', 'full', 'full', 1)} | {min(v for k, v in seconds.items() if '-1k-' in k):.0f} to "
        f"{max(v for k, v in seconds.items() if '-1k-' in k):.0f} |",
        f"| 2k tokens ({tokens(min(by_length['2k']))} to {tokens(max(by_length['2k']))}) | 32 | "
        f"{mean(MQ, '2k context', 'full', 'full', 1)} | {min(v for k, v in seconds.items() if '-2k-' in k):.0f} to "
        f"{max(v for k, v in seconds.items() if '-2k-' in k):.0f} |",
        "| 8k tokens ({}) | 8 | 0.0 | {:.0f}, {:.0f} |".format(
            " to ".join(
                tokens(f(r["history_tokens"] for r in questions(MQ_LONG).values() if r["length"] == "8k"))
                for f in (min, max)
            ),
            *sorted(v for k, v in long_seconds.items() if "-8k-" in k),
        ),
        "| 16k tokens ({}) | 8 | 0.0 | {:.0f}, {:.0f} |".format(
            " to ".join(
                tokens(f(r["history_tokens"] for r in questions(MQ_LONG).values() if r["length"] == "16k"))
                for f in (min, max)
            ),
            *sorted(v for k, v in long_seconds.items() if "-16k-" in k),
        ),
        f"| 32k tokens | 4 | 0.0 | {tokens(unit_seconds(MQ_32K)['mq-32k-0'])} |".replace(
            "32k tokens", "32k tokens (31,554 to 31,666)"
        ),
        f"By kind over 1k and 2k: kv {mean(MQ, 'kv', 'full', 'full', 1)} (32), needle "
        f"{mean(MQ, 'needle', 'full', 'full', 1)} "
        f"(16), vt {float(card(MQ)['vt', 'full', 'full']['mean']):.1f} (16)",
        f"of the {sum(long_verdicts.values())} pairs of a press with h2o there, "
        f"{long_verdicts['no signal']} carry no signal "
        f"and {long_verdicts['identical']} is\n  identical",
        f"grew {mean_of['8k'] / four_k:.1f}x from the quieter 4k document to 8k, "
        f"{mean_of['16k'] / mean_of['8k']:.1f}x from 8k to 16k "
        f"and {unit_seconds(MQ_32K)['mq-32k-0'] / mean_of['16k']:.1f}x\n  from 16k to 32k",
        f"4 questions, {unit_seconds(MQ_32K)['mq-32k-0'] / 60:.0f} minutes",
        f"all {sum(verdicts(MQ_32K, PRESSES).values())} pairs\n  with h2o carry no signal",
        f"streaming_llm keeps {mean(MQ, 'overall', '512 tokens', 'streaming_llm', 1)} overall",
        f"snapkv and tova {float(card(MQ)['overall', '512 tokens', 'tova']['mean']):.1f}, h2o "
        f"{float(card(MQ)['overall', '512 tokens', 'h2o']['mean']):.1f} and rmm "
        f"{float(card(MQ)['overall', '512 tokens', 'rmm']['mean']):.1f}",
        f"against the full cache's {float(card(MQ)['overall', 'full', 'full']['mean']):.1f}",
        f"(+7.8 [+1.6, +15.6] at 256,\n  {diff(MQ, 'overall', '512 tokens', 'streaming_llm', 1)} at 512)".replace(
            "+7.8 [+1.6, +15.6]", diff(MQ, "overall", "256 tokens", "streaming_llm", 1)
        ),
        f"tova at 512 ({diff(MQ, 'overall', '512 tokens', 'tova', 1)})",
        f"with h2o, {floor['no signal']} carry no\n  signal",
        f"{floor['identical']} are identical and {floor['tie']}\n  are ties",
        f"h2o answers {sum(r['score'] for r in h2o_256):.0f} of the {len(h2o_256)} questions at 256 tokens",
    ]
    assert sum(floor.values()) == 48 and sum(long_verdicts.values()) == 98
    assert verdicts(MQ_32K, PRESSES) == Counter({"no signal": 56})
    assert long_verdicts - Counter({"no signal": 94, "identical": 1}) == Counter(
        verdicts(MQ_LONG, ("streaming_llm",)) - Counter({"no signal": 11})
    )
    assert verdicts(MQ_LONG, ("streaming_llm",)) == Counter({"no signal": 11, "tie": 2, "too few": 1})
    assert float(card(MQ)["overall", "512 tokens", "snapkv"]["mean"]) == float(
        card(MQ)["overall", "512 tokens", "tova"]["mean"]
    )
    assert float(card(MQ)["overall", "256 tokens", "h2o"]["mean"]) == 0
    ties = [abs(float(c["diff"])) for (_, _, p), c in card(MQ).items() if p in RMMS and c["verdict"] == "tie"]
    claims.append(f"each within {max(ties):.1f} points")
    return claims


def lab_claims() -> list[str]:
    hit = {(b, p): float(line["mean"]) for (c, b, p), line in card(TRACES).items() if c == "hit_rate"}
    at_512 = "512 tokens"
    controls = [hit[at_512, f"recent_window(h2o,window={lag})"] for lag in LAGS]
    summaries = {r["text"]: r for r in rows(TRACES) if r["metric"] == "summary"}
    held = {
        press: [
            sum(r["recent_64_held"]) / len(r["recent_64_held"])
            for r in rows(TRACES)
            if r["press"] == press and "recent_64_held" in r
        ]
        for press in ("rmm", "h2o")
    }
    share = [sum(v) / len(v) for v in (r["recent_64_attention_share"] for r in summaries.values())]
    rmm = [v for (_, p), v in hit.items() if p == "rmm"]
    h2o = [v for (_, p), v in hit.items() if p == "h2o"]
    recall = json.loads((RESULTS / TRACES / "controlled.json").read_text())
    test_recall = recall["test_recall"]
    claims = [
        wall(TRACES),
        f"{len({p for _, p in hit})} policies at 4 budgets ({len(hit)} policy x budget cells",
        *(
            f"| {lag} | {hit[at_512, f'rmm(lag={lag})']:.3f} | {control:.3f} |"
            for lag, control in zip(LAGS, controls, strict=True)
        ),
        f"`rmm(lag=0)` {hit[at_512, 'rmm(lag=0)']:.3f}, `h2o` {hit[at_512, 'h2o']:.3f}, Belady "
        f"{hit[at_512, 'belady']:.3f}",
        f"({min(controls):.3f} to {max(controls):.3f} at every H)",
        f"hits only {hit[at_512, 'rmm']:.3f} at 512 tokens, and {min(rmm):.3f} to {max(rmm):.3f} at every budget, "
        f"against `h2o`'s {min(h2o):.3f} to {max(h2o):.3f}",
        f"accuracy is {summaries['multi_news:0']['teacher_forced_accuracy']:.3f} (multi_news) and "
        f"{summaries['locomo:conv-26']['teacher_forced_accuracy']:.3f} (LoCoMo)",
        f"`rmm` holds {min(held['rmm']):.1f} to {max(held['rmm']):.1f} of the 64 newest positions",
        f"where `h2o` holds {min(held['h2o']):.1f} to {max(held['h2o']):.1f}",
        "{:.3f} and {:.3f} of each step's attention".format(*share),
        "recall of the reused items recency {recency:.3f}, H2O {h2o:.3f}, predictor {predictor:.3f}, smoother "
        "{smoother:.3f}, Belady {belady:.3f}".format(**test_recall),
        f"K/N floor ({recall['theory']['online_floor_K_over_N']:.3f})",
    ]
    assert {line["verdict"] for line in card(TRACES).values()} == {"too few", "reference"}
    for budget, press in hit:
        if press.startswith("rmm(lag=") and press != "rmm(lag=0)":
            lag = press.removeprefix("rmm(lag=").removesuffix(")")
            assert hit[budget, press] < hit[budget, f"recent_window(h2o,window={lag})"], (budget, press)
    return claims


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60)} s"


def readme_claims() -> list[str]:
    protocols = json.loads((RESULTS / "bench" / "protocols.json").read_text())
    history, decoding = protocols["locomo_history"], protocols["longbench_decoding"]
    lengths = [q["history_tokens"] for q in history["per_question"]]
    long_seconds = unit_seconds(MQ_LONG)
    first = {
        run["command"]: run["wall_seconds"]
        for run in json.loads((RESULTS / "bench" / "first_commands.json").read_text())["runs"]
    }
    return [
        f"10 multi_news examples x 11 cells: {minutes(first['make eval-longbench'])}",
        f"20 LoCoMo questions x 6 cells, streamed: {minutes(first['make eval-locomo'])}",
        "never separates from H2O ({tie} ties, {identical} identical pairs, {no_signal} with no signal)".format(
            **{k.replace(" ", "_"): v for k, v in verdicts(REUSE, ("rmm",)).items()}
        ),
        f"{verdicts(MQ, RMMS)['no signal']} of its 48 pairs with H2O carry\nno signal",
        f"full cache's {float(card(MQ)['overall', 'full', 'full']['mean']):.1f}%",
        "({:.0f} s and {:.0f} s per 4k\ndocument, {:.0f} s and {:.0f} s per 16k one, {} s for one of 32k".format(
            *sorted(v for k, v in long_seconds.items() if "-4k-" in k),
            *sorted(v for k, v in long_seconds.items() if "-16k-" in k),
            tokens(unit_seconds(MQ_32K)["mq-32k-0"]),
        ),
        f"over {history['questions']} questions of {history['conversation']} ({min(lengths) // 100 * 100:,} to "
        f"{-(-max(lengths) // 100) * 100:,} history\n  tokens): {history['median_incremental_s']:.2f} s against "
        f"{history['median_naive_s']:.1f} s, median ratio {history['median_ratio']:.3f}",
        f"{decoding['median_tokens_per_second']['batched']:.1f} against "
        f"{decoding['median_tokens_per_second']['one_at_a_time']:.1f} tokens per second, {decoding['ratio']:.2f}x",
        f"measured by the same script, is {decoding['ceiling']['ratio']:.2f}x",
    ]


PROBE = "probe/smollm2-135m"
DU, DU_CONFIDENCE = "demonstrated utility", "demonstrated utility (confidence)"
CONFIDENT, CONFIDENT_64 = "rmm(correctness='confidence')", "rmm(lag=64,correctness='confidence')"
CONFIDENT_128 = "rmm(lag=128,correctness='confidence')"
MEMORY_RMMS = ("rmm", "rmm(lag=32)", "rmm(lag=128)", CONFIDENT, CONFIDENT_128)


def probe_rows(press: str, k: int) -> dict[int, dict]:
    return {r["probe"]: r for r in rows(PROBE) if r["press"] == press and r["budget"] == f"top {k} of 16"}


def gap(scores: dict, reference: dict) -> str:
    """A paired difference of two presses' scores, in percentage points, as the documents write it."""
    interval = paired(scores, reference, "gap", 10_000, 0).scaled(100)
    return " ".join(
        [number(interval.mean, 1, True), f"[{number(interval.low, 1, True)}, {number(interval.high, 1, True)}]"]
    )


def reuse_scores(press: str, budget: int) -> dict[tuple, float]:
    """A press's scores on the reuse questions whose history exceeded the budget."""
    return {
        (r["conversation"], r["question_index"]): r["score"]
        for r in rows(REUSE)
        if r["press"] == press and r["budget"] == f"tokens={budget}" and r["history_tokens"] > budget
    }


def probe_claims() -> list[str]:
    correct, k2, k4 = "answered correctly", "top 2 of 16", "top 4 of 16"
    h2o = probe_rows("h2o", 2).values()
    claims = [
        wall(PROBE),
        f"SmolLM2 answered {sum(r['correct'] for r in h2o)} of the {len(h2o)} probes correctly",
        f"a median of {statistics.median(r['answer_tokens'] for r in h2o):.0f} answer tokens after a "
        f"{statistics.median(r['prompt_tokens'] for r in h2o):.0f}-token prompt",
        f"demonstrated utility minus h2o is {diff(PROBE, correct, k2, DU, 1)} at k=2 and "
        f"{diff(PROBE, correct, k4, DU, 1)} at k=4",
        f"Recency loses to h2o at k=4 ({diff(PROBE, correct, k4, 'recency', 1)}), tova at k=2 "
        f"({diff(PROBE, correct, k2, 'tova', 1)}) and snapkv at k=4 ({diff(PROBE, correct, k4, 'snapkv', 1)})",
    ]
    for condition, ks in ((correct, (2, 4)), ("answered incorrectly", (4,))):
        n = card(PROBE)[condition, k4, DU]["n"]
        for k in ks:
            cells = " | ".join(
                mean(PROBE, condition, f"top {k} of 16", press, 1) for press in (DU, "h2o", "recency", "tova", "snapkv")
            )
            claims.append(f"| {condition} (n={n}) | {k} | {cells} |")
    assert verdicts(PROBE, (DU,), condition=correct) == Counter({"tie": 2})
    same = {
        k: sum(probe_rows(DU, k)[p]["score"] == r["score"] for p, r in probe_rows(DU_CONFIDENCE, k).items())
        for k in (2, 4)
    }
    overall = gap(*({p: r["score"] for p, r in probe_rows(press, 4).items()} for press in (DU_CONFIDENCE, DU)))
    claims.append(f"on {same[4]} of the 400 probes at k=4 and on all {same[2]} at k=2 ({overall} overall at")
    b256, b512 = ([reuse_scores(press, budget) for press in (CONFIDENT, "rmm")] for budget in (256, 512))
    claims += [
        f"`rmm(correctness='confidence')` minus `rmm` is {gap(*b256)} at 256 tokens (the same score on "
        f"{sum(b256[0][q] == b256[1][q] for q in b256[0])} of {len(b256[0])} questions) and {gap(*b512)} at 512 "
        f"({sum(b512[0][q] == b512[1][q] for q in b512[0])} of {len(b512[0])})",
    ]
    for budget in (256, 512):
        lagged, reference = reuse_scores(CONFIDENT_64, budget), reuse_scores("rmm(lag=64)", budget)
        assert lagged == reference, "at lag 64 the two give the same score on every question"
    return claims


MEMORY, MEMORY_ALL = "memory/smollm2-135m", "memory/smollm2-135m-all-rows"
OLD, HELD = "stated over K facts before", "answer held (%), "
MEMORY_PRESSES = ("full", "h2o", "snapkv", "streaming_llm", "tova", *MEMORY_RMMS)


def memory_table(run: str, presses: tuple[str, ...]) -> list[str]:
    """The results README's table of a memory run: per press, the re-queries of facts stated over K facts before
    (answered, answer held) and every re-query of a used fact (answered, answer held)."""
    conditions = (f"reused, {OLD}", f"{HELD}reused, {OLD}", f"never reused, {OLD}", "reused", f"{HELD}reused")
    return [
        f"| {p} | " + " | ".join(mean(run, c, "full" if p == "full" else "256 tokens", p, 1) for c in conditions) + " |"
        for p in presses
    ]


def memory_scores(run: str, press: str) -> dict[tuple, float]:
    return {(r["conversation"], r["question_index"]): r["score"] for r in rows(run) if r["press"] == press}


def memory_claims() -> list[str]:
    claims = [wall(MEMORY), wall(MEMORY_ALL), *memory_table(MEMORY, MEMORY_PRESSES)]
    claims += memory_table(MEMORY_ALL, ("full", "h2o", "streaming_llm", *MEMORY_RMMS))
    n = {condition: card(MEMORY)[condition, "full", "full"]["n"] for condition in ("reused", f"reused, {OLD}")}
    claims.append(f"{n['reused']} re-queries of a used fact, {n[f'reused, {OLD}']} of them stated over K facts")
    claims.append(
        f"h2o's {mean(MEMORY, f'{HELD}reused', '256 tokens', 'h2o', 1)} "
        f"({diff(MEMORY, f'{HELD}reused', '256 tokens', 'rmm(lag=128)', 1)}, a win)"
    )
    assert verdict(MEMORY, f"{HELD}reused", "256 tokens", "rmm(lag=128)") == "win"
    for run in (MEMORY, MEMORY_ALL):
        for lagged, reference in ((CONFIDENT, "rmm"), (CONFIDENT_128, "rmm(lag=128)")):
            claims.append(gap(memory_scores(run, lagged), memory_scores(run, reference)))
    return claims


DOCUMENTS = {
    "results/README.md": longbench_claims()
    + locomo_claims()
    + reuse_claims()
    + multiquery_claims()
    + lab_claims()
    + probe_claims()
    + memory_claims(),
    "README.md": readme_claims(),
}


def flattened(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_quoted_figure_is_the_committed_files(document):
    text = flattened((ROOT / document).read_text())
    missing = [claim for claim in DOCUMENTS[document] if flattened(claim) not in text]
    assert not missing, f"{document} does not say what the files hold: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_no_interval_is_quoted_that_no_claim_recomputes(document):
    quoted = INTERVAL.findall(flattened((ROOT / document).read_text()))
    claimed = " | ".join(flattened(claim) for claim in DOCUMENTS[document])
    unbacked = [interval for interval in quoted if interval not in claimed]
    assert not unbacked, f"{document} quotes intervals no file backs: {unbacked}"
