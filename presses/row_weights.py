"""w(t), RMM's weight on each row of attention it observes, under each of its correctness modes.

Teacher-forced correctness and the confidence proxy are read from a ``Transcript`` of what the model runs, the
random control from the same teacher-forced record (``presses.random_weights``), uniform weights are ones and
supplied weights are read per absolute position. A row whose weight is not known yet (its prediction or next token
is still to come) weighs 1 until the smoother settles it (``Smoother.revise`` with ``confirmation``).
"""

from __future__ import annotations

import warnings
from typing import Protocol

import torch
from transformers import PreTrainedModel

from presses.attention import host_values
from presses.random_weights import RandomControl
from presses.smoother import Confirmation
from presses.teacher_forcing import FROM_PREDICTIONS, Transcript


def newest_position(positions: torch.Tensor, held: list[int] | None) -> int:
    """The newest of ``positions`` (batch, n_rows); from ``held``, the first sequence's on the host, when it is the
    only sequence."""
    return int(positions.max()) if held is None or positions.shape[0] > 1 else max(held)


def prefill_block(kwargs: dict, batch: int, held: list[int]) -> tuple[int, ...]:
    """The random control's block of each sequence a prefill starts: its positions before the prefill's last row
    (``held``: the first sequence's positions of the rows, on the host)."""
    positions = kwargs.get("position_ids")
    if positions is None or positions.shape[0] == 1:
        return (held[-1],) * batch
    return tuple(row[-1] for row in host_values(positions))


class Weighted(Protocol):
    """A press whose rows are weighed: its correctness mode, or a (batch, length) tensor of weights per position."""

    correctness: str | torch.Tensor


class RowWeights:
    """The weights of the rows of ``press`` under its ``correctness`` (read whenever asked), from ``transcript`` for
    the modes that come from the model's predictions, the random control's drawn with ``seed``; ``model``: the model
    the press was shown (None before it was), whose forward a prefill's predictions may need."""

    def __init__(self, press: Weighted, seed: int, transcript: Transcript) -> None:
        self.press, self.transcript = press, transcript
        self.control = RandomControl(seed)
        self.model: PreTrainedModel | None = None

    @property
    def correctness(self) -> str | torch.Tensor:
        return self.press.correctness

    @property
    def from_predictions(self) -> bool:
        """Whether w(t) comes from the model's own predictions (teacher forced, confidence, the random control)."""
        return isinstance(self.correctness, str) and self.correctness in FROM_PREDICTIONS

    @property
    def random(self) -> bool:
        return isinstance(self.correctness, str) and self.correctness == "random"

    def attach(self, model: PreTrainedModel, owner: object) -> None:
        """Record what ``model`` runs under the hooks of the press that runs ``owner`` (nothing for weights that need
        no prediction)."""
        self.transcript.detach()
        self.model = model
        if self.from_predictions:
            self.transcript.attach(model, owner, confident=self.correctness == "confidence")

    def clear(self) -> None:
        self.transcript.clear()
        self.control.clear()

    def start(self, block: tuple[int, ...]) -> None:
        """A prefill (or a replayed prefix) of the sequences: the random control's block of each."""
        self.control.start(block)

    def at(
        self, positions: torch.Tensor, prefilling: bool, held: list[int] | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """w(t) at ``positions`` (batch, n_rows), and the rows whose weights are still provisional (their indices):
        rows whose prediction (or next token) is not known yet count as correct until ``Smoother.revise``.
        ``held``: the first sequence's positions on the host, which spare waits for the device where they tell."""
        if isinstance(self.correctness, torch.Tensor):
            newest = newest_position(positions, held)
            if newest >= self.correctness.shape[-1]:
                raise ValueError(
                    f"RMMPress has {self.correctness.shape[-1]} per-position weights but the cache reaches position "
                    f"{newest}: supply one weight per position of the sequence."
                )
            weights = self.correctness.to(positions.device).expand(positions.shape[0], -1)
            return weights.gather(1, positions), []
        if self.from_predictions and prefilling:
            self.transcript.predict(self.model, positions, self.correctness)
        if self.random and self.transcript.knows_tokens(positions):
            return self.control.weights(self.transcript, positions, newest_position(positions, held))
        known = None
        if self.from_predictions and not self.random:
            known = self.transcript.weights(positions, self.correctness, held)
        if self.from_predictions and known is None:
            warnings.warn(
                f"RMMPress(correctness={self.correctness!r}) cannot see the token ids (the model ran on inputs_embeds, "
                "or a wrapper such as PerLayerCompressionPress never showed it the model): uniform weights",
                stacklevel=2,
            )
        return known or (torch.ones(positions.shape, device=positions.device), [])

    def confirmation(self) -> Confirmation:
        """How a provisional row's weight is settled (``Smoother.revise``)."""
        if self.random:
            return self.control.confirm(self.transcript)
        return self.transcript.confirmation(self.correctness)

    def settled_at(self, position: int) -> bool | None:
        """Whether the weight of the row at ``position`` is known, from the transcript's host record (None: ask the
        device)."""
        if not self.from_predictions or self.random:
            return None
        return self.transcript.settled_at(position, self.correctness)
