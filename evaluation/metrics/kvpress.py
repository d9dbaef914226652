"""The scoring rules of KVPress's evaluation (``evaluation/benchmarks/*/calculate_metrics.py``), one per benchmark
family, re-implemented from what each does: a rule maps one prediction and its example to a float, and a benchmark's
score is the mean of those floats (per task where KVPress groups by task), except where an aggregate says otherwise.

Rules that need what is not installed here (LooGLE's METEOR and BERTScore) and KVPress's scorers that cannot score
their own hub data (five InfiniteBench tasks, ZeroSCROLLS' hidden answers) are refused in one line.
"""

from __future__ import annotations

import ast
import re
import string
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from evaluation.errors import EvaluationError
from evaluation.metrics import longbench, ruler
from evaluation.metrics.f1 import token_f1


class Example(Protocol):
    """What a rule reads of an example in KVPress's columns: its task and its gold answers."""

    task: str
    answers: Sequence[str]


Rule = Callable[..., float]

# --- RULER ---------------------------------------------------------------------------------------------------------


def string_match(prediction: str, example: Example) -> float:
    """RULER's rule (``evaluation.metrics.ruler``), in [0, 1]: ``string_match_part`` for the qa tasks (the task's
    name up to its first "_"), ``string_match_all`` for every other task."""
    metric = "string_match_part" if example.task.split("_")[0] == "qa" else "string_match_all"
    return ruler.score(metric, prediction, example.answers)


# --- LooGLE --------------------------------------------------------------------------------------------------------

CLOZE_TASK = "shortdep_cloze"
LOOGLE_REFUSED = {
    "meteor": "nltk's wordnet corpus, which is not installed (nltk.download needs the network)",
    "bert": "the bert-score package and its roberta-large model, which are not installed",
}


@dataclass(frozen=True)
class ClozeCounts:
    """One cloze example: masked entities named exactly, named with a shared word, and the count they divide by."""

    exact: int
    exact_count: int
    partial: int
    partial_count: int


def literal_dict(text: str) -> dict | None:
    """``text`` read as a Python literal if it is a dict, else None (KVPress evals it; a literal is read safely)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def cloze_counts(prediction: str, reference: str) -> ClozeCounts:
    """LooGLE's cloze counts: ``reference`` is a dict of masks to entities. Exact: masks the prediction's dict maps
    to the same entity, out of all masks, or 0 out of 1 when the prediction is not a dict. Partial: masks whose
    predicted entity shares a whitespace word with the gold one, 0 when it is not a dict, out of all masks."""
    gold = literal_dict(reference)
    if gold is None:
        raise EvaluationError(f"a LooGLE cloze answer must be a dict of masks to entities, not {reference[:60]!r}")
    predicted = literal_dict(prediction)
    if predicted is None:
        return ClozeCounts(0, 1, 0, len(gold))
    exact = sum(predicted.get(mask) == entity for mask, entity in gold.items())
    try:
        partial = sum(
            mask in predicted and bool(set(entity.split()) & set(predicted[mask].split()))
            for mask, entity in gold.items()
        )
    except AttributeError:  # a predicted entity that is not a string: KVPress counts the whole example 0
        partial = 0
    return ClozeCounts(exact, len(gold), partial, len(gold))


def cloze_aggregate(counts: Sequence[ClozeCounts]) -> dict[str, float]:
    """The cloze task's score as KVPress reports it: matches summed over examples over counts summed, to 4
    decimals (a micro average, not the mean of the per-example fractions)."""
    return {
        "exact_match": round(sum(c.exact for c in counts) / sum(c.exact_count for c in counts), 4),
        "partial_match": round(sum(c.partial for c in counts) / sum(c.partial_count for c in counts), 4),
    }


def loogle_text_metrics(prediction: str, reference: str) -> dict[str, float]:
    """LooGLE's metrics of one QA or summary prediction: BLEU-1 and BLEU-4 (nltk's sentence BLEU, one weight on
    one n-gram order, on whitespace words) and the ROUGE-1, ROUGE-2, ROUGE-L recall of the ``rouge`` package
    against the reference. A metric that fails (an empty prediction for ROUGE) is 0, as in KVPress. METEOR and
    BERTScore are refused: see ``LOOGLE_REFUSED``."""
    from rouge import Rouge

    try:
        bleu = bleu_scores(reference.replace("\n", " ").split(), prediction.replace("\n", " ").split())
    except Exception:  # KVPress's rule: a metric that raises scores 0
        bleu = {"bleu1": 0.0, "bleu4": 0.0}
    try:
        scores = Rouge().get_scores(hyps=[prediction], refs=[reference])[0]
        rouge = {key: float(scores[key]["r"]) for key in ("rouge-1", "rouge-2", "rouge-l")}
    except Exception:  # KVPress's rule: a metric that raises scores 0
        rouge = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    return bleu | rouge


def bleu_scores(gold_words: list[str], predicted_words: list[str]) -> dict[str, float]:
    """nltk's sentence BLEU with all the weight on 1-grams (bleu1) or on 4-grams (bleu4), without smoothing."""
    from nltk.translate.bleu_score import sentence_bleu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nltk warns of n-gram orders without overlap; the value is unchanged
        return {
            "bleu1": float(sentence_bleu([gold_words], predicted_words, weights=(1, 0, 0, 0))),
            "bleu4": float(sentence_bleu([gold_words], predicted_words, weights=(0, 0, 0, 1))),
        }


