"""One uncompressed prefill and what every press scores it from: the engine behind both protocols.

A prefill press prunes each layer's cache only after that layer's attention, so a prefill's hidden states
never depend on the press. One full-cache prefill can therefore serve every press and budget (LongBench's
shared path), and one growing cache can serve every turn of a conversation (LoCoMo's stream).

The history's KV cache is extended with new tokens only; it is never re-prefilled. Alongside it, per layer,
what every served press scores the *whole* history from stays up to date, since new rows only add to it:

- one ``presses.smoother.Smoother`` per demonstrated-utility definition in use: KVPress's H2O column sums
  (``lag=None``, uniform weights) for ``ObservedAttentionPress``, and one per RMM lag and weighting;
- the last ``RECENT_ROWS`` rows' layer inputs and rotary embeddings, from which SnapKV recomputes its
  window's attention and TOVA the newest row's.

``compress`` then builds, for one press at one budget, the cache a full re-prefill of the history under
that press would have produced, with the press's own scoring rule. ``supports`` says which presses' scores
read nothing else; any other press needs its own prefill.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from kvpress import ScorerPress
from kvpress.presses.base_press import BasePress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache, PreTrainedModel

from evaluation.press_specs import reads
from presses.attention import attention_rows, group_mean, sliding_window
from presses.ordered_scorer_press import OrderedScorerPress
from presses.smoother import Smoother
from presses.teacher_forcing import top1_predictions

RECENT_ROWS = 128  # > SnapKV's default observation window of 64 (it needs one more row than its window)
H2O_SUMS = (None, False)  # the smoother definition (lag, teacher-forced) whose utility is H2O's column sums

SmootherKey = tuple[int | None, bool]


def smoother_key(press: BasePress | None) -> SmootherKey | None:
    """Which smoother a press scores from: RMM its own (lag, weighting), ``ObservedAttentionPress`` H2O's sums."""
    kind = reads(press)
    if kind == "smoother":
        return press.lag, press.teacher_forced
    return H2O_SUMS if kind == "column_sums" else None


@dataclass
class LayerStatistics:
    smoothers: dict[SmootherKey, Smoother]
    recent_hidden: torch.Tensor | None = None  # (batch, <= RECENT_ROWS, hidden): the layer input of the newest rows
    recent_cos: torch.Tensor | None = None  # (batch, <= RECENT_ROWS, head_dim)
    recent_sin: torch.Tensor | None = None


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


