"""RMM's fixed-lag smoother: demonstrated utility per cached position, and the commit rule.

"Eviction as Estimation: A Fixed-Lag Smoothing View of Test-Time Memory", sections 4 (Eq. 1) and 5. One
``Smoother`` follows one layer's cache: for every cached slot (per batch row and KV head) it holds the slot's
absolute position t_k, the demonstrated utility observed so far and how many rows it counted. Rows of attention
are observed as they arrive (``observe``), the commit rule ranks the slots (``scores``), and an eviction gathers
the state with the very indices that gather the cache (``keep``), so the utility of a kept position is never
forgotten and never misaligned. The press (``presses.rmm_press``), the shared-prefill engine
(``evaluation.history``) and the eviction lab (``evaluation.traces``) all rank through this one class.

Two definitions, by lag:

- a finite lag H is the paper's smoother. DU_H(k) = sum over rows t in (t_k, t_k + H] of w(t) a(t -> k)
  (Eq. 1): the window opens *after* t_k, so a position's attention to itself never counts. The H newest
  positions are the provisional buffer (age t_newest - t_k < H): never evicted. An older position's window
  has been observed (rows the press never saw, such as a prefill hidden from ``DecodingPress``, count
  nothing); it is committed if it ranks among the best n_kept - H, and keeps competing with that utility
  afterwards. A newcomer must outrank an incumbent (section 5): on equal utility the older position stays.
  H = 0 commits at arrival: the window is empty and every utility 0, so no newcomer outranks an incumbent
  and the first positions stay: the no-information end of the paper's commit-lag axis.
- ``lag=None`` is the paper's benchmark scorer (section 8): KVPress's H2O score with a weight on each row,
  sum over every row t >= t_k of w(t) a(t -> k) divided by the number of rows counted. Its sum includes the
  diagonal (t = t_k) because ``ObservedAttentionPress`` sums every row of the attention matrix; with uniform
  weights it keeps exactly what ``ObservedAttentionPress`` keeps. Nothing is provisional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

UNSEEN = float("-inf")  # the score of a slot no valid row can see (a padding position): evicted first


def in_window(rows: torch.Tensor, slots: torch.Tensor, lag: int | None) -> torch.Tensor:
    """Whether row t counts towards the slot at position t_k: (..., n_rows, n_slots) booleans.

    ``rows`` (..., n_rows) and ``slots`` (..., n_slots) are absolute positions with broadcastable leading axes.
    A finite lag: t_k < t <= t_k + lag (Eq. 1). ``None``: t >= t_k.
    """
    distance = rows[..., :, None] - slots[..., None, :]
    if lag is None:
        return distance >= 0
    return (distance > 0) & (distance <= lag)


Confirmation = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # positions -> (correct, known)


@dataclass
class Smoother:
    """The smoother's state for one layer: shapes (batch, num_kv_heads, n_slots).

    ``positions``: each slot's absolute position; ``utility``: sum of w(t) a(t -> k) over the observed rows of
    its window (float32); ``rows``: how many observed rows counted (``lag=None`` divides by it); ``seen``: whether
    any valid row could attend to the slot (a padding slot is never seen); ``newest``: the newest observed row's
    position per batch row, (batch,); ``pending``: rows whose weight is not confirmed yet, each as its position
    (batch,) and its contribution to every slot (batch, num_kv_heads, n_slots), held apart from ``utility`` and
    counted as correct until ``revise`` adds or drops it.
    """

    lag: int | None
    positions: torch.Tensor
    utility: torch.Tensor
    rows: torch.Tensor
    seen: torch.Tensor
    newest: torch.Tensor
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def start(cls, lag: int | None, positions: torch.Tensor) -> Smoother:
        """A smoother over slots at ``positions`` (batch, num_kv_heads, n_slots) with nothing observed yet."""
        zeros = torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
        first = positions.amin(dim=(1, 2)) if positions.shape[-1] else positions.new_zeros(positions.shape[0])
        newest = first - 1
        return cls(lag, positions, zeros, zeros.clone(), torch.zeros_like(zeros, dtype=torch.bool), newest)

    @property
    def size(self) -> int:
        return self.positions.shape[-1]

    def append(self, positions: torch.Tensor) -> None:
        """New slots at ``positions`` (batch, num_kv_heads, n_new), after the existing ones (as a cache appends)."""
        zeros = torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
        self.positions = torch.cat([self.positions, positions], dim=-1)
        self.utility = torch.cat([self.utility, zeros], dim=-1)
        self.rows = torch.cat([self.rows, zeros], dim=-1)
        self.seen = torch.cat([self.seen, zeros.bool()], dim=-1)
        self.pending = [(row, torch.cat([contribution, zeros], dim=-1)) for row, contribution in self.pending]

    def observe(
        self,
        row_positions: torch.Tensor,
        weights: torch.Tensor,
        probs: torch.Tensor,
        valid: torch.Tensor | None = None,
        unconfirmed: torch.Tensor | None = None,
    ) -> None:
        """Add rows of attention to the slots of their windows.

        ``row_positions`` (batch, n_rows); ``weights`` (batch, n_rows): w(t); ``probs``
        (batch, num_kv_heads, n_rows, n_visible): each row's attention to the first ``n_visible`` slots, averaged
        over the query heads of each KV group (zero where the row cannot see the slot); ``valid`` (batch, n_rows):
        False for a row that is no real token (padding), which then neither adds nor counts; ``unconfirmed``
        (n_rows,): rows whose weight is provisional, kept in ``pending`` for ``revise``.
        """
        visible = probs.shape[-1]
        window = in_window(row_positions[:, None, :], self.positions[..., :visible], self.lag)
        if valid is not None:
            window &= valid[:, None, :, None]
        contribution = probs.float() * weights.float()[:, None, :, None] * window
        held = torch.zeros(contribution.shape[2], dtype=torch.bool, device=contribution.device)
        if unconfirmed is not None:
            held = unconfirmed.to(contribution.device)
        self.utility[..., :visible] += contribution[:, :, ~held].sum(2)
        self.rows[..., :visible] += window.sum(2)
        reached = probs > 0 if valid is None else (probs > 0) & valid[:, None, :, None]
        self.seen[..., :visible] |= reached.any(2)
        self.newest = torch.maximum(self.newest, row_positions[:, -1])
        for row in held.nonzero()[:, 0].tolist():
            pending = torch.zeros_like(self.utility)
            pending[..., :visible] = contribution[:, :, row]
            self.pending.append((row_positions[:, row], pending))

    def set_sums(self, utility: torch.Tensor) -> None:
        """Take the utility of every slot from sums computed elsewhere over all rows up to the newest slot
        (``presses.fused_attention``), on a fresh smoother of consecutive positions."""
        self.newest = self.positions.amax(dim=(1, 2))
        ages = self.newest[:, None, None] - self.positions
        self.utility = utility
        self.rows = (ages + 1 if self.lag is None else ages.clamp(max=self.lag)).float()
        self.seen = torch.ones_like(self.seen)

    def revise(self, confirm: Confirmation) -> None:
        """Settle the pending rows whose correctness is now known: a right one's contribution joins the utility,
        a wrong one's is dropped. Unsettled rows keep counting as correct (``scores``)."""
        still = []
        for row, contribution in self.pending:
            correct, known = confirm(row[:, None])
            if bool(known.all()):
                self.utility += contribution * correct[:, 0, None, None]
            else:
                still.append((row, contribution))
        self.pending = still

    @property
    def unsettled(self) -> int:
        """How many observed rows still wait for their weight."""
        return len(self.pending)

    def provisional(self) -> torch.Tensor:
        """The provisional buffer: slots younger than the lag, (batch, num_kv_heads, n_slots) booleans."""
        if not self.lag:
            return torch.zeros_like(self.seen)
        return self.newest[:, None, None] - self.positions < self.lag

    def scores(self) -> torch.Tensor:
        """The commit rule as a ranking, (batch, num_kv_heads, n_slots) float32: keeping the highest n_kept keeps
        the provisional buffer (+inf) and the committed slots of highest demonstrated utility (rows still pending
        counted as correct); slots no valid row saw score -inf. A newcomer must outrank an incumbent: ties keep
        the lower position (``kept_indices(..., keep_older=True)``)."""
        provisional = self.provisional()
        utility = self.utility + sum(contribution for _, contribution in self.pending)
        scores = utility if self.lag is not None else utility / self.rows.clamp(min=1)
        scores = scores.masked_fill(~self.seen & ~provisional, UNSEEN)
        return scores.masked_fill(provisional, float("inf"))

    def check_budget(self, n_kept: int) -> None:
        """The buffer is never evicted: a budget that cannot hold it and one committed slot is refused."""
        if self.lag is not None and self.lag >= n_kept:
            raise ValueError(
                f"RMMPress(lag={self.lag}) keeps its {self.lag} newest positions provisional, but the budget keeps "
                f"only {n_kept}: use a lag below {n_kept} or keep more positions"
            )

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the slots ``indices`` (batch, num_kv_heads, n_kept), in that order (the cache's gather)."""
        self.positions = self.positions.gather(-1, indices)
        self.utility = self.utility.gather(-1, indices)
        self.rows = self.rows.gather(-1, indices)
        self.seen = self.seen.gather(-1, indices)
        self.pending = [(row, contribution.gather(-1, indices)) for row, contribution in self.pending]
