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
    chosen = rng.sample(locks, sessions * facts)
    codes = rng.sample(range(1000, 10000), sessions * facts)
    stated = [
        [
            (name, thing, str(code))
            for (name, thing), code in zip(
                chosen[s * facts : (s + 1) * facts], codes[s * facts : (s + 1) * facts], strict=True
            )
        ]
        for s in range(sessions)
    ]
    asked = [rng.randrange(facts) for _ in range(sessions)]  # which fact of each session is used
    controls = [rng.choice([i for i in range(facts) if i != asked[s]]) for s in range(sessions)]
    session_list, questions = [], []
    where: list[dict[int, list[str]]] = []  # per session, fact index -> the turn ids stating it
    for s in range(sessions):
        number = s + 1
        turns_text: list[tuple[str, str]] = []
        if s:  # the previous session's control, stated again where its used code's answer ends
            turns_text.append((SPEAKERS[0], _statement(*stated[s - 1][controls[s - 1]])))
            where[s - 1][controls[s - 1]].append(f"D{number}:1")
        units = [[asked[s], controls[s]], *([i] for i in range(facts) if i not in (asked[s], controls[s]))]
        rng.shuffle(units)
        lines = [(SPEAKERS[i % 2], rng.choice(CHAT)) for i in range(chat)]
        slots = set(rng.sample(range(chat + len(units)), len(units)))
        fact_turns: dict[int, list[str]] = {}
        unit_list, chat_lines = iter(units), iter(lines)
        for position in range(chat + len(units)):
            if position not in slots:
                turns_text.append(next(chat_lines))
                continue
            for i in next(unit_list):
                if i == controls[s]:
                    turns_text.append((SPEAKERS[1], PAUSE))
                turns_text.append((SPEAKERS[0], _statement(*stated[s][i])))
                fact_turns[i] = [f"D{number}:{len(turns_text)}"]
        earlier = number - lag
        cues = []
        if earlier >= 1:
            for kind, i in (("reuse", asked[earlier - 1]), ("fresh", controls[earlier - 1])):
                name, thing, _ = stated[earlier - 1][i]
                cues.append((kind, i, f"{name} called me about the {thing} again."))
            if (index + number) % 2:  # the used code first in every other pair
                cues.reverse()
            turns_text += [(SPEAKERS[1], text) for _, _, text in cues]
        turns = [Turn(speaker, f"D{number}:{t + 1}", text, None) for t, (speaker, text) in enumerate(turns_text)]
        session_list.append(Session(number, f"day {number}", turns))
        where.append(fact_turns)
        cue_turns = {i: f"D{number}:{len(turns) - len(cues) + c + 1}" for c, (_, i, _) in enumerate(cues)}
        for order, (kind, i, _) in enumerate(cues, 1):  # asked in the cues' order
            name, thing, code = stated[earlier - 1][i]
            evidence = [*where[earlier - 1][i], cue_turns[i]]
            questions.append(_question(len(questions), name, thing, code, evidence, kind, earlier, order))
        name, thing, code = stated[s][asked[s]]
        questions.append(_question(len(questions), name, thing, code, fact_turns[asked[s]], "first"))
    return Conversation(f"reuse-{index}", SPEAKERS[0], SPEAKERS[1], session_list, questions)


def _statement(name: str, thing: str, code: str) -> str:
    """A code's statement, and its control's restatement, word for word."""
    return f"Please note this down for me, Alex: the code of {name}'s {thing} is {code}."


def _question(
    index: int, name: str, thing: str, code: str, evidence: list[str], kind: str, pair: int = 0, order: int = 0
) -> Question:
    return Question(index, f"What is the code of {name}'s {thing}?", code, evidence, 0, None, kind, pair, order)
