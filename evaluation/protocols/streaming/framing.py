"""The chat framing of a growing history: the token ids each increment (a session, a question, an answer) adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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

    def session_text(self, messages: list[Message], session: str) -> str:
        """The text a session adds after ``messages``; ``session_ids`` are its tokens."""
        if self.tokenizer.chat_template is None:
            return f"\n{session}"
        return self._increment(self._chat(messages, False), self._chat([*messages, ("user", session)], False))

    def question_text(self, messages: list[Message], question: str) -> str:
        """The text a question adds after ``messages``, up to the answer's start; ``question_ids`` are its tokens."""
        if self.tokenizer.chat_template is None:
            return f"\n{question}"
        return self._increment(self._chat(messages, False), self._chat([*messages, ("user", question)], True))

    def answer_text(self, messages: list[Message], question: str, answer: str) -> str:
        """The text an answer to ``question`` adds; ``answer_ids`` are its tokens."""
        if self.tokenizer.chat_template is None:
            return f" {answer}\n"
        asked = [*messages, ("user", question)]
        return self._increment(self._chat(asked, True), self._chat([*asked, ("assistant", answer)], False))

    def session_ids(self, messages: list[Message], session: str) -> list[int]:
        return self.encode(self.session_text(messages, session))

    def question_ids(self, messages: list[Message], question: str) -> list[int]:
        return self.encode(self.question_text(messages, question))

    def answer_ids(self, messages: list[Message], question: str, answer: str) -> list[int]:
        return self.encode(self.answer_text(messages, question, answer))

    @staticmethod
    def _increment(before: str, after: str) -> str:
        if not after.startswith(before):
            raise ValueError(
                "the chat template does not extend a conversation by appending to it; use a model whose does"
            )
        return after[len(before) :]
