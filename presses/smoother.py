"""RMM's fixed-lag smoother: demonstrated utility per cached position, and the commit rule.

"Eviction as Estimation", sections 4 (Eq. 1) and 5; the definitions are in docs/presses.md. One ``Smoother``
follows one layer's cache: for every cached slot (per batch row and KV head) its absolute position t_k, the
demonstrated utility observed so far, how many rows counted, and a fingerprint of its key. Rows of attention
are observed as they arrive (``observe``), the commit rule ranks the slots (``scores``), and an eviction gathers
the state with the very indices that gather the cache (``keep``); when someone else evicted, the fingerprints
say which slots survived (``locate``). The press, the evaluation engine and the eviction lab all rank through it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from presses.column_sums import in_window
from presses.fingerprints import MARK_DIMS, nearest_slots

UNSEEN = float("-inf")  # the score of a slot no valid row can see (a padding position): evicted first
UNKNOWN = -(2**40)  # the position of a slot whose position cannot be known: older than any Eq. 1 window reaches

Confirmation = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # positions -> (correct, known)


class Pending(NamedTuple):
    """A row whose weight is not known yet: its position (batch,), its contribution to every slot, and the first
    sequence's position on the host (None where unknown there)."""

    row: torch.Tensor
    contribution: torch.Tensor
    position: int | None