def loogle_refused(metric: str) -> float:
    """LooGLE's METEOR or BERTScore: refused in one line naming what is missing."""
    raise EvaluationError(f"LooGLE's {metric} needs {LOOGLE_REFUSED[metric]}: it is not computed here")


def loogle(prediction: str, example: Example) -> float:
    """LooGLE, in [0, 1]: for the cloze task the fraction of masks named exactly (KVPress's aggregate is
    ``cloze_aggregate``); for QA and summaries the ROUGE-L recall against the gold answer (KVPress reports every
    metric of ``loogle_text_metrics``, each the mean over the task's examples)."""
    if example.task == CLOZE_TASK:
        counts = cloze_counts(prediction, example.answers[0])
        return counts.exact / counts.exact_count if counts.exact_count else 0.0
    return loogle_text_metrics(prediction, example.answers[0])["rouge-l"]


# --- ZeroSCROLLS ---------------------------------------------------------------------------------------------------


def hidden_answers(prediction: str, example: Example) -> float:
    """ZeroSCROLLS: refused; its test answers are hidden and KVPress's scorer returns no metric."""
    raise EvaluationError(
        "ZeroSCROLLS' test answers are hidden (KVPress's scorer returns no metric): submit the predictions to the "
        "ZeroSCROLLS leaderboard"
    )


# --- InfiniteBench -------------------------------------------------------------------------------------------------

RETRIEVAL_SEPARATORS = "\n:\"'.,?!{}"
CHOICE_SEPARATORS = "\n\"'.,?!{}"
CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")
LAST_CHOICE_LETTER = re.compile(r"\b[A-D]\b(?!.*\b[A-D]\b)")
FULLWIDTH_PUNCTUATION = "".join(chr(ord(mark) + 0xFEE0) for mark in string.punctuation if mark != ".")
CJK_PUNCTUATION = "".join(
    map(
        chr,
        (
            *(0xFF61, 0xFF5F, 0xFF60, 0xFF62, 0xFF63, 0xFF64),
            *(0x3001, 0x3002, 0x3003, 0x300B, *range(0x300C, 0x3012), *range(0x3014, 0x3020), 0x3030, 0x303E, 0x303F),
            *(0x2013, 0x2014, 0x2018, 0x2019, *range(0x201B, 0x2020), 0x2026, 0x2027, 0xFE4F),
        ),
    )
)
CHINESE_PUNCTUATION = FULLWIDTH_PUNCTUATION + CJK_PUNCTUATION + "."
INFINITEBENCH_REFUSED = {
    "code_run": "compares its string label with an integer, so every prediction scores 0",
    "code_debug": "reads a second label its hub rows do not have (an IndexError)",
    "math_find": "expects a number label, its hub rows hold a string (a TypeError)",
    "math_calc": "expects a list label, its hub rows hold an array of strings (an AssertionError)",
    "longbook_sum_eng": "refuses it (a conflict with the rouge package)",
}


