"""The GPU code paths on this CPU: one and two virtual devices (``tests.virtual_devices``), every tensor's device
checked as CUDA checks it, host syncs counted. Each path predicts what it predicts on the plain CPU."""

from __future__ import annotations

import json

import pytest
import torch
from kvpress import DecodingPress
from transformers import DynamicCache

from evaluation.catalogue.budgets import Budget, press_cells, ratio_for
from evaluation.catalogue.resolved import make_press, resolve_presses
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.engine.decoding import decode_batch, generate
from evaluation.engine.history import History
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.conversation import ConversationRun
from evaluation.protocols.streaming.protocol import row_key
from evaluation.protocols.traces.record import record
from evaluation.runs.store import MemoryStore
from presses import RMMPress, TOVAPress
from tests.helpers import CHAT_TEMPLATE, byte_tokenizer, tiny_model
from tests.test_locomo_protocol import CONVERSATION
from tests.virtual_devices import place, virtual_devices

DEVICES = [1, 2]
CONTEXT = torch.randint(3, 256, (1, 96), generator=torch.Generator().manual_seed(3))
QUESTION = torch.randint(3, 256, (1, 4), generator=torch.Generator().manual_seed(4))
SHARED = [*DEFAULT_PRESSES, "rmm(lag=8)", "adakv(snapkv)", "pyramidkv(window_size=8)", "knorm"]
STREAMED = [*SHARED, "tests.helpers:OwnPrefillKnorm"]  # the last re-prefills the history before each question


def on_devices(arch: str, devices: int | None, attention: str = "sdpa"):
    model = tiny_model(arch, attention, hidden_size=256 if attention == "sdpa" else 64, head_dim=64)
    return model if devices is None else place(model, devices)


def shared_grid(model) -> list[list[int]]:
    cells = press_cells(resolve_presses(SHARED), [Budget("ratio", 0.5)], "")
    presses = [cell.press.build(ratio_for(cell.budget, CONTEXT.shape[1])) for cell in cells]
    history = History(model, frozenset({"context"}), presses)
    history.extend(CONTEXT[0].tolist(), "context")
    caches = [history.compress(press) for press in presses]
    return decode_batch(model, caches, QUESTION.to(model.device), history.length, 6, set())


@pytest.mark.parametrize("devices", DEVICES)
def test_the_shared_engine_and_batched_decoding(devices):
    expected = shared_grid(on_devices("llama", None))
    model = on_devices("llama", devices)
    with virtual_devices():
        assert shared_grid(model) == expected


@pytest.mark.parametrize("devices", DEVICES)
@pytest.mark.parametrize(
    ("name", "attention"),
    [("rmm(lag=4)", "sdpa"), ("rmm", "sdpa"), ("h2o", "eager"), ("tova", "sdpa"), ("adakv(snapkv)", "sdpa")],
)
def test_the_per_cell_path(devices, name, attention):
    def run(model) -> list[int]:
        context, question = CONTEXT.to(model.device), QUESTION.to(model.device)
        return generate(model, context, question, make_press(name, 0.5), 6, set()).token_ids

    expected = run(on_devices("qwen2", None, attention))
    model = on_devices("qwen2", devices, attention)
    with virtual_devices():
        assert run(model) == expected


def decode_under(model, press) -> list[int]:
    """Prefill outside the press (as KVPress's pipeline does), then 10 greedy steps under ``press``."""
    cache, tokens = DynamicCache(), []
    with torch.no_grad():
        model.model(input_ids=CONTEXT.to(model.device), past_key_values=cache)
        with press(model):
            ids, position = QUESTION.to(model.device), CONTEXT.shape[1]
            for _ in range(10):
                positions = torch.arange(position, position + ids.shape[1], device=model.device)[None]
                logits = model(input_ids=ids, past_key_values=cache, position_ids=positions).logits
                position += ids.shape[1]
                ids = logits[:, -1:].argmax(-1)
                tokens.append(int(ids[0, 0]))
    return tokens


@pytest.mark.parametrize("devices", DEVICES)
@pytest.mark.parametrize("make", [lambda: RMMPress(lag=4), lambda: TOVAPress()], ids=["rmm", "tova"])
def test_decoding_under_decoding_press(devices, make):
    expected = decode_under(on_devices("llama", None), DecodingPress(make(), compression_interval=1, target_size=48))
    model = on_devices("llama", devices)
    with virtual_devices():
        assert decode_under(model, DecodingPress(make(), compression_interval=1, target_size=48)) == expected


def stream(model) -> list[str]:
    """The LoCoMo conversation of the protocol tests, evidence placement, every default press at 200 tokens."""
    from evaluation.protocols.locomo.data import parse_conversation
    from evaluation.protocols.locomo.task import LOCOMO, LocomoSettings
    from evaluation.runs.models import ModelSettings

    tokenizer = byte_tokenizer(CHAT_TEMPLATE)
    config = StreamConfig(
        model=ModelSettings(),
        task="locomo",
        presses=STREAMED,
        budgets=[Budget("tokens", 200)],
        max_turns=None,
        max_history_tokens=None,
        rmm_weights="answers",
        output=None,
        max_new_tokens=4,
        settings=LocomoSettings(conversations=None, placement="evidence", history="gold", data=None),
        allow_import=True,
    )
    cells = press_cells(resolve_presses(config.presses, config.allow_import), config.budgets, "")
    store = MemoryStore(row_key, [])
    run = ConversationRun(config, LOCOMO, model, tokenizer, cells)
    run.run(parse_conversation(CONVERSATION), store)
    return [row["prediction"] for row in store.rows]


