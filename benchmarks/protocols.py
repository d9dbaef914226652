"""Two protocol costs, each measured side by side in one process and reported as a median ratio.

1. LoCoMo: the per-question cost of keeping the history's statistics up to date. For each of the first
   ``--questions`` questions of one conversation (file placement, history limited to ``--history-tokens``),
   appending the previous turn to the incremental history (``History.extend_segments``: one forward) is timed
   against a naive re-prefill of the whole history so far (a fresh ``History`` over every token, in as few
   forwards), both followed by compressing it for every default press at 1,800 tokens. Goal: incremental / naive
   <= 0.05.
2. LongBench: decoding the committed grid's caches of one multi_news prompt (``--presses``, default the
   committed run's: the full cache and six presses at keep 50% and 25%, 13 caches) in one ragged batch
   (``decode_batch``) against one cache at a time (``decode``, the per-cell path's batch-1 greedy loop, which
   equals ``generate()`` on the full cache: tests), ``--tokens`` tokens each with no stop token, ``--repeats``
   times interleaved. Tokens per second; goal: batched / one at a time >= 6. Beside it, the machine's ceiling
   for that ratio: a step of the model over as many one-token sequences with no cache against one such step,
   as many times as there are caches (the weights and the matrix products alone, which batching shares;
   reading each cache costs the same either way).

Writes ``results/bench/protocols.json``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch
from report import write_report
from transformers import DynamicCache

from evaluation.catalogue.budgets import Budget, press_cells, ratio_for
from evaluation.catalogue.resolved import make_press, resolve_press, resolve_presses
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.engine.decoding import decode, decode_batch
from evaluation.engine.history import History
from evaluation.protocols.locomo.data import load_conversations
from evaluation.protocols.locomo.task import LOCOMO
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.work import cases
from evaluation.protocols.streaming.framing import Framing
from evaluation.protocols.streaming.placements import fit_sessions
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings
from evaluation.runs.terminal import quiet_libraries

ROOT = Path(__file__).resolve().parents[1]


def locomo_history(args: argparse.Namespace, model, tokenizer) -> dict:
    conversation = next(c for c in load_conversations(args.locomo) if c.sample_id == args.conversation)
    sessions = fit_sessions(
        lambda s: Framing(tokenizer, LOCOMO.text(conversation, s)), conversation, args.history_tokens
    )
    framing = Framing(tokenizer, LOCOMO.text(conversation, sessions))
    budget = Budget("tokens", 1800)
    presses = [name for name in DEFAULT_PRESSES if name != "full"]
    history = History(model, frozenset({"answer"}), [resolve_press(name).needs for name in presses])
    history.extend(framing.start_ids(), "conversation")
    messages, kinds, rows = [], ["conversation"] * history.length, []
    for question in conversation.questions[: args.questions]:
        prompt, answer = LOCOMO.question_prompt(conversation, question), LOCOMO.gold_answer(question)
        turn = [(framing.question_ids(messages, prompt), "question")]
        turn.append((framing.answer_ids(messages, prompt, answer), "answer"))
        messages += [("user", prompt), ("assistant", answer)]
        start = time.perf_counter()
        history.extend_segments(turn)
        for name in presses:
            history.compress(make_press(name, ratio_for(budget, history.length)))
        incremental = time.perf_counter() - start
        kinds += [kind for ids, kind in turn for _ in ids]
        start = time.perf_counter()
        naive = History(model, frozenset({"answer"}), [resolve_press(name).needs for name in presses])
        boundaries = [0] + [i for i in range(1, len(kinds)) if kinds[i] != kinds[i - 1]] + [len(kinds)]
        naive.extend_segments([(history.token_ids[a:b], kinds[a]) for a, b in itertools.pairwise(boundaries)])
        for name in presses:
            naive.compress(make_press(name, ratio_for(budget, naive.length)))
        rebuilt = time.perf_counter() - start
        rows.append({"history_tokens": history.length, "incremental_s": incremental, "naive_s": rebuilt})
        print(
            f"question {len(rows)}: {history.length} tokens, incremental {incremental:.2f} s, naive {rebuilt:.2f} s",
            flush=True,
        )
    ratios = [row["incremental_s"] / row["naive_s"] for row in rows]
    return {
        "conversation": args.conversation,
        "questions": len(rows),
        "per_question": rows,
        "median_incremental_s": statistics.median(row["incremental_s"] for row in rows),
        "median_naive_s": statistics.median(row["naive_s"] for row in rows),
        "median_ratio": statistics.median(ratios),
        "goal": "<= 0.05",
    }


def longbench_decoding(args: argparse.Namespace, model, tokenizer) -> dict:
    budgets = [Budget("ratio", 0.5), Budget("ratio", 0.75)]
    config = LongBenchConfig(
        model=ModelSettings(),
        data_dir=str(args.longbench),
        presses=args.presses,
        budgets=budgets,
        n=1,
        max_length=args.max_length,
        output=ROOT,
    )
    prompt = cases(config, model, tokenizer)[0].prompt
    length = prompt.context_ids.shape[1]
    cells = press_cells(resolve_presses(args.presses), budgets, "")
    presses = [cell.press.build(ratio_for(cell.budget, length)) for cell in cells]
    history = History(model, frozenset({"context"}), presses)
    history.extend(prompt.context_ids[0].tolist(), "context")
    caches = [history.compress(press) for press in presses]
    tokens = len(caches) * args.tokens
    rates: dict[str, list[float]] = {"batched": [], "one_at_a_time": []}
    for repeat in range(args.repeats):
        for mode in ("batched", "one_at_a_time") if repeat % 2 == 0 else ("one_at_a_time", "batched"):
            copies = [_copy(cache.cache) for cache in caches]  # decode() extends the cache it is given
            start = time.perf_counter()
            if mode == "batched":
                decode_batch(model, caches, prompt.question_ids, length, args.tokens, set())
            else:
                for copy in copies:
                    decode(model, copy, prompt.question_ids, length, args.tokens, set())
            rates[mode].append(tokens / (time.perf_counter() - start))
            print(f"repeat {repeat + 1}, {mode}: {rates[mode][-1]:.1f} tokens/s", flush=True)
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    return {
        "ceiling": projection_ceiling(model, len(caches), args.repeats),
        "context_tokens": length,
        "caches": len(caches),
        "tokens_per_cache": args.tokens,
        "tokens_per_second": rates,
        "median_tokens_per_second": medians,
        "ratio": medians["batched"] / medians["one_at_a_time"],
        "goal": ">= 6",
    }


def projection_ceiling(model, batch: int, repeats: int) -> dict:
    """``batch`` one-token steps one at a time against one step of ``batch`` sequences, no cache, interleaved."""
    steps: dict[str, list[float]] = {"one_at_a_time_s": [], "batched_s": []}
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batch):
            model(input_ids=torch.ones((1, 1), dtype=torch.long, device=model.device))
        steps["one_at_a_time_s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        model(input_ids=torch.ones((batch, 1), dtype=torch.long, device=model.device))
        steps["batched_s"].append(time.perf_counter() - start)
    medians = {key: statistics.median(values) for key, values in steps.items()}
    return {**steps, "ratio": medians["one_at_a_time_s"] / medians["batched_s"]}


def _copy(cache):
    copy = DynamicCache()
    for index, layer in enumerate(cache.layers):
        copy.update(layer.keys.clone(), layer.values.clone(), index)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=shared_data() / "locomo" / "locomo10.json")
    parser.add_argument("--longbench", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--conversation", default="conv-26")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--history-tokens", type=int, default=6000)
    parser.add_argument("--max-length", type=int, default=2048, help="LongBench prompt truncation")
    parser.add_argument(
        "--presses",
        nargs="+",
        default=["full", "snapkv", "h2o", "streaming_llm", "tova", "rmm", "rmm(lag=64)"],
        help="LongBench grid (default: the committed run's, make eval-longbench-committed)",
    )
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per cache")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/protocols.json")
    args = parser.parse_args()
    quiet_libraries()
    model, tokenizer = ModelSettings().load()
    with torch.no_grad():
        report = {
            "locomo_history": locomo_history(args, model, tokenizer),
            "longbench_decoding": longbench_decoding(args, model, tokenizer),
        }
    write_report(args.output, report)
    print(
        f"LoCoMo incremental / naive per question: {report['locomo_history']['median_ratio']:.3f} (goal <= 0.05); "
        f"LongBench batched / one at a time tokens/s: {report['longbench_decoding']['ratio']:.2f} (goal >= 6; "
        f"this machine's ceiling {report['longbench_decoding']['ceiling']['ratio']:.2f})"
    )


if __name__ == "__main__":
    main()