def replaced(text: str, characters: str, by: str = " ") -> str:
    """``text`` with each of ``characters`` replaced by ``by``."""
    return text.translate(str.maketrans({character: by for character in characters}))


def first_integer(prediction: str) -> str:
    """The first run of ASCII digits in the prediction, or "" if it has none."""
    match = re.search(r"[0-9]+", prediction)
    return match.group(0) if match else ""


def retrieval_match(prediction: str, answers: Sequence[str]) -> float:
    """kv_retrieval: 1 if the first answer is one of the prediction's words (split at whitespace and at
    newlines, colons, quotes, periods, commas, question and exclamation marks and braces)."""
    return float(answers[0] in replaced(prediction, RETRIEVAL_SEPARATORS).split())


def first_integer_match(prediction: str, answers: Sequence[str]) -> float:
    """passkey and number_string: 1 if the prediction's first run of digits is the first answer."""
    return float(first_integer(prediction) == answers[0])


def name_match(prediction: str, answers: Sequence[str]) -> float:
    """longdialogue_qa_eng: 1 if any answer occurs in the prediction, case-insensitive."""
    return float(any(answer.upper() in prediction.strip().upper() for answer in answers))


def english_f1(prediction: str, answers: Sequence[str]) -> float:
    """longbook_qa_eng: the best token F1 over the answers, after SQuAD's normalisation."""
    words = longbench.normalize_answer(prediction).split()
    return max((token_f1(words, longbench.normalize_answer(answer).split()) for answer in answers), default=0.0)


def normalize_chinese(text: str) -> str:
    """Lowercase, drop all whitespace, drop ASCII punctuation and InfiniteBench's Chinese punctuation: the fullwidth
    forms of ASCII punctuation but the full stop, and CJK marks (the closing 》 without the opening 《, as it lists
    them)."""
    dropped = set(string.punctuation + CHINESE_PUNCTUATION)
    return "".join(character for character in "".join(text.lower().split()) if character not in dropped)


def chinese_f1(prediction: str, answers: Sequence[str]) -> float:
    """longbook_qa_chn: the best character F1 over the answers, after ``normalize_chinese``."""
    characters = list(normalize_chinese(prediction))
    return max((token_f1(characters, list(normalize_chinese(answer))) for answer in answers), default=0.0)


def choice_match(prediction: str, answers: Sequence[str]) -> float:
    """longbook_choice_eng, InfiniteBench's cascade: 1 if the first letter A-D that stands alone and is the last one
    on its line is an answer; else, if the stripped prediction starts with A-D, whether that letter is an answer;
    else whether the prediction is an answer; else the text after the first of "answer is:", "answer:", "answer is",
    "option is" (punctuation made spaces) starting with an answer; else whether the first word that is a substring
    of "ABCD" is an answer."""
    text = prediction.strip()
    match = LAST_CHOICE_LETTER.search(text)
    if match and match.group(0) in answers:
        return 1.0
    if not text:
        return 0.0
    if text[0] in "ABCD":
        return float(text[0] in answers)
    if text in answers:
        return 1.0
    text = replaced(text, CHOICE_SEPARATORS)
    while "  " in text:
        text = text.replace("  ", " ")
    for prefix in CHOICE_PREFIXES:
        at = text.find(prefix)
        if at == -1:
            continue
        after = text[at + len(prefix) + 1 :]
        return float(len(text) >= at + len(prefix) + 1 and any(after.startswith(answer) for answer in answers))
    word = next((word for word in text.split() if word in "ABCD"), None)
    return float(word is not None and word in answers)


