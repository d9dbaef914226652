"""One uncompressed prefill, extended turn by turn, and every press's cache built from it by the press's own hook.

A prefill press prunes each layer's cache only after that layer's attention, so the prefill's hidden states never
depend on the press: one full-cache prefill can serve every press and budget (LongBench), and one growing cache
every turn of a conversation (the streaming protocol). The history's cache is extended with new tokens only.
Alongside it, per layer, it keeps what the served presses' hooks read (``evaluation.catalogue.needs``): the newest
rows of the layer's input (all of them if any press reads every row), the rotary embeddings, and the column sums
of attention that H2O and RMM read instead of the (length x length) weights, which new rows only add to (per KV
head: both presses average them over each KV group's query heads). A short extension of the cache (a turn) takes
those rows from its own forward, which then runs ``fused_sdpa`` (equal to sdpa within float rounding), instead of
a second pass over the keys (``engine.fused_rows``).

``compress`` then runs a press's own forward hook on each layer's stored inputs (``engine.hooks``): the cache a
prefill of the whole history under that press would leave, decided by the press's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext

import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from transformers import DynamicCache, PreTrainedModel

from evaluation.catalogue.needs import Needs, combined, needs
from evaluation.catalogue.registry import ALL, SHARED
from evaluation.engine.fused_rows import fused_rows
from evaluation.engine.hooks import Compressed, cache_of, no_new_hooks, run_hook, run_score
from presses.harness import (
    DEFAULT_CHUNK_SIZE,
    FROM_PREDICTIONS,
    H2O_SUMS,
    ColumnSums,
    add_column_sums,
    attention_rows,
    forward_capturing,
    group_mean,
    language_model,
    random_weights,
    sliding_window,
    top1_confidence,
    top1_predictions,
)

EXTEND_CHUNK = 8192  # tokens per forward: a forward captures every layer's input for its tokens
# new rows x keys up to which an extension of a cache keeps its forward's attention rows (``fused_rows``: every
# layer's until the forward ends, 4 bytes per KV head each, 180 MiB at most on SmolLM2), so the column sums need no
# second pass of the queries over the keys; a longer extension recomputes them a chunk at a time, and the first
# forward (the prompt) runs sdpa, bit for bit the prefill a press's own pipeline runs
KEPT_ROW_ELEMENTS = 1 << 19


def evicts_nothing(press: BasePress) -> bool:
    """A press set to compression ratio 0 (a press whose ratio is known only after a forward is run)."""
    try:
        return press.compression_ratio == 0
    except (AssertionError, AttributeError, ValueError):
        return False


class History:
    """One conversation's uncompressed cache and what its served presses read, extended turn by turn.

    Rows of the ``teacher_forced_kinds`` weigh in a statistic by its correctness mode (RMM's): in teacher-forced
    column sums by their teacher-forced correctness, in confidence sums by the probability of their top-1
    prediction, in a random control's by the control's draw (``presses.random_weights``, the first extension its
    block); every other row weighs 1. ``weights`` holds each served weighting's weight of every row. ``presses``:
    the presses it will be asked to serve, or what each reads (its ``Needs``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        teacher_forced_kinds: frozenset[str],
        presses: Iterable[BasePress | Needs | None] = (),
    ) -> None:
        if not self.serves(model):
            raise ValueError(
                f"{type(model).__name__} has sliding-window attention layers, which the shared-prefill engine does not "
                "model: run such a model on the per-cell path (LongBench --path per-cell)"
            )
        served = [press if isinstance(press, Needs) else needs(press) for press in presses if press is not None]
        served = [need for need in served if need.path == SHARED]
        self.rows = combined([need.rows for need in served])
        self.statistics = sorted({s for need in served for s in need.sums}, key=repr)
        self.model, self.teacher_forced_kinds = model, teacher_forced_kinds
        self.layers = language_model(model).layers
        self.cache = DynamicCache()
        self.token_ids: list[int] = []
        weighted = [s for s in self.statistics if s.correctness in FROM_PREDICTIONS]
        self.weights: dict[str, list[float]] = {s.weighting: [] for s in weighted}  # each served weighting's
        self.seeds = {s.weighting: s.seed for s in weighted if s.seed is not None}  # the random controls'
        self.correct: list[float | None] = []  # with a random control: per row its teacher-forced correctness,
        # -1 while unknown, None for a row of a kind not teacher-forced
        self.block = 0  # the random controls' block: the rows of the first extension but its last
        self.inputs: list[torch.Tensor] = []  # per layer (batch, <= rows, hidden): the newest rows' layer input
        self.rotary: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, every row's (cos, sin)
        self.sums: dict[ColumnSums, list[torch.Tensor]] = {s: [] for s in self.statistics}  # (batch, heads, length)
        self.pending: dict[ColumnSums, dict[int, torch.Tensor]] = {}  # per layer, the newest row's share
        self.newest_logits: torch.Tensor | None = None  # (1, 1, vocab): the prediction after the newest token
        self._padded_input: torch.Tensor | None = None  # ``layer_input``'s buffer, zeros but for the newest rows
        self._newest_prediction: int | None = None
        self._pending_is_forced = False  # whether the newest row's teacher-forced weight waits for the next token
        self._random_newest: int | None = None  # the newest row's prediction, for the random controls

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @staticmethod
    def serves(model: PreTrainedModel) -> bool:
        """Whether a press's hook on stored inputs sees the model's attention (no sliding-window layer)."""
        return all(sliding_window(layer.self_attn) is None for layer in language_model(model).layers)

    def can_serve(self, press: BasePress | None) -> bool:
        """Whether this history keeps what the press's hook reads."""
        if press is None:
            return True
        need = needs(press)
        rows_kept = need.rows is not ALL and (self.rows is ALL or need.rows <= self.rows)
        return need.path == SHARED and (self.rows is ALL or rows_kept) and need.sums <= set(self.statistics)

    def extend(self, token_ids: list[int], kind: str) -> None:
        """Append tokens of one kind (e.g. "context", or "conversation", "question", "answer")."""
        self.extend_segments([(token_ids, kind)])

    def extend_segments(self, segments: list[tuple[list[int], str]]) -> None:
        """Append consecutive segments of tokens, each of one kind (a question and its answer), in as few forwards
        as ``EXTEND_CHUNK`` tokens per forward allow, so that the layer inputs a forward captures stay bounded."""
        token_ids = [token for ids, _ in segments for token in ids]
        forced = [kind in self.teacher_forced_kinds for ids, kind in segments for _ in ids]
        if self.seeds and not self.length:
            self.block = len(token_ids) - 1
            if len(token_ids) > EXTEND_CHUNK:  # the block's rows are weighed before its last forward
                self.correct = self._correctness(token_ids, forced)
        for first in range(0, len(token_ids), EXTEND_CHUNK):
            self._extend(token_ids[first : first + EXTEND_CHUNK], forced[first : first + EXTEND_CHUNK])

    @torch.no_grad()
    def _extend(self, token_ids: list[int], teacher_forced: list[bool]) -> None:
        start, model = self.length, self.model
        ids = torch.tensor([token_ids], device=model.device)
        kept_rows = (
            bool(self.statistics) and start > 0 and len(token_ids) * (start + len(token_ids)) <= KEPT_ROW_ELEMENTS
        )
        fused = fused_rows(model, self.layers, DEFAULT_CHUNK_SIZE, unpadded=True) if kept_rows else nullcontext()
        with fused as requests:
            hidden, captured = forward_capturing(model, ids, self.cache, start)
        lm_head = model.get_output_embeddings()
        new_weights = self._new_weights(lm_head, hidden, token_ids, teacher_forced)
        self.newest_logits = lm_head(hidden[:, -1:])
        self._padded_input = None
        self.token_ids += token_ids
        for mode, weights in new_weights.items():
            self.weights[mode] += weights
        for index, layer in enumerate(self.layers):
            layer_input, (cos, sin) = captured[index]
            first = index == len(self.inputs)
            if first:
                self.inputs.append(layer_input[:, :0].clone())  # not a view: it would pin the whole input
                self.rotary.append((cos[:, :0].clone(), sin[:, :0].clone()))
            kept = self.inputs[index]
            rows = layer_input.shape[1] + kept.shape[1] if self.rows is ALL else self.rows
            self.inputs[index] = torch.cat([kept, layer_input], dim=1)[:, -rows:].clone() if rows else kept
            if index and captured[index][1] is captured[0][1]:  # one rotary embedding for every layer (Llama, Qwen2)
                self.rotary[index] = self.rotary[0]
            else:
                old_cos, old_sin = self.rotary[index]
                self.rotary[index] = (torch.cat([old_cos, cos], dim=1), torch.cat([old_sin, sin], dim=1))
            if self.statistics:
                kept = requests[index].chunks if requests else []
                self._add_rows(index, layer.self_attn, layer_input, (cos, sin), start, new_weights, kept or None)
                kept.clear()  # this layer's rows are summed: free them

    def _new_weights(
        self, lm_head: torch.nn.Module, hidden: torch.Tensor, token_ids: list[int], forced: list[bool]
    ) -> dict[str, list[float]]:
        """Each served mode's weights of the new rows, from one pass over the vocabulary for the top-1 predictions
        (and probabilities) of the rows of a teacher-forced kind, the only rows whose weight they set; the previous
        newest row's teacher-forced weight, now that its next token is known, is settled. No mode served, no pass."""
        if not self.weights:
            return {}
        rows = [row for row, is_forced in enumerate(forced) if is_forced]
        predicted, confident = {}, {}
        if rows:
            selected = hidden[:, torch.tensor(rows, device=hidden.device)]
            if "confidence" in self.weights:
                ids, probabilities = top1_confidence(lm_head, selected)
                confident = dict(zip(rows, probabilities[0].tolist(), strict=True))
            else:
                ids = top1_predictions(lm_head, selected)
            predicted = dict(zip(rows, ids[0].tolist(), strict=True))
        new_weights = {}
        if "teacher_forced" in self.weights:
            next_ids = token_ids[1:]
            new_weights["teacher_forced"] = [
                float(predicted[row] == next_ids[row]) if row in predicted and row < len(next_ids) else 1.0
                for row in range(len(token_ids))
            ]
            if self._pending_is_forced:  # the previous newest row's next token is known now
                self.weights["teacher_forced"][-1] = float(self._newest_prediction == token_ids[0])
            self._newest_prediction, self._pending_is_forced = predicted.get(len(token_ids) - 1), forced[-1]
        if "confidence" in self.weights:  # known with the row's logits: nothing waits
            new_weights["confidence"] = [confident.get(row, 1.0) for row in range(len(token_ids))]
        if self.seeds:
            new_weights |= self._random_weights(predicted, token_ids)
        return new_weights

    def _random_weights(self, predicted: dict[int, int], token_ids: list[int]) -> dict[str, list[float]]:
        """Each random control's weights of the new rows (``presses.random_weights``), once their teacher-forced
        correctness, and the previous newest row's, is recorded; a row's weight reads the rows before it only."""
        start = self.length
        if self.correct and self.correct[-1] == -1 and len(self.correct) == start:
            self.correct[-1] = float(self._random_newest == token_ids[0])
        for row in range(len(self.correct) - start, len(token_ids)):  # the rows a first pass has not recorded
            following = token_ids[row + 1] if row + 1 < len(token_ids) else None
            self.correct.append(
                None if row not in predicted else -1 if following is None else float(predicted[row] == following)
            )
        self._random_newest = predicted.get(len(token_ids) - 1)
        counted = torch.tensor([[value is not None for value in self.correct]])
        correct = torch.tensor([[value or 0.0 for value in self.correct]])
        block, new = torch.tensor([self.block]), slice(start, start + len(token_ids))
        return {
            key: random_weights(correct, correct >= 0, counted, block, seed)[0][0, new].tolist()
            for key, seed in self.seeds.items()
        }

    @torch.no_grad()
    def _correctness(self, token_ids: list[int], forced: list[bool]) -> list[float | None]:
        """The teacher-forced correctness of a first extension's rows (-1 for its last, None where not forced),
        from a forward of its own, ``EXTEND_CHUNK`` tokens at a time."""
        cache, predicted, stack = DynamicCache(), [], language_model(self.model)
        for first in range(0, len(token_ids), EXTEND_CHUNK):
            ids = torch.tensor([token_ids[first : first + EXTEND_CHUNK]], device=self.model.device)
            positions = torch.arange(first, first + ids.shape[1], device=ids.device)[None]
            hidden = stack(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True)[0]
            predicted += top1_predictions(self.model.get_output_embeddings(), hidden)[0].tolist()
        following = [*token_ids[1:], None]
        return [
            None if not is_forced else -1 if after is None else float(guess == after)
            for guess, after, is_forced in zip(predicted, following, forced, strict=True)
        ]

    def _add_rows(
        self,
        index: int,
        module: torch.nn.Module,
        layer_input: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        start: int,
        new_weights: dict[str, list[float]],
        kept: list[tuple[int, torch.Tensor]] | None,
    ) -> None:
        """Add the new rows' attention (``kept`` by the forward, per KV head, else recomputed) to every statistic's
        column sums at one layer, weighted by the statistic's correctness mode; the newest teacher-forced row's
        share held apart until its next token."""
        keys = self.cache.layers[index].keys
        zeros = keys.new_zeros(1, keys.shape[1], keys.shape[2] - start, dtype=torch.float32)
        for statistic, sums in self.sums.items():
            if index == len(sums):
                sums.append(zeros[..., :0].clone())
            sums[index] = torch.cat([sums[index], zeros], dim=-1)
            held = self.pending.get(statistic, {}).pop(index, None)
            if held is not None:  # the previous newest row, now that its weight is known
                sums[index][..., : held.shape[-1]] += held * self.weights[statistic.weighting][start - 1]
        weights = {mode: torch.tensor([row_weights], device=keys.device) for mode, row_weights in new_weights.items()}
        if self._pending_is_forced:
            weights["teacher_forced"][0, -1] = 0.0
        if kept is None:  # the sums are kept per KV head, as both presses rank
            chunks = attention_rows(module, layer_input, keys, None, {"position_embeddings": rotary}).chunks
            kept = ((first, group_mean(probs, keys.shape[1])) for first, probs in chunks)
        for first, probs in kept:
            rows = torch.arange(start + first, start + first + probs.shape[2], device=keys.device)
            for statistic, sums in self.sums.items():
                weighted = weights.get(statistic.weighting)
                add_column_sums(
                    sums[index], probs, rows, statistic.lag, None if weighted is None else weighted[:, rows - start]
                )
                forced = statistic.correctness == "teacher_forced"
                if forced and self._pending_is_forced and start + first + probs.shape[2] == self.length:
                    held = torch.zeros_like(sums[index])
                    add_column_sums(held, probs[:, :, -1:], rows[-1:], statistic.lag, None)
                    self.pending.setdefault(statistic, {})[index] = held

    def column_sums(self, statistic: ColumnSums, index: int) -> torch.Tensor:
        """A statistic's sums over the whole history at one layer, the newest row counted as correct."""
        held = self.pending.get(statistic, {}).get(index)
        return self.sums[statistic][index] if held is None else self.sums[statistic][index] + held

    def layer_input(self, index: int, rows: int | None) -> torch.Tensor:
        """The layer's input over the whole history as the press's hook takes it: every row, or zeros but for the
        newest ``rows`` (the only ones the press reads)."""
        kept = self.inputs[index]
        if rows is ALL or kept.shape[1] == self.length:
            return kept
        full = self._padded_input  # one buffer for every layer and press, until the history grows
        if full is None or full.dtype != kept.dtype or full.device != kept.device:
            full = self._padded_input = kept.new_zeros(kept.shape[0], self.length, kept.shape[2])
        else:
            full[:, -kept.shape[1] :] = 0  # what an earlier call wrote
        if rows:
            full[:, -rows:] = kept[:, -rows:]
        return full

    def compress(self, press: BasePress | None) -> Compressed:
        """The press's cache of the whole history (the history's own cache for ``None``, the full cache: callers
        must not extend it), each layer decided by the press's own hook."""
        if press is None or evicts_nothing(press):
            return Compressed(self.cache, [None] * len(self.layers), owned=False)
        layers, masks = [], []
        for kept_keys, kept_values, mask in self._per_layer(press, run_hook):
            layers.append((kept_keys, kept_values))
            masks.append(mask)
        return Compressed(cache_of(layers), masks)

    def scores(self, press: ScorerPress) -> list[torch.Tensor]:
        """The scorer's own score of every position of the history, per layer (batch, num_kv_heads, length), from
        what its hook would read at the end of a prefill of the whole history."""
        return list(self._per_layer(press, run_score))

    def _per_layer(self, press: BasePress, call: Callable) -> Iterator:
        """``call(press, module, keys, values, hidden, rotary, weights, sums)`` layer by layer, on the inputs the
        press's hook reads."""
        if not self.can_serve(press):
            raise ValueError(f"{press!r} reads more than this history keeps: give it its own prefill")
        need = needs(press)
        with no_new_hooks(self.model):  # what post_init_from_model hooks on the model (RMM's transcript) goes after
            press.post_init_from_model(self.model)
            for index, layer in enumerate(self.layers):
                module = layer.self_attn
                module.rotary_emb = language_model(self.model).rotary_emb  # as KVPress's context manager sets it
                sums = {statistic: self.column_sums(statistic, index) for statistic in need.sums}
                keys, values = self.cache.layers[index].keys, self.cache.layers[index].values
                weights = None  # H2O's sums as a one-row stand-in for the eager weights, one copy per query head
                if need.reads_weights:
                    heads = module.config.num_attention_heads // keys.shape[1]
                    weights = sums[H2O_SUMS].repeat_interleave(heads, 1)[:, :, None]
                hidden = self.layer_input(index, need.rows)
                yield call(press, module, keys, values, hidden, self.rotary[index], weights, sums)
