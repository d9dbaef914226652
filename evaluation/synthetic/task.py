"""The synthetic families as streamed datasets: generated from the run's settings, asked with their own
prompts, scored by string match."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict

from evaluation.arguments import whole
from evaluation.benchmark import Benchmark
from evaluation.errors import EvaluationError
from evaluation.locomo.render import header, render_session
from evaluation.press_specs import DEFAULT_PRESSES
from evaluation.streaming.config import StreamConfig
from evaluation.streaming.episodes import Conversation, Question, Session
from evaluation.streaming.task import StreamTask, register
from evaluation.synthetic import multiquery, reuse

OVERALL = "overall"
REUSE_CONDITIONS = {"first": "first ask", "reuse": "asked again", "fresh": "never asked (control)"}
DOCUMENT_HEADER = "Read the document below. Questions about it follow.\n\n"


def string_match(prediction: str, answer: str) -> float:
    """1 when the answer appears in the prediction as a whole word or number (case-insensitive), else 0:
    RULER's containment rule, except that "48213" does not count as holding "4821"."""
    return float(re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", prediction, re.IGNORECASE) is not None)


def sentence_answer(question: Question) -> str:
    """The gold answer as the history records it: the question's subject and the value, as a sentence ("What is
    the code of Mia's locker?" -> "The code of Mia's locker is 4821."). Whole sentences give a small model the
    answer format from the turns before (measured on SmolLM2: 7 of 8 codes, against 3 of 8 for bare codes)."""
    subject = question.question.removeprefix("What is ").removesuffix("?")
    return f"{subject[0].upper()}{subject[1:]} is {question.answer}."


def scored(conversation: Conversation, question: Question, prediction: str) -> tuple[str, float]:
    return prediction, string_match(prediction, str(question.answer))


PRESSES = (*DEFAULT_PRESSES, "rmm(lag=16)", "rmm(lag=64)", "rmm(lag=128)")  # lags below every budget


def generated(
    config: StreamConfig, generate: Callable[..., list[Conversation]]
) -> tuple[dict[str, str], list[Conversation]]:
    """The episodes of ``config.episodes`` and their fingerprint (a resumed run must regenerate the same)."""
    try:
        conversations = generate(**config.episodes)
    except (TypeError, ValueError) as error:
        raise EvaluationError(f"{config.task} episodes {config.episodes}: {error}") from error
    text = json.dumps([asdict(conversation) for conversation in conversations], sort_keys=True)
    return {"episodes": hashlib.sha256(text.encode()).hexdigest()}, conversations


def render_document(session: Session) -> str:
    return "\n".join(turn.text for turn in session.turns) + "\n\n"


def length_of(conversation: Conversation) -> str:
    """A multiquery episode's nominal document length, from its id (mq-<length>-<index>)."""
    return conversation.sample_id.split("-")[1]


def _benchmark(name: str, conditions: Callable[[dict], list[str]], order: tuple[str, ...]) -> Benchmark:
    return Benchmark(name, conditions, lambda row: (row["conversation"], row["question_index"]), 100, 1, order)


def add_generator_options(parser: argparse.ArgumentParser) -> None:
    """A synthetic family's generator options; its episodes stream with the evidence placement and gold history."""
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    parser.add_argument("--episodes", type=whole(1), default=8, help="episodes per setting (default 8)")


def add_reuse_options(parser: argparse.ArgumentParser) -> None:
    add_generator_options(parser)
    parser.add_argument("--sessions", type=whole(2), default=6, help="sessions per episode (default 6)")
    parser.add_argument("--facts", type=whole(2), default=2, help="codes stated per session (default 2)")
    parser.add_argument("--lag", type=whole(1), default=1, help="sessions between a code's two asks (default 1)")


def add_multiquery_options(parser: argparse.ArgumentParser) -> None:
    add_generator_options(parser)
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=whole(512),
        default=[4096],
        help="document tokens (default 4096; a document longer than the model's context needs "
        "--max-history-tokens above it)",
    )


def streamed(episodes: dict) -> dict:
    """The ``StreamConfig`` fields of a synthetic family: its generator settings, streamed like LoCoMo's evidence
    placement with the gold history."""
    return {
        "conversations": None,
        "placement": "evidence",
        "history": "gold",
        "data": None,
        "episodes": episodes,
    }


def reuse_settings(args: argparse.Namespace) -> dict:
    generator = {"seed": args.seed, "episodes": args.episodes, "sessions": args.sessions, "facts": args.facts}
    return streamed({**generator, "lag": args.lag})


def multiquery_settings(args: argparse.Namespace) -> dict:
    return streamed({"seed": args.seed, "lengths": args.lengths, "per_length": args.episodes})


REUSE = StreamTask(
    name="reuse",
    help="endogenous reuse: a code used at one turn is asked again sessions later, against matched controls",
    description="Generate (from --seed) conversations that state lock codes session by session; each "
    "session's code asked once (first), asked again --lag sessions later (reuse), and a same-age code never "
    "asked before (fresh, the control). Streamed like LoCoMo's evidence placement, every press at every budget.",
    load=lambda config: generated(config, reuse.reuse_episodes),
    header=header,
    render_session=render_session,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark(
        "Reuse", lambda row: [OVERALL, REUSE_CONDITIONS[row["kind"]]], (OVERALL, *REUSE_CONDITIONS.values())
    ),
    metric="Accuracy (%, string match of the code)",
    add_options=add_reuse_options,
    settings=reuse_settings,
    presses=PRESSES,
    budgets=(256, 512),
    max_new_tokens=24,
    row_fields=lambda conversation, question: {"family": "reuse", "kind": question.kind},
)

MULTIQUERY = StreamTask(
    name="multiquery",
    help="shared-context multi-query: one long generated document, then several questions (kv, vt, needle)",
    description="Generate (from --seed) documents of about --lengths tokens holding key-value records, "
    "variable chains and needles among filler, then ask several questions about each, streamed like LoCoMo: "
    "each question answered from the history re-compressed to each budget.",
    load=lambda config: generated(config, multiquery.multiquery_episodes),
    header=lambda conversation: DOCUMENT_HEADER,
    render_session=render_document,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark(
        "Multi-query",
        lambda row: [OVERALL, f"{row['length']} context", row["kind"]],
        (OVERALL, *multiquery.KINDS),
    ),
    metric="Accuracy (%, string match of the number)",
    add_options=add_multiquery_options,
    settings=multiquery_settings,
    presses=PRESSES,
    budgets=(1024, 2048),
    max_new_tokens=24,
    row_fields=lambda conversation, question: {
        "family": "multiquery",
        "kind": question.kind,
        "length": length_of(conversation),
    },
)

SYNTHETIC_TASKS = {task.name: register(task) for task in (REUSE, MULTIQUERY)}