INFINITEBENCH_RULES: dict[str, Callable[[str, Sequence[str]], float]] = {
    "kv_retrieval": retrieval_match,
    "kv_retrieval_prefix": retrieval_match,
    "kv_retrieval_both": retrieval_match,
    "passkey": first_integer_match,
    "number_string": first_integer_match,
    "longdialogue_qa_eng": name_match,
    "longbook_qa_eng": english_f1,
    "longbook_qa_chn": chinese_f1,
    "longbook_choice_eng": choice_match,
}


def infinitebench(prediction: str, example: Example) -> float:
    """InfiniteBench's rule of the example's task, in [0, 1]; a task's score is the mean. KVPress scores a whole
    file by its first row's task; here each example by its own. The five tasks KVPress's scorer cannot score on
    its hub data are refused in one line."""
    if example.task in INFINITEBENCH_REFUSED:
        raise EvaluationError(
            f"InfiniteBench task {example.task}: KVPress's scorer {INFINITEBENCH_REFUSED[example.task]}; "
            f"scored tasks: {', '.join(INFINITEBENCH_RULES)}"
        )
    if example.task not in INFINITEBENCH_RULES:
        raise EvaluationError(
            f"no InfiniteBench rule for task {example.task!r}: known {', '.join(INFINITEBENCH_RULES)}"
        )
    return INFINITEBENCH_RULES[example.task](prediction, example.answers)


# --- LongBench and LongBench-E (the official rules of evaluation.metrics.longbench) -----------------------------------

CLASSIFICATION_TASKS = frozenset({"trec", "lsht"})
LENGTH_BUCKETS = ((4000, "0-4k"), (8000, "4-8k"))


def longbench_sample(task: str, prediction: str, answers: Sequence[str], all_classes: Sequence[str] | None) -> float:
    """LongBench's sample score of a task; a classification task without its classes, or an unknown task, is one
    line."""
    if task not in longbench.TASK_METRICS:
        raise EvaluationError(f"no LongBench metric for task {task!r}: known {', '.join(longbench.TASK_METRICS)}")
    if task in CLASSIFICATION_TASKS and all_classes is None:
        raise EvaluationError(f"LongBench's {task} is scored against its rows' all_classes: pass all_classes")
    return longbench.sample_score(task, prediction, answers, all_classes)


