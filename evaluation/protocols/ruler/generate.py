"""RULER's 13 tasks generated offline as KVPress-format examples, re-implemented from the definitions in
``nvidia-long-context-eval`` (RULER's ``data/synthetic/*.py``), with its settings, templates and answer prefixes
read from the package.

Each example is RULER's input (the family's template, filled, then its answer prefix) split as KVPress splits its
RULER dataset: the context runs up to the last occurrence of the question's opening words (the instruction, any
worked example and the haystack), the question from there to the answer prefix's first word, the answer prefix the
rest. Its length follows RULER's rule: the haystack grows by increments while the prompt (as the harness builds
it, chat template included) plus the task's tokens to generate stays within ``length``, and the example keeps the
largest haystack that does: ``length - tolerance(task, length) < prompt + tokens_to_generate <= length``.

Where this differs from RULER's scripts: each increment is RULER's cut to at most ``length / 32`` tokens' worth
(RULER's 500 essay words are half of a 1024-token prompt); the frequent-words text is fitted with its tokens to
generate, as every other task (RULER fits it alone); a QA question whose gold documents alone exceed the length is
passed over (RULER's loop would not end); sentences are cut by ``sources.split_sentences``, not punkt; and the
randomness is Python's ``random.Random`` seeded per example by (seed, task, length, index), so the examples are the
same for the same arguments and tokenizer, but RULER's own random draws are not reproduced."""

from __future__ import annotations

