"""What a single-turn protocol of KVPress-format examples declares besides its configuration: its rows' key and
their answer likelihood."""

from __future__ import annotations

from typing import TypeVar

from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.protocols.protocol import LIKELIHOOD, Protocol, Row
from evaluation.protocols.single_turn.config import SingleTurnConfig

C = TypeVar("C", bound=SingleTurnConfig)


class SingleTurnProtocol(Protocol[C]):
    """A single-turn protocol of KVPress-format examples: its rows are keyed by example, press and budget and hold
    the gold answer's likelihood."""

    likelihood = LIKELIHOOD
    presses = DEFAULT_PRESSES

    def row_key(self, row: Row) -> tuple[str, str, str, str]:
        return row["task"], row["id"], row["press"], row["budget"]  # type: ignore[typeddict-item]
