"""A probe as the model reads it: a worked example, then the sixteen facts and the question, and where each fact's
tokens are.

The worked example (its facts, question and answer) shows the answer's form: with ``reasoning`` the answer first
states the two facts it chains, then the colour ("Ann lives in Rome. The flag of Rome is grey. So the answer is
grey."); without, the colour alone. Each fact is encoded on its own, so its tokens are exactly its span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evaluation.protocols.probe.facts import EXAMPLE_ANSWER, EXAMPLE_FACTS, EXAMPLE_QUESTION, EXAMPLE_REASONING, Probe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PLACEHOLDER = "\x00facts\x00"
ANSWER_IS = "the answer is"


def ask(facts: str, question: str) -> str:
    return f"Facts:\n{facts}\n\nQuestion: {question}"


def frame(tokenizer: PreTrainedTokenizerBase, question: str, reasoning: bool) -> tuple[str, str]:
    """The prompt's text before and after the facts."""
    example = ask("\n".join(EXAMPLE_FACTS), EXAMPLE_QUESTION)
    answer = EXAMPLE_REASONING if reasoning else EXAMPLE_ANSWER
    if tokenizer.chat_template is None:
        text = f"{example}\nAnswer: {answer}\n\n{ask(PLACEHOLDER, question)}\nAnswer:"
    else:
        messages = [("user", example), ("assistant", answer), ("user", ask(PLACEHOLDER, question))]
        chat = [{"role": role, "content": content} for role, content in messages]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    head, tail = text.split(PLACEHOLDER)
    return head, tail


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, probe: Probe, reasoning: bool
) -> tuple[list[int], list[tuple[int, int]]]:
    """The prompt's token ids and each fact's (start, stop) token span."""
    head, tail = frame(tokenizer, probe.question, reasoning)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    ids, spans = encode(head), []
    for number, fact in enumerate(probe.facts):
        if number:
            ids += encode("\n")
        spans.append((len(ids), len(ids) + len(encoded := encode(fact))))
        ids += encoded
    return ids + encode(tail), spans


def final_answer(prediction: str) -> str:
    """What a reasoned answer concludes: the text after its last "the answer is", else all of it."""
    at = prediction.lower().rfind(ANSWER_IS)
    return prediction if at < 0 else prediction[at + len(ANSWER_IS) :]
