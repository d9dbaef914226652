"""Official LongBench prompting: template, middle truncation, chat template, and the context/question split."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from evaluation.protocols.longbench.data import Example, TaskConfig

RAW_COMPLETION_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
STOP_AT_NEWLINE_TASKS = frozenset({"samsum"})


@dataclass(frozen=True)
class Prompt:
    """Token ids of the part compressed by the press and of the part appended after compression."""

    context_ids: torch.Tensor  # (1, n_context)
    question_ids: torch.Tensor  # (1, n_question); empty when query-aware
    truncated: bool


def middle_truncate(text: str, tokenizer: PreTrainedTokenizerBase, max_length: int) -> tuple[str, bool]:
    """Keep the first and last ``max_length // 2`` tokens, decoded and joined (the official rule)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_length:
        return text, False
    half = max_length // 2
    head = tokenizer.decode(ids[:half], skip_special_tokens=True)
    return head + tokenizer.decode(ids[-half:], skip_special_tokens=True), True


def build_prompt(
    example: Example, config: TaskConfig, tokenizer: PreTrainedTokenizerBase, max_length: int, query_aware: bool
) -> Prompt:
    """Fill the task template, truncate it to ``max_length`` tokens, wrap it in the chat template (except
    for the raw-completion tasks), tokenize it, then split the tokens right after the context unless
    ``query_aware``."""
    text, truncated = middle_truncate(
        config.prompt.format(context=example.context, input=example.input), tokenizer, max_length
    )
    chat = example.task not in RAW_COMPLETION_TASKS and tokenizer.chat_template is not None
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    question = config.prompt.split("{context}")[1].format(input=example.input)
    cut = len(text) if query_aware else text.rfind(question)
    if cut < 0:
        raise ValueError(f"{example.task} {example.id}: the question part of the template is not in the prompt")
    encoded = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    # the prompt is tokenized once and split at the first token that ends after the cut, so the context and the
    # question together are exactly the query-aware tokens (a token spanning the cut goes with the question)
    split = next((i for i, (_, end) in enumerate(offsets) if end > cut), len(ids))
    return Prompt(torch.tensor([ids[:split]]), torch.tensor([ids[split:]]), truncated)
