"""Every figure README.md and results/README.md quote, recomputed from the committed files.

results/README.md states its claims as table rows that name their scorecard cell,
``| claim | `RUN: METRIC · CONDITION · BUDGET · PRESS vs BASELINE` | difference [interval] | n | clusters | MDE | p |
verdict | Holm p | Holm |`` for a paired difference (against ``h2o`` or ``full``: the run's scorecard.csv; against
another press: its press_contrasts.csv; a reuse contrast named in the CONDITION place: its contrasts.csv), and
``| claim | `RUN: METRIC · CONDITION · BUDGET · PRESS` | mean [interval] | n |`` for a cell's mean. Each such row is
rebuilt here from the file, at the decimals the document prints. The other figures (wall times, counts, the lab's
fields) are claims built here from run.json, predictions.jsonl or a json file. A last test finds every interval
the documents quote and requires a row or a claim for it, so no interval stands on no file.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from functools import cache
from pathlib import Path

import pytest

from evaluation.protocols.traces.policies import lag_control, seed_h2o
from evaluation.protocols.traces.tova_claims import tova_claims
from evaluation.reporting.conditions import RANDOM_CONTROL
from evaluation.reporting.intervals import paired
from evaluation.reporting.scorecard import p_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
INTERVAL = re.compile(r"[+-]?\d+\.\d+%? \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]")
ROW = re.compile(r"^\| (?P<claim>[^|]*?) \| `(?P<spec>[^`]+)` \| (?P<cells>.*) \|$", re.M)
RUNS = sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.glob("*/*/run.json"))


def csv_rows(run: str, name: str) -> list[dict]:
    path = RESULTS / run / name
    return list(csv.DictReader(path.open())) if path.exists() else []


@cache
def scorecard(run: str) -> dict[tuple[str, ...], dict]:
    return {(r["metric"], r["condition"], r["budget"], r["press"]): r for r in csv_rows(run, "scorecard.csv")}


@cache
def press_contrasts(run: str) -> dict[tuple[str, ...], dict]:
    keys = ("metric", "condition", "budget", "press", "baseline")
    return {tuple(r[k] for k in keys): r for r in csv_rows(run, "press_contrasts.csv")}


@cache
def contrasts(run: str) -> dict[tuple[str, ...], dict]:
    return {(r["metric"], r["contrast"], r["budget"], r["press"]): r for r in csv_rows(run, "contrasts.csv")}


@cache
def rows(run: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / run / "predictions.jsonl").read_text().splitlines()]


@cache
def record(run: str) -> dict:
    return json.loads((RESULTS / run / "run.json").read_text())


def decimals(text: str) -> int:
    found = re.search(r"\.(\d+)", text)
    return len(found.group(1)) if found else 0


def number(value: str | float, digits: int, signed: bool = False) -> str:
    return f"{float(value):+.{digits}f}" if signed else f"{float(value):.{digits}f}"


def interval(line: dict, prefix: str, digits: int, signed: bool) -> str:
    keys = (f"{prefix}diff", f"{prefix}diff_low", f"{prefix}diff_high") if signed else ("mean", "low", "high")
    center, low, high = (number(line[k], digits, signed) for k in keys)
    return f"{center} [{low}, {high}]"


def cell_row(spec: str, printed: list[str]) -> list[str]:
    """The cells a claim row naming ``spec`` must print, rebuilt from its file at ``printed``'s decimals."""
    run, _, where = spec.partition(": ")
    parts = where.split(" · ")
    assert len(parts) == 4, f"`{spec}`: METRIC · CONDITION · BUDGET · PRESS [vs BASELINE]"
    metric, condition, budget, press = parts
    press, _, baseline = press.partition(" vs ")
    digits = decimals(printed[0])
    if not baseline:
        line = scorecard(run)[metric, condition, budget, press]
        return [interval(line, "", digits, False), line["n"]]
    if (metric, condition, budget, press) in contrasts(run):
        line, prefix = contrasts(run)[metric, condition, budget, press], ""
        assert baseline == "control", f"`{spec}`: a reuse contrast is read against its control"
    elif baseline in ("h2o", "full"):
        line, prefix = scorecard(run)[metric, condition, budget, press], "" if baseline == "h2o" else "full_"
    else:
        line, prefix = press_contrasts(run)[metric, condition, budget, press, baseline], ""
    mde = number(line[f"{prefix}mde"], decimals(printed[3])) if line[f"{prefix}mde"] else "-"
    return [
        interval(line, prefix, digits, True),
        line["n"],
        line["clusters"],
        mde,
        p_text(float(line[f"{prefix}p"] or "nan"), float(line[f"{prefix}p_error"] or 0)),
        line[f"{prefix}verdict"],
        p_text(float(line[f"{prefix}holm_p"] or "nan")),
        line[f"{prefix}holm_verdict"],
    ]


