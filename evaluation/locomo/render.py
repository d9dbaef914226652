"""LoCoMo as text: the conversation, the question prompts, and the chat framing of the growing history.

The wording re-implements the official harness from its description: a header naming the two speakers,
``DATE:`` / ``CONVERSATION:`` per session, ``<speaker> said, "<text>"`` per turn (image turns add
``and shared <caption>.``), a short-answer instruction, the temporal instruction for category 2, and
category 5 asked as a two-option choice in a seeded random order.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from evaluation.locomo.data import Conversation, Question, Session

HEADER = (
    "Below is a conversation between {a} and {b}. It took place over several days, "
    "and the date of each session is written at its start.\n\n"
)
INSTRUCTION = (
    "Based on the conversation above, write a short answer to the question below. "
    "Use exact words from the conversation whenever possible."
)
TEMPORAL = " Use the DATE of the conversation to answer with an approximate date."
ABSTAIN = "Not mentioned in the conversation"


def render_session(session: Session) -> str:
    lines = [f"DATE: {session.date}", "CONVERSATION:"]
    for turn in session.turns:
        caption = f" and shared {turn.caption}." if turn.caption else ""
        lines.append(f'{turn.speaker} said, "{turn.text}"{caption}')
    return "\n".join(lines) + "\n\n"


def render_conversation(conversation: Conversation, sessions: list[Session]) -> str:
    header = HEADER.format(a=conversation.speaker_a, b=conversation.speaker_b)
    return header + "".join(render_session(session) for session in sessions)


def choice_options(conversation: Conversation, question: Question) -> list[str]:
    """Category 5's two options (the adversarial answer and the abstention) in a seeded random order."""
    options = [question.adversarial_answer or str(question.answer), ABSTAIN]
    random.Random(f"{conversation.sample_id}:{question.index}").shuffle(options)
    return options


def question_prompt(conversation: Conversation, question: Question) -> str:
    text = question.question
    if question.category == 2:
        text += TEMPORAL
    if question.category == 5:
        first, second = choice_options(conversation, question)
        text += f" Select the correct answer: (a) {first} (b) {second}."
    return f"{INSTRUCTION}\n\nQuestion: {text} Short answer:"


def gold_answer(question: Question) -> str:
    """What the history records as the answer: the gold answer, or the abstention for unanswerable category 5."""
    return ABSTAIN if question.category == 5 and question.answer is None else str(question.answer)


def resolve_choice(prediction: str, options: list[str]) -> str:
    """A category 5 answer given as a letter ("(b)", "b)", "b") is scored as that option's text."""
    match = re.match(r"\s*\(?([ab])\)?(?:\s|\.|$)", prediction.lower())
    return options["ab".index(match.group(1))] if match else prediction


@dataclass(frozen=True)
class Framing:
    """Token ids of the conversation, and functions for a turn's question and answer increments.

    With a chat template the conversation is the system message and each turn a user question followed by
    the assistant's answer; each increment is the text the template adds (it must extend the previous text).
    Without one, plain text: the question prompt after a blank line, the answer after a space.
    """

    tokenizer: PreTrainedTokenizerBase
    conversation_text: str

    def _chat(self, turns: list[tuple[str, str]], open_question: str | None) -> str:
        messages = [{"role": "system", "content": self.conversation_text}]
        for question, answer in turns:
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if open_question is not None:
            messages.append({"role": "user", "content": open_question})
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=open_question is not None, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def conversation_ids(self) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.tokenizer.encode(self.conversation_text)
        return self.encode(self._chat([], None))

    def question_ids(self, turns: list[tuple[str, str]], question: str) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.encode(f"\n{question}")
        return self.encode(self._increment(self._chat(turns, None), self._chat(turns, question)))

    def answer_ids(self, turns: list[tuple[str, str]], question: str, answer: str) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.encode(f" {answer}\n")
        return self.encode(self._increment(self._chat(turns, question), self._chat([*turns, (question, answer)], None)))

    @staticmethod
    def _increment(before: str, after: str) -> str:
        if not after.startswith(before):
            raise ValueError(
                "the chat template does not extend a conversation by appending to it; use a model whose does"
            )
        return after[len(before) :]
