"""The synthetic families as streamed datasets: generated from the run's settings, asked with their own
prompts, scored by string match."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.errors import EvaluationError
from evaluation.metrics.synthetic import string_match
from evaluation.protocols.locomo.render import header, render_session
from evaluation.protocols.options import MAX_GENERATED, MAX_TOKENS, whole
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question, Session
from evaluation.protocols.streaming.framing import Framing, Message
from evaluation.protocols.streaming.placements import asked_after_session
from evaluation.protocols.streaming.protocol import register_task
from evaluation.protocols.streaming.task import StreamTask
from evaluation.protocols.synthetic import memory, multiquery, reuse
from evaluation.reporting.conditions import SECTION_8, Benchmark, Contrast
from evaluation.settings import SAMPLED, setting

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OVERALL = "overall"
REUSE_CONDITIONS = {"first": "first ask", "reuse": "asked again", "fresh": "never asked (control)"}
ORDERS = {1: "asked first", 2: "asked second"}
REACH = {True: "the lag's window reaches the first use", False: "the lag's window misses the first use"}
DOCUMENT_HEADER = "Read the document below. Questions about it follow.\n\n"


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
    """The episodes of ``config.settings.episodes`` and their fingerprint (a resumed run must regenerate the same)."""
    settings = asdict(config.settings.episodes)  # type: ignore[attr-defined]
    try:
        conversations = generate(**settings)
    except (TypeError, ValueError) as error:
        raise EvaluationError(f"{config.task} episodes {settings}: {error}") from error
    text = json.dumps([asdict(conversation) for conversation in conversations], sort_keys=True)
    return {"episodes": hashlib.sha256(text.encode()).hexdigest()}, conversations


def render_document(session: Session) -> str:
    return "\n".join(turn.text for turn in session.turns) + "\n\n"


def length_of(conversation: Conversation) -> str:
    """A multiquery episode's nominal document length, from its id (mq-<length>-<index>)."""
    return conversation.sample_id.split("-")[1]


def _benchmark(
    name: str,
    conditions: Callable[[dict], list[str]],
    order: tuple[str, ...],
    contrasts: tuple[Contrast, ...] = (),
    unit: str = "episode",
) -> Benchmark:
    """A synthetic family's benchmark: its questions clustered by the generated episode (``unit``) they ask."""
    return Benchmark(
        name,
        conditions,
        lambda row: (row["conversation"], row["question_index"]),
        100,
        1,
        order,
        contrasts,
        unit="accuracy, %",
        cluster=lambda row: row["conversation"],
        cluster_unit=unit,
        press_contrasts=SECTION_8,
    )


def seed() -> Any:
    return setting("--seed", type=int, default=0, help="the generator's seed (default 0)")


def episodes() -> Any:
    return setting("--episodes", type=whole(1, MAX_GENERATED), default=8, help="episodes per setting (default 8)")


class Generated:
    """A synthetic family's own settings (``episodes``: its generator's, declared with their options): its episodes
    stream like LoCoMo's evidence placement with the gold history, every episode asked."""

    conversations: ClassVar[None] = None
    placement: ClassVar[str] = "evidence"
    history: ClassVar[str] = "gold"


@dataclass(kw_only=True)
class ReuseEpisodes:
    seed: int = seed()
    episodes: int = episodes()
    sessions: int = setting("--sessions", type=whole(2), default=6, help="sessions per episode (default 6)")
    facts: int = setting("--facts", type=whole(2), default=2, help="codes stated per session (default 2)")
    lag: int = setting("--lag", type=whole(1), default=1, help="sessions between a code's two asks (default 1)")


@dataclass(kw_only=True)
class ReuseSettings(Generated):
    episodes: ReuseEpisodes = field(metadata=SAMPLED)


@dataclass(kw_only=True)
class MultiqueryEpisodes:
    seed: int = seed()
    per_length: int = episodes()
    lengths: list[int] = setting(
        "--lengths",
        nargs="+",
        type=whole(512, MAX_TOKENS),
        default=[4096],
        help="document tokens (default 4096; a document longer than the model's context needs "
        "--max-history-tokens above it)",
    )


@dataclass(kw_only=True)
class MultiquerySettings(Generated):
    episodes: MultiqueryEpisodes = field(metadata=SAMPLED)