def cell_claims(text: str) -> list[tuple[str, list[str], list[str]]]:
    """Every claim row of ``text``: its spec, the cells it prints and the cells its file gives."""
    found = []
    for match in ROW.finditer(text):
        printed = [cell.strip() for cell in match["cells"].split(" | ")]
        found.append((match["spec"], printed, cell_row(match["spec"], printed)))
    return found


def work_seconds(run: str) -> float:
    """The wall time of the sessions that ran units."""
    return sum(s["wall_seconds"] for s in record(run)["sessions"] if s.get("units_run"))


def commits(run: str) -> list[str]:
    return [s["git_commit"] for s in record(run)["sessions"] if s.get("units_run")]


def runs_table_row(run: str) -> str:
    """The runs table's commit and wall-time cells of ``run``."""
    seconds = work_seconds(run)
    made = ", ".join(dict.fromkeys(c[:7] for c in commits(run)))
    return f"[{run}]({run}/scorecard.md) | {made} | {round(seconds):,} s ({seconds / 60:.1f} min) |"


LB, LOCOMO, PROBE, MIDDLE, RECENCY_5_8 = (
    "longbench/smollm2-135m",
    "locomo/smollm2-135m",
    "probe/smollm2-135m",
    "probe/smollm2-135m-middle",
    "probe/smollm2-135m-recency-5-8",
)
MEMORY, TRACES, REUSE, MQ = (
    "memory/smollm2-135m",
    "traces/smollm2-135m",
    "reuse/smollm2-135m",
    "multiquery/smollm2-135m",
)


RULER, NEEDLE = "ruler/smollm2-135m", "needle/smollm2-135m"
LIKELIHOOD = "longbench/smollm2-135m-likelihood-low"
LIKELIHOOD_HIGH = "longbench/smollm2-135m-likelihood-high"
LIKELIHOOD_RANDOM = "longbench/smollm2-135m-likelihood-random"


def ruler_claims() -> list[str]:
    card, needle = scorecard(RULER), scorecard(NEEDLE)

    def cell(metric: str, length: int, press: str, budget: str = "keep 50%") -> dict:
        return card[metric, f"average @ {length}", "full" if press == "full" else budget, press]

    tova = [-float(cell("score", length, "tova")["full_diff"]) for length in (1024, 2048)]
    rmm = [float(cell("score", length, "rmm")["mde"]) for length in (1024, 2048)]
    lost = {
        (line["press"], line["budget"])
        for key, line in needle.items()
        if key[0] == "score" and key[1] == "1024 tokens" and line["full_verdict"] == "loss"
    }
    after = [line for key, line in needle.items() if key[0] == "score" and line["full_holm_verdict"] == "loss"]
    assert lost == {(p, b) for p in ("snapkv", "tova", "rmm", "streaming_llm") for b in ("keep 50%", "keep 25%")} - {
        ("streaming_llm", "keep 50%")
    }
    assert not [line for line in after if line["family"] == "primary"]
    return [
        f"the full cache answers {float(cell('score', 1024, 'full')['mean']):.1f} points at 1,024 tokens, and H2O "
        f"{float(cell('score', 1024, 'h2o')['mean']):.1f} at keep 50%",
        f"it trails the full cache by {tova[0]:.1f} and {tova[1]:.1f} points",
        f"(MDE {rmm[0]:.1f} and {rmm[1]:.1f} points)",
        f"its answer NLL is {float(cell('answer NLL', 1024, 'rmm')['diff']):.3f} nats worse",
        f"1,024 tokens ({float(needle['score', '1024 tokens', 'full', 'full']['mean']):.1f} points",
        f"not at 2,048 ({float(needle['score', '2048 tokens', 'full', 'full']['mean']):.1f})",
    ]


def runs_claims() -> list[str]:
    return [runs_table_row(run) for run in RUNS]


def markdown_line(run: str, start: str) -> list[str]:
    """The cells of the line of ``run``'s scorecard.md that starts with ``start``."""
    for line in (RESULTS / run / "scorecard.md").read_text().splitlines():
        if line.startswith(start):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"{run}: no line starts with {start!r}")


def longbench_claims() -> list[str]:
    full = markdown_line(LB, "| multi_news | full | full | 24 |")
    per_example = work_seconds(LB) / 24
    return [
        f"{full[4]} of the full cache's summaries",
        f"and {full[5]} repeat a sentence",
        f"the run cost {per_example:.0f} s per example",
        f"the\n  paper's n=40 would take {40 * per_example / 60:.0f} minutes",
    ]


