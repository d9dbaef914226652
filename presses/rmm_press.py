from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
from kvpress.presses.base_press import is_prefilling
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import PreTrainedModel

from presses.attention import (
    DEFAULT_CHUNK_SIZE,
    attention_rows,
    group_mean,
    recomputed_keys,
    row_positions,
    surviving_slots,
)
from presses.fused_attention import fused_column_sums, take_fused_sums
from presses.ordered_scorer_press import OrderedScorerPress, check_compression_ratio, gather_kept, kept_indices
from presses.smoother import Smoother
from presses.teacher_forcing import (
    Transcript,
    hooks_suspended,
    input_ids_of,
    language_model,
    top1_predictions,
)

CORRECTNESS_MODES = ("teacher_forced", "uniform")
MISSING_IDS = (
    "RMMPress(correctness='teacher_forced') could not see the token ids: the model was called with "
    "inputs_embeds, or RMMPress runs inside a press that never calls post_init_from_model (such as "
    "PerLayerCompressionPress). Use correctness='uniform' or supply per-position weights."
)


@dataclass
class RMMPress(OrderedScorerPress):
    """RMM: fixed-lag smoothing with demonstrated utility.

    "Eviction as Estimation: A Fixed-Lag Smoothing View of Test-Time Memory", sections 4, 5 and 8.

    The rule (``presses.smoother``, one definition for this press, the evaluation engine and the eviction lab):

    - ``lag=H`` (finite) is the paper's smoother. A cached position k has demonstrated utility (Eq. 1)

          DU_H(k) = sum over rows t in (t_k, t_k + H] of w(t) * a(t -> k),

      averaged over the query heads of its KV group, where a(t -> k) is the attention of row t to k and w(t)
      the row's teacher-forced correctness (1 if the model's top-1 prediction at t is the token t + 1, else 0).
      The window opens after t_k: a position's attention to itself never counts. At a budget of n_kept the
      press keeps the H newest positions as the provisional buffer (never evicted; a lag that does not fit
      the budget is an error) and the best n_kept - H older ones by utility as committed, so its total is the
      same n_kept as any other press at that budget, of which H are the buffer. A newcomer must outrank an
      incumbent: on equal utility the older position stays. ``lag=0`` commits at arrival: the window is empty,
      every utility is 0, so the first positions stay.
    - ``lag=None`` is the paper's benchmark scorer (section 8): KVPress's H2O score with a weight per row,
      sum over every row t >= t_k (the diagonal included, as ``ObservedAttentionPress`` sums every row of
      the attention matrix) of w(t) a(t -> k), divided by the number of rows counted. With uniform weights it
      keeps exactly what ``ObservedAttentionPress`` keeps. Nothing is provisional.

    The two differ at the diagonal because Eq. 1 measures use by *later* predictions, while the H2O sum is
    over the whole attention matrix.

    The smoother follows the cache: during decoding (as ``DecodingPress``'s base press; as both presses of
    ``PrefillDecodingPress(prefilling_press=rmm, decoding_press=DecodingPress(rmm))`` it also carries the
    prefill's utilities) each cached position keeps its utility across compression steps, gathered with the
    same indices as the cache at every eviction, and a committed position keeps competing with it. Every
    observed row carries its real correctness: teacher-forced for prompt and question rows, the emitted token
    for generated ones. A row whose prediction or next token is not known yet counts as correct until it is
    (the newest generated row: by construction under greedy decoding); a forward of several such rows (a
    question inside ``DecodingPress``) is observed but evicts nothing until their predictions exist. Inside
    ``DecodingPress`` the prefill is never shown to the press, so its positions enter with no utility; the
    buffer must hold every step between compressions (``hidden_states_buffer_size >= compression_interval``).

    Where the weights come from: used as a press on its own, RMMPress defers each layer's prefill compression
    to the end of the model's forward, where the logits are known (a prefill press prunes a layer's cache
    only after that layer's attention, so deferring changes no hidden state). Inside another press's hooks a
    ``Transcript`` records the token ids and predictions; the prefill rows' predictions then come from one
    extra forward over the context.

    Scores are accumulated and ranked in float32 whatever the model's dtype. Without eager attention weights
    the rows are recomputed from the layer's queries and keys chunk by chunk; the model's attention mask
    (padding, sliding window) is honoured.

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the cache to evict, in [0, 1).
    lag : int or None, default=None
        The commit lag H >= 0, or None for the H2O-class scorer without a buffer.
    correctness : "teacher_forced", "uniform", or per-position weights, default="teacher_forced"
        The row weights w(t): the model's own teacher-forced correctness, all ones, or one non-negative weight
        per absolute position (shape (length,) or (batch, length)) supplied by the caller.
    chunk_size : int, default=64
        Query rows per chunk when attention rows are recomputed.
    fused_attention : bool, default=False
        Under sdpa, compute each layer's prefill attention output and the sums in one chunked pass
        (``presses.fused_attention``) instead of sdpa followed by a second pass; the output then equals sdpa's
        within float rounding, not bit for bit. Needs the weights before the forward, so only with uniform or
        per-position correctness, and only when RMMPress is the press the model runs under.
    """

    compression_ratio: float = 0.0
    lag: int | None = None
    correctness: str | torch.Tensor | Sequence[float] = "teacher_forced"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fused_attention: bool = False

    _smoothers: dict[int, Smoother] = field(default_factory=dict, init=False, repr=False, compare=False)
    _caches: dict[int, weakref.ref] = field(default_factory=dict, init=False, repr=False, compare=False)
    _transcript: Transcript = field(default_factory=Transcript, init=False, repr=False, compare=False)
    _model: PreTrainedModel | None = field(default=None, init=False, repr=False, compare=False)
    _deferring: bool = field(default=False, init=False, repr=False, compare=False)
    _deferred: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lag is not None and (isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 0):
            raise ValueError(f"lag must be None or an integer >= 0 (the commit lag H), got {self.lag!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")
        if not isinstance(self.fused_attention, bool):
            raise ValueError(f"fused_attention must be True or False, got {self.fused_attention!r}")
        if self.fused_attention and self.teacher_forced:
            raise ValueError(
                "fused_attention=True sums during the forward, before teacher-forced weights exist: use "
                "correctness='uniform' or per-position weights, or fused_attention=False"
            )
        if isinstance(self.correctness, str):
            if self.correctness not in CORRECTNESS_MODES:
                raise ValueError(
                    f"correctness must be one of {CORRECTNESS_MODES} or a sequence of per-position weights, "
                    f"got {self.correctness!r}"
                )
            return
        weights = torch.as_tensor(self.correctness, dtype=torch.float32)
        if weights.ndim not in (1, 2) or not torch.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(
                "per-position correctness weights must be finite, non-negative, of shape (length,) or "
                f"(batch, length); got shape {tuple(weights.shape)}"
            )
        self.correctness = weights if weights.ndim == 2 else weights.unsqueeze(0)

    @property
    def teacher_forced(self) -> bool:
        return isinstance(self.correctness, str) and self.correctness == "teacher_forced"

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> torch.Tensor:
        """The commit rule over the cache, (batch, num_kv_heads, k_len): +inf for the provisional buffer, the
        demonstrated utility (``lag=None``: its mean over the rows counted) for the rest. Observes the rows of
        ``hidden_states`` first, so the layer's smoother then describes ``keys``."""
        return self.observe(module, hidden_states, keys, attentions, kwargs).scores()

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep what ``score`` ranks highest and gather the smoother with the cache. Rows are observed even when
        nothing is evicted (``DecodingPress`` drops its buffer after every call)."""
        check_compression_ratio(self.compression_ratio)
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        smoother = self._smoothers[module.layer_idx]
        if self.compression_ratio == 0 or smoother.unsettled > 1:
            # several rows whose predictions come only at the end of this forward (a question inside
            # DecodingPress): observed now, nothing evicted until their weights are known
            return keys, values
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        smoother.check_budget(n_kept)
        kept = self.select(scores, n_kept)
        smoother.keep(kept)
        return gather_kept(keys, values, kept)

    def select(self, scores: torch.Tensor, n_kept: int) -> torch.Tensor:
        """The ``n_kept`` highest scores; a newcomer must outrank an incumbent, so ties keep the older position."""
        return kept_indices(scores, n_kept, keep_older=True)

    def observe(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> Smoother:
        """Bring the layer's smoother up to date with the rows of ``hidden_states`` (the newest positions)."""
        batch, num_kv_heads, k_len = keys.shape[:3]
        n_rows = hidden_states.shape[1]
        positions = row_positions(kwargs, n_rows).expand(batch, -1)
        prefilling = is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1])
        cache = kwargs.get("past_key_values")
        known = self._caches.get(module.layer_idx)
        if known is not None and known() is not cache:  # another sequence's cache: its smoother is not this one's
            self._smoothers.pop(module.layer_idx, None)
        smoother = self._smoother(module.layer_idx, positions, num_kv_heads, k_len, n_rows, prefilling)
        self._smoothers[module.layer_idx] = smoother
        self._caches[module.layer_idx] = weakref.ref(cache) if cache is not None else lambda: None
        fused = take_fused_sums(module, k_len) if prefilling and attentions is None else None
        if fused is not None:
            smoother.set_sums(group_mean(fused.float(), num_kv_heads))
            return smoother
        smoother.revise(self._transcript.confirm)
        weights, unconfirmed = self.row_weights(positions, prefilling)
        full_keys = keys if k_len >= n_rows else recomputed_keys(module, hidden_states, kwargs)
        rows = attention_rows(module, hidden_states, full_keys, attentions, kwargs, n_rows, self.chunk_size)
        for first, probs in rows.chunks:
            span = slice(first, first + probs.shape[2])
            smoother.observe(
                positions[:, span],
                weights[:, span],
                group_mean(probs, num_kv_heads),
                None if rows.valid is None else rows.valid[:, span],
                None if unconfirmed is None else unconfirmed[span],
            )
        if k_len < n_rows:  # an earlier press of a ComposedPress evicted: keep the smoother of its survivors
            smoother.keep(surviving_slots(full_keys, keys))
        return smoother

    def _smoother(
        self, layer: int, positions: torch.Tensor, num_kv_heads: int, k_len: int, n_rows: int, prefilling: bool
    ) -> Smoother:
        """The layer's smoother, with a slot for every position appended since it last observed; a fresh one for a
        new sequence (a prefill: every row, before any eviction of an earlier press; or the first decoding step
        that meets an uncompressed cache)."""
        smoother = None if prefilling else self._smoothers.get(layer)
        continues = smoother is not None and int(positions[0, 0]) > int(smoother.newest[0])
        if continues and smoother.positions.shape[0] == positions.shape[0]:
            appended = int(positions[0, -1] - smoother.newest[0])
            if smoother.size + appended == k_len:
                if appended > n_rows:
                    raise ValueError(
                        f"RMMPress was handed {n_rows} rows for {appended} new positions: DecodingPress keeps fewer "
                        "buffered rows than steps between compressions; set hidden_states_buffer_size >= "
                        "compression_interval so every row is observed"
                    )
                new = positions[:, -1:] - appended + 1 + torch.arange(appended, device=positions.device)
                smoother.append(new[:, None].expand(-1, smoother.positions.shape[1], -1))
                return smoother
        length = max(k_len, n_rows)
        if not prefilling and int(positions[0, -1]) + 1 != k_len:
            raise ValueError(
                f"RMMPress first meets this sequence while decoding, in a cache of {k_len} positions that reaches "
                f"position {int(positions[0, -1])}: another press compressed it, so the positions it holds are "
                "unknown. Let the same RMMPress compress the prefill, e.g. PrefillDecodingPress(prefilling_press=rmm, "
                "decoding_press=DecodingPress(rmm))"
            )
        slots = positions[:, -1:] - length + 1 + torch.arange(length, device=positions.device)
        return Smoother.start(self.lag, slots[:, None].expand(-1, num_kv_heads, -1).contiguous())

    def row_weights(self, positions: torch.Tensor, prefilling: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """w(t) at ``positions`` (batch, n_rows), and which rows' weights are still provisional (n_rows,): rows
        whose prediction or next token is not known yet count as correct until ``Smoother.revise``."""
        if isinstance(self.correctness, torch.Tensor):
            if int(positions.max()) >= self.correctness.shape[-1]:
                raise ValueError(
                    f"RMMPress has {self.correctness.shape[-1]} per-position weights but the cache reaches position "
                    f"{int(positions.max())}: supply one weight per position of the sequence."
                )
            weights = self.correctness.to(positions.device).expand(positions.shape[0], -1)
            return weights.gather(1, positions), None
        if self.correctness == "uniform":
            return torch.ones(positions.shape, device=positions.device), None
        if prefilling and not self._deferring:
            self._predict_context(positions)
        if not self._transcript.knows_tokens(positions):
            raise RuntimeError(MISSING_IDS)
        correct, known = self._transcript.confirm(positions)
        return torch.where(known, correct, 1.0), ~known.all(0)

    def _predict_context(self, positions: torch.Tensor) -> None:
        """Inside another press's hooks: the prefill rows' predictions from one extra forward over the context."""
        if self._model is None or not self._transcript.knows_tokens(positions):
            raise RuntimeError(MISSING_IDS)
        if bool(self._transcript.confirm(positions[:, :-1])[1].all()):
            return
        context = self._transcript.tokens.gather(1, positions)
        with torch.no_grad(), hooks_suspended(self._model):
            hidden = language_model(self._model)(input_ids=context, use_cache=False)[0]
        self._transcript.store(positions, context, top1_predictions(self._model.get_output_embeddings(), hidden))

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Inside another press, record the token ids and predictions of what the model runs. The smoothers and
        the transcript outlive the wrapper's context: kvpress's pipeline prefills under one entry and decodes the
        same cache under a second; a new sequence starts afresh (a prefill at position 0 clears the transcript,
        and a prefill or another cache object starts a new smoother)."""
        self._transcript.detach()
        self._model = model
        if self.teacher_forced and not self._deferring:
            self._transcript.attach(model, self)

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        self._smoothers, self._caches = {}, {}
        self._transcript.clear()
        try:
            if not self.teacher_forced:
                with self._fused_sums(model), super().__call__(model):
                    yield
                return
            self._deferring = True
            commit = language_model(model).register_forward_hook(
                partial(self._commit_deferred, model.get_output_embeddings()), with_kwargs=True
            )
            try:
                with super().__call__(model):
                    yield
            finally:
                commit.remove()
        finally:
            self._deferring, self._deferred, self._model = False, [], None
            self._smoothers, self._caches = {}, {}
            self._transcript.clear()

    def _fused_sums(self, model: PreTrainedModel) -> AbstractContextManager[None]:
        if not self.fused_attention:
            return nullcontext()
        weights = self.correctness if isinstance(self.correctness, torch.Tensor) else None
        return fused_column_sums(model, language_model(model).layers, weights, self.lag, self.chunk_size)

    def forward_hook(self, module: nn.Module, input: list, kwargs: dict, output: list) -> list:
        if self._deferring and is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
            # Held until the logits exist; eager weights are dropped (the rows are recomputed in chunks).
            self._deferred.append((module, input, kwargs, (output[0], None)))
            return output
        return super().forward_hook(module, input, kwargs, output)

    def _commit_deferred(self, lm_head: nn.Module, stack: nn.Module, args: tuple, kwargs: dict, output) -> None:
        if not self._deferred:
            return
        layers, self._deferred = self._deferred, []
        input_ids = input_ids_of(args, kwargs)
        if input_ids is None:
            raise RuntimeError(MISSING_IDS)
        positions = row_positions(layers[0][2], input_ids.shape[1]).expand(input_ids.shape[0], -1)
        self._transcript.store(positions, input_ids, top1_predictions(lm_head, output[0]))
        for layer in layers:
            super().forward_hook(*layer)