def streamed_increments(
    conversation: Conversation, first: int, last: int, tokenizer: PreTrainedTokenizerBase
) -> list[tuple[str, int, str]]:
    """What the evidence placement streams from session ``first`` through session ``last``, increment by increment
    as its ``Framing`` adds them (the chat template's text between the parts included): ("session", number, text),
    and for each question asked after a session ("question", index, text) and ("answer", index, text)."""
    framing = Framing(tokenizer, header(conversation))
    messages: list[Message] = []
    increments = []
    for session in conversation.sessions[:last]:
        text = render_session(session)
        if session.number >= first:
            increments.append(("session", session.number, framing.session_text(messages, text)))
        messages.append(("user", text))
        for question in (q for q in conversation.questions if asked_after_session(conversation, q) == session.number):
            answer = sentence_answer(question)
            if session.number >= first:
                increments.append(("question", question.index, framing.question_text(messages, question.question)))
                increments.append(("answer", question.index, framing.answer_text(messages, question.question, answer)))
            messages += [("user", question.question), ("assistant", answer)]
    return increments


def first_use_distance(conversation: Conversation, question: Question, tokenizer: PreTrainedTokenizerBase) -> int:
    """Positions, in the token stream a run builds (``streamed_increments``, each increment encoded on its own as
    the history extends), from the last token of a code's statement to the first token of the code in its first
    use: the first ask's answer (a used code) or the next session's restatement of it (a control). A commit lag H
    counts that use in the code's demonstrated utility when this is at most H."""
    number, turn = (int(part) for part in question.evidence[0].removeprefix("D").split(":"))
    increments = streamed_increments(conversation, number, number + 1, tokenizer)
    code = str(question.answer)
    statement = conversation.sessions[number - 1].turns[turn - 1].text
    if question.kind == "fresh":
        following, again = (int(part) for part in question.evidence[1].removeprefix("D").split(":"))
        use = conversation.sessions[following - 1].turns[again - 1].text
        used_in, copy = ("session", following), f'"{use}"'
    else:
        asked = next(q for q in conversation.questions if q.kind == "first" and q.question == question.question)
        used_in, copy = ("answer", asked.index), sentence_answer(asked)
    where = [(kind, owner) for kind, owner, _ in increments]
    texts = [text for _, _, text in increments]
    stated = texts[0].index(f'"{statement}"') + len(statement)
    used = where.index(used_in)
    return token_position(texts, used, texts[used].index(copy) + copy.rindex(code), tokenizer) - token_position(
        texts, 0, stated, tokenizer
    )


def token_position(texts: list[str], piece: int, char: int, tokenizer: PreTrainedTokenizerBase) -> int:
    """The position of the token holding character ``char`` of ``texts[piece]`` in the stream of ``texts``, each
    encoded on its own (``Framing.encode``)."""
    before = sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in texts[:piece])
    spans = tokenizer(texts[piece], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return before + next(i for i, (_, end) in enumerate(spans) if end > char)


def reuse_fields(conversation: Conversation, question: Question, tokenizer: PreTrainedTokenizerBase) -> dict:
    fields = {"family": "reuse", "kind": question.kind, "pair": question.pair, "order": question.order}
    if question.kind in ("reuse", "fresh"):
        fields["first_use_distance"] = first_use_distance(conversation, question, tokenizer)
    return fields


def spec_lag(spec: str) -> int | None:
    """The commit lag of a press spec's ``RMMPress`` (``catalogue.resolved.commit_lag_of``)."""
    from evaluation.catalogue.resolved import commit_lag_of  # imports KVPress: not at the command line's start

    return commit_lag_of(spec)


def reuse_conditions(row: dict) -> list[str]:
    """Overall, the row's kind, and for a reused code or its control the kind by order of asking and, for a
    press with a finite commit lag, whether the lag's window reaches the code's first use."""
    kind = REUSE_CONDITIONS[row["kind"]]
    conditions = [OVERALL, kind]
    if row["kind"] in ("reuse", "fresh"):
        conditions.append(f"{kind}, {ORDERS[row['order']]}")
        lag = spec_lag(row["press"])
        if lag is not None:
            conditions.append(f"{kind}, {REACH[row['first_use_distance'] <= lag]}")
    return conditions


REUSE_ORDER = (
    OVERALL,
    *REUSE_CONDITIONS.values(),
    *(f"{REUSE_CONDITIONS[k]}, {o}" for k in ("reuse", "fresh") for o in ORDERS.values()),
    *(f"{REUSE_CONDITIONS[k]}, {r}" for k in ("reuse", "fresh") for r in REACH.values()),
)
REUSE_CONTRASTS = (
    Contrast(
        REUSE_CONDITIONS["reuse"],
        REUSE_CONDITIONS["fresh"],
        lambda row: (row["conversation"], row["pair"]),
        "The difference sets a question and its answer against a plain restatement, not a use against none: under "
        "`--rmm-weights answers` RMM weighs every row but an answer's by 1, so the restatement's rows add their "
        "attention to the control whatever the model predicts, while the used code's answer rows count only where "
        "predicted correctly; under `--rmm-weights all` a correctly predicted restatement is itself a use (Eq. 1).",
    ),
)

REUSE = StreamTask(
    name="reuse",
    help="endogenous reuse: a code used at one turn is asked again sessions later, against matched controls",
    description="Generate (from --seed) conversations that state lock codes session by session; each "
    "session's code asked once (first), asked again --lag sessions later (reuse), and a same-age code stated "
    "again where the used one is answered, never asked before (fresh, the control). Streamed like LoCoMo's "
    "evidence placement, every press at every budget.",
    load=lambda config: generated(config, reuse.reuse_episodes),
    header=header,
    render_session=render_session,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark("Reuse", reuse_conditions, REUSE_ORDER, REUSE_CONTRASTS),
    metric="Accuracy (%, string match of the code)",
    settings=ReuseSettings,
    presses=PRESSES,
    budgets=(256, 512),
    max_new_tokens=24,
    row_fields=reuse_fields,
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
        unit="document",
    ),
    metric="Accuracy (%, string match of the number)",
    settings=MultiquerySettings,
    presses=PRESSES,
    budgets=(1024, 2048),
    max_new_tokens=24,
    row_fields=lambda conversation, question, tokenizer: {
        "family": "multiquery",
        "kind": question.kind,
        "length": length_of(conversation),
    },
)