def likelihood_claims() -> list[str]:
    low, high = scorecard(LIKELIHOOD), scorecard(LIKELIHOOD_HIGH)
    cells = [(low, "keep 12%"), (low, "keep 25%"), (high, "keep 50%"), (high, "keep 75%")]

    def field(press: str, name: str) -> list[float]:
        return [float(card["answer NLL", "multi_news", budget, press][name]) for card, budget in cells]

    def four(values: list[float], digits: int) -> str:
        return ", ".join(f"{v:.{digits}f}" for v in values[:3]) + f" and {values[3]:.{digits}f}"

    others = [d for press in ("tova", "snapkv", "streaming_llm", "knorm") for d in field(press, "diff")[:2]]
    share = [-100 * s for s in field("rmm", "cost_share")[2:]]
    failed = [int(card["answer NLL", "multi_news", budget, "rmm(lag=64)"]["failed"] or 0) for card, budget in cells]
    assert failed == [2, 1, 0, 0]
    ties = {
        key[3] for card in (low, high) for key, line in card.items() if key[2] != "full" and line["verdict"] != "loss"
    }
    assert ties == {"h2o", "knorm", "rmm(lag=64)"}
    at75 = {press: high["answer NLL", "multi_news", "keep 75%", press] for press in ("knorm", "rmm(lag=64)")}
    return [
        f"loses to it by {four(field('rmm', 'diff'), 3)} nats at keep 12.5%, 25%, 50% and 75% (MDEs "
        f"{four(field('rmm', 'mde'), 3)})",
        f"RMM's loss is {min(share):.0f}-{max(share):.0f}% of H2O's own loss",
        f"lose to H2O by {min(others):.2f} to {max(others):.2f} nats",
        *(f"(+{float(line['diff']):.3f}, MDE {float(line['mde']):.3f})" for line in at75.values()),
        f"random eviction loses to H2O by {four(field('random', 'diff'), 2)} nats",
        f"the full cache by {four(field('h2o', 'full_diff'), 2)}",
        *random_control_claims(),
    ]


SAME_PRESSES = ("full", "h2o", "rmm")


def random_control_contrasts() -> dict[str, dict]:
    """RMM against its random-weight control, by budget (press_contrasts.csv)."""
    card = press_contrasts(LIKELIHOOD_RANDOM)
    assert {key[3] for key in card} == {"rmm"}
    return {key[2]: line for key, line in card.items() if key[4] == RANDOM_CONTROL}


def random_control_differences() -> list[float]:
    contrast = random_control_contrasts()
    return [float(contrast[budget]["diff"]) for budget in ("keep 25%", "keep 50%")]


def random_control_claims() -> list[str]:
    """RMM against its random-weight control: RMM's and H2O's rows equal the budget runs' (one computation), and the
    figures results/README.md quotes."""
    contrast = random_control_contrasts()
    same = {(r["id"], r["press"], r["budget"]): r["answer_nll"] for r in rows(LIKELIHOOD_RANDOM)}
    budgets = {r["budget"] for r in rows(LIKELIHOOD_RANDOM)}
    earlier = [r for run in (LIKELIHOOD, LIKELIHOOD_HIGH) for r in rows(run) if r["budget"] in budgets]
    assert all(same[r["id"], r["press"], r["budget"]] == r["answer_nll"] for r in earlier if r["press"] in SAME_PRESSES)
    assert all(line["holm_verdict"] == "loss" for line in contrast.values())
    diffs = random_control_differences()
    return [
        f"RMM's answer NLL\n  is {diffs[0]:.3f} and {diffs[1]:.3f} nats above its control's",
        f"at keep 25% p = {float(contrast['keep 25%']['p']):.3f} sits at the threshold",
    ]


def locomo_claims() -> list[str]:
    asked = {(r["conversation"], r["question_index"]): r for r in rows(LOCOMO)}
    over = {b: sum(q["history_tokens"] > b for q in asked.values()) for b in (512, 1800)}
    fits = len(asked) - over[1800]
    assert all(q["evidence_visible"] for q in asked.values())
    assert scorecard(LOCOMO)["score", "first turn", "512 tokens", "rmm"]["verdict"] == "identical"
    return [
        f"The evidence was inside the history for all {len(asked)} questions",
        f"The history exceeded 512\ntokens for all {over[512]} and 1,800 tokens for {over[1800]}; the other {fits}",
        f"on the {scorecard(LOCOMO)['score', 'later turns', '1800 tokens', 'h2o']['n']} evicted histories",
    ]


