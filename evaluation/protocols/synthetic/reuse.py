"""Endogenous reuse: what a correct answer used at one turn is needed again some turns later.

An episode is a conversation streamed session by session. Each session states ``facts`` lock codes
("the code of Mia's locker is 4821") among chit-chat. Right after session ``s`` one of its codes is asked
(kind ``first``: the turn that uses the fact; the history then holds the question and its gold answer, a second
copy of the code). The session ends with the same exchange for another of its codes, in the same words but
inside the session ("What is the code of Nora's safe?" / "The code of Nora's safe is 7946."): a second copy of
one form that no question asked. ``lag`` sessions later, a cue line brings each of the two locks up again and
both are asked: the used one (kind ``reuse``) and its matched control (kind ``fresh``: as old, stated as often
and in the same form, cued the same way, but never asked). Which of the two is asked first alternates from pair
to pair (``order``), so that the order of asking is balanced. The difference between the two is whether the
code was used by an answer the protocol asked for. ``lag`` counts sessions, not tokens.
"""

from __future__ import annotations

import random

from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.protocols.synthetic.words import CHAT, NAMES, THINGS

SPEAKERS = ("Sam", "Alex")


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
    where: list[dict[int, str]] = []  # per session, fact index -> its turn id
    for s in range(sessions):
        number = s + 1
        lines: list[tuple[str, str]] = [(SPEAKERS[i % 2], rng.choice(CHAT)) for i in range(chat)]
        slots = sorted(rng.sample(range(len(lines) + facts), facts))
        turns_text: list[tuple[str, str]] = []
        fact_lines = iter(range(facts))
        chat_lines = iter(lines)
        for position in range(len(lines) + facts):
            if position in slots:
                i = next(fact_lines)
                name, thing, code = stated[s][i]
                turns_text.append((SPEAKERS[0], f"Please note this down: the code of {name}'s {thing} is {code}."))
            else:
                turns_text.append(next(chat_lines))
        fact_turns = {i: [f"D{number}:{slots[i] + 1}"] for i in range(facts)}
        earlier = number - lag
        cues = []
        if earlier >= 1:
            for kind, i in (("reuse", asked[earlier - 1]), ("fresh", controls[earlier - 1])):
                name, thing, _ = stated[earlier - 1][i]
                cues.append((kind, i, f"{name} called me about the {thing} again."))
            if (index + number) % 2:  # the used code first in every other pair
                cues.reverse()
            turns_text += [(SPEAKERS[1], text) for _, _, text in cues]
        name, thing, code = stated[s][controls[s]]
        turns_text += [(SPEAKERS[1], _ask(name, thing)), (SPEAKERS[0], _told(name, thing, code))]
        fact_turns[controls[s]].append(f"D{number}:{len(turns_text)}")
        turns = [Turn(speaker, f"D{number}:{t + 1}", text, None) for t, (speaker, text) in enumerate(turns_text)]
        session_list.append(Session(number, f"day {number}", turns))
        where.append(fact_turns)
        name, thing, code = stated[s][asked[s]]
        questions.append(_question(len(questions), name, thing, code, fact_turns[asked[s]], "first"))
        cue_turns = {i: f"D{number}:{len(turns) - 2 - len(cues) + c + 1}" for c, (_, i, _) in enumerate(cues)}
        for order, (kind, i, _) in enumerate(cues, 1):  # asked in the cues' order
            name, thing, code = stated[earlier - 1][i]
            evidence = [*where[earlier - 1][i], cue_turns[i]]
            questions.append(_question(len(questions), name, thing, code, evidence, kind, earlier, order))
    return Conversation(f"reuse-{index}", SPEAKERS[0], SPEAKERS[1], session_list, questions)


def _ask(name: str, thing: str) -> str:
    return f"What is the code of {name}'s {thing}?"


def _told(name: str, thing: str, code: str) -> str:
    """The gold answer sentence, as the history records it after a question (``synthetic.task.sentence_answer``)."""
    return f"The code of {name}'s {thing} is {code}."


def _question(
    index: int, name: str, thing: str, code: str, evidence: list[str], kind: str, pair: int = 0, order: int = 0
) -> Question:
    return Question(index, _ask(name, thing), code, evidence, 0, None, kind, pair, order)
