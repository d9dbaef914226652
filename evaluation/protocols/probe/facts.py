"""Two-hop probes: sixteen one-sentence facts, two of which chain to the answer of a question.

Eight facts say where a person lives ("Mia lives in Oslo."), eight what colour a city's flag is ("The flag of
Oslo is red."), over eight people, eight cities and eight colours, each used once. The question names one person
and asks for the colour of the flag of that person's city, so its answer chains two facts (the person's home, then
that city's flag) and the other fourteen, of the same two forms, are distractors. The facts come in a shuffled
order; where the two gold facts then stand is the placement's (``PLACEMENTS``): ``shuffled`` leaves them there,
``middle`` moves them to the fixed middle positions ``MIDDLE``, ``recency-5-8`` to two of the positions
``RECENCY_5_8`` (recency ranks 5 to 8: the 5th to 8th newest of the sixteen), drawn per probe, each in the order the
shuffle gave them (home first or flag first), with the distractors in their shuffled order around them, so the same
seed and index give the same facts, question, gold order and distractor order under every placement: only the gold
facts' positions differ. Everything is drawn from ``random.Random(f"probe:{seed}:{index}")``: the same seed gives the
same probes (``recency-5-8`` draws its two positions last, so the other placements draw nothing for it).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from evaluation.protocols.synthetic.words import CITIES, COLORS, NAMES

FACTS, PEOPLE = 16, 8
LIVES = re.compile(r"^(\w+) lives in (\w+)\.$")
FLAG = re.compile(r"^The flag of (\w+) is (\w+)\.$")
ASKED = re.compile(r"^What colour is the flag of the city where (\w+) lives\?$")
# the worked example the model sees first (people and cities outside the probes' vocabulary)
EXAMPLE_FACTS = ("Tom lives in Bern.", "The flag of Bern is pink.", "Ann lives in Rome.", "The flag of Rome is grey.")
EXAMPLE_QUESTION = "What colour is the flag of the city where Ann lives?"
EXAMPLE_REASONING = "Ann lives in Rome. The flag of Rome is grey. So the answer is grey."
EXAMPLE_ANSWER = "grey."
MIDDLE = (6, 8)  # 0-based: the gold facts 7th and 9th of the 16, in their shuffled order, one distractor between
RECENCY_5_8 = tuple(range(FACTS - 8, FACTS - 4))  # 0-based 8..11: recency ranks 8..5 (rank r: position FACTS - r)
SHUFFLED = "shuffled"
# the shuffled facts, the gold (home, flag) and the probe's generator -> their order
Placement = Callable[[list[str], tuple[str, str], random.Random], list[str]]


@dataclass(frozen=True)
class Probe:
    index: int
    facts: tuple[str, ...]
    question: str
    answer: str  # the colour
    bridge: str  # the city the chain passes through
    gold: tuple[int, int]  # the facts the answer chains, in chain order: (the person's home, the city's flag)


def gold_answer(probe: Probe, reasoning: bool) -> str:
    """The probe's gold answer in the worked example's form: with ``reasoning`` the chain then the colour
    (``EXAMPLE_REASONING``), without it the colour alone (``EXAMPLE_ANSWER``)."""
    if not reasoning:
        return f"{probe.answer}."
    asked = ASKED.match(probe.question)
    person = asked[1] if asked else ""
    return (
        f"{person} lives in {probe.bridge}. The flag of {probe.bridge} is {probe.answer}. "
        f"So the answer is {probe.answer}."
    )


def placed_at(facts: list[str], gold: tuple[str, str], positions: tuple[int, int]) -> list[str]:
    """The distractors in their order, with the gold facts inserted at ``positions`` (ascending) in the order
    ``facts`` holds them."""
    placed = [fact for fact in facts if fact not in gold]
    for position, fact in zip(positions, sorted(gold, key=facts.index), strict=True):
        placed.insert(position, fact)
    return placed


def in_recency_5_8(facts: list[str], gold: tuple[str, str], rng: random.Random) -> list[str]:
    """The gold facts at two positions of ``RECENCY_5_8`` drawn from ``rng``."""
    first, second = sorted(rng.sample(RECENCY_5_8, 2))
    return placed_at(facts, gold, (first, second))


PLACEMENTS: dict[str, Placement] = {
    SHUFFLED: lambda facts, gold, rng: facts,
    "middle": lambda facts, gold, rng: placed_at(facts, gold, MIDDLE),
    "recency-5-8": in_recency_5_8,
}
PLACEMENT_TEXTS = {  # each placement in words, as the scorecard and the dry run state it
    SHUFFLED: "the gold facts where the shuffle puts them",
    "middle": f"the gold facts at positions {MIDDLE[0] + 1} and {MIDDLE[1] + 1} of {FACTS}",
    "recency-5-8": f"the gold facts at two of the positions {RECENCY_5_8[0] + 1} to {RECENCY_5_8[-1] + 1} of {FACTS} "
    "(recency ranks 5 to 8), drawn per probe",
}


def probes(seed: int, count: int, placement: str = SHUFFLED) -> list[Probe]:
    """``count`` probes, deterministic in ``seed``, their gold facts where ``placement`` (``PLACEMENTS``) puts
    them."""
    if count < 1:
        raise ValueError(f"a probe run needs at least 1 probe, got {count}")
    if placement not in PLACEMENTS:
        raise ValueError(f"no gold-fact placement {placement!r}: choose one of {', '.join(PLACEMENTS)}")
    place = PLACEMENTS[placement]
    return [_probe(random.Random(f"probe:{seed}:{index}"), index, place) for index in range(count)]


def _probe(rng: random.Random, index: int, place: Placement) -> Probe:
    people, cities, colours = rng.sample(NAMES, PEOPLE), rng.sample(CITIES, PEOPLE), rng.sample(COLORS, PEOPLE)
    homes = [f"{person} lives in {city}." for person, city in zip(people, cities, strict=True)]
    flags = [f"The flag of {city} is {colour}." for city, colour in zip(cities, colours, strict=True)]
    facts = homes + flags
    rng.shuffle(facts)
    asked = rng.randrange(PEOPLE)
    facts = place(facts, (homes[asked], flags[asked]), rng)
    gold = (facts.index(homes[asked]), facts.index(flags[asked]))
    question = f"What colour is the flag of the city where {people[asked]} lives?"
    return Probe(index, tuple(facts), question, colours[asked], cities[asked], gold)


def solve(facts: tuple[str, ...], question: str) -> tuple[str, tuple[int, int]]:
    """The answer and the two facts it chains, read from the facts' text alone."""
    homes, flags = {}, {}
    for number, fact in enumerate(facts):
        if match := LIVES.match(fact):
            homes[match[1]] = (match[2], number)
        elif match := FLAG.match(fact):
            flags[match[1]] = (match[2], number)
        else:
            raise ValueError(f"fact {number} is of neither form: {fact!r}")
    asked = ASKED.match(question)
    if asked is None:
        raise ValueError(f"not a probe question: {question!r}")
    city, home = homes[asked[1]]
    colour, flag = flags[city]
    return colour, (home, flag)