@pytest.mark.parametrize("devices", DEVICES)
def test_a_locomo_stream_with_every_default_press(devices):
    def model(placed: int | None):
        loaded = tiny_model("qwen2", "sdpa", context=4096, hidden_size=256, head_dim=64)
        loaded.generation_config.eos_token_id = 2
        return loaded if placed is None else place(loaded, placed)

    expected = stream(model(None))
    placed = model(devices)
    with virtual_devices():
        assert stream(placed) == expected


@pytest.mark.parametrize("devices", DEVICES)
def test_the_traces(devices):
    expected = record(on_devices("llama", None), CONTEXT[0].tolist(), "trace")
    model = on_devices("llama", devices)
    with virtual_devices():
        trace = record(model, CONTEXT[0].tolist(), "trace")
    assert torch.equal(trace.correct, expected.correct)
    assert all(torch.allclose(a, b) for a, b in zip(trace.layers, expected.layers, strict=True))


def test_generation_waits_for_the_device_once_per_step_and_the_prefill_a_fixed_number_of_times():
    """Batched decoding reads one token per sequence per step; the history's prefill, its column sums for H2O
    and RMM included, does not wait for the device chunk by chunk; RMM's own prefill waits a fixed number of
    times per layer, however many chunks its rows take."""
    model = on_devices("llama", 2)
    presses = [make_press(name, 0.5) for name in ("h2o", "rmm", "rmm(lag=8)", "snapkv", "tova")]
    with virtual_devices() as mode:
        history = History(model, frozenset({"context"}), presses)
        history.extend(torch.randint(3, 256, (256,)).tolist(), "context")  # 4 chunks of 64 rows in each layer
        copies = mode.syncs["copy from pageable CPU memory"]  # ids and positions made on the host (measured: 8)
        assert mode.sync_count - copies <= 2 and copies <= 8, dict(mode.syncs)
        caches = [history.compress(press) for press in presses]
        mode.reset()
        steps = 12
        decode_batch(model, caches, torch.tensor([[5, 6]], device=model.device), history.length, steps, set())
        copies = mode.syncs["copy from pageable CPU memory"]  # each step's new tokens, made on the host
        assert mode.sync_count - copies <= steps and copies <= steps + 3, dict(mode.syncs)
        counts = []
        for length in (64, 256):
            mode.reset()
            context = torch.randint(3, 256, (1, length), device=model.device)
            generate(model, context, QUESTION.to(model.device), RMMPress(0.5), 0, set())
            counts.append(mode.sync_count)
        assert counts[0] == counts[1] <= 12 * len(model.model.layers), f"RMM's prefill waits {counts} times"
    json.dumps(dict(mode.syncs))


def syncs_per_token(make) -> list[int]:
    """Host syncs (host-to-device copies from pageable memory counted) of each of 6 greedy steps under
    ``DecodingPress(make())`` on one virtual device, the prefill outside it (as KVPress's pipeline runs it)."""
    model, counts = on_devices("llama", 1), []
    with virtual_devices() as mode, torch.no_grad():
        cache = DynamicCache()
        model.model(input_ids=CONTEXT.to(model.device), past_key_values=cache)
        with DecodingPress(make(), compression_interval=1, target_size=48)(model):
            ids, position = QUESTION.to(model.device), CONTEXT.shape[1]
            for _ in range(6):
                mode.reset()
                positions = torch.arange(position, position + ids.shape[1], device=model.device)[None]
                logits = model(input_ids=ids, past_key_values=cache, position_ids=positions).logits
                position += ids.shape[1]
                ids = logits[:, -1:].argmax(-1)
                counts.append(mode.sync_count)
    return counts


def test_decoding_press_rmm_waits_for_the_device_a_constant_number_of_times_per_token():
    """Beyond what KVPress's own DecodingPress waits (its prefill test, once per layer: measured under KNorm),
    RMM reads the step's positions once per forward, whatever the number of layers: 2 waits per token, none per
    layer, no copy from the host's pageable memory (a step of 24 waits on 2 layers before)."""
    from kvpress import KnormPress

    rmm, knorm = syncs_per_token(RMMPress), syncs_per_token(KnormPress)
    assert all(r - k <= 2 for r, k in zip(rmm[1:], knorm[1:], strict=True)), (rmm, knorm)
    assert knorm[1:] == [len(on_devices("llama", 1).model.layers)] * 5, "KVPress's own: once per layer"


def test_a_copy_from_pageable_host_memory_is_counted():
    with virtual_devices() as mode:
        torch.ones(3).to(torch.device("meta", 0))
        assert mode.syncs["copy from pageable CPU memory"] == 1
        torch.tensor([1, 2], device=torch.device("meta", 0))
        assert mode.syncs["copy from pageable CPU memory"] == 2
        on_device = torch.zeros(2, device=torch.device("meta", 0))
        on_device.copy_(torch.ones(2))
        assert mode.syncs["copy from pageable CPU memory"] == 3
