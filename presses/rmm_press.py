from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from kvpress.utils import compute_n_kept
from transformers import PreTrainedModel

from presses.attention import DEFAULT_CHUNK_SIZE
from presses.budget import protected_refusal
from presses.column_sums import ColumnSums
from presses.following import CacheFollower
from presses.fused_attention import fused_column_sums
from presses.model_hooks import language_model
from presses.ordered_scorer_press import OrderedScorerPress, check_compression_ratio, gather_kept, kept_indices
from presses.random_weights import check_seed
from presses.row_weights import RowWeights
from presses.teacher_forcing import Transcript, checked_correctness


@dataclass
class RMMPress(OrderedScorerPress):
    """RMM: fixed-lag smoothing with demonstrated utility.

    "Eviction as Estimation: A Fixed-Lag Smoothing View of Test-Time Memory", sections 4, 5 and 8.

    A cached position k has demonstrated utility (Eq. 1) DU_H(k) = sum over rows t in (t_k, t_k + H] of
    w(t) a(t -> k), averaged over the query heads of its KV group; w(t) is 1 if the model's top-1 prediction
    at t is the token t + 1 (teacher forcing), else 0, or, with no gold token, the probability the model gives
    that prediction (``confidence``, a deployment proxy); ``random`` is the control that weighs as many rows 1 as
    are correct, chosen at random by ``seed`` (``presses.random_weights``). The H newest positions are the
    provisional buffer, never evicted; the rest of the budget keeps the committed positions of highest utility,
    and a newcomer must outrank an incumbent. ``lag=None`` is the paper's benchmark scorer, KVPress's H2O score
    with a weight per row, which with uniform weights keeps exactly what ``ObservedAttentionPress`` keeps. One
    smoother per layer follows the cache through prefill and decoding, whoever evicts (docs/presses.md).

    A prefill's score reads the attention only through the column sums of ``statistic``: whoever computed them
    already (its own fused prefill, a caller's shared prefill) hands them over with ``hand_column_sums`` before
    the layer's hook runs, and the press takes them instead of recomputing them (a ``ColumnSumReader``).

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the cache to evict, in [0, 1).
    lag : int or None, default=None
        The commit lag H >= 0, or None for the H2O-class scorer without a buffer.
    correctness : "teacher_forced", "confidence", "uniform", "random", or per-position weights, default="teacher_forced"
        w(t): teacher-forced, top-1 probability, all ones, the random control at the correct share, or one per
        absolute position ((length,) or (batch, length)).
    chunk_size : int, default=64
        Query rows per chunk when attention rows are recomputed.
    fused_attention : bool, default=False
        Under sdpa, the prefill's attention output and its sums from one chunked pass (uniform or supplied weights).
    seed : int, default=0
        The draws of ``correctness="random"``, in [0, 2**32); another value with another mode is refused.
    """

    compression_ratio: float = 0.0
    lag: int | None = None
    correctness: str | torch.Tensor | Sequence[float] = "teacher_forced"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fused_attention: bool = False
    seed: int = 0

    _transcript: Transcript = field(default_factory=Transcript, init=False, repr=False, compare=False)
    _weights: RowWeights = field(init=False, repr=False, compare=False)
    _follower: CacheFollower = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lag is not None and (isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 0):
            raise ValueError(f"lag must be None or an integer >= 0 (the commit lag H), got {self.lag!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")
        if not isinstance(self.fused_attention, bool):
            raise ValueError(f"fused_attention must be True or False, got {self.fused_attention!r}")
        self.correctness = checked_correctness(self.correctness)
        check_seed(self.seed)
        self._weights = RowWeights(self, self.seed, self._transcript)
        if self.fused_attention and self.from_predictions:
            raise ValueError(
                f"fused_attention=True sums during the forward, before the weights of correctness={self.correctness!r} "
                "exist (they need the forward's logits): use correctness='uniform' or per-position weights, or "
                "fused_attention=False"
            )
        if self.seed and not self._weights.random:
            raise ValueError(
                f"seed draws the weights of correctness='random'; with correctness={self.correctness!r} it changes "
                "nothing: leave it out"
            )
        self._follower = CacheFollower(self.lag, self.chunk_size, self._weights)

    @property
    def from_predictions(self) -> bool:
        """Whether w(t) comes from the model's own predictions (teacher forced, confidence, the random control), via
        a transcript."""
        return self._weights.from_predictions

    @property
    def statistic(self) -> ColumnSums:
        """The column sums of the prefill's attention that this press's prefill score reads."""
        if not isinstance(self.correctness, str):
            return ColumnSums(self.lag, "supplied")
        return ColumnSums(self.lag, self.correctness, self.seed if self._weights.random else None)

    def hand_column_sums(self, layer_idx: int, sums: torch.Tensor | None) -> None:
        """Hand the press the column sums of ``statistic`` (batch, num_heads, k_len) over a prefill of the layer
        ``layer_idx`` whose hook has yet to run (None: take back what was handed).

        The layer's next prefill over k_len keys scores from them, once, instead of recomputing its attention rows;
        sums over another number of keys are left unread.
        """
        self._follower.hand(layer_idx, sums)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """The commit rule over ``keys`` (batch, num_kv_heads, k_len): +inf for the provisional buffer, the
        demonstrated utility (``lag=None``: its mean over the rows counted) for the rest."""
        smoother, slots = self._follower.observe(module, hidden_states, keys, attentions, kwargs)
        return smoother.scores().gather(-1, slots)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep what ``score`` ranks highest and gather the smoother with the cache; on equal scores the older
        position stays, in whatever order the cache holds the keys."""
        check_compression_ratio(self.compression_ratio)
        smoother, slots = self._follower.observe(module, hidden_states, keys, attentions, kwargs)
        if self.compression_ratio == 0:
            return keys, values
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        refusal = protected_refusal(type(self).__name__, "lag", self.lag, n_kept) if self.lag is not None else ""
        if refusal:
            raise ValueError(refusal)
        by_age = smoother.positions.gather(-1, slots).argsort(dim=-1, stable=True)
        ranked = smoother.scores().gather(-1, slots.gather(-1, by_age))
        kept = by_age.gather(-1, kept_indices(ranked, n_kept, keep_older=True))  # a newcomer must outrank
        kept = kept.sort(-1).values
        smoother.keep(slots.gather(-1, kept))
        return gather_kept(keys, values, kept)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Record the token ids and predictions of what the model runs, under this press or a wrapper's hooks;
        the hooks go when the hooks of the press that holds this one are removed."""
        super().post_init_from_model(model)
        self._weights.attach(model, self)

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        self._follower.clear()
        self._weights.clear()
        weights = self.correctness if isinstance(self.correctness, torch.Tensor) else None
        fused = (
            fused_column_sums(model, language_model(model).layers, self, weights, self.chunk_size)
            if self.fused_attention
            else nullcontext()
        )
        with fused, super().__call__(model):
            yield