@dataclass(kw_only=True)
class MemoryEpisodes:
    seed: int = seed()
    episodes: int = episodes()
    budget_facts: int = setting(
        "--budget-facts", type=whole(1), default=20, help="K: the memory's budget in facts (default 20)"
    )
    multiples: list[int] = setting(
        "--multiples",
        nargs="+",
        type=whole(1),
        default=[2, 5, 10],
        help="re-query when the stream has stated these multiples of K facts (default 2 5 10)",
    )
    reuse_every: int = setting(
        "--reuse-every", type=whole(2), default=10, help="one fact in this many is used (default 10)"
    )
    queries: int = setting(
        "--queries", type=whole(1), default=3, help="used and never-used facts re-queried at each point (default 3)"
    )


@dataclass(kw_only=True)
class MemorySettings(Generated):
    episodes: MemoryEpisodes = field(metadata=SAMPLED)


def memory_conditions(row: dict) -> list[str]:
    older = [f"{row['kind']}, {memory.OLDER}"] if row["older"] else []
    return [OVERALL, row["kind"], *older, f"{row['kind']}, {row['multiple']}x the budget"]


MEMORY = StreamTask(
    name="memory",
    help="the bounded-memory probe (section 7): facts stream past the budget, a few used, re-queried later",
    description="Generate (from --seed) streams of one-line lock codes, --budget-facts x the largest of "
    "--multiples in all; one fact in --reuse-every is used right after its session (its question and gold answer "
    "join the history, unscored), the rest never recur. At each multiple of the budget, used and never-used facts "
    "are re-queried. Each row also records the share of (layer, KV head) slots whose cache holds a copy of the "
    "code.",
    load=lambda config: generated(config, memory.memory_episodes),
    header=lambda conversation: DOCUMENT_HEADER,
    render_session=render_document,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark(
        "Bounded memory",
        memory_conditions,
        (
            OVERALL,
            *(c for k in memory.KINDS for c in (k, f"{k}, {memory.OLDER}")),
            *(f"{k}, {m}x the budget" for k in memory.KINDS for m in (2, 5, 10)),
        ),
    ),
    metric="Accuracy (%, string match of the code; `answer held`: share of layer x KV head slots holding every "
    "token of a copy of the code)",
    settings=MemorySettings,
    presses=(
        *DEFAULT_PRESSES,
        "rmm(lag=32)",
        "rmm(lag=128)",
        "rmm(correctness='confidence')",
        "rmm(lag=128,correctness='confidence')",
    ),
    budgets=(256,),
    max_new_tokens=16,
    row_fields=lambda conversation, question, tokenizer: {
        "family": "memory",
        "kind": question.kind,
        "multiple": question.pair,
        "older": memory.older_than_the_budget(conversation, question),
    },
    told=lambda question: question.kind == "use",
    retention=True,
)

SYNTHETIC_TASKS = {task.name: register_task(task) for task in (REUSE, MULTIQUERY, MEMORY)}