def probe_claims() -> list[str]:
    answered = {r["probe"]: r["correct"] for r in rows(PROBE)}
    middle = {r["probe"]: r["correct"] for r in rows(MIDDLE)}
    both_5_8 = {
        r["probe"]: r["correct"]
        for r in rows(PROBE)
        if r["press"] == "recency" and all(5 <= rank <= 8 for rank in r["gold_ranks"])
    }
    ranks = markdown_line(PROBE, "Each scorer's share")[0]
    by_rank = {
        bin_: markdown_line(PROBE, f"| answered correctly, older gold fact at recency rank {bin_} | top 4 of 16 |")
        for bin_ in ("2-4", "5-8", "13-16")
    }
    share = {bin_: [cell.split(" [")[0] for cell in cells[2:]] for bin_, cells in by_rank.items()}
    n = {bin_: cells[2].rsplit("(", 1)[1].rstrip(")") for bin_, cells in by_rank.items()}
    du, h2o, tova, recency = 0, 2, 3, 5
    wrong = markdown_line(PROBE, "| answered incorrectly, older gold fact at recency rank 5-8 | top 4 of 16 |")
    wrong_5_8 = [cell.split(" [")[0] for cell in wrong[2:]]
    assert all(share["2-4"][i] == "100.0" for i in range(6) if i != tova) and share["2-4"][tova] != "100.0"
    return [
        f"SmolLM2 answered {sum(answered.values())} of 400\n  probes correctly",
        re.search(r"mean recency rank: (\d+\.\d) on the \d+ probes answered correctly; (\d+\.\d)", ranks).expand(
            r"mean recency rank is \1\n  on them against \2 on the rest"
        ),
        f"newest (n={n['2-4']}), every scorer but TOVA finds both in all {n['2-4']}",
        f"5th to 8th (n={n['5-8']}), demonstrated utility {share['5-8'][du]}%, h2o\n  {share['5-8'][h2o]}%, "
        f"recency {share['5-8'][recency]}%",
        f"13th to 16th (n={n['13-16']}), demonstrated utility {share['13-16'][du]}%, h2o {share['13-16'][h2o]}%",
        f"demonstrated utility rises from {wrong_5_8[du]}% on the incorrectly answered probes to {share['5-8'][du]}% "
        f"where recency stays at {wrong_5_8[recency]}%",
        f"SmolLM2\n  answers {sum(middle.values())} of 400 correctly",
        f"but TOVA's {float(scorecard(MIDDLE)['score', 'overall', 'top 4 of 16', 'tova']['mean']):.1f}%",
        f"({sum(both_5_8.values())} of the {len(both_5_8)} shuffled probes with both gold facts there answered "
        "correctly)",
        *recency_5_8_claims(),
    ]


def recency_5_8_top_4() -> tuple[int, int, int]:
    """The recency-5-8 probe's rows of demonstrated utility at top 4: the probes, those answered correctly, and of
    those the ones where it ranks both gold facts in its top 4."""
    probe = [r for r in rows(RECENCY_5_8) if r["press"] == "demonstrated utility" and r["budget"] == "top 4 of 16"]
    correct = [r for r in probe if r["correct"]]
    return len(probe), len(correct), sum(r["score"] > 0 for r in correct)


def recency_5_8_claims() -> list[str]:
    """The probe's control at recency ranks 5 to 8: how many answered, and what each scorer finds on them."""
    probes, correct, found = recency_5_8_top_4()
    cells = scorecard(RECENCY_5_8)
    share = float(cells["score", "answered correctly", "top 4 of 16", "demonstrated utility"]["mean"])
    overall = {press: float(cells["score", "overall", "top 4 of 16", press]["mean"]) for press in ("tova", "h2o")}
    return [
        f"answers {correct} of {probes:,} probes correctly",
        f"On those {correct}, demonstrated utility puts both gold facts in its top 4 on {found} ({share:.1f}%)",
        f"TOVA finds both on {overall['tova']:.1f}% of all {probes:,} probes, h2o on {overall['h2o']:.1f}%",
    ]


def memory_claims() -> list[str]:
    queried = {(r["conversation"], r["question_index"]): r for r in rows(MEMORY)}
    full = scorecard(MEMORY)
    old = int(full["score", "reused, stated over K facts before", "full", "full"]["n"])
    bounded = [
        float(line["mean"])
        for (m, c, b, p), line in full.items()
        if m == "score" and c == "reused, stated over K facts before" and b != "full"
    ]
    return [
        f"re-queried: {len(queried)} re-queries, {full['score', 'reused', 'full', 'full']['n']} of a used fact, "
        f"{full['score', 'reused, stated over K facts before', 'full', 'full']['n']} of them stated over K facts",
        f"answers at most {max(bounded):.1f}% of those re-queries",
        f"every bounded press answers at most {round(max(bounded) * old / 100)} of those {old}",
        f"full cache's {float(full['score', 'reused, stated over K facts before', 'full', 'full']['mean']):.1f}%",
    ]


def lab_means(condition: str) -> dict[tuple[str, str], float]:
    """The lab's mean of ``condition`` (a trace metric) per budget and policy."""
    return {(b, p): float(line["mean"]) for (_, c, b, p), line in scorecard(TRACES).items() if c == condition}


