"""RMM's random-weight control: rows weighted at the share of correct rows, chosen at random with a seed.

RMM weighs a row's attention by its teacher-forced correctness; on SmolLM2 about half the rows are wrong, so RMM
also sums fewer rows than H2O. The control weighs the same share of rows at random, so that a difference between
RMM and the control is due to which rows are correct, not to how many are counted. Rows whose weight is not
correctness (rows of a kind the engine does not teacher-force, padding) weigh 1 under both.

Every row t has a uniform draw u(t), a function of the seed and of t alone (``uniforms``). A sequence's first
prefill sets its block; a row's weight then depends on the draws and on the correctness of the block's rows and of
the rows before it, nothing else, so it is the same whichever path computes it (the press's own prefill, the
engine's shared prefill in any number of forwards, a replayed prefix, a stream) and never changes once drawn:

- the **block**, every row of the prefill but its last (the rows a prefill settles at once): exactly as many rows
  weigh 1 as are correct, those of the smallest u, so the weights are a seeded random permutation of the
  block's correctness;
- every **later row** (a prefill's last row, a stream's rows, settled one at a time): 1 when u(t) is below the
  running correct share of the rows before it, C / N for C correct among N (1 before any), so the share follows
  the correct share without reading the row's own correctness.

When every row is correct the control weighs every row 1 (H2O's weights, as RMM's are then); when none is, none
but a stream's first row.

A row's weight is known once every row it depends on is settled (the block's rows, or the rows before it); until
then it counts as 1, as an unsettled teacher-forced row does.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from presses.smoother import Confirmation
    from presses.teacher_forcing import Transcript

PAGE = 4096  # positions whose draws come from one generator
MAX_SEED = 2**32  # seeds are below this; a page's generator is seeded by seed * 2**24 + page


@cache
def _page(seed: int, page: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 2**24 + page)
    return torch.rand(PAGE, generator=generator, dtype=torch.float64)


def uniforms(seed: int, length: int) -> torch.Tensor:
    """u(t) for positions 0..length-1, float64 in [0, 1) on the CPU: each page of ``PAGE`` positions from its own
    seeded generator, so u(t) depends on the seed and t alone."""
    pages = [_page(seed, page) for page in range(-(-length // PAGE))]
    return torch.cat(pages)[:length] if pages else torch.zeros(0, dtype=torch.float64)


def check_seed(seed: object) -> None:
    """Refuse a seed that is not a whole number in [0, ``MAX_SEED``)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be a whole number in [0, {MAX_SEED}), got {seed!r}")


def random_weights(
    correct: torch.Tensor, settled: torch.Tensor, counted: torch.Tensor, block: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The control's weight of every position 0..length-1 of each sequence, and whether it is known.

    Parameters
    ----------
    correct : (batch, length) tensor
        1 where the row's top-1 prediction is its next token (read only where ``settled``).
    settled : (batch, length) bool tensor
        Whether the row's correctness is known.
    counted : (batch, length) bool tensor
        The rows whose weight is correctness (the others weigh 1 and count in no share).
    block : (batch,) integer tensor
        How many leading positions form each sequence's block (0: none).
    seed : int
        Chooses the draws u(t).

    Returns
    -------
    weights, known : (batch, length) float32 and bool tensors
        Weights 0 or 1, and 1 where not yet known.
    """
    length, device = correct.shape[-1], correct.device
    u = uniforms(seed, length).to(device)
    right = (correct > 0) & settled & counted
    in_block = torch.arange(length, device=device) < block[:, None]
    members = counted & in_block
    rank = torch.where(members, u, 2.0).argsort(dim=-1, stable=True).argsort(dim=-1)  # the block's rows first, by u
    chosen = rank < (right & in_block).sum(-1, keepdim=True)
    block_known = (~members | settled).all(-1, keepdim=True)
    rows, rights = counted.long(), right.long()
    before, right_before = rows.cumsum(-1) - rows, rights.cumsum(-1) - rights
    drawn = u < torch.where(before > 0, right_before.double() / before.clamp(min=1), 1.0)
    unsettled = (counted & ~settled).long()
    later_known = unsettled.cumsum(-1) - unsettled == 0
    weights = torch.where(in_block, chosen, drawn)
    known = ~counted | torch.where(in_block, block_known, later_known)
    return torch.where(known & counted, weights.float(), 1.0), known


class RandomControl:
    """The control's weights of a press's sequences, read from the teacher-forced correctness its ``Transcript``
    records; ``block``: how many leading positions of each sequence form its block, set by the press's prefill
    (``start``; none before one). One table per state of the transcript serves every layer."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.block: tuple[int, ...] = ()
        self._table: tuple[object, object, tuple[int, ...], torch.Tensor, torch.Tensor] | None = None

    def start(self, block: tuple[int, ...]) -> None:
        """A prefill (or a replayed prefix) of the sequences: the first ``block[b]`` positions of sequence b."""
        self.block = block

    def clear(self) -> None:
        self.block, self._table = (), None

    def table(self, transcript: Transcript, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``random_weights`` of positions 0..length-1 (at least) of the transcript's sequences."""
        held = self._table
        fresh = held is None or held[0] is not transcript.tokens or held[1] is not transcript.predictions
        if fresh or held[2] != self.block or held[3].shape[-1] < length:
            correct, settled, counted = transcript.correctness_table(length)
            block = torch.tensor(self.block or (0,) * correct.shape[0], device=correct.device)
            weights, known = random_weights(correct, settled, counted, block, self.seed)
            self._table = held = (transcript.tokens, transcript.predictions, self.block, weights, known)
        return held[3], held[4]

    def weights(self, transcript: Transcript, positions: torch.Tensor, newest: int) -> tuple[torch.Tensor, list[int]]:
        """The weights of the rows at ``positions`` (batch, n_rows), the newest at position ``newest``, and which
        rows' weights are not known yet (their indices: they count as 1 until ``confirm`` settles them)."""
        weights, known = self.confirm(transcript, newest + 1)(positions)
        return weights, torch.nonzero(~known.all(0))[:, 0].tolist()

    def confirm(self, transcript: Transcript, length: int | None = None) -> Confirmation:
        """A ``Smoother.revise`` confirmation: positions (batch, k) -> their weights and whether they are known."""

        def confirmed(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            size = length if length is not None else int(positions.max()) + 1
            weights, known = self.table(transcript, size)
            index = positions.to(weights.device).clamp(min=0)
            return weights.gather(1, index), known.gather(1, index)

        return confirmed
