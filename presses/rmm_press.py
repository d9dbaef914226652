from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
from kvpress.presses.base_press import is_prefilling
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from presses.attention import DEFAULT_CHUNK_SIZE, attention_column_sums, group_mean, rows_per_key
from presses.fused_attention import fused_column_sums, take_fused_sums
from presses.ordered_scorer_press import OrderedScorerPress
from presses.teacher_forcing import hooks_suspended, input_ids_of, language_model, teacher_forced_correctness

CORRECTNESS_MODES = ("teacher_forced", "uniform")
MISSING_IDS = (
    "RMMPress(correctness='teacher_forced') could not see the context's token ids: the model was called with "
    "inputs_embeds, or RMMPress runs inside a press that never calls post_init_from_model (such as "
    "PerLayerCompressionPress). Use correctness='uniform' or supply per-position weights."
)


@dataclass
class RMMPress(OrderedScorerPress):
    """RMM: fixed-lag smoothing with demonstrated utility.

    "Eviction as Estimation: A Fixed-Lag Smoothing View of Test-Time Memory" (sections 4, 5 and 8).

    The rule: a cached position k scores its demonstrated utility

        score(k) = sum_{t >= k, t - k <= H} w(t) * a(t -> k)  /  #{t >= k, t - k <= H},

    averaged over the query heads of each KV group, where a(t -> k) is the attention from query row t to
    position k and w(t) is the teacher-forced correctness of row t: 1 if the model's top-1 prediction at t is
    the actual token t + 1, else 0 (the last row, whose next token is unknown, weighs 1). The last H positions
    are provisional: never evicted. This is ``ObservedAttentionPress``'s score except for w(t); with uniform
    weights and no lag it keeps exactly what ``ObservedAttentionPress`` keeps.

    The weights come from the same prefill: used as a press on its own, RMMPress defers every layer's
    compression to the end of the model's forward, where the final hidden states (hence the logits) are
    known; a prefill press only prunes the cache after each layer's attention, so deferring changes no hidden
    state. Inside another press's hooks (``AdaKVPress``, ``KeyRerotationPress``, ``ComposedPress``), where
    that deferral cannot apply, the weights come from one extra forward pass over the context. During
    decoding compression (``DecodingPress``) the scored rows were produced by greedy decoding, so they are
    correct by construction and weigh 1.

    Without eager attention weights, the weighted column sums are computed chunk by chunk from the layer's
    queries and keys in O(chunk_size x length) memory per head.

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the cache to evict, in [0, 1).
    lag : int or None, default=None
        The commit lag H. With H, only rows t in [k, k + H] count towards k and the last H positions are
        provisional. None: every later row counts and nothing is provisional (H -> infinity).
    correctness : "teacher_forced", "uniform", or per-position weights, default="teacher_forced"
        The row weights w(t): the model's own teacher-forced correctness, all ones, or one non-negative weight
        per cached position (shape (length,) or (batch, length)) supplied by the caller.
    chunk_size : int, default=64
        Query rows per chunk when the sums are recomputed without eager attention weights.
    fused_attention : bool, default=False
        Under sdpa, compute each layer's prefill attention output and the sums in one chunked pass
        (``presses.fused_attention``) instead of sdpa followed by a second pass over every query-key product:
        scoring then costs little more than the attention itself, but the layer's output comes from that
        chunked pass, equal to sdpa's within float rounding rather than bit for bit. Needs the weights before
        the forward, so only with uniform or per-position correctness; only when RMMPress is the press the
        model runs under (inside a wrapper press the sums are recomputed).
    """

    compression_ratio: float = 0.0
    lag: int | None = None
    correctness: str | torch.Tensor | Sequence[float] = "teacher_forced"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fused_attention: bool = False

    _weights: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _deferring: bool = field(default=False, init=False, repr=False, compare=False)
    _deferred: list = field(default_factory=list, init=False, repr=False, compare=False)
    _model: PreTrainedModel | None = field(default=None, init=False, repr=False, compare=False)
    _context_ids: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _capture: list[RemovableHandle] = field(default_factory=list, init=False, repr=False, compare=False)

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
        k_len = keys.shape[2]
        n_rows = attentions.shape[2] if attentions is not None else hidden_states.shape[1]
        weights = self.row_weights(n_rows, k_len, kwargs, keys.device)
        sums = take_fused_sums(module, k_len) if attentions is None else None
        if sums is None:
            sums = attention_column_sums(
                module, hidden_states, keys, attentions, kwargs, n_rows, weights, self.lag, self.chunk_size
            )
        return self.demonstrated_utility(sums, n_rows, keys.shape[1])

    def demonstrated_utility(self, sums: torch.Tensor, n_rows: int, num_kv_heads: int) -> torch.Tensor:
        """The rule, from weighted column sums (batch, num_heads, k_len) over the last ``n_rows`` rows.

        Each sum is divided by the number of rows that could attend its key, averaged over each KV group, and
        the last ``lag`` positions (the provisional buffer) score +inf. Returns (batch, num_kv_heads, k_len).
        """
        counts = rows_per_key(sums.shape[-1], n_rows, self.lag, sums.device).to(sums.dtype)
        scores = group_mean(sums / counts, num_kv_heads)
        if self.lag:
            scores[..., -self.lag :] = float("inf")
        return scores

    def row_weights(self, n_rows: int, k_len: int, kwargs: dict, device: torch.device) -> torch.Tensor | None:
        """w(t) for the last ``n_rows`` rows, shape (batch, n_rows); None when every row weighs 1."""
        if isinstance(self.correctness, torch.Tensor):
            if self.correctness.shape[-1] != k_len:
                raise ValueError(
                    f"RMMPress has {self.correctness.shape[-1]} per-position weights but the cache holds {k_len} "
                    "positions: supply exactly one weight per position of the compressed sequence."
                )
            return self.correctness[:, k_len - n_rows :].to(device)
        if self.correctness == "uniform" or not is_prefilling(
            kwargs["cache_position"], kwargs["hidden_states"].shape[1]
        ):
            return None
        if self._weights is None:
            self._weights = self._pre_pass_weights()
        return self._weights[:, k_len - n_rows :].to(device)

    def _pre_pass_weights(self) -> torch.Tensor:
        if self._model is None or self._context_ids is None:
            raise RuntimeError(MISSING_IDS)
        with torch.no_grad(), hooks_suspended(self._model):
            hidden = language_model(self._model)(input_ids=self._context_ids, use_cache=False)[0]
        return teacher_forced_correctness(self._model.get_output_embeddings(), hidden, self._context_ids)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Inside another press, watch the next forward of the decoder stack for its token ids."""
        self._release_capture()
        if not self.teacher_forced or self._deferring:
            return
        self._model = model
        stack = language_model(model)
        self._capture = [
            stack.register_forward_pre_hook(self._capture_ids, with_kwargs=True),
            stack.register_forward_hook(lambda *_: self._release_capture()),
        ]

    def _capture_ids(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._context_ids, self._weights = input_ids_of(args, kwargs), None

    def _release_capture(self) -> None:
        for handle in self._capture:
            handle.remove()
        self._capture, self._model, self._context_ids, self._weights = [], None, None, None

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
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
            self._deferring, self._deferred, self._weights = False, [], None

    def _fused_sums(self, model: PreTrainedModel) -> AbstractContextManager[None]:
        if not self.fused_attention:
            return nullcontext()
        weights = self.correctness if isinstance(self.correctness, torch.Tensor) else None
        return fused_column_sums(model, language_model(model).layers, weights, self.lag, self.chunk_size)

    def forward_hook(self, module: nn.Module, input: list, kwargs: dict, output: list) -> list:
        if self._deferring and is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
            # Held until the logits exist; eager weights are dropped (the sums are recomputed in chunks).
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
        self._weights = teacher_forced_correctness(lm_head, output[0], input_ids)
        try:
            for layer in layers:
                super().forward_hook(*layer)
        finally:
            self._weights = None