def lag_pairs(means: dict[tuple[str, str], float]) -> list[tuple[int, float, float]]:
    """Each finite lag H > 0 at each budget: H, ``rmm(lag=H)``'s mean and its commit-lag control's."""
    pairs = []
    for (budget, press), value in means.items():
        found = re.fullmatch(r"rmm\(lag=(\d+)\)", press)
        if found and int(found[1]) > 0:
            pairs.append((int(found[1]), value, means[budget, lag_control(int(found[1]))]))
    return pairs


def lab_claims() -> list[str]:
    hit, recall = lab_means("hit_rate"), lab_means("heavy_hitter_recall")

    def cell(budget: int, press: str) -> str:
        return f"{hit[f'{budget} tokens', press]:.3f}" if (f"{budget} tokens", press) in hit else "-"

    budgets = sorted({int(b.split()[0]) for b, _ in hit})
    assert len(lag_pairs(hit)) == len(lag_pairs(recall)) > 0, "every finite lag beside its control"
    assert all(control >= lagged for _, lagged, control in lag_pairs(hit)), "the control holds as much or more"
    assert all(lagged > control for lag, lagged, control in lag_pairs(recall) if lag >= 4), "the lag leads recall"
    summaries = {r["text"]: r for r in rows(TRACES) if r["metric"] == "summary"}
    held = {
        press: [
            sum(r["recent_64_held"]) / len(r["recent_64_held"])
            for r in rows(TRACES)
            if r["press"] == press and "recent_64_held" in r
        ]
        for press in ("rmm", "h2o")
    }
    share = [statistics.fmean(r["recent_64_attention_share"]) for r in summaries.values()]
    controlled = json.loads((RESULTS / TRACES / "controlled.json").read_text())
    claims = [
        *(
            f"| {lag} | {cell(128, f'rmm(lag={lag})')} | {cell(128, f'recent_window(rmm,window={lag})')} | "
            f"{cell(512, f'rmm(lag={lag})')} | {cell(512, f'recent_window(rmm,window={lag})')} |"
            for lag in (1, 4, 16, 64, 256)
        ),
        f"`rmm(lag=0)` {cell(512, 'rmm(lag=0)')}, `h2o` {cell(512, 'h2o')}, Belady {cell(512, 'belady')} at 512 tokens",
        f"hits only {cell(512, 'rmm')} at 512 tokens",
        f"accuracy {summaries['multi_news:0']['teacher_forced_accuracy']:.3f} on multi_news, "
        f"{summaries['locomo:conv-26']['teacher_forced_accuracy']:.3f}\non LoCoMo",
        f"`rmm` holds {min(held['rmm']):.1f} to {max(held['rmm']):.1f} of the 64 newest",
        f"where `h2o` holds {min(held['h2o']):.1f} to {max(held['h2o']):.1f}",
        "{:.3f} and {:.3f} of each step's attention".format(*share),
        "recall of the reused items recency {recency:.3f}, H2O {h2o:.3f}, predictor {predictor:.3f}, smoother "
        "{smoother:.3f}, Belady {belady:.3f}".format(**controlled["test_recall"]),
        f"K/N floor ({controlled['theory']['online_floor_K_over_N']:.3f})",
    ]
    claims.append(
        f"(at 512 tokens, lag 64: {recall['512 tokens', 'rmm(lag=64)']:.3f} against "
        f"{recall['512 tokens', 'recent_window(rmm,window=64)']:.3f})"
    )
    labels = sorted({b for b, _ in recall}, key=lambda label: int(label.split()[0]))
    belady, summed = ([recall[b, press] for b in labels] for press in ("belady", seed_h2o(32)))
    assert all(recall[b, "belady"] < recall[b, press] for b in labels for press in ("tova", "h2o", seed_h2o(32)))
    claims += [
        f"scores {min(belady):.3f} to {max(belady):.3f} (the means at each budget)",
        f"summed H2O scores {min(summed):.3f} to {max(summed):.3f}",
    ]
    seed = tova_claims(rows(TRACES), budgets, 32)
    claims += [
        f"| {c.text} | {c.budget} | {c.tova_mass - c.seed_mass:+.3f} | {c.tova_recall:.3f} | {c.seed_recall:.3f} | "
        f"{c.tova_recent:.3f} | {c.tova_first:.3f} |"
        for c in seed
    ]
    gaps = [c.tova_mass - c.seed_mass for c in seed]
    kvpress = [c.tova_mass - c.h2o_mass for c in seed]
    at_256 = [c for c in seed if c.budget == "256 tokens"]
    assert min(gaps) > 0 and all(c.seed_recall > c.tova_recall for c in seed)
    assert all(c.belady_recall < c.tova_recall < min(c.seed_recall, c.h2o_recall) for c in seed)
    assert all(c.h2o_first > c.tova_first for c in at_256)
    belady_recalls = [c.belady_recall for c in seed]
    claims += [
        f"by {min(gaps):.3f} to {max(gaps):.3f}",
        f"TOVA's retained mass differs by {min(kvpress):+.3f} to {max(kvpress):+.3f}: a tie",
        f"{min(kvpress):+.3f} to {max(kvpress):+.3f} against KVPress's",
        f"scores below all three there ({min(belady_recalls):.3f} to {max(belady_recalls):.3f})",
        "TOVA holds {:.1%} and {:.1%} of the 64 newest".format(*(c.tova_recent for c in at_256)),
        "but only {:.1%} and {:.1%} of the 4 first".format(*(c.tova_first for c in at_256)),
        "fewer than KVPress's H2O ({:.1%} and {:.1%})".format(*(c.h2o_first for c in at_256)),
        "(KVPress's H2O {:.1%} and {:.1%})".format(*(c.h2o_first for c in at_256)),
        "The traces put {:.3f} and {:.3f}\nof each step's attention".format(*share),
    ]
    return claims


