"""Batched decoding without padding: the ragged cache and attention against one sequence at a time."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from evaluation.generation import decode, decode_batch
from evaluation.history import History
from evaluation.press_specs import make_press
from evaluation.ragged import RaggedCache
from tests.helpers import tiny_model


def random_cache(length: int, seed: int, layers: int = 2) -> DynamicCache:
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for layer in range(layers):
        cache.update(
            torch.randn(1, 2, length, 8, generator=generator), torch.randn(1, 2, length, 8, generator=generator), layer
        )
    return cache


def test_a_ragged_cache_appends_after_each_group_grows_past_its_room_and_copies_its_caches():
    caches = [random_cache(5, 0), random_cache(5, 1), random_cache(9, 2)]
    originals = [cache.layers[1].keys.clone() for cache in caches]
    ragged = RaggedCache.from_caches(caches, room=1)
    steps = [torch.randn(3, 2, 1, 8), torch.randn(3, 2, 2, 8)]  # the second step outgrows the room
    for step in steps:
        keys, values = ragged.update(step, -step, 1)
    assert keys.rows == [slice(0, 2), slice(2, 3)]
    for row, cache in enumerate(caches):
        group = 0 if row < 2 else 1
        view = keys.tensors[group][row - keys.rows[group].start]
        expected = torch.cat([cache.layers[1].keys[0], *(step[row] for step in steps)], dim=1)
        assert torch.equal(view, expected)
        assert torch.equal(values.tensors[group][row - keys.rows[group].start, :, -3:], -expected[:, -3:])
        assert torch.equal(cache.layers[1].keys, originals[row]), "the source caches are not modified"

    ragged.batch_select_indices(torch.tensor([1, 2]))
    keys, _ = ragged.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8), 1)
    assert keys.rows == [slice(0, 1), slice(1, 2)]
    assert [tensor.shape[2] for tensor in keys.tensors] == [9, 13]
    assert torch.equal(keys.tensors[0][0, :, :5], caches[1].layers[1].keys[0])

    ragged.batch_select_indices(torch.tensor([1]))
    assert ragged.get_seq_length(1) == 13
    assert len(ragged.layers[1].key_buffers) == 1


def test_caches_of_equal_length_must_be_adjacent():
    with pytest.raises(ValueError, match="adjacent"):
        RaggedCache.from_caches([random_cache(4, 0), random_cache(6, 1), random_cache(4, 2)], room=2)


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
    caches = [history.compress(make_press(name, ratio))[0] for name, ratio in cells]
    unstopped = decode_batch(model, caches, question, 96, 10, set())
    stop = {unstopped[2][3]}  # stops the SnapKV cache early, inside the group of three 48-token caches
    batched = decode_batch(model, caches, question, 96, 10, stop)
    assert len(batched[2]) == 3
    assert len({len(tokens) for tokens in batched}) > 1, "sequences leave the batch at different steps"
    assert model.config._attn_implementation == "sdpa", "the model's attention is restored"
    assert [cache.get_seq_length() for cache in caches] == [48, 96, 48, 72, 48], "the caches are not modified"
    for (name, ratio), tokens in zip(cells, batched, strict=True):
        alone = decode(model, history.compress(make_press(name, ratio))[0], question, 96, 10, stop)
        assert tokens == alone, name