class History:
    """One conversation's uncompressed cache plus the press statistics, extended turn by turn.

    Rows of the ``teacher_forced_kinds`` take their teacher-forced correctness as RMM weight (the paper's
    protocol: only the rows of answer tokens); every other row weighs 1. ``presses``: the presses it will be
    asked to serve (their smoothers are kept up to date from the first token on).
    """

    def __init__(
        self, model: PreTrainedModel, teacher_forced_kinds: frozenset[str], presses: Iterable[BasePress | None] = ()
    ) -> None:
        if not self.serves(model):
            raise ValueError(
                f"{type(model).__name__} has sliding-window attention layers, which the shared-prefill engine does not "
                "model: run such a model on the per-cell path (LongBench --path per-cell)"
            )
        self.model = model
        self.teacher_forced_kinds = teacher_forced_kinds
        self.smoother_keys = sorted({H2O_SUMS} | {key for press in presses if (key := smoother_key(press))}, key=str)
        self.cache = DynamicCache()
        self.token_ids: list[int] = []
        self.weights: list[float] = []
        self.layers: list[LayerStatistics] = []
        self.newest_logits: torch.Tensor | None = None  # (1, 1, vocab): the prediction after the newest token
        self._newest_prediction: int | None = None  # its argmax, awaiting the next token
        self._pending_is_forced = False  # whether the newest row's weight waits for the next token

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @torch.no_grad()
    def extend(self, token_ids: list[int], kind: str) -> None:
        """Append tokens of one kind (e.g. "context", or "conversation", "question", "answer") and update
        every statistic."""
        start = self.length
        ids = torch.tensor([token_ids], device=self.model.device)
        hidden, captured = forward_capturing_layer_inputs(self.model, ids, self.cache, start)

        # Row t's weight is its teacher-forced correctness (does its argmax equal token t + 1?) for the
        # teacher-forced kinds, else 1; the newest row's next token is unknown until the next extension, so it
        # counts as correct until then (``Smoother.revise``).
        teacher_forced = kind in self.teacher_forced_kinds
        lm_head = self.model.get_output_embeddings()
        predicted = top1_predictions(lm_head, hidden)[0].tolist()
        correct = [float(p == t) for p, t in zip(predicted[:-1], token_ids[1:], strict=True)] + [1.0]
        new_weights = correct if teacher_forced else [1.0] * len(token_ids)
        if self._pending_is_forced:
            self.weights[-1] = float(self._newest_prediction == token_ids[0])
        self.newest_logits = lm_head(hidden[:, -1:])
        self._newest_prediction, self._pending_is_forced = predicted[-1], teacher_forced
        self.token_ids += token_ids
        self.weights += new_weights

        positions = torch.arange(start, self.length, device=self.model.device)[None]
        weights = torch.tensor([new_weights], device=self.model.device)
        unconfirmed = torch.zeros(len(token_ids), dtype=torch.bool)
        unconfirmed[-1] = teacher_forced

        def confirm(_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            revised = torch.tensor([[self.weights[start - 1]]])
            return revised, torch.ones_like(revised, dtype=torch.bool)

        for index, layer in enumerate(self.model.model.layers):
            layer_input, (cos, sin) = captured[index]
            keys = self.cache.layers[index].keys
            if index == len(self.layers):
                none = positions[:, None, :0].expand(-1, keys.shape[1], -1)
                self.layers.append(LayerStatistics({key: Smoother.start(key[0], none) for key in self.smoother_keys}))
            statistics = self.layers[index]
            for smoother in statistics.smoothers.values():
                smoother.revise(confirm)
                smoother.append(positions[:, None, :].expand(-1, keys.shape[1], -1))
            rows = attention_rows(layer.self_attn, layer_input, keys, None, {"position_embeddings": (cos, sin)})
            for first, probs in rows.chunks:
                span = slice(first, first + probs.shape[2])
                grouped = group_mean(probs, keys.shape[1])
                for (_, forced), smoother in statistics.smoothers.items():
                    row_weights = weights[:, span] if forced else torch.ones_like(weights[:, span])
                    smoother.observe(positions[:, span], row_weights, grouped, None, unconfirmed[span] & forced)
            if statistics.recent_hidden is not None:
                layer_input = torch.cat([statistics.recent_hidden, layer_input], dim=1)
                cos, sin = (
                    torch.cat([statistics.recent_cos, cos], dim=1),
                    torch.cat([statistics.recent_sin, sin], dim=1),
                )
            statistics.recent_hidden = layer_input[:, -RECENT_ROWS:]
            statistics.recent_cos, statistics.recent_sin = cos[:, -RECENT_ROWS:], sin[:, -RECENT_ROWS:]

    @staticmethod
    def serves(model: PreTrainedModel) -> bool:
        """Whether the engine's plain causal statistics are the model's attention (no sliding-window layer)."""
        return all(sliding_window(layer.self_attn) is None for layer in model.model.layers)

    @staticmethod
    def supports(press: BasePress | None) -> bool:
        """Whether the press's score reads only what a history keeps (``press_specs.reads``); SnapKV with a
        window of ``RECENT_ROWS`` or more does not."""
        kind = reads(press)
        return (
            press is None
            or kind in ("nothing", "newest_row", "column_sums", "smoother")
            or (kind == "window" and press.window_size < RECENT_ROWS)
        )

    def scores(self, press: ScorerPress, layer: int) -> torch.Tensor:
        """The press's own scores over the whole history, (batch, num_kv_heads, length)."""
        module = self.model.model.layers[layer].self_attn
        statistics = self.layers[layer]
        keys, values = self.cache.layers[layer].keys, self.cache.layers[layer].values
        kind = reads(press)
        if kind == "smoother":
            return statistics.smoothers[smoother_key(press)].scores()
        if kind == "column_sums":
            # its score reads only attentions.sum(2): the running column sums (one row) stand for the full matrix
            sums = statistics.smoothers[H2O_SUMS].utility.unsqueeze(2)
            return press.score(module, None, keys, values, sums, {})
        kwargs = {"position_embeddings": (statistics.recent_cos, statistics.recent_sin)}
        return press.score(module, statistics.recent_hidden, keys, values, None, kwargs)

    def compress(self, press: ScorerPress | None) -> tuple[DynamicCache, list[torch.Tensor]]:
        """A compressed copy for answering (a full copy when ``press`` is None), and the kept indices per layer.
        The press keeps its own selection rule; kept keys keep their original positions."""
        key = smoother_key(press)
        if not self.supports(press) or (key is not None and key not in self.smoother_keys):
            raise ValueError(f"{press!r} reads more than this history keeps: give it its own prefill")
        compressed, kept_per_layer = DynamicCache(), []
        for layer in range(len(self.cache.layers)):
            keys, values = self.cache.layers[layer].keys, self.cache.layers[layer].values
            if press is None or press.compression_ratio == 0:
                kept = torch.arange(self.length).expand(1, keys.shape[1], -1)
            else:
                scores = self.scores(press, layer)
                n_kept = compute_n_kept(self.length, press.compression_ratio)
                if reads(press) == "smoother":
                    self.layers[layer].smoothers[key].check_budget(n_kept)
                # each press keeps its own selection rule: ours in position order, KVPress's ScorerPress by topk
                kept = (
                    press.select(scores, n_kept)
                    if isinstance(press, OrderedScorerPress)
                    else scores.topk(n_kept).indices
                )
            gather = kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            compressed.update(keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous(), layer)
            kept_per_layer.append(kept)
        return compressed, kept_per_layer