def gap(scores: dict, reference: dict) -> str:
    """A paired difference of two presses' scores in percentage points, with its bootstrap interval (of
    conversations or episodes where the keys name one)."""
    clusters = {key: key[0] for key in scores} if all(key[0] is not None for key in scores) else None
    interval = paired(scores, reference, "gap", 10_000, 0, clusters).scaled(100)
    return f"{interval.mean:+.1f} [{interval.low:+.1f}, {interval.high:+.1f}]"


def scores(run: str, press: str, budget: str | None = None, evicted: int | None = None) -> dict[tuple, float]:
    """A press's score per question (or probe) of ``run``, at ``budget``; ``evicted``: only histories above it."""
    return {
        (r.get("conversation"), r.get("question_index"), r.get("probe")): r["score"]
        for r in rows(run)
        if r["press"] == press
        and (budget is None or r["budget"] == budget)
        and (evicted is None or r["history_tokens"] > evicted)
    }


CONFIDENT, CONFIDENT_128 = "rmm(correctness='confidence')", "rmm(lag=128,correctness='confidence')"


def confidence_claims() -> list[str]:
    du, confident = "demonstrated utility", "demonstrated utility (confidence)"
    probe = {k: (scores(PROBE, confident, f"top {k} of 16"), scores(PROBE, du, f"top {k} of 16")) for k in (2, 4)}
    same = {k: sum(a[q] == b[q] for q in a) for k, (a, b) in probe.items()}
    reuse = {
        b: (scores(REUSE, CONFIDENT, f"tokens={b}", b), scores(REUSE, "rmm", f"tokens={b}", b)) for b in (256, 512)
    }
    matched = {b: sum(a[q] == r[q] for q in a) for b, (a, r) in reuse.items()}
    return [
        f"on {same[4]} of 400 probes at k=4 and on all {same[2]} at k=2 ({gap(*probe[4])} at k=4)",
        f"over all {len(scores(MEMORY, 'rmm'))} re-queries, {gap(scores(MEMORY, CONFIDENT), scores(MEMORY, 'rmm'))} "
        "without a lag and "
        f"{gap(scores(MEMORY, CONFIDENT_128), scores(MEMORY, 'rmm(lag=128)'))}"
        " at lag 128",
        f"{gap(*reuse[256])} at 256 tokens (the same score on {matched[256]} of {len(reuse[256][0])} questions) and "
        f"{gap(*reuse[512])} at 512 ({matched[512]} of {len(reuse[512][0])})",
    ]


def reuse_claims() -> list[str]:
    full = contrasts(REUSE)["score", "asked again - never asked (control)", "full", "full"]
    reached = scorecard(REUSE)[
        "score", "asked again, the lag's window reaches the first use", "256 tokens", "rmm(lag=128)"
    ]
    assert full["minuend"] == full["subtrahend"]
    return [
        f"answers the reused codes and their controls alike ({float(full['minuend']):.1f}% each)",
        f"reaches a reused code's first use in only {reached['n']} of {full['n']} pairs at lag 128",
    ]


def multiquery_claims() -> list[str]:
    asked = {(r["conversation"], r["question_index"]): r for r in rows(MQ)}
    by_length = {n: [r["history_tokens"] for r in asked.values() if r["length"] == n] for n in ("1k", "2k")}
    h2o = {b: scores(MQ, "h2o", f"tokens={b}") for b in (256, 512)}
    assert float(scorecard(MQ)["score", "vt", "full", "full"]["mean"]) == 0
    assert sum(h2o[256].values()) == 0 and sum(h2o[512].values()) == 1
    return [
        f"8 of about 1k tokens ({min(by_length['1k']):,} to {max(by_length['1k']):,} history tokens) and 8 of about "
        f"2k ({min(by_length['2k']):,} to {max(by_length['2k']):,}): {len(asked)} questions",
        f"H2O answers none of the {len(h2o[256])} questions at 256 tokens and one at 512",
    ]


