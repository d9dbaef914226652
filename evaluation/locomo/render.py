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


def header(conversation: Conversation) -> str:
    return HEADER.format(a=conversation.speaker_a, b=conversation.speaker_b)


def render_conversation(conversation: Conversation, sessions: list[Session]) -> str:
    return header(conversation) + "".join(render_session(session) for session in sessions)


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


Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class Framing:
    """Token ids of the history's start and of each increment (a session, a question, an answer).

    With a chat template the history's start is the system message (the rendered conversation, or only its
    header when sessions are streamed one by one as user messages), each question a user message and each
    answer the assistant's reply; each increment is the text the template adds (it must extend the previous
    text). Without one, plain text: a session or the question prompt after a newline, the answer after a space.
    """

    tokenizer: PreTrainedTokenizerBase
    system: str

    def _chat(self, messages: list[Message], generation_prompt: bool) -> str:
        chat = [{"role": "system", "content": self.system}] + [{"role": r, "content": c} for r, c in messages]
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=generation_prompt, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def start_ids(self) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.tokenizer.encode(self.system)
        return self.encode(self._chat([], False))

    def session_ids(self, messages: list[Message], session: str) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.encode(f"\n{session}")
        return self.encode(
            self._increment(self._chat(messages, False), self._chat([*messages, ("user", session)], False))
        )

    def question_ids(self, messages: list[Message], question: str) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.encode(f"\n{question}")
        return self.encode(
            self._increment(self._chat(messages, False), self._chat([*messages, ("user", question)], True))
        )

    def answer_ids(self, messages: list[Message], question: str, answer: str) -> list[int]:
        if self.tokenizer.chat_template is None:
            return self.encode(f" {answer}\n")
        asked = [*messages, ("user", question)]
        return self.encode(self._increment(self._chat(asked, True), self._chat([*asked, ("assistant", answer)], False)))

    @staticmethod
    def _increment(before: str, after: str) -> str:
        if not after.startswith(before):
            raise ValueError(
                "the chat template does not extend a conversation by appending to it; use a model whose does"
            )
        return after[len(before) :]
