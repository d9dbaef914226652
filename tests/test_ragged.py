"""Batched decoding without padding: the ragged cache and attention against one sequence at a time."""

from __future__ import annotations

import copy
import weakref

import torch
from transformers import DynamicCache

from evaluation.catalogue.resolved import make_press
from evaluation.engine.decoding import decode, decode_batch
from evaluation.engine.history import History
from evaluation.engine.hooks import Compressed, cache_of
from evaluation.engine.ragged import RaggedCache
from tests.helpers import tiny_model


def listed(rows: torch.Tensor | slice) -> list[int]:
    """A group's batch rows as a list, from its index (a slice when they are consecutive)."""
    return list(range(rows.start, rows.stop)) if isinstance(rows, slice) else rows.tolist()


def random_cache(length: int, seed: int, layers: int = 2) -> Compressed:
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for layer in range(layers):
        cache.update(
            torch.randn(1, 2, length, 8, generator=generator), torch.randn(1, 2, length, 8, generator=generator), layer
        )
    return Compressed(cache, [None] * layers)


def test_a_ragged_cache_appends_after_each_group_grows_past_its_room_and_copies_its_caches():
    caches = [random_cache(5, 0), random_cache(9, 2), random_cache(5, 1)]
    originals = [cache.cache.layers[1].keys.clone() for cache in caches]
    ragged = RaggedCache.from_caches(caches, room=1)
    steps = [torch.randn(3, 2, 1, 8), torch.randn(3, 2, 2, 8)]  # the second step outgrows the room
    for step in steps:
        keys, values = ragged.update(step, -step, 1)
    assert [listed(rows) for rows in keys.rows] == [[0, 2], [1]], "equal lengths group, wherever they stand"
    for row, cache in enumerate(caches):
        group = 1 if row == 1 else 0
        view = keys.tensors[group][listed(keys.rows[group]).index(row)]
        expected = torch.cat([cache.cache.layers[1].keys[0], *(step[row] for step in steps)], dim=1)
        assert torch.equal(view, expected)
        assert torch.equal(values.tensors[group][listed(keys.rows[group]).index(row), :, -3:], -expected[:, -3:])
        assert torch.equal(cache.cache.layers[1].keys, originals[row]), "the source caches are not modified"

    ragged.keep_rows([1, 2])
    keys, _ = ragged.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8), 1)
    assert [listed(rows) for rows in keys.rows] == [[1], [0]]
    assert [tensor.shape[2] for tensor in keys.tensors] == [9, 13]
    assert torch.equal(keys.tensors[0][0, :, :5], caches[2].cache.layers[1].keys[0])

    ragged.keep_rows([1])
    assert ragged.get_seq_length(1) == 9
    assert len(ragged.layers[1].groups) == 1


def test_layers_of_one_cache_may_differ_in_length():
    """PyramidKV keeps a different number of positions in each layer: each layer groups its own lengths."""
    long, short = random_cache(6, 0), random_cache(4, 1)
    layers = [(short.cache.layers[0].keys, short.cache.layers[0].values)]
    layers.append((long.cache.layers[1].keys, long.cache.layers[1].values))
    layers = RaggedCache.from_caches([long, Compressed(cache_of(layers), [None, None])], room=1).layers
    assert [len(layer.groups) for layer in layers] == [2, 1]


def test_batched_decoding_equals_one_cache_at_a_time_whatever_the_lengths_and_stops(arch):
    """Caches in no length order, three of one length: a sequence that stops inside its group leaves the batch
    and every other decodes on as it would alone."""
    model = tiny_model(arch, "sdpa")
    generator = torch.Generator().manual_seed(7)
    context = torch.randint(3, 256, (1, 96), generator=generator)
    question = torch.randint(3, 256, (1, 4), generator=generator)
    cells = [("tova", 0.5), ("full", 0.0), ("snapkv", 0.5), ("rmm", 0.25), ("streaming_llm", 0.5)]
    history = History(model, frozenset({"context"}), [make_press(name, ratio) for name, ratio in cells])
    history.extend(context[0].tolist(), "context")
    caches = [history.compress(make_press(name, ratio)) for name, ratio in cells]
    unstopped = decode_batch(model, caches, question, 96, 10, set())
    stop = {unstopped[2][3]}  # stops the SnapKV cache early, inside the group of three 48-token caches
    batched = decode_batch(model, caches, question, 96, 10, stop)
    assert len(batched[2]) == 3
    assert len({len(tokens) for tokens in batched}) > 1, "sequences leave the batch at different steps"
    assert model.config._attn_implementation == "sdpa", "the model's attention is restored"
    assert [cache.kept_tokens for cache in caches] == [48, 96, 48, 72, 48], "the caches are not modified"
    for (name, ratio), tokens in zip(cells, batched, strict=True):
        alone = decode(model, copy.deepcopy(history.compress(make_press(name, ratio)).cache), question, 96, 10, stop)
        assert tokens == alone, name


def test_a_batch_that_takes_over_its_caches_releases_each_layer_it_copied_but_not_a_shared_cache():
    owned, shared = random_cache(5, 0), random_cache(7, 1)
    shared.owned = False  # a history's own cache, which it goes on extending
    before = shared.cache.layers[1].keys.clone()
    released = [weakref.ref(t) for layer in owned.cache.layers for t in (layer.keys, layer.values)]
    ragged = RaggedCache.from_caches([owned, shared], room=1, consume=True)
    assert all(layer.keys.numel() == layer.values.numel() == 0 for layer in owned.cache.layers)
    assert all(ref() is None for ref in released), "a released layer is freed, not pinned as a view's base"
    assert torch.equal(shared.cache.layers[1].keys, before)
    keys, _ = ragged.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8), 1)
    assert [tensor.shape[2] for tensor in keys.tensors] == [6, 8]
