"""One uncompressed prefill and what every press scores it from: the engine behind both protocols.

A prefill press prunes each layer's cache only after that layer's attention, so a prefill's hidden states
never depend on the press. One full-cache prefill can therefore serve every press and budget (LongBench's
shared path), and one growing cache can serve every turn of a conversation (LoCoMo's stream).

The history's KV cache is extended with new tokens only; it is never re-prefilled. Alongside it,
per layer, the statistics every press needs to score the *whole* history stay up to date:

- column sums of attention over all rows (H2O / ``ObservedAttentionPress``), since new rows only add to them;
- the same sums with RMM's row weights;
- the last ``RECENT_ROWS`` rows' layer inputs and rotary embeddings, from which SnapKV recomputes its
  window's attention and TOVA the newest row's.

``compress`` then builds, for one press at one budget, the cache a full re-prefill of the history under
that press would have produced, by handing the press's own ``score`` these statistics. ``supports`` says
which presses' scores read nothing else; any other press needs its own prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress import ObservedAttentionPress, ScorerPress, SnapKVPress, StreamingLLMPress
from kvpress import TOVAPress as KVPressTOVAPress
from kvpress.presses.base_press import BasePress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache, PreTrainedModel

from presses import RMMPress, TOVAPress
from presses.attention import attention_column_sums, recomputed_column_sums
from presses.ordered_scorer_press import OrderedScorerPress, kept_indices
from presses.teacher_forcing import teacher_forced_correctness

RECENT_ROWS = 128  # > SnapKV's default observation window of 64 (it needs one more row than its window)


@dataclass
class LayerStatistics:
    column_sums: torch.Tensor  # (batch, num_heads, length): sum over every row of a(t -> k)
    weighted_sums: torch.Tensor  # (batch, num_heads, length): sum over every row of w(t) a(t -> k)
    newest_row: torch.Tensor  # (batch, num_heads, length): the newest row's attention (to revise its weight)
    recent_hidden: torch.Tensor  # (batch, <= RECENT_ROWS, hidden): the layer input of the newest rows
    recent_cos: torch.Tensor  # (batch, <= RECENT_ROWS, head_dim)
    recent_sin: torch.Tensor


LayerInput = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]  # hidden states, rotary (cos, sin)


@torch.no_grad()
def forward_capturing_layer_inputs(
    model: PreTrainedModel, ids: torch.Tensor, cache: DynamicCache, start: int
) -> tuple[torch.Tensor, dict[int, LayerInput]]:
    """Run the decoder stack over ``ids`` at positions ``start`` onwards, extending ``cache``; returns the final
    hidden states and, per layer index, the attention layer's input and rotary embeddings."""
    captured: dict[int, LayerInput] = {}

    def capture(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"])

    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in model.model.layers]
    try:
        positions = torch.arange(start, start + ids.shape[1], device=model.device).unsqueeze(0)
        hidden = model.model(input_ids=ids, past_key_values=cache, position_ids=positions)[0]
    finally:
        for hook in hooks:
            hook.remove()
    return hidden, captured


