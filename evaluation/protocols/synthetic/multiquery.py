"""Shared-context multi-query, in the style of SCBench and RULER's synthetic tasks: one long document, then
several questions about it, each asked after the previous one's question and gold answer joined the history.

A document of about ``length`` tokens (``CHARS_PER_TOKEN`` characters per token; each row records the
history's real token count) is filler sentences with, at random depths: pass-code records of animals (every
one a key-value pair, ``kv`` asks one of them), variable chains "VAR AB = 41234." ... "VAR CD = VAR AB." ...
"VAR EF = VAR CD." (``vt`` asks the last variable's value; other chains distract), and special magic numbers
of cities (``needle`` asks one; the others distract). The questions are asked in a seeded order.
"""

from __future__ import annotations

import random
from itertools import pairwise

from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.protocols.synthetic.words import ADJECTIVES, ANIMALS, CITIES, COLORS, LETTERS, NOUNS, VERBS

CHARS_PER_TOKEN = 4.4  # SmolLM2's tokenizer on these documents
KINDS = ("kv", "vt", "needle")
QUESTIONS = {"kv": 2, "vt": 1, "needle": 1}
CHAIN_HOPS = 2
CHAINS = 3
NEEDLES = 4
RECORD_EVERY = 12  # filler sentences per pass-code record
FILLER_CHARS = 45  # a filler sentence's typical length
Special = tuple[str, str, tuple[str, ...]]  # a special sentence: its kind, its text, what it states


def length_label(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def multiquery_episodes(seed: int, lengths: list[int], per_length: int) -> list[Conversation]:
    """``per_length`` documents at each length, deterministic in ``seed``."""
    if any(length < 512 for length in lengths):
        raise ValueError(f"document lengths {lengths} must be at least 512 tokens")
    return [
        _episode(random.Random(f"multiquery:{seed}:{length}:{index}"), f"mq-{length_label(length)}-{index}", length)
        for length in lengths
        for index in range(per_length)
    ]


def _filler(rng: random.Random) -> str:
    adjective, noun, verb, other, place = (
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
        rng.choice(VERBS),
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
    )
    return f"The {adjective} {noun} {verb} the {other} {place}."


def _episode(rng: random.Random, sample_id: str, length: int) -> Conversation:
    """One document of about ``length`` tokens: its records, chains and needles among filler sentences, each at a
    seeded depth, and its questions in a seeded order, each with the turns stating its answer as evidence."""
    target = int(length * CHARS_PER_TOKEN)
    specials, chains = _specials(rng, target)
    lines: list[str] = []
    written = sum(len(text) + 1 for _, text, _ in specials)
    while written < target:
        lines.append(_filler(rng))
        written += len(lines[-1]) + 1
    placed = _placed(rng, specials, len(lines))
    at = {position: i for i, position in placed.items()}
    document, filler = [], iter(lines)
    for position in range(len(lines) + len(specials)):
        document.append(specials[at[position]][1] if position in at else next(filler))
    turn_of = {i: f"D1:{placed[i] + 1}" for i in range(len(specials))}
    turns = [Turn("", f"D1:{t + 1}", text, None) for t, text in enumerate(document)]
    return Conversation(
        sample_id,
        "",
        "",
        [Session(1, "", turns)],
        [
            Question(index, text, answer, evidence, 0, None, kind)
            for index, (kind, text, answer, evidence) in enumerate(_questions(rng, specials, chains, turn_of))
        ],
    )


def _specials(rng: random.Random, target: int) -> tuple[list[Special], list[tuple[str, str]]]:
    """A document's special sentences for ``target`` characters, in order: its pass-code records, each chain's
    steps (its first variable's value, then each variable set to the one before) and the cities' magic numbers;
    and each chain's last variable with its value."""
    pool = [(color, animal) for color in COLORS for animal in ANIMALS]
    wanted = target // (FILLER_CHARS * (RECORD_EVERY + 1))
    records = rng.sample(pool, min(len(pool), max(QUESTIONS["kv"], wanted)))
    codes = rng.sample(range(10000, 100000), len(records) + CHAINS)
    specials: list[Special] = [
        ("kv", f"The pass code of the {color} {animal} is {code}.", (color, animal, str(code)))
        for (color, animal), code in zip(records, codes, strict=False)
    ]
    names = rng.sample([a + b for a in LETTERS for b in LETTERS], CHAINS * (CHAIN_HOPS + 1))
    chains = []
    for c in range(CHAINS):
        chain = names[c * (CHAIN_HOPS + 1) : (c + 1) * (CHAIN_HOPS + 1)]
        value = str(codes[len(records) + c])
        chains.append((chain[-1], value))
        texts = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in pairwise(chain)]
        specials += [("vt-step", text, ()) for text in texts]
    cities = rng.sample(CITIES, NEEDLES)
    magic = rng.sample(range(1_000_000, 10_000_000), NEEDLES)
    specials += [
        ("needle", f"The special magic number for {city} is {number}.", (city, str(number)))
        for city, number in zip(cities, magic, strict=True)
    ]
    return specials, chains


def _chain_steps(specials: list[Special]) -> list[list[int]]:
    """Each chain's steps: their indices in ``specials``, in the chain's order."""
    steps = [i for i, (kind, _, _) in enumerate(specials) if kind == "vt-step"]
    return [steps[c * (CHAIN_HOPS + 1) : (c + 1) * (CHAIN_HOPS + 1)] for c in range(CHAINS)]


def _placed(rng: random.Random, specials: list[Special], fillers: int) -> dict[int, int]:
    """Each special's position in a document of ``fillers`` filler sentences and ``specials``, drawn at random but
    with each chain's steps in their order: the sorted positions are handed out to the specials in a shuffled
    order, then each chain's steps are re-sorted among the positions they received."""
    positions = sorted(rng.sample(range(fillers + len(specials)), len(specials)))
    order = list(range(len(specials)))
    rng.shuffle(order)
    placed = dict(zip(order, positions, strict=True))
    for group in _chain_steps(specials):
        for i, position in zip(group, sorted(placed[i] for i in group), strict=True):
            placed[i] = position
    return placed


def _questions(
    rng: random.Random, specials: list[Special], chains: list[tuple[str, str]], turn_of: dict[int, str]
) -> list[tuple[str, str, str, list[str]]]:
    """The document's questions in a seeded order, each (kind, text, answer, evidence turns): ``QUESTIONS[kind]``
    of each kind, on records, chains and needles drawn at random."""
    questions = []
    kv = [i for i, (kind, _, _) in enumerate(specials) if kind == "kv"]
    for i in rng.sample(kv, QUESTIONS["kv"]):
        color, animal, code = specials[i][2]
        questions.append(("kv", f"What is the pass code of the {color} {animal}?", code, [turn_of[i]]))
    groups = _chain_steps(specials)
    for c in rng.sample(range(CHAINS), QUESTIONS["vt"]):
        name, value = chains[c]
        questions.append(("vt", f"What is the value of VAR {name}?", value, [turn_of[i] for i in groups[c]]))
    needles = [i for i, (kind, _, _) in enumerate(specials) if kind == "needle"]
    for i in rng.sample(needles, QUESTIONS["needle"]):
        city, number = specials[i][2]
        questions.append(("needle", f"What is the special magic number for {city}?", number, [turn_of[i]]))
    rng.shuffle(questions)
    return questions
