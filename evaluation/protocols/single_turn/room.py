"""The prompt's room, one check for every single-turn protocol (LongBench, RULER, the needle, KVPress's datasets):
a model's context must hold a case's answer, what follows its context (its question, the chat template's closing)
and the fewest tokens the protocol keeps of its context. A context that may be cut (LongBench's in the middle,
KVPress's datasets' at its end) keeps ``--max-length`` tokens where given, else at least ``MIN_PROMPT``; a
generated example (RULER, the needle) is kept whole, since a cut would drop what its question asks for.

Each protocol states its cases' ``Room``; ``check_room`` refuses the first that the model's context cannot hold, in
one line naming the numbers: before the model loads where its files say its context (``known_context``), and
again where a prompt is built (a model whose files were not local).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from evaluation.errors import EvaluationError
from evaluation.runs.models import known_context

MIN_PROMPT = 64  # the fewest tokens a cut prompt keeps: its question and a little of its context
AT_LEAST = f"a prompt of at least {MIN_PROMPT}"


@dataclass(frozen=True)
class Room:
    """What a case of task ``task`` needs of a context: ``prompt`` tokens of its context (``prompt_what`` says
    which), ``answer`` tokens for its answer, and ``after`` tokens after its context (``after_what``, "" for none);
    ``remedy``: what else than a longer context makes room."""

    task: str
    answer: int
    prompt: int = MIN_PROMPT
    prompt_what: str = AT_LEAST
    after: int = 0
    after_what: str = ""
    remedy: str = ""

    @property
    def needed(self) -> int:
        return self.prompt + self.answer + self.after

    def refusal(self, model: str, context: int) -> str:
        """Why ``model``'s ``context`` cannot hold the case ("" when it can)."""
        if self.needed <= context:
            return ""
        after = f" and {self.after_what}" if self.after_what else ""
        return (
            f"--model {model}: its context of {context} tokens cannot hold {self.prompt_what} plus {self.task}'s "
            f"answer length of {self.answer}{after} ({self.needed} tokens): use a model with a longer context"
            + (f", or {self.remedy}" if self.remedy else "")
        )


def check_room(model: str, rooms: Iterable[Room], context: int | None = None) -> None:
    """Refuse the first of ``rooms`` that ``context`` tokens cannot hold; ``context`` None: the model's as its
    files say it, without loading it, and nothing checked when they are not local (the load checks it).

    Raises
    ------
    EvaluationError
        One line: the model, its context, what the case needs and what to do.
    """
    context = known_context(model) if context is None else context
    for room in dict.fromkeys(rooms) if context is not None else ():
        refusal = room.refusal(model, context)
        if refusal:
            raise EvaluationError(refusal)