@dataclass
class Smoother:
    """The smoother's state for one layer: shapes (batch, num_kv_heads, n_slots).

    ``utility``: sum of w(t) a(t -> k) over the observed rows of each slot's window (float32); ``rows``: how many
    observed rows counted (``lag=None`` divides by it); ``seen``: whether any valid row could attend to the slot;
    ``marks``: key fingerprints (..., n_slots, MARK_DIMS); ``newest``: the newest observed row's position per
    batch row; ``pending``: rows whose weight is not known yet, as (position (batch,), contribution to every
    slot), counted as correct until ``revise`` settles them.
    """

    lag: int | None
    positions: torch.Tensor
    marks: torch.Tensor
    utility: torch.Tensor
    rows: torch.Tensor
    seen: torch.Tensor
    newest: torch.Tensor
    pending: list[Pending] = field(default_factory=list)
    newest_position: int = -1  # ``newest`` of batch row 0, on the host (kept by the caller of ``observe``)
    source: Callable[[], object] = lambda: None  # a weak reference to the layer input a prefill observed

    @classmethod
    def start(cls, lag: int | None, positions: torch.Tensor, marks: torch.Tensor) -> Smoother:
        """A smoother over slots at ``positions`` (batch, num_kv_heads, n_slots) with nothing observed yet."""
        zeros = torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
        newest = positions.amin(dim=(1, 2)) - 1 if positions.shape[-1] else positions.new_full(positions.shape[:1], -1)
        return cls(lag, positions, marks, zeros, zeros.clone(), torch.zeros_like(zeros, dtype=torch.bool), newest)

    @property
    def size(self) -> int:
        return self.positions.shape[-1]

    def append(self, positions: torch.Tensor, marks: torch.Tensor) -> None:
        """New slots at ``positions`` (batch, num_kv_heads, n_new), after the existing ones (as a cache appends)."""
        zeros = torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
        self.positions = torch.cat([self.positions, positions], dim=-1)
        self.marks = torch.cat([self.marks, marks], dim=-2)
        self.utility = torch.cat([self.utility, zeros], dim=-1)
        self.rows = torch.cat([self.rows, zeros], dim=-1)
        self.seen = torch.cat([self.seen, zeros.bool()], dim=-1)
        self.pending = [
            held._replace(contribution=torch.cat([held.contribution, zeros], dim=-1)) for held in self.pending
        ]

    def observe(
        self,
        row_positions: torch.Tensor,
        weights: torch.Tensor,
        probs: torch.Tensor,
        valid: torch.Tensor | None = None,
        unconfirmed: list[int] | None = None,
        host_positions: list[int] | None = None,
    ) -> None:
        """Add rows of attention to the slots of their windows.

        ``row_positions`` (batch, n_rows); ``weights`` (batch, n_rows): w(t); ``probs`` (batch, num_kv_heads,
        n_rows, n_visible): each row's attention to the first ``n_visible`` slots, averaged over the query heads of
        each KV group; ``valid`` (batch, n_rows): False for padding rows, which neither add nor count;
        ``unconfirmed``: the indices (among the n_rows) of rows whose weight is provisional, kept in ``pending`` for
        ``revise`` (a host list: nothing here waits for the device); ``host_positions``: the first sequence's
        ``row_positions`` on the host, kept with them so that ``revise`` may ask the host whether they are settled.
        """
        device = self.positions.device  # the layer's keys' device: row data may come from another (a device map)
        row_positions, weights, probs = row_positions.to(device), weights.to(device), probs.to(device)
        valid = None if valid is None else valid.to(device)
        visible = probs.shape[-1]
        window = in_window(row_positions[:, None, :], self.positions[..., :visible], self.lag)
        if valid is not None:
            window &= valid[:, None, :, None]
        contribution = probs.float() * weights.float()[:, None, :, None] * window
        held = unconfirmed or []
        settled = contribution.sum(2)
        if held:  # the held rows picked one by one: an index tensor would be a copy from the host
            settled -= torch.stack([contribution[:, :, row] for row in held], dim=2).sum(2)
        self.utility[..., :visible] += settled
        self.rows[..., :visible] += window.sum(2)
        reached = probs > 0 if valid is None else (probs > 0) & valid[:, None, :, None]
        self.seen[..., :visible] |= reached.any(2)
        self.newest = torch.maximum(self.newest, row_positions[:, -1])
        for row in held:
            pending = torch.zeros_like(self.utility)
            pending[..., :visible] = contribution[:, :, row]
            self.pending.append(
                Pending(row_positions[:, row], pending, host_positions[row] if host_positions else None)
            )

    def set_sums(self, utility: torch.Tensor) -> None:
        """Take every slot's utility from sums computed elsewhere over all rows up to the newest slot
        (``presses.column_sums``), on a fresh smoother of consecutive positions."""
        self.newest = self.positions.amax(dim=(1, 2))
        self.newest_position = int(self.newest[0])
        ages = self.newest[:, None, None] - self.positions
        self.utility = utility
        self.rows = (ages + 1 if self.lag is None else ages.clamp(max=self.lag)).float()
        self.seen = torch.ones_like(self.seen)

    def revise(self, confirm: Confirmation, settled_at: Callable[[int], bool | None] = lambda position: None) -> None:
        """Settle the pending rows whose correctness is now known: a right one's contribution joins the utility,
        a wrong one's is dropped. ``settled_at``: whether a row at a position is settled, known on the host (None:
        not known there, and the device is asked)."""
        still = []
        for held in self.pending:
            known = None if held.position is None else settled_at(held.position)
            correct, settled = confirm(held.row[:, None])
            if known if known is not None else bool(settled.all()):
                self.utility += held.contribution * correct[:, 0, None, None].to(held.contribution.device)
            else:
                still.append(held)
        self.pending = still

    def provisional(self) -> torch.Tensor:
        """The provisional buffer: slots younger than the lag, (batch, num_kv_heads, n_slots) booleans."""
        if not self.lag:
            return torch.zeros_like(self.seen)
        return self.newest[:, None, None] - self.positions < self.lag

    def scores(self) -> torch.Tensor:
        """The commit rule as a ranking, float32: the provisional buffer +inf, committed slots their demonstrated
        utility (pending rows counted as correct; ``lag=None``: its mean over the rows counted), slots no valid
        row saw -inf. Ties keep the older slot (``kept_indices(..., keep_older=True)``)."""
        provisional = self.provisional()
        utility = self.utility + sum(held.contribution for held in self.pending)
        scores = utility if self.lag is not None else utility / self.rows.clamp(min=1)
        scores = scores.masked_fill(~self.seen & ~provisional, UNSEEN)
        return scores.masked_fill(provisional, float("inf"))

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the slots ``indices`` (batch, num_kv_heads, n_kept), in that order (the cache's gather)."""
        self.positions = self.positions.gather(-1, indices)
        self.marks = self.marks.gather(-2, indices[..., None].expand(-1, -1, -1, MARK_DIMS))
        self.utility = self.utility.gather(-1, indices)
        self.rows = self.rows.gather(-1, indices)
        self.seen = self.seen.gather(-1, indices)
        self.pending = [held._replace(contribution=held.contribution.gather(-1, indices)) for held in self.pending]

    def drop_from(self, position: int) -> None:
        """Forget the slots and pending rows at ``position`` and later: a cache cropped back to before them (its
        newest entries, appended last, are the ones cut)."""
        kept = int((self.positions[0, 0] < position).sum())
        self.keep(torch.arange(kept, device=self.positions.device).expand(*self.positions.shape[:2], -1))
        self.pending = [
            held for held in self.pending if (int(held.row[0]) if held.position is None else held.position) < position
        ]
        self.newest = torch.clamp(self.newest, max=position - 1)
        self.newest_position = min(self.newest_position, position - 1)

    def locate(self, marks: torch.Tensor) -> torch.Tensor:
        """The slot of each key fingerprint ``marks`` (batch, num_kv_heads, m, MARK_DIMS): (batch, num_kv_heads, m)
        indices. A key that matches none (another press changed it, as ``KeyRerotationPress`` does) gets a slot
        of its own, started afresh at an unknown position: it competes from nothing."""
        index, same = nearest_slots(self.marks, marks)
        if bool(same.all()):
            return index
        warnings.warn(
            "RMMPress cannot tell which cached keys some keys are (another press changed them): they start unobserved",
            stacklevel=3,
        )
        new = ~same
        count = int(new.sum(-1).max())
        fresh = torch.full((*self.positions.shape[:2], count), UNKNOWN, device=self.positions.device)
        start = self.size
        self.append(fresh, marks.new_zeros(*fresh.shape, MARK_DIMS))
        rank = new.long().cumsum(-1) - 1  # the k-th unmatched key of a head takes that head's k-th fresh slot
        index = torch.where(new, start + rank.clamp(min=0), index)
        self.marks.scatter_(-2, index[..., None].expand(-1, -1, -1, MARK_DIMS), marks)
        return index
