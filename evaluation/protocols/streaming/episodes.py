"""What the streaming protocol streams: conversations of sessions of turns, and the questions asked along the way.

LoCoMo's conversations and the synthetic families' generated episodes are both read into these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    speaker: str
    dia_id: str
    text: str
    caption: str | None


@dataclass(frozen=True)
class Session:
    number: int
    date: str
    turns: list[Turn]


@dataclass(frozen=True)
class Question:
    index: int  # position in the conversation's qa list
    question: str
    answer: str | int | None
    evidence: list[str]
    category: int  # LoCoMo's 1-5; 0 for a synthetic question
    adversarial_answer: str | None
    kind: str = ""  # a synthetic question's condition (evaluation.protocols.synthetic)
    pair: int = 0  # a synthetic question's matched pair (the reuse family's earlier session; 0: none)
    order: int = 0  # its place in the pair's order of asking (1 or 2; 0: none)

    @property
    def evidence_sessions(self) -> set[int]:
        """Sessions holding the evidence turns ("D3:12" is in session 3; the file's own variants "D:11:26" and
        "D9:1 D4:4" are read too)."""
        return {int(match) for item in self.evidence for match in re.findall(r"D:?(\d+):", item)}


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    questions: list[Question]
