"""The prompt of a KVPress-format example as KVPress's pipeline builds it: the context wrapped in the model's chat
template as the user's message, the question after it with the template's closing and the answer prefix; without
a chat template, the BOS token before the context and a newline after the question. Query-aware, the question
joins the context (KVPress's evaluation's ``query_aware``)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from evaluation.protocols.kvpress.columns import KVPressExample
from evaluation.protocols.longbench.prompts import Prompt


def prompt_parts(
    tokenizer: PreTrainedTokenizerBase, context: str, question: str, answer_prefix: str
) -> tuple[str, str]:
    """The text compressed and the text that follows it, as KVPress's pipeline splits them."""
    if tokenizer.chat_template is None:
        return (tokenizer.bos_token or "") + context, question + "\n" + answer_prefix
    separator = "#" * (len(context) + 10)
    wrapped = tokenizer.apply_chat_template(
        [{"role": "user", "content": context + separator}], add_generation_prompt=True, tokenize=False
    )
    head, suffix = wrapped.split(separator)
    return head, question + suffix + answer_prefix


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, context: str, question: str, answer_prefix: str) -> int:
    """How many tokens the prompt of these texts takes, context and question together."""
    head, tail = prompt_parts(tokenizer, context, question, answer_prefix)
    return len(tokenizer.encode(head, add_special_tokens=False)) + len(tokenizer.encode(tail, add_special_tokens=False))


def example_parts(tokenizer: PreTrainedTokenizerBase, example: KVPressExample, query_aware: bool) -> tuple[str, str]:
    """``prompt_parts`` of the example; query-aware, its question joins its context."""
    context, question = (example.context + example.question, "") if query_aware else (example.context, example.question)
    return prompt_parts(tokenizer, context, question, example.answer_prefix)


def after_context(tokenizer: PreTrainedTokenizerBase, example: KVPressExample, query_aware: bool) -> int:
    """How many tokens follow the example's context in its prompt: its question, the template's closing and the
    answer prefix."""
    return len(tokenizer.encode(example_parts(tokenizer, example, query_aware)[1], add_special_tokens=False))


def build_prompt(
    example: KVPressExample, tokenizer: PreTrainedTokenizerBase, max_context: int, query_aware: bool
) -> Prompt:
    """The example's context and question token ids; a context over ``max_context`` tokens keeps its first
    ``max_context`` (KVPress's pipeline's cut), and the prompt records it as truncated."""
    head, tail = example_parts(tokenizer, example, query_aware)
    context_ids = tokenizer.encode(head, add_special_tokens=False)
    question_ids = tokenizer.encode(tail, add_special_tokens=False)
    truncated = len(context_ids) > max_context
    return Prompt(torch.tensor([context_ids[:max_context]]), torch.tensor([question_ids]), truncated)
