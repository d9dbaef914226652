"""One smoother per layer following the cache RMM scores, whoever evicts (docs/presses.md).

A prefill is observed whole, once per forward, from the layer's own input; while decoding, the rows handed in
(``DecodingPress``'s buffer). A cache met for the first time while decoding has its prefix replayed (KVPress's
pipeline prefills outside ``DecodingPress``); a cache cropped back for a new question drops the cropped slots; when
someone else evicted, the key fingerprints say which slots survived. Column sums someone computed already (a fused
prefill, a caller's shared prefill) are handed over (``hand``) and read instead of the attention rows.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from presses.attention import (
    attention_rows,
    group_mean,
    is_prefilling,
    newest_host_positions,
    recomputed_keys,
    row_positions,
)
from presses.fingerprints import key_marks
from presses.prefix import replay, token_ids_of
from presses.row_weights import RowWeights, prefill_block
from presses.smoother import UNKNOWN, Smoother


class CacheFollower:
    """Each layer's smoother at commit lag ``lag`` and the cache it follows, the rows' weights from ``weights``,
    attention rows recomputed ``chunk_size`` at a time."""

    def __init__(self, lag: int | None, chunk_size: int, weights: RowWeights) -> None:
        self.lag, self.chunk_size, self.weights = lag, chunk_size, weights
        self.smoothers: dict[int, Smoother] = {}
        self.caches: dict[int, weakref.ref] = {}
        self.prefix: dict = {}
        self.handed: dict[int, torch.Tensor] = {}

    def clear(self) -> None:
        """Forget every cache followed (a new context of the press)."""
        self.smoothers, self.caches, self.prefix = {}, {}, {}

    def hand(self, layer_idx: int, sums: torch.Tensor | None) -> None:
        """Column sums (batch, num_heads, k_len) for the layer's next prefill over k_len keys (None: take them
        back)."""
        if sums is None:
            self.handed.pop(layer_idx, None)
        else:
            self.handed[layer_idx] = sums

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
        known = self.caches.get(layer)
        smoother = self.smoothers.get(layer) if known is not None and known() is cache else None
        if prefilling and (smoother is None or smoother.source() is not rows):  # a new forward: observe it whole
            full = keys if k_len == n_rows else recomputed_keys(module, rows, kwargs)
            smoother = Smoother.start(self.lag, positions[:, None].expand(-1, num_kv_heads, -1), key_marks(full))
            self.weights.start(prefill_block(kwargs, batch, held))
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
        self.smoothers[layer] = smoother
        self.caches[layer] = weakref.ref(cache) if cache is not None else lambda: None
        if smoother.size == k_len and (not prefilling or k_len == n_rows):
            return smoother, torch.arange(k_len, device=keys.device).expand(batch, num_kv_heads, -1)
        return smoother, smoother.locate(key_marks(keys))  # a subset of what was observed (a wrapper's choice)

    def _observe_rows(
        self, module, smoother, hidden_states, keys, attentions, kwargs, positions, held, prefilling
    ) -> None:
        """Observe the rows of ``hidden_states`` at ``positions`` that ``smoother`` has not seen yet; ``held``: the
        first sequence's positions of those rows, on the host."""
        smoother.revise(self.weights.confirmation(), self.weights.settled_at)
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
        weights, unconfirmed = self.weights.at(positions[:, -n_new:], prefilling, observed)
        rows = attention_rows(module, hidden_states, keys, attentions, kwargs, n_new, self.chunk_size)
        for first, probs in rows.chunks:
            span = slice(first, first + probs.shape[2])
            valid = None if rows.valid is None else rows.valid[:, span]
            settled = [row - first for row in unconfirmed if span.start <= row < span.stop]
            grouped = group_mean(probs, keys.shape[1])
            smoother.observe(positions[:, -n_new:][:, span], weights[:, span], grouped, valid, settled, observed[span])

    def _handed_sums(self, layer_idx: int, k_len: int) -> torch.Tensor | None:
        """The sums handed for the layer over ``k_len`` keys, taken; None if none."""
        sums = self.handed.get(layer_idx)
        if sums is None or sums.shape[-1] != k_len:
            return None
        return self.handed.pop(layer_idx)

    def _observe_prefix(self, module, smoother, keys, kwargs, positions, held: list[int]) -> None:
        """A decoding cache met for the first time: replay its older positions, which this press never saw
        (KVPress's pipeline prefills outside ``DecodingPress``), from layer 0's values, and observe their rows.
        A prefix another press compressed cannot be replayed: it starts unobserved."""
        first, cache, model = held[0], kwargs["past_key_values"], self.weights.model
        if model is None or held[-1] + 1 != keys.shape[2]:
            warnings.warn(
                "RMMPress meets a compressed cache it never saw: its older positions start unobserved", stacklevel=3
            )
            return
        if self.prefix.get("cache") is not cache or module.layer_idx not in self.prefix["captured"]:
            ids = token_ids_of(model, cache.layers[0].values[:, :, :first])
            captured, hidden = replay(model, ids)
            self.weights.transcript.store(model, ids, hidden)
            self.weights.start((first - 1,) * keys.shape[0])
            self.prefix = {"cache": cache, "captured": captured}
        hidden, rotary = self.prefix["captured"].pop(module.layer_idx)
        rows = torch.arange(first, device=keys.device).expand(keys.shape[0], -1)
        kwargs = {"position_embeddings": rotary, "position_ids": rows[:1]}
        self._observe_rows(module, smoother, hidden, keys[:, :, :first], None, kwargs, rows, list(range(first)), False)
