"""Endogenous reuse: what a correct answer used at one turn is needed again some turns later.

An episode is a conversation streamed session by session. Each session states ``facts`` lock codes ("Please note
this down for me, Alex: the code of Mia's locker is 4821.") among chit-chat. One of its codes is asked right after
the session (kind ``first``: the turn that uses the fact; the history then holds the question and its gold answer,
a second copy of the code). The code stated two lines after it, past Alex's pause (``PAUSE``), is its matched
control: the next session opens by stating it again, word for word (a plain restatement, no question), so the
control's second copy directly follows the used code's answer and each copy of the control trails the used code's.
After a session, its re-asks come first and its first ask last, so that only the next session's opening separates
that answer from the restatement; the pause is as long as that gap, so in the stream a run builds the two codes are
first used at the same distance from their statements. ``lag`` sessions later, a cue line brings each of the two
locks up again and both are asked: the used one (kind ``reuse``) and its control (kind ``fresh``: as old, stated as
often, cued the same way, never asked). Which of the two is asked first alternates from pair to pair (``order``), so
that the order of asking is balanced. ``lag`` counts sessions, not tokens.
"""

from __future__ import annotations

import random

from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.protocols.synthetic.words import CHAT, NAMES, THINGS

SPEAKERS = ("Sam", "Alex")
# Alex's line between the used code's statement and its control's: as long in SmolLM2's tokens (16) as what the chat
# framing and the next session's opening put between the used code's answer and the control's restatement
PAUSE = "Hold on, let me find a pen that writes."


def reuse_episodes(
    seed: int, episodes: int, sessions: int = 6, facts: int = 2, chat: int = 6, lag: int = 1
) -> list[Conversation]:
    """``episodes`` conversations of ``sessions`` sessions, deterministic in ``seed``."""
    if lag < 1 or lag >= sessions:
        raise ValueError(f"lag {lag} must be at least 1 and below the {sessions} sessions")
    if facts < 2:
        raise ValueError("each session needs 2 facts at least: the one asked and its never-asked control")
    locks = [(name, thing) for name in NAMES for thing in THINGS]
    if sessions * facts > len(locks):
        raise ValueError(f"{sessions} sessions x {facts} facts exceed the {len(locks)} distinct locks")
    return [
        _episode(random.Random(f"reuse:{seed}:{index}"), index, sessions, facts, chat, lag, locks)
        for index in range(episodes)
    ]


def _episode(
    rng: random.Random,
    index: int,
    sessions: int,
    facts: int,
    chat: int,
    lag: int,
    locks: list[tuple[str, str]],
) -> Conversation:
    """Conversation ``index``: each session's codes among its chit-chat, the previous session's control restated
    first; after the session its re-asks of the session ``lag`` before (cued at its end), then its first ask."""
    stated = _codes(rng, locks, sessions, facts)
    asked = [rng.randrange(facts) for _ in range(sessions)]  # which fact of each session is used
    controls = [rng.choice([i for i in range(facts) if i != asked[s]]) for s in range(sessions)]
    session_list, questions = [], []
    where: list[dict[int, list[str]]] = []  # per session, fact index -> the turn ids stating it
    for s in range(sessions):
        number = s + 1
        lines: list[tuple[str, str]] = []
        if s:  # the previous session's control, stated again where its used code's answer ends
            lines.append((SPEAKERS[0], _statement(*stated[s - 1][controls[s - 1]])))
            where[s - 1][controls[s - 1]].append(f"D{number}:1")
        where.append(_state_facts(rng, lines, number, stated[s], asked[s], controls[s], chat))
        earlier = number - lag
        if earlier >= 1:
            pair = [("reuse", asked[earlier - 1]), ("fresh", controls[earlier - 1])]
            if (index + number) % 2:  # the used code first in every other pair
                pair.reverse()
            cues, asks = _recall(
                pair, stated[earlier - 1], where[earlier - 1], number, earlier, len(lines), len(questions)
            )
            lines += [(SPEAKERS[1], cue) for cue in cues]
            questions += asks
        turns = [Turn(speaker, f"D{number}:{t + 1}", text, None) for t, (speaker, text) in enumerate(lines)]
        session_list.append(Session(number, f"day {number}", turns))
        name, thing, code = stated[s][asked[s]]
        questions.append(_question(len(questions), name, thing, code, where[s][asked[s]], "first"))
    return Conversation(f"reuse-{index}", SPEAKERS[0], SPEAKERS[1], session_list, questions)