def longbench_rule(prediction: str, example: Example, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench as KVPress scores it, in [0, 1]: the official metric of the task on the prediction with its leading
    whitespace stripped (KVPress strips it, spaces included, before the first line is taken); a task's score is
    100 x the mean, to 2 decimals."""
    return longbench_sample(example.task, prediction.lstrip(), example.answers, all_classes)


def longbench_e(prediction: str, example: Example, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench-E as KVPress scores it, in [0, 1]: the official metric of the task (its name without "-e") on the
    prediction as it is; KVPress reports 100 x the mean per length bucket, see ``length_buckets``."""
    return longbench_sample(example.task.removesuffix("-e"), prediction, example.answers, all_classes)


def length_bucket(length: int) -> str:
    """LongBench-E's bucket of an example of ``length`` words: 0-4k, 4-8k or 8k+."""
    return next((name for bound, name in LENGTH_BUCKETS if length < bound), "8k+")


def length_buckets(scores: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
    """LongBench-E's task score: 100 x the mean score per length bucket, to 2 decimals (NaN for an empty bucket,
    as numpy's mean of nothing in KVPress)."""
    buckets: dict[str, list[float]] = {"0-4k": [], "4-8k": [], "8k+": []}
    for score, length in zip(scores, lengths, strict=True):
        buckets[length_bucket(length)].append(score)
    return {
        name: round(100 * sum(values) / len(values), 2) if values else float("nan") for name, values in buckets.items()
    }


# --- LongBench-v2 --------------------------------------------------------------------------------------------------


def multiple_choice(prediction: str, example: Example) -> float:
    """LongBench-v2, 0 or 1: with the "*" removed, the prediction contains "The correct answer is (X)" or
    "The correct answer is X" for the gold letter X. KVPress reports the mean, and the mean per difficulty and per
    length (hub columns this example does not carry)."""
    text = prediction.replace("*", "")
    return float(
        any(
            f"The correct answer is ({letter})" in text or f"The correct answer is {letter}" in text
            for letter in example.answers
        )
    )


# --- Needle in a haystack ------------------------------------------------------------------------------------------


def needle_rouge_scores(prediction: str, needle: str) -> dict[str, dict[str, float]]:
    """What KVPress's scorer returns for one row: the ``rouge`` package's ROUGE-1, ROUGE-2 and ROUGE-L (f, p, r) with
    the needle as the hypothesis and the prediction as the reference (its order: p is the share of the needle's
    n-grams found in the prediction), both stripped."""
    from rouge import Rouge

    return Rouge().get_scores(needle.strip(), prediction.strip())[0]


def needle_rouge(prediction: str, example: Example) -> float:
    """Needle in a haystack, in [0, 1]: the ROUGE-1 F of ``needle_rouge_scores`` (F does not depend on the
    argument order). KVPress reports every value per row and no aggregate; it raises on a prediction with no word
    (empty, or punctuation alone: the ``rouge`` package finds nothing to compare), which scores 0 here."""
    if not any(character.isalnum() for character in prediction):
        return 0.0
    return float(needle_rouge_scores(prediction, example.answers[0])["rouge-1"]["f"])


# --- AIME25 and MATH-500 -------------------------------------------------------------------------------------------


def last_boxed(prediction: str) -> str:
    """AIME25's extraction: the text after the last "boxed{" up to the next "}" (the whole prediction up to its
    first "}" when nothing is boxed)."""
    return prediction.split("boxed{")[-1].split("}")[0]


def first_boxed(prediction: str) -> str | None:
    """MATH-500's extraction: the text after the first "boxed{" up to the next "}", None when nothing is boxed."""
    parts = prediction.split("boxed{")
    return parts[1].split("}")[0] if len(parts) > 1 else None


def answered(prediction: str) -> bool:
    """Whether the prediction boxed an answer (KVPress's "answered" count)."""
    return "boxed{" in prediction


def boxed_last(prediction: str, example: Example) -> float:
    """AIME25, 0 or 1: ``last_boxed`` equals the gold answer's text exactly (no normalisation; a nested brace cuts
    the extraction). The accuracy is the mean."""
    return float(last_boxed(prediction) in example.answers)


def boxed_first(prediction: str, example: Example) -> float:
    """MATH-500, 0 or 1: ``first_boxed`` equals the gold answer's text exactly (no normalisation; a nested brace,
    as in \\frac{1}{2}, cuts the extraction, so such answers never match). The accuracy is the mean."""
    return float(first_boxed(prediction) in example.answers)


# --- Registry ------------------------------------------------------------------------------------------------------

RULES: dict[str, Rule] = {
    "string_match": string_match,
    "loogle": loogle,
    "hidden_answers": hidden_answers,
    "infinitebench": infinitebench,
    "longbench": longbench_rule,
    "longbench_e": longbench_e,
    "multiple_choice": multiple_choice,
    "needle_rouge": needle_rouge,
    "boxed_last": boxed_last,
    "boxed_first": boxed_first,
}
CLASS_RULES = frozenset({"longbench", "longbench_e"})
SCALE: dict[str, float] = {
    "string_match": 100.0,
    "loogle": 1.0,
    "hidden_answers": 1.0,
    "infinitebench": 1.0,
    "longbench": 100.0,
    "longbench_e": 100.0,
    "multiple_choice": 1.0,
    "needle_rouge": 1.0,
    "boxed_last": 1.0,
    "boxed_first": 1.0,
}


def score(rule: str, prediction: str, example: Example, *, all_classes: Sequence[str] | None = None) -> float:
    """The example's score in [0, 1] by the rule named ``rule`` (``RULES``); KVPress reports a mean of these times
    ``SCALE[rule]`` (per task where it groups by task). ``all_classes`` is LongBench's class list (trec)."""
    if rule in CLASS_RULES:
        return RULES[rule](prediction, example, all_classes=all_classes)
    return RULES[rule](prediction, example)