def results_claims() -> list[str]:
    return (
        runs_claims()
        + longbench_claims()
        + likelihood_claims()
        + locomo_claims()
        + probe_claims()
        + memory_claims()
        + lab_claims()
        + reuse_claims()
        + multiquery_claims()
        + confidence_claims()
        + ruler_claims()
    )


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60)} s"


def bench(name: str) -> dict:
    return json.loads((RESULTS / "bench" / f"{name}.json").read_text())


def tokens_per_second(decoding: dict) -> str:
    speeds = decoding["median_tokens_per_second"]
    return f"{speeds['batched']:.1f} against {speeds['one_at_a_time']:.1f} tokens per second, {decoding['ratio']:.2f}x"


def readme_claims() -> list[str]:
    first = {run["command"]: run["wall_seconds"] for run in bench("first_commands")["runs"]}
    probes, correct, found = recency_5_8_top_4()
    rmm = [scorecard(LIKELIHOOD)["answer NLL", "multi_news", budget, "rmm"] for budget in ("keep 12%", "keep 25%")]
    rmm += [scorecard(LIKELIHOOD_HIGH)["answer NLL", "multi_news", b, "rmm"] for b in ("keep 50%", "keep 75%")]
    trails = [float(line["diff"]) for line in rmm]
    full = scorecard(MQ)["score", "overall", "full", "full"]
    memory_control = press_contrasts("memory/smollm2-135m-random")[
        "answer NLL", "reused", "256 tokens", "rmm", RANDOM_CONTROL
    ]
    return [
        f"RMM trails it by {min(trails):.3f} to {max(trails):.3f} nats",
        "control beats RMM ({:.3f}, {:.3f} nats)".format(*random_control_differences()),
        f"used facts RMM beats that control after Holm ({float(memory_control['diff']):.3f} nats)",
        f"demonstrated utility finds them on {found} of the {correct} correct answers of {probes:,}",
        f"loses most of the full cache's {float(full['mean']):.1f}%",
        f"the offline SmolLM2 wheel: {minutes(bench('first_commands')['setup']['wall_seconds'])}",
        f"10 multi_news examples x 11 cells: {minutes(first['make eval-longbench'])}",
        f"20 LoCoMo questions x 6 cells, streamed: {minutes(first['make eval-locomo'])}",
    ]


def made_at(report: dict) -> str:
    return f"({report['date'][:10]} at {report['commit'][:7]}"


def path_claims(paths: dict) -> list[str]:
    examples = [
        f"{e['shared_seconds']:.1f} s / {e['per_cell_seconds']:.1f} s = {e['ratio']:.3f} "
        f"({e['context_tokens']:,} tokens)"
        for e in paths["examples"]
    ]
    same = min(e["same_predictions"] for e in paths["examples"])
    cells = f"{same} of {paths['cells']} cells predict the same text"
    return [*examples, f"median {paths['median_ratio']:.3f}", cells]