def _codes(
    rng: random.Random, locks: list[tuple[str, str]], sessions: int, facts: int
) -> list[list[tuple[str, str, str]]]:
    """Each session's ``facts`` (name, thing, code): distinct locks of ``locks`` and distinct four-digit codes."""
    chosen = rng.sample(locks, sessions * facts)
    codes = rng.sample(range(1000, 10000), sessions * facts)
    return [
        [
            (name, thing, str(code))
            for (name, thing), code in zip(
                chosen[s * facts : (s + 1) * facts], codes[s * facts : (s + 1) * facts], strict=True
            )
        ]
        for s in range(sessions)
    ]


def _state_facts(
    rng: random.Random,
    lines: list[tuple[str, str]],
    number: int,
    stated: list[tuple[str, str, str]],
    asked: int,
    control: int,
    chat: int,
) -> dict[int, list[str]]:
    """Session ``number``'s facts ``stated`` appended to its ``lines`` among ``chat`` lines of chit-chat, at seeded
    places in a seeded order: the used fact (``asked``) and its ``control`` one unit, ``PAUSE`` between them, each
    other fact a unit of its own. Each fact's turn id (a list, the restatement's id is added to the control's)."""
    units = [[asked, control], *([i] for i in range(len(stated)) if i not in (asked, control))]
    rng.shuffle(units)
    chit_chat = [(SPEAKERS[i % 2], rng.choice(CHAT)) for i in range(chat)]
    slots = set(rng.sample(range(chat + len(units)), len(units)))
    fact_turns: dict[int, list[str]] = {}
    unit_list, chat_lines = iter(units), iter(chit_chat)
    for position in range(chat + len(units)):
        if position not in slots:
            lines.append(next(chat_lines))
            continue
        for i in next(unit_list):
            if i == control:
                lines.append((SPEAKERS[1], PAUSE))
            lines.append((SPEAKERS[0], _statement(*stated[i])))
            fact_turns[i] = [f"D{number}:{len(lines)}"]
    return fact_turns


def _recall(
    pair: list[tuple[str, int]],
    stated: list[tuple[str, str, str]],
    where: dict[int, list[str]],
    number: int,
    earlier: int,
    before: int,
    first: int,
) -> tuple[list[str], list[Question]]:
    """Session ``number``'s cue lines, after its first ``before`` turns, bringing up session ``earlier``'s used fact
    and its control (``pair``: each one's kind and index, in the order asked), and the questions on them, each with
    its statements (``where``) and its cue as evidence, numbered from ``first``."""
    cues, asks = [], []
    for order, (kind, i) in enumerate(pair, 1):
        name, thing, code = stated[i]
        cues.append(f"{name} called me about the {thing} again.")
        evidence = [*where[i], f"D{number}:{before + order}"]
        asks.append(_question(first + order - 1, name, thing, code, evidence, kind, earlier, order))
    return cues, asks


def _statement(name: str, thing: str, code: str) -> str:
    """A code's statement, and its control's restatement, word for word."""
    return f"Please note this down for me, Alex: the code of {name}'s {thing} is {code}."


def _question(
    index: int, name: str, thing: str, code: str, evidence: list[str], kind: str, pair: int = 0, order: int = 0
) -> Question:
    return Question(index, f"What is the code of {name}'s {thing}?", code, evidence, 0, None, kind, pair, order)
