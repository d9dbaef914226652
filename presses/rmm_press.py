from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from kvpress.utils import compute_n_kept
from transformers import PreTrainedModel

from presses.attention import (
    DEFAULT_CHUNK_SIZE,
    attention_rows,
    group_mean,
    host_values,
    is_prefilling,
    newest_host_positions,
    recomputed_keys,
    row_positions,
)
from presses.column_sums import ColumnSums
from presses.fused_attention import fused_column_sums
from presses.ordered_scorer_press import OrderedScorerPress, check_compression_ratio, gather_kept, kept_indices
from presses.prefix import replay, token_ids_of
from presses.random_weights import RandomControl, check_seed
from presses.smoother import UNKNOWN, Smoother, key_marks
from presses.teacher_forcing import FROM_PREDICTIONS, Transcript, checked_correctness, language_model


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

    _smoothers: dict[int, Smoother] = field(default_factory=dict, init=False, repr=False, compare=False)
    _caches: dict[int, weakref.ref] = field(default_factory=dict, init=False, repr=False, compare=False)
    _transcript: Transcript = field(default_factory=Transcript, init=False, repr=False, compare=False)
    _model: PreTrainedModel | None = field(default=None, init=False, repr=False, compare=False)
    _prefix: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _handed: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)
    _random: RandomControl = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lag is not None and (isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 0):
            raise ValueError(f"lag must be None or an integer >= 0 (the commit lag H), got {self.lag!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")
        if not isinstance(self.fused_attention, bool):
            raise ValueError(f"fused_attention must be True or False, got {self.fused_attention!r}")
        if self.fused_attention and self.from_predictions:
            raise ValueError(
                f"fused_attention=True sums during the forward, before the weights of correctness={self.correctness!r} "
                "exist (they need the forward's logits): use correctness='uniform' or per-position weights, or "
                "fused_attention=False"
            )
        self.correctness = checked_correctness(self.correctness)
        check_seed(self.seed)
        if self.seed and not self.random:
            raise ValueError(
                f"seed draws the weights of correctness='random'; with correctness={self.correctness!r} it changes "
                "nothing: leave it out"
            )
        self._random = RandomControl(self.seed)

    @property
    def random(self) -> bool:
        """Whether w(t) is the random control (``correctness="random"``)."""
        return isinstance(self.correctness, str) and self.correctness == "random"

    @property
    def from_predictions(self) -> bool:
        """Whether w(t) comes from the model's own predictions (teacher forced or confidence), via a transcript."""
        return isinstance(self.correctness, str) and self.correctness in FROM_PREDICTIONS

    @property
    def statistic(self) -> ColumnSums:
        """The column sums of the prefill's attention that this press's prefill score reads."""
        if not isinstance(self.correctness, str):
            return ColumnSums(self.lag, "supplied")
        return ColumnSums(self.lag, self.correctness, self.seed if self.random else None)

    def hand_column_sums(self, layer_idx: int, sums: torch.Tensor | None) -> None:
        """Hand the press the column sums of ``statistic`` (batch, num_heads, k_len) over a prefill of the layer
        ``layer_idx`` whose hook has yet to run (None: take back what was handed).

        The layer's next prefill over k_len keys scores from them, once, instead of recomputing its attention rows;
        sums over another number of keys are left unread.
        """
        if sums is None:
            self._handed.pop(layer_idx, None)
        else:
            self._handed[layer_idx] = sums

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """The commit rule over ``keys`` (batch, num_kv_heads, k_len): +inf for the provisional buffer, the
        demonstrated utility (``lag=None``: its mean over the rows counted) for the rest."""
        smoother, slots = self.observe(module, hidden_states, keys, attentions, kwargs)
        return smoother.scores().gather(-1, slots)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep what ``score`` ranks highest and gather the smoother with the cache; on equal scores the older
        position stays, in whatever order the cache holds the keys."""
        check_compression_ratio(self.compression_ratio)
        smoother, slots = self.observe(module, hidden_states, keys, attentions, kwargs)
        if self.compression_ratio == 0:
            return keys, values
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        smoother.check_budget(n_kept)
        by_age = smoother.positions.gather(-1, slots).argsort(dim=-1, stable=True)
        kept = by_age.gather(-1, self.select(smoother.scores().gather(-1, slots.gather(-1, by_age)), n_kept))
        kept = kept.sort(-1).values
        smoother.keep(slots.gather(-1, kept))
        return gather_kept(keys, values, kept)

    def select(self, scores: torch.Tensor, n_kept: int) -> torch.Tensor:
        """The ``n_kept`` highest scores; a newcomer must outrank an incumbent, so ties keep the older position."""
        return kept_indices(scores, n_kept, keep_older=True)

    def observe(self, module, hidden_states, keys, attentions, kwargs) -> tuple[Smoother, torch.Tensor]:
        """The layer's smoother, brought up to date, and the slot of each of ``keys`` in it, (batch, num_kv_heads,
        k_len). A prefill is observed whole, once per forward, from the layer's own input (a wrapper may hand a
        slice of it, as ``ChunkPress`` does); while decoding, the rows handed in (``DecodingPress``'s buffer)."""
        batch, num_kv_heads, k_len = keys.shape[:3]
        layer, cache = module.layer_idx, kwargs.get("past_key_values")
        prefilling = is_prefilling(kwargs, kwargs["hidden_states"].shape[1])
        rows = kwargs["hidden_states"] if prefilling else hidden_states
        n_rows = rows.shape[1]
        positions = row_positions(kwargs, n_rows).expand(batch, -1).to(keys.device)
        held = newest_host_positions(kwargs, n_rows)  # the first sequence's, on the host
        known = self._caches.get(layer)
        smoother = self._smoothers.get(layer) if known is not None and known() is cache else None
        if prefilling and (smoother is None or smoother.source() is not rows):  # a new forward: observe it whole
            full = keys if k_len == n_rows else recomputed_keys(module, rows, kwargs)
            smoother = Smoother.start(self.lag, positions[:, None].expand(-1, num_kv_heads, -1), key_marks(full))
            self._random.start(prefill_block(kwargs, batch, held))
            self._observe_rows(module, smoother, rows, full, attentions, kwargs, positions, held, True)
            smoother.source = weakref.ref(rows)
        elif smoother is None:  # a cache met for the first time while decoding
            old = k_len - n_rows  # cached positions older than the rows handed in: 0.. unless another press evicted
            compressed = held[-1] + 1 != k_len
            older = (
                torch.full((old,), UNKNOWN, device=keys.device) if compressed else torch.arange(old, device=keys.device)
            )
            slots = torch.cat([older.expand(batch, -1), positions], dim=1)
            smoother = Smoother.start(
                self.lag, slots[:, None].expand(-1, num_kv_heads, -1).contiguous(), key_marks(keys)
            )
            self._observe_prefix(module, smoother, keys, kwargs, positions, held)
            self._observe_rows(module, smoother, rows, keys, attentions, kwargs, positions, held, False)
        elif not prefilling:
            first, last = held[0], held[-1]
            if first <= smoother.newest_position:  # the cache was cropped back (a new question)
                smoother.drop_from(first)
            appended = last - smoother.newest_position
            if appended > n_rows:
                raise ValueError(
                    f"RMMPress was handed {n_rows} rows for {appended} new positions: DecodingPress keeps fewer "
                    "buffered rows than steps between compressions; set hidden_states_buffer_size >= "
                    "compression_interval so every row is observed"
                )
            if smoother.size != k_len - appended:  # someone evicted without telling: find the survivors
                smoother.keep(smoother.locate(key_marks(keys[:, :, : k_len - appended])))
            new = positions[:, None, n_rows - appended :].expand(-1, num_kv_heads, -1)
            smoother.append(new, key_marks(keys[:, :, k_len - appended :]))
            self._observe_rows(module, smoother, rows, keys, attentions, kwargs, positions, held, False)
        self._smoothers[layer] = smoother
        self._caches[layer] = weakref.ref(cache) if cache is not None else lambda: None
        if smoother.size == k_len and (not prefilling or k_len == n_rows):
            return smoother, torch.arange(k_len, device=keys.device).expand(batch, num_kv_heads, -1)
        return smoother, smoother.locate(key_marks(keys))  # a subset of what was observed (a wrapper's choice)

    def _observe_rows(
        self, module, smoother, hidden_states, keys, attentions, kwargs, positions, held, prefilling
    ) -> None:
        """Observe the rows of ``hidden_states`` at ``positions`` that ``smoother`` has not seen yet; ``held``: the
        first sequence's positions of those rows, on the host."""
        confirmation = self._random.confirm(self._transcript) if self.random else None
        smoother.revise(confirmation or self._transcript.confirmation(self.correctness), self._settled_at)
        sums = self._handed_sums(module.layer_idx, keys.shape[2]) if prefilling and attentions is None else None
        if sums is not None:
            smoother.set_sums(group_mean(sums.float(), keys.shape[1]))
            return
        last = held[-1]
        n_new = min(positions.shape[1], max(0, last - smoother.newest_position))  # rows at consecutive positions
        smoother.newest_position = max(smoother.newest_position, last)
        if not n_new:
            return
        observed = held[len(held) - n_new :]
        weights, unconfirmed = self.row_weights(positions[:, -n_new:], prefilling, observed)
        rows = attention_rows(module, hidden_states, keys, attentions, kwargs, n_new, self.chunk_size)
        for first, probs in rows.chunks:
            span = slice(first, first + probs.shape[2])
            valid = None if rows.valid is None else rows.valid[:, span]
            settled = [row - first for row in unconfirmed if span.start <= row < span.stop]
            grouped = group_mean(probs, keys.shape[1])
            smoother.observe(positions[:, -n_new:][:, span], weights[:, span], grouped, valid, settled, observed[span])

    def _handed_sums(self, layer_idx: int, k_len: int) -> torch.Tensor | None:
        """The sums handed for the layer over ``k_len`` keys, taken from the press; None if none."""
        sums = self._handed.get(layer_idx)
        if sums is None or sums.shape[-1] != k_len:
            return None
        return self._handed.pop(layer_idx)

    def _observe_prefix(self, module, smoother, keys, kwargs, positions, held: list[int]) -> None:
        """A decoding cache met for the first time: replay its older positions, which this press never saw
        (KVPress's pipeline prefills outside ``DecodingPress``), from layer 0's values, and observe their rows.
        A prefix another press compressed cannot be replayed: it starts unobserved."""
        first, cache = held[0], kwargs["past_key_values"]
        if self._model is None or held[-1] + 1 != keys.shape[2]:
            warnings.warn(
                "RMMPress meets a compressed cache it never saw: its older positions start unobserved", stacklevel=3
            )
            return
        if self._prefix.get("cache") is not cache or module.layer_idx not in self._prefix["captured"]:
            ids = token_ids_of(self._model, cache.layers[0].values[:, :, :first])
            captured, hidden = replay(self._model, ids)
            self._transcript.store(self._model, ids, hidden)
            self._random.start((first - 1,) * keys.shape[0])
            self._prefix = {"cache": cache, "captured": captured}
        hidden, rotary = self._prefix["captured"].pop(module.layer_idx)
        rows = torch.arange(first, device=keys.device).expand(keys.shape[0], -1)
        kwargs = {"position_embeddings": rotary, "position_ids": rows[:1]}
        self._observe_rows(module, smoother, hidden, keys[:, :, :first], None, kwargs, rows, list(range(first)), False)

    def row_weights(
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
            self._transcript.predict(self._model, positions, self.correctness)
        if self.random and self._transcript.knows_tokens(positions):
            return self._random.weights(self._transcript, positions, newest_position(positions, held))
        known = None
        if self.from_predictions and not self.random:
            known = self._transcript.weights(positions, self.correctness, held)
        if self.from_predictions and known is None:
            warnings.warn(
                f"RMMPress(correctness={self.correctness!r}) cannot see the token ids (the model ran on inputs_embeds, "
                "or a wrapper such as PerLayerCompressionPress never showed it the model): uniform weights",
                stacklevel=2,
            )
        return known or (torch.ones(positions.shape, device=positions.device), [])

    def _settled_at(self, position: int) -> bool | None:
        """Whether the weight of the row at ``position`` is known, from the transcript's host record (None: ask the
        device)."""
        if not self.from_predictions or self.random:
            return None
        return self._transcript.settled_at(position, self.correctness)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Record the token ids and predictions of what the model runs, under this press or a wrapper's hooks;
        the hooks go when the hooks of the press that holds this one are removed."""
        super().post_init_from_model(model)
        self._transcript.detach()
        self._model = model
        if self.from_predictions:
            self._transcript.attach(model, self, confident=self.correctness == "confidence")

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        self._smoothers, self._caches, self._prefix = {}, {}, {}
        self._transcript.clear()
        self._random.clear()
        weights = self.correctness if isinstance(self.correctness, torch.Tensor) else None
        fused = (
            fused_column_sums(model, language_model(model).layers, self, weights, self.chunk_size)
            if self.fused_attention
            else nullcontext()
        )
        with fused, super().__call__(model):
            yield