def bench_claims() -> list[str]:
    names = ("grid", "grid_goal", "scoring", "memory", "protocols")
    grid, goal, scoring, memory, protocols = (bench(name) for name in names)
    ray, history, decoding = grid["ray"], protocols["locomo_history"], protocols["longbench_decoding"]
    claims = [made_at(report) for report in (grid, goal, scoring, memory, protocols)]
    per_question = [q["incremental_s"] / q["naive_s"] for q in history["per_question"]]
    claims += [
        f"{history['questions']} questions, nothing else running): LoCoMo {history['conversation']}",
        f"median {history['median_incremental_s']:.2f} s against {history['median_naive_s']:.1f} s, ratio "
        f"{history['median_ratio']:.3f} (goal {history['goal']}; per question {min(per_question):.3f} to "
        f"{max(per_question):.3f})",
        f"{decoding['caches']} caches decoded in one ragged batch against one at a time, {tokens_per_second(decoding)}",
        f"ceiling for the ratio in the same run: {decoding['ceiling']['ratio']:.2f}x",
    ]
    claims += path_claims(grid["paths"]) + path_claims(goal["paths"])
    claims.append(
        f"{ray['median_seconds']['2']:.1f} s / {ray['median_seconds']['1']:.1f} s = {ray['ratio_2_over_1']:.3f}"
    )
    modes = list(scoring["lengths"]["2048"])[1:]
    for length, medians in scoring["lengths"].items():
        ratios = (f"{medians[mode]['time_ratio']:.2f}x, {medians[mode]['rss_ratio']:.2f}x" for mode in modes)
        claims.append(f"| {int(length):,} | {' | '.join(ratios)} |")
    added = (m["h2o"]["peak_rss_gb"] - m["sdpa"]["peak_rss_gb"] for m in scoring["lengths"].values())
    claims.append(f"({', '.join(f'{gb:.2f}' for gb in added)} GB;")
    eight = scoring["lengths"]["8192"]
    claims.append(f"peaks at {eight['h2o']['peak_rss_gb']:.2f} GB against {eight[modes[1]]['peak_rss_gb']:.2f} GB")
    claims.append(f"chunked and {eight[modes[2]]['peak_rss_gb']:.2f} GB fused")
    long = scoring["long"][modes[1]]
    claims.append(
        f"{scoring['long']['length']:,} tokens completes in {long['seconds']:.0f} s with a {long['peak_rss_gb']:.2f} GB"
    )
    streaming, only = bench("streaming"), bench("likelihood_only")
    (streamed,) = streaming["repeats"]
    claims += [
        made_at(streaming),
        made_at(only),
        f"{streamed['batched_s']:.1f} s against cell by cell {streamed['cells_s']:.1f} s, "
        f"{streaming['median_ratio']:.2f}x",
        f"mean NLL is {streamed['max_text_nll_difference']:.1e} nats, and of one token's "
        f"{streamed['max_nll_difference']:.3f}",
        f"this machine's ceiling for the ratio, the forwards alone, {streaming['ceiling']['ratio']:.2f}x",
        f"median {only['median_ratio']:.2f}x",
        *(
            f"{e['generate_s']:,.1f} s against {e['likelihood_only_s']:.1f} s ({e['context_tokens']:,} tokens)"
            for e in only["examples"]
        ),
    ]
    peaks, seconds = memory["median_peak_over_kv_cache"], memory["median_seconds"]
    here, reference, plain = peaks["this checkout"], peaks["reference 003305c"], peaks["plain prefill"]
    claims += [
        f"{here:.2f} full KV caches here against {reference:.2f} at 003305c",
        f"grows by {plain:.2f} caches ({plain - 1:.2f} of activations above its cache)",
        f"the ideal is {memory['ideal_over_kv_cache']:.2f}",
        f"{here:.2f} - {plain - 1:.2f} = {here - plain + 1:.2f}, within the ideal",
        f"took {seconds['this checkout']:.1f} s here against {seconds['reference 003305c']:.1f} s at 003305c "
        f"(ratio {memory['seconds_over_reference']:.3f})",
    ]
    return claims


DOCUMENTS = {
    "results/README.md": results_claims,
    "README.md": readme_claims,
    "docs/benchmarks.md": bench_claims,
}


def flattened(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("run", RUNS)
def test_every_committed_run_is_clean_and_fits_90_minutes(run):
    assert commits(run), f"{run}: no session ran a unit"
    assert not any(c.endswith("-dirty") for c in commits(run)), f"{run} was made from a dirty tree"
    assert work_seconds(run) <= 90 * 60, f"{run} took over 90 minutes"


def test_every_claim_row_is_its_file():
    text = (RESULTS / "README.md").read_text()
    found = cell_claims(text)
    assert len(found) >= 40, "results/README.md states its claims as rows naming their cells"
    wrong = [(spec, printed, expected) for spec, printed, expected in found if printed != expected]
    assert not wrong, f"rows that do not say what their cells hold: {wrong}"


@pytest.mark.parametrize("report", sorted(path.stem for path in (RESULTS / "bench").glob("*.json")))
def test_every_bench_report_records_the_clean_commit_it_was_measured_at(report):
    commit = bench(report).get("commit", "")
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit), f"results/bench/{report}.json records no clean commit: {commit!r}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_quoted_figure_is_the_committed_files(document):
    text = flattened((ROOT / document).read_text())
    missing = [claim for claim in DOCUMENTS[document]() if flattened(claim) not in text]
    assert not missing, f"{document} does not say what the files hold: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_no_interval_is_quoted_that_no_claim_recomputes(document):
    text = (ROOT / document).read_text()
    quoted = INTERVAL.findall(flattened(ROW.sub("", text)))
    claimed = " | ".join(flattened(claim) for claim in DOCUMENTS[document]())
    unbacked = [interval for interval in quoted if interval not in claimed]
    assert not unbacked, f"{document} quotes intervals no file backs: {unbacked}"


def test_make_reproduce_samples_every_committed_run_and_the_makefile_makes_them():
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    reproduced = re.search(r"^REPRODUCED := (.*)$", makefile, re.M)
    assert reproduced, "the Makefile lists the runs make reproduce samples"
    sampled = {entry.split(":")[0].removeprefix("results/") for entry in reproduced.group(1).split()}
    assert sampled == set(RUNS), "make reproduce samples exactly the committed runs"
    targets = {t for t in re.findall(r"--output results/(\S+)", makefile) if not t.startswith(("bench/", "scorecard/"))}
    assert targets == set(RUNS), "every committed run has its Makefile command, and every command its run"