def _grow(sums: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Zero-pad the key axis of earlier sums to the new history length."""
    return None if sums is None else torch.nn.functional.pad(sums, (0, length - sums.shape[-1]))


class History:
    """One conversation's uncompressed cache plus the press statistics, extended turn by turn.

    Rows of the ``teacher_forced_kinds`` take their teacher-forced correctness as RMM weight (the paper's
    protocol: only the rows of answer tokens); every other row weighs 1.
    """

    def __init__(self, model: PreTrainedModel, teacher_forced_kinds: frozenset[str]) -> None:
        self.model = model
        self.teacher_forced_kinds = teacher_forced_kinds
        self.cache = DynamicCache()
        self.token_ids: list[int] = []
        self.weights: list[float] = []
        self.layers: list[LayerStatistics] = []
        self.newest_logits: torch.Tensor | None = None  # (1, 1, vocab): the prediction after the newest token
        self._newest_prediction: int | None = None  # its argmax, awaiting the next token
        self._newest_teacher_forced = False

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @torch.no_grad()
    def extend(self, token_ids: list[int], kind: str) -> None:
        """Append tokens of one kind (e.g. "context", or "conversation", "question", "answer") and update
        every statistic."""
        start, attention = self.length, [layer.self_attn for layer in self.model.model.layers]
        ids = torch.tensor([token_ids], device=self.model.device)
        hidden, captured = forward_capturing_layer_inputs(self.model, ids, self.cache, start)

        # Row t's weight is its teacher-forced correctness (does its argmax equal token t + 1?) for the
        # teacher-forced kinds, else 1; the newest row's next token is unknown until the next extension.
        teacher_forced = kind in self.teacher_forced_kinds
        correct = teacher_forced_correctness(self.model.get_output_embeddings(), hidden, ids)[0].tolist()
        new_weights = correct if teacher_forced else [1.0] * len(token_ids)
        revise = self._newest_teacher_forced and self._newest_prediction != token_ids[0]
        if revise:
            self.weights[-1] = 0.0
        self.newest_logits = self.model.get_output_embeddings()(hidden[:, -1:])
        self._newest_prediction = int(self.newest_logits.argmax())
        self._newest_teacher_forced = teacher_forced
        self.token_ids += token_ids
        self.weights += new_weights
        # the plain sums, and the weighted ones unless every new row weighs 1: both from one pass over the rows
        weightings: list[torch.Tensor | None] = [None]
        if any(w != 1.0 for w in new_weights):
            weightings.append(torch.tensor([new_weights], device=self.model.device))

        for index, module in enumerate(attention):
            layer_input, (cos, sin) = captured[index]
            keys = self.cache.layers[index].keys
            kwargs = {"position_embeddings": (cos, sin)}
            both = recomputed_column_sums(module, layer_input, keys, kwargs, weightings)
            sums, weighted = both[0].float(), both[-1].float()
            newest = attention_column_sums(module, layer_input, keys, None, kwargs, n_rows=1).float()
            if index < len(self.layers):
                previous = self.layers[index]
                sums = sums + _grow(previous.column_sums, self.length)
                weighted = weighted + _grow(previous.weighted_sums, self.length)
                if revise:
                    weighted = weighted - _grow(previous.newest_row, self.length)
                layer_input = torch.cat([previous.recent_hidden, layer_input], dim=1)
                cos, sin = torch.cat([previous.recent_cos, cos], dim=1), torch.cat([previous.recent_sin, sin], dim=1)
            statistics = LayerStatistics(
                sums, weighted, newest, layer_input[:, -RECENT_ROWS:], cos[:, -RECENT_ROWS:], sin[:, -RECENT_ROWS:]
            )
            if index < len(self.layers):
                self.layers[index] = statistics
            else:
                self.layers.append(statistics)

    @staticmethod
    def supports(press: BasePress | None) -> bool:
        """Whether the press's score reads only what the history keeps (exact types: a subclass may read more).

        RMM with a commit lag or supplied weights, and SnapKV with a window of ``RECENT_ROWS`` or more, do not.
        """
        if press is None or type(press) in (ObservedAttentionPress, StreamingLLMPress, TOVAPress, KVPressTOVAPress):
            return True
        if type(press) is SnapKVPress:
            return press.window_size < RECENT_ROWS
        return type(press) is RMMPress and press.lag is None and isinstance(press.correctness, str)

    def scores(self, press: ScorerPress, layer: int) -> torch.Tensor:
        """The press's own scores over the whole history, (batch, num_kv_heads, length)."""
        module = self.model.model.layers[layer].self_attn
        statistics = self.layers[layer]
        keys, values = self.cache.layers[layer].keys, self.cache.layers[layer].values
        if isinstance(press, RMMPress):
            sums = statistics.weighted_sums if press.teacher_forced else statistics.column_sums
            return press.demonstrated_utility(sums.to(keys.dtype), self.length, keys.shape[1])
        if isinstance(press, ObservedAttentionPress):
            # its score reads only attentions.sum(2): the running column sums stand for the full matrix
            return press.score(module, None, keys, values, statistics.column_sums.to(keys.dtype).unsqueeze(2), {})
        kwargs = {"position_embeddings": (statistics.recent_cos, statistics.recent_sin)}
        return press.score(module, statistics.recent_hidden, keys, values, None, kwargs)

    def compress(self, press: ScorerPress | None) -> tuple[DynamicCache, list[torch.Tensor]]:
        """A compressed copy for answering (a full copy when ``press`` is None), and the kept indices per layer.
        The press keeps its own selection rule; kept keys keep their original positions."""
        if not self.supports(press):
            raise ValueError(f"{type(press).__name__} reads more than the history keeps: give it its own prefill")
        compressed, kept_per_layer = DynamicCache(), []
        for layer in range(len(self.cache.layers)):
            keys, values = self.cache.layers[layer].keys, self.cache.layers[layer].values
            if press is None or press.compression_ratio == 0:
                kept = torch.arange(self.length).expand(1, keys.shape[1], -1)
            else:
                scores = self.scores(press, layer)
                n_kept = compute_n_kept(self.length, press.compression_ratio)
                # each press keeps its own selection rule: ours in position order, KVPress's ScorerPress by topk
                kept = (
                    kept_indices(scores, n_kept)
                    if isinstance(press, OrderedScorerPress)
                    else scores.topk(n_kept).indices
                )
            gather = kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            compressed.update(keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous(), layer)
            kept_per_layer.append(kept)
        return compressed, kept_per_layer
