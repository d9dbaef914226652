"""The bounded-memory probe (the paper's section 7, second probe): facts stream past a budget, a few are used.

An episode states ``budget_facts x max(multiples)`` lock codes, one line each ("Mia's gym bag: 4821."), in
sessions of ``session_facts``. A seeded subset, one fact in ``reuse_every``, is used right after the session that
states it: the question about it and its gold answer join the history (kind ``use``, told, never scored), the
reminder the paper's reused facts carry. The rest never recur. When the stream has stated ``m x budget_facts``
facts, for each ``m`` of ``multiples``, up to ``queries`` used facts (kind ``reused``) and as many never-used
ones (kind ``never reused``), none asked before, are re-queried. ``pair`` records the trajectory multiple.
A re-queried fact stated more than K facts before its query lies beyond any K-fact recency window
(:func:`older_than_the_budget`): the paper's re-query, at which recency answers 0.
"""

from __future__ import annotations

import random

from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.protocols.synthetic.words import NAMES, STORAGE

SPEAKERS = ("Sam", "Alex")
KINDS = ("reused", "never reused")
OLDER = "stated over K facts before"


def memory_episodes(
    seed: int,
    episodes: int,
    budget_facts: int = 20,
    multiples: tuple[int, ...] = (2, 5, 10),
    session_facts: int = 5,
    reuse_every: int = 10,
    queries: int = 3,
) -> list[Conversation]:
    """``episodes`` streams, deterministic in ``seed``."""
    multiples = tuple(multiples)
    if not multiples or min(multiples) < 1 or sorted(set(multiples)) != list(multiples):
        raise ValueError(f"multiples {multiples} must be increasing whole numbers from 1")
    total = budget_facts * multiples[-1]
    keys = [(name, thing) for name in NAMES for thing in STORAGE]
    if total > len(keys):
        raise ValueError(f"{total} facts exceed the {len(keys)} distinct locks: lower budget_facts or multiples")
    if (budget_facts * multiples[0]) % session_facts:
        raise ValueError(
            f"each re-query point (a multiple of {budget_facts} facts) must end a session of {session_facts}"
        )
    if budget_facts % session_facts:
        raise ValueError(f"budget_facts {budget_facts} must be a multiple of session_facts {session_facts}")
    if reuse_every < 2 or queries < 1:
        raise ValueError("reuse_every must be at least 2 and queries at least 1")
    return [
        _episode(
            random.Random(f"memory:{seed}:{index}"),
            index,
            total,
            budget_facts,
            multiples,
            session_facts,
            reuse_every,
            queries,
            keys,
        )
        for index in range(episodes)
    ]


def _episode(
    rng: random.Random,
    index: int,
    total: int,
    budget_facts: int,
    multiples: tuple[int, ...],
    session_facts: int,
    reuse_every: int,
    queries: int,
    keys: list[tuple[str, str]],
) -> Conversation:
    facts = [
        (name, thing, str(code))
        for (name, thing), code in zip(rng.sample(keys, total), rng.sample(range(1000, 10000), total), strict=True)
    ]
    used = set(rng.sample(range(total), max(1, round(total / reuse_every))))
    checkpoints = {m * budget_facts // session_facts: m for m in multiples}  # session number -> multiple
    sessions, questions, asked = [], [], set()
    for number in range(1, total // session_facts + 1):
        first = (number - 1) * session_facts
        turns = [
            Turn(SPEAKERS[0], f"D{number}:{i + 1}", f"{name}'s {thing}: {code}.", None)
            for i, (name, thing, code) in enumerate(facts[first : first + session_facts])
        ]
        sessions.append(Session(number, f"day {number}", turns))
        for fact in sorted(used & set(range(first, first + session_facts))):
            questions.append(_question(len(questions), facts[fact], [f"D{number}:{fact - first + 1}"], "use"))
        if number in checkpoints:
            stated = range(first + session_facts)
            for kind, pool in (("reused", used), ("never reused", set(stated) - used)):
                candidates = sorted(f for f in pool if f < first + session_facts and f not in asked)
                for fact in rng.sample(candidates, min(queries, len(candidates))):
                    asked.add(fact)
                    where = f"D{fact // session_facts + 1}:{fact % session_facts + 1}"
                    evidence = [where, f"D{number}:{session_facts}"]  # asked once the stream reaches the point
                    questions.append(_question(len(questions), facts[fact], evidence, kind, checkpoints[number]))
    return Conversation(f"memory-{index}", SPEAKERS[0], SPEAKERS[1], sessions, questions)


def _question(index: int, fact: tuple[str, str, str], evidence: list[str], kind: str, multiple: int = 0) -> Question:
    name, thing, code = fact
    return Question(index, f"What is the code of {name}'s {thing}?", code, evidence, 0, None, kind, multiple)


def older_than_the_budget(conversation: Conversation, question: Question) -> bool:
    """Whether at least K facts were stated after the re-queried fact, K read back from the question itself:
    its query point (``evidence[-1]``) is the ``pair`` x K-th fact."""
    turns = [turn.dia_id for session in conversation.sessions for turn in session.turns]
    fact, query = (turns.index(evidence) for evidence in question.evidence)
    return query - fact >= (query + 1) // question.pair