import random
import re
import string
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache, partial
from itertools import pairwise
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample
from evaluation.protocols.kvpress.prompt import prompt_tokens
from evaluation.protocols.ruler.sources import Question, essay_words, qa_dataset, split_sentences, word_list
from evaluation.protocols.ruler.tasks import TASK_NAMES, RulerTask, ruler_task
from evaluation.protocols.single_turn.examples import after_prefix, first_answer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
REPEATED_HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_NOISE = REPEATED_HAYSTACK + "\n"
DEPTHS = tuple(round(100 * i / 39) for i in range(40))
SINGLE_NEEDLE_WORDING = (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer"))
DOCUMENT = "Document {i}:\n{document}"
SHORT = 4096
FINENESS = 32

VT_EXAMPLE_LENGTH = 500
VT_EXAMPLE_INCREMENT = 5
CWE_EXAMPLE = {"short": (20, 3, 1), "long": (40, 10, 3)}
CWE_SHORT_FREQUENCIES = (6, 1)
FWE_WORD_LENGTH = 6
FWE_VOCABULARY_PER_TOKENS = 50

QUESTION_OPENINGS = {
    "niah": re.compile(r"What (?:is|are all) the special magic"),
    "variable_tracking": re.compile(r"Question: Find all variables that are assigned the value"),
    "common_words_extraction": re.compile(r"Question: What are the 10 most common words in the above list\?"),
    "freq_words_extraction": re.compile(r"Question: Do not provide any explanation\."),
    "qa": re.compile(r"Answer the question based on the given documents\."),
}
ANSWER_OPENINGS = {family: re.compile(r"Answer:") for family in QUESTION_OPENINGS} | {
    "niah": re.compile(r"The special magic")
}


@dataclass(frozen=True)
class Growth:
    """How a task's haystack grows: by ``step`` ``unit``, from ``floor`` (the least that holds every needle,
    statement, common word or gold document) up to at most ``cap``. ``tokens_per_unit`` bounds the tokens one unit
    adds (for BPE tokenizers of the SmolLM2 or Llama kind), so ``step * tokens_per_unit`` bounds how far under the
    length an example may fall."""

    unit: str
    step: int
    floor: int
    cap: int
    tokens_per_unit: int

    def refined(self, length: int) -> Growth:
        """The same growth with its step cut to at most ``length / 32`` tokens' worth (one unit at least)."""
        return replace(self, step=min(self.step, max(1, length // (FINENESS * self.tokens_per_unit))))


@dataclass(frozen=True)
class Built:
    """One RULER input at one haystack size: its text (template and answer prefix, filled), its gold answers, and
    for needle tasks the needles inserted."""

    text: str
    answers: tuple[str, ...]
    needles: tuple[str, ...] = ()


class TooShort(Exception):
    """The smallest haystack already exceeds the length."""


def ruler_growth(task: RulerTask, length: int) -> Growth:
    """RULER's own increments for ``task`` at ``length``: the essay by 500 words, the repeated sentences and the
    distractor needles by 25 (5 below 4096 tokens), variable tracking by 10 noise lines, common words by 10 words,
    frequent words by ``length // 32`` words, QA by 10 documents."""
    settings, short = task.settings, length < SHORT
    if task.family == "niah":
        kind = settings["type_haystack"]
        if kind == "essay":
            return Growth("essay words", 500, 1, len(essay_words()), 2)
        step = 5 if short else 25
        needles = max(int(settings["num_needle_k"]), int(settings["num_needle_q"])) * int(settings["num_needle_v"])
        unit, per_unit = ("sentences", 30) if kind == "repeat" else ("needles", 90)
        return Growth(unit, step, needles, 10**9, per_unit)
    if task.family == "variable_tracking":
        return Growth("noise lines", 10, int(settings["num_hops"]) + 1, 10**9, 30)
    if task.family == "common_words_extraction":
        repeats = CWE_SHORT_FREQUENCIES[1] if short else int(settings["freq_ucw"])
        return Growth("words", 10, int(settings["num_cw"]), len(cwe_words()), 8 * repeats)
    if task.family == "freq_words_extraction":
        step = max(1, length // 32)
        return Growth("words", step, 1, 10**9, 4)
    return Growth("documents", 10, 1, len(qa_dataset(str(settings["dataset"])).documents), 1000)


def growth(task: RulerTask, length: int) -> Growth:
    """The haystack's growth for ``task`` at ``length``: RULER's increments, each cut to at most ``length / 32``
    tokens' worth, so that an example falls at most about 3% under its length wherever the haystack's unit allows
    (a QA document is one unit however long)."""
    return ruler_growth(task, length).refined(length)


def tolerance(task: str, length: int) -> int:
    """How many tokens an example's prompt plus its tokens to generate may fall under ``length``: one increment of
    its haystack, bounded for BPE tokenizers of the SmolLM2 or Llama kind (a byte-level tokenizer exceeds it):
    about ``length / 32`` where the haystack's unit allows, one document (1000 tokens) for QA below 32k tokens.
    Every example also has ``prompt + tokens_to_generate <= length``."""
    rule = growth(ruler_task(task), length)
    return rule.step * rule.tokens_per_unit


def example_random(seed: int, task: str, length: int, index: int) -> random.Random:
    """The random generator of one example."""
    return random.Random(f"ruler/{seed}/{task}/{length}/{index}")


def random_value(kind: str, rng: random.Random) -> str:
    """A needle's key or value: a 7-digit number, an adjective-noun word, or a UUID (version 4)."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(word_list('adjectivelist.txt'))}-{rng.choice(word_list('nounlist.txt'))}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise EvaluationError(f"unknown RULER needle type {kind!r}: known are numbers, words, uuids")


def niah_wording(task: RulerTask) -> tuple[str, str]:
    """The template with its answer prefix, and the value type's name: reworded for one needle asked (RULER's
    ``num_needle_q * num_needle_v == 1``: "Some" -> "A", "are all" -> "is", "are" -> "is", singular type)."""
    template, kind = task.template + task.answer_prefix, str(task.settings["type_needle_v"])
    if int(task.settings["num_needle_q"]) * int(task.settings["num_needle_v"]) == 1:
        for old, new in SINGLE_NEEDLE_WORDING:
            template = template.replace(old, new)
        kind = kind[:-1]
    return template, kind


def build_niah(task: RulerTask, size: int, rng: random.Random) -> Built:
    """RULER's needle in a haystack with ``size`` haystack units."""
    settings = task.settings
    kind_k, kind_v = str(settings["type_needle_k"]), str(settings["type_needle_v"])
    num_q, num_v = int(settings["num_needle_q"]), int(settings["num_needle_v"])
    num_k = max(int(settings["num_needle_k"]), num_q)
    keys = [random_value(kind_k, rng) for _ in range(num_k)]
    values = [[random_value(kind_v, rng) for _ in range(num_v)] for _ in keys]
    needles = [
        NEEDLE.format(type_needle_v=kind_v, key=k, value=v) for k, vs in zip(keys, values, strict=True) for v in vs
    ]
    rng.shuffle(needles)
    context = niah_haystack(task, size, needles, rng)
    asked = rng.sample(range(num_k), num_q)
    queries = [keys[i] for i in asked]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    template, kind = niah_wording(task)
    text = template.format(type_needle_v=kind, context=context, query=query)
    return Built(text, tuple(v for i in asked for v in values[i]), tuple(needles))


def niah_haystack(task: RulerTask, size: int, needles: list[str], rng: random.Random) -> str:
    """The haystack with the needles in it: essay sentences with the needles at depths drawn from RULER's 40, or
    ``size`` repeated sentences (or distractor needles) with the needles at random lines."""
    kind = task.settings["type_haystack"]
    if kind == "essay":
        sentences = split_sentences(" ".join(essay_words()[:size]).strip())
        cuts = sorted(int(len(sentences) * depth / 100) for depth in rng.sample(DEPTHS, len(needles)))
        bounds = [0, *cuts, len(sentences)]
        pieces = []
        for i, (low, high) in enumerate(pairwise(bounds)):
            pieces += [" ".join(sentences[low:high])] + ([needles[i]] if i < len(needles) else [])
        return " ".join(piece for piece in pieces if piece)
    if kind == "repeat":
        lines = [REPEATED_HAYSTACK] * size
    else:
        kind_k, kind_v = str(task.settings["type_needle_k"]), str(task.settings["type_needle_v"])
        lines = [
            NEEDLE.format(type_needle_v=kind_v, key=random_value(kind_k, rng), value=random_value(kind_v, rng))
            for _ in range(size)
        ]
    for position, needle in zip(sorted(rng.sample(range(size), len(needles)), reverse=True), needles, strict=True):
        lines.insert(position, needle)
    return "\n".join(lines)


def vt_chain(num_hops: int, letters: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """One chain of variable assignments: its variables (distinct, ``letters`` capitals each) and its statements,
    ``VAR X = <5-digit number>`` then ``VAR Y = VAR X`` for each hop."""
    names: list[str] = []
    while len(names) < num_hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        names += [name] if name not in names else []
    statements = [f"VAR {names[0]} = {rng.randint(10000, 99998)}"]
    statements += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(num_hops)]
    return names, statements


def vt_input(task: RulerTask, noises: int, rng: random.Random, worked: bool) -> Built:
    """RULER's variable tracking: one chain's statements at random lines of ``noises`` noise lines; the worked
    example (``worked``) has 3-letter variables, the question 5-letter ones."""
    num_hops = int(task.settings["num_hops"])
    names, statements = vt_chain(min(10, num_hops) if worked else num_hops, 3 if worked else 5, rng)
    lines = [VT_NOISE] * noises
    for j, position in enumerate(sorted(rng.sample(range(len(lines)), len(statements)))):
        lines.insert(position + j, statements[j])
    context = " ".join(lines).replace(". \n", ".\n")
    value = statements[0].split("=")[-1].strip()
    text = (task.template + task.answer_prefix).format(context=context, query=value, num_v=len(names))
    return Built(text, tuple(names))


def vt_worked_text(built: Built) -> str:
    """A worked example as RULER puts it before the question: its input, its answers, a blank line."""
    return built.text + " " + " ".join(built.answers) + "\n\n"


def build_vt(task: RulerTask, size: int, rng: random.Random, worked_noises: int) -> Built:
    """RULER's variable tracking with one worked example (``worked_noises`` noise lines) before the question's."""
    worked = vt_worked_text(vt_input(task, worked_noises, rng, worked=True))
    built = vt_input(task, size, rng, worked=False)
    return Built(" " + worked + "\n\n" + built.text, built.answers)


@cache
def cwe_words() -> tuple[str, ...]:
    """RULER's common-words vocabulary: wonderwords' nouns, adjectives and verbs, unique, sorted."""
    return tuple(sorted({*word_list("nounlist.txt"), *word_list("adjectivelist.txt"), *word_list("verblist.txt")}))


def numbered(words: list[str]) -> str:
    """Words as RULER numbers them: ``1. first 2. second ...``."""
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def cwe_list(
    rng: random.Random, num_words: int, common_repeats: int, rare_repeats: int, num_common: int
) -> tuple[str, list[str]]:
    """A shuffled numbered list of ``num_words`` distinct words, the first ``num_common`` of them
    ``common_repeats`` times each, the others ``rare_repeats`` times; and the common words."""
    chosen = rng.sample(cwe_words(), num_words)
    common, rare = chosen[:num_common], chosen[num_common:]
    items = common * common_repeats + rare * rare_repeats
    rng.shuffle(items)
    return numbered(items), common


def build_cwe(task: RulerTask, size: int, rng: random.Random, length: int) -> Built:
    """RULER's common words extraction over ``size`` words, after one worked example; below 4096 tokens RULER
    repeats the common words 6 times and the others once (its settings' ``freq_cw``, ``freq_ucw`` from 4096), and
    its worked example is smaller."""
    short = length < SHORT
    num_common = int(task.settings["num_cw"])
    example_words, example_common, example_rare = CWE_EXAMPLE["short" if short else "long"]
    common, rare = CWE_SHORT_FREQUENCIES if short else (int(task.settings["freq_cw"]), int(task.settings["freq_ucw"]))
    template = task.template + task.answer_prefix
    example_context, example_answers = cwe_list(rng, example_words, example_common, example_rare, num_common)
    context, answers = cwe_list(rng, size, common, rare, num_common)
    worked = template.format(context=example_context, query="") + numbered(example_answers)
    return Built(worked + "\n" + template.format(context=context, query=""), tuple(answers))


def zeta(s: float, terms: int = 1000) -> float:
    """Riemann's zeta function at ``s > 1`` (Euler-Maclaurin after ``terms`` terms; error far under 1e-12)."""
    head = sum(k**-s for k in range(1, terms))
    return head + terms ** (1 - s) / (s - 1) + terms**-s / 2 + s * terms ** (-s - 1) / 12


def fwe_vocabulary(length: int, rng: random.Random) -> list[str]:
    """RULER's coded words: ``length // 50`` distinct random 6-letter words, shuffled, the first replaced by the
    noise word ``...``."""
    words: set[str] = set()
    while len(words) < max(4, length // FWE_VOCABULARY_PER_TOKENS):
        words.add("".join(rng.choices(string.ascii_lowercase, k=FWE_WORD_LENGTH)))
    vocabulary = sorted(words)
    rng.shuffle(vocabulary)
    return ["...", *vocabulary[1:]]


def build_fwe(task: RulerTask, size: int, rng: random.Random, length: int) -> Built:
    """RULER's frequent words extraction: the word of rank k appears ``int(size * k**-alpha / zeta(alpha))``
    times, shuffled; the answers are ranks 2 to 4 (rank 1 is the noise ``...``)."""
    alpha = float(task.settings["alpha"])
    vocabulary = fwe_vocabulary(length, rng)
    counts = [int(size * k**-alpha / zeta(alpha)) for k in range(1, len(vocabulary) + 1)]
    words = [word for word, count in zip(vocabulary, counts, strict=True) for _ in range(count)]
    rng.shuffle(words)
    text = (task.template + task.answer_prefix).format(context=" ".join(words), query="")
    return Built(text, tuple(vocabulary[1:4]))


def qa_documents(question: Question, size: int, total: int, rng: random.Random) -> list[int]:
    """RULER's documents for a question: its gold ones, then its article's other paragraphs, then random others,
    ``size`` in all (every document when ``size`` reaches them), shuffled."""
    if size >= total:
        chosen = list(range(total))
    elif size - len(question.gold) <= len(question.nearby):
        chosen = [*question.gold, *rng.sample(question.nearby, size - len(question.gold))]
    else:
        chosen = [*question.gold, *question.nearby]
        taken = set(chosen)
        while len(chosen) < size:
            candidate = rng.randrange(total)
            if candidate not in taken:
                chosen.append(candidate)
                taken.add(candidate)
    rng.shuffle(chosen)
    return chosen


def qa_builder(task: RulerTask, question: Question, rng_of: Callable[[], random.Random]) -> Callable[[int], Built]:
    """A question's input as a function of its number of documents."""
    return lambda size: build_qa(task, size, rng_of(), question)


def build_qa(task: RulerTask, size: int, rng: random.Random, question: Question) -> Built:
    """RULER's QA: ``size`` documents, the question's gold ones among them, numbered."""
    dataset = qa_dataset(str(task.settings["dataset"]))
    chosen = qa_documents(question, size, len(dataset.documents), rng)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=dataset.documents[d]) for i, d in enumerate(chosen))
    text = (task.template + task.answer_prefix).format(context=context, query=question.query)
    return Built(text, question.answers)


def split(family: str, text: str) -> tuple[str, str, str]:
    """A RULER input as KVPress splits it: context up to the last question opening, question up to the answer
    prefix's first word, answer prefix."""
    cut = list(QUESTION_OPENINGS[family].finditer(text))[-1].start()
    rest = text[cut:]
    answer = ANSWER_OPENINGS[family].search(rest)
    assert answer is not None
    return text[:cut], rest[: answer.start()], rest[answer.start() :]


def fit(
    build: Callable[[int], Built], measure: Callable[[Built], int], rule: Growth, hint: int, length: int
) -> tuple[int, Built]:
    """The largest haystack, from ``hint``, whose example ``measure``s within ``length`` while one more step would
    not: grown by doubling jumps (halved back to one step on an overshoot), or shrunk a step at a time;
    ``TooShort`` when even the floor does not fit."""
    size = min(max(hint, rule.floor), rule.cap)
    built = build(size)
    if measure(built) <= length:
        jump = rule.step
        while size < rule.cap:
            bigger = min(size + jump, rule.cap)
            candidate = build(bigger)
            if measure(candidate) <= length:
                size, built, jump = bigger, candidate, jump * 2
            elif jump > rule.step:
                jump = max(rule.step, jump // 2)
            else:
                break
        return size, built
    while size > rule.floor:
        size = max(size - rule.step, rule.floor)
        built = build(size)
        if measure(built) <= length:
            return size, built
    raise TooShort(measure(built))


def needle_depth(context: str, needles: tuple[str, ...], answers: tuple[str, ...]) -> float | None:
    """Where the first needle the question asks for (one holding a gold answer; a multikey task's distractor keys
    are not asked for) starts in the context, in characters over the context's length."""
    asked = [needle for needle in needles if any(f": {answer}." in needle for answer in answers)]
    if not asked:
        return None
    return min(context.index(needle) for needle in asked) / len(context)


def to_example(task: RulerTask, length: int, index: int, built: Built) -> KVPressExample:
    """One generated input as a KVPress-format example."""
    context, question, answer_prefix = split(task.family, built.text)
    return KVPressExample(
        id=f"{task.name}/{length}/{index}",
        task=task.name,
        context=context,
        question=question,
        answer_prefix=answer_prefix,
        answers=built.answers,
        max_new_tokens=task.tokens_to_generate,
        length=length,
        depth=needle_depth(context, built.needles, built.answers),
    )


def vt_worked_noises(task: RulerTask, tokenizer: PreTrainedTokenizerBase, seed: int) -> int:
    """How many noise lines RULER's worked variable-tracking example gets: the most, by 5, whose text (answers
    included, no chat template) plus the tokens to generate stays within 500 tokens."""
    rng_of = partial(example_random, seed, task.name, VT_EXAMPLE_LENGTH, -1)
    floor = max(VT_EXAMPLE_INCREMENT, int(task.settings["num_hops"]) + 1)
    rule = Growth("noise lines", VT_EXAMPLE_INCREMENT, floor, 10**9, 30)

    def measure(built: Built) -> int:
        return len(tokenizer.encode(vt_worked_text(built), add_special_tokens=False)) + task.tokens_to_generate

    try:
        size, _ = fit(lambda size: vt_input(task, size, rng_of(), True), measure, rule, floor, VT_EXAMPLE_LENGTH)
    except TooShort as error:
        raise EvaluationError(
            f"RULER's worked variable-tracking example takes {error.args[0]} tokens of this tokenizer, over RULER's "
            f"{VT_EXAMPLE_LENGTH}: vt cannot run with it; leave vt out of --tasks"
        ) from None
    return size


def builders(
    task: RulerTask, length: int, tokenizer: PreTrainedTokenizerBase, seed: int
) -> Callable[[int], Callable[[int], Built]]:
    """For each example's index, its input as a function of the haystack's size (same size, same input)."""
    family = task.family
    if family == "niah":
        return lambda index: lambda size: build_niah(task, size, example_random(seed, task.name, length, index))
    if family == "variable_tracking":
        worked = vt_worked_noises(task, tokenizer, seed)
        return lambda index: lambda size: build_vt(task, size, example_random(seed, task.name, length, index), worked)
    build = build_cwe if family == "common_words_extraction" else build_fwe
    return lambda index: lambda size: build(task, size, example_random(seed, task.name, length, index), length)


def generate(task: str, length: int, n: int, tokenizer: PreTrainedTokenizerBase, seed: int) -> list[KVPressExample]:
    """``n`` examples of RULER's ``task`` at ``length`` tokens (prompt plus tokens to generate, as the harness
    builds the prompt with ``tokenizer``), deterministic for these arguments.

    Parameters
    ----------
    task : str
        One of RULER's 13 tasks (``niah_single_1`` ... ``qa_2``).
    length : int
        The target: ``length - tolerance(task, length) < prompt + tokens_to_generate <= length``.
    n : int
        How many examples; ids ``{task}/{length}/{index}``.
    tokenizer
        The model's tokenizer (its chat template counted).
    seed : int
        Any integer; other seeds give other examples.
    """
    spec = ruler_task(task)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise EvaluationError(f"a RULER length must be a whole number of tokens >= 1, not {length!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise EvaluationError(f"a RULER example count must be a whole number >= 0, not {n!r}")

    def measure(built: Built) -> int:
        return prompt_tokens(tokenizer, *split(spec.family, built.text)) + spec.tokens_to_generate

    if spec.family == "qa":
        return generate_qa(spec, length, n, measure, seed)
    rule, examples = growth(spec, length), []
    build_for, hint = builders(spec, length, tokenizer, seed), rule.floor
    for index in range(n):
        try:
            hint, built = fit(build_for(index), measure, rule, hint, length)
        except TooShort as error:
            raise EvaluationError(
                f"RULER's {task} does not fit in {length} tokens: its smallest haystack takes {error.args[0]} "
                "(prompt and tokens to generate); ask for a longer length"
            ) from None
        examples.append(to_example(spec, length, index, built))
    return examples


def generate_qa(
    task: RulerTask, length: int, n: int, measure: Callable[[Built], int], seed: int
) -> list[KVPressExample]:
    """RULER's QA examples: its questions in the dataset's order, each with the most documents that fit; a
    question whose gold documents alone exceed the length is passed over (RULER would stall on it)."""
    rule, examples = growth(task, length), []
    questions: Iterator[Question] = iter(qa_dataset(str(task.settings["dataset"])).questions)
    hint = rule.floor
    while len(examples) < n:
        question = next(questions, None)
        if question is None:
            raise EvaluationError(f"only {len(examples)} of RULER's {task.name} questions fit in {length} tokens")
        rng_of = partial(example_random, seed, task.name, length, len(examples))
        floor_rule = replace(rule, floor=len(question.gold))
        try:
            hint, built = fit(qa_builder(task, question, rng_of), measure, floor_rule, hint, length)
        except TooShort:
            continue
        examples.append(to_example(task, length, len(examples), built))
    return examples


def ruler_gold(example: KVPressExample) -> str:
    """The answer whose likelihood a RULER cell scores, in the format the prompt shows it: vt's variables after a
    space, as its worked example answers; cwe's words numbered, as its worked example lists them; qa's first answer;
    the others' answers joined by ", " (a space before them where the answer prefix ends without one)."""
    if example.task not in TASK_NAMES:
        return first_answer(example)
    family = ruler_task(example.task).family
    if family == "variable_tracking":
        return " " + " ".join(example.answers)
    if family == "common_words_extraction":
        return numbered(list(example.answers))
    if family == "qa":
        return first_answer(example)
    return after_prefix(example, ", ".join(example.answers))
