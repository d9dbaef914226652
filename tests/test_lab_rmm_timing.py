"""The eviction lab's RMM learns a row's correctness when the next token arrives, as RMMPress does on a model:
the lab's replay holds what ``DecodingPress(RMMPress(correctness="teacher_forced"))`` holds decoding a tiny model,
and a newcomer whose own prediction was wrong is not evicted on arrival."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from kvpress import DecodingPress
from transformers import DynamicCache

from evaluation.errors import EvaluationError
from evaluation.protocols.protocol import results_defining
from evaluation.protocols.traces.policies import (
    LayerTrace,
    StreamedPolicy,
    WindowedRMMPolicy,
    lag_control,
    sweep_name,
)
from evaluation.protocols.traces.protocol import RMM_CORRECTNESS_KNOWN, TRACES, TracesConfig
from evaluation.protocols.traces.replay import replay
from evaluation.protocols.traces.streamed import StreamedPress
from evaluation.runs.models import ModelSettings
from evaluation.runs.record import RunRecord
from presses import RMMPress
from presses.attention import group_mean
from tests.helpers import SHARED_DATA, tiny_model

LENGTH, BUDGET, KV_HEADS = 72, 24, 2


def held(trace: LayerTrace, policy, budget: int) -> list[list[int]]:
    return [group.nonzero()[:, 0].tolist() for group in replay(trace, policy, budget).held]


def test_a_newcomer_whose_prediction_was_wrong_stays_until_the_next_token_says_so():
    """Three positions, budget 2, row 2's prediction wrong. At step 2 the rows 0 and 1 are settled (right) and row
    2 counts as right: means 0: (1 + 0.5 + 0.2) / 3 = 0.567, 1: (0.5 + 0.2) / 2 = 0.35, 2: 0.6 / 1 = 0.6, so 1
    goes. Knowing row 2's correctness on arrival would score 2 at 0 and evict it."""
    rows = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.2, 0.6]]])
    trace = LayerTrace(rows, torch.tensor([1.0, 1.0, 0.0]))
    assert held(trace, StreamedPolicy(sweep_name(None), None), 2) == [[0, 2]]
    assert held(trace, WindowedRMMPolicy(lag_control(0), 0), 2) == [[0, 2]]
    assert held(trace, KnownOnArrival(sweep_name(None), None), 2) == [[0, 1]]


@dataclass
class KnownOnArrival(StreamedPolicy):
    """RMM handed each row's correctness as per-position weights, known when the row arrives (the lab's earlier
    replay): the timing the press does not have."""

    def start(self, trace: LayerTrace, budget: int) -> None:
        press = RMMPress(lag=self.lag, correctness=trace.correct[None])
        self.stream = StreamedPress(press, budget, trace.rows[:, :budget, :budget])


def slot_positions(keys: torch.Tensor, by_position: dict[int, torch.Tensor]) -> list[int]:
    """The position of each of one KV head's cached keys (n, head_dim), read back from the keys each position
    appended."""
    found = []
    for key in keys:
        matches = [p for p, appended in by_position.items() if torch.allclose(appended, key, atol=1e-6)]
        assert len(matches) == 1
        found.append(matches[0])
    return found


@torch.no_grad()
def decode_under_rmm(lag: int | None) -> tuple[LayerTrace, dict[int, list[list[int]]]]:
    """A tiny model reads position 0, then under ``DecodingPress(RMMPress(lag, "teacher_forced"),
    compression_interval=1, target_size=BUDGET)`` one token per forward: its own argmax at odd steps, a fixed
    random token at even ones, so about half the rows predict the next token.

    Returns the trace of what the press saw, per layer and KV head (stacked): row t is step t's attention over the
    cache it held then, averaged over the KV head's query heads, 0 on positions already evicted, with each row's
    correctness (the prediction at t against the token at t + 1; the last row 1); and, after each step t from
    ``BUDGET`` on, the positions the press held, per layer and KV head."""
    model = tiny_model("llama", "eager")
    layers = len(model.model.layers)
    forced = torch.randint(3, 256, (LENGTH,), generator=torch.Generator().manual_seed(3))
    rows = torch.zeros(layers, KV_HEADS, LENGTH, LENGTH)
    appended: list[list[dict[int, torch.Tensor]]] = [[{} for _ in range(KV_HEADS)] for _ in range(layers)]
    before: dict[int, list[list[int]]] = {}  # step t: what each layer and KV head held after step t - 1, and t
    cache = DynamicCache()

    def capture(module, args, kwargs, output) -> None:  # runs before DecodingPress's hook: the cache before eviction
        layer, position = module.layer_idx, int(kwargs["position_ids"][0, -1])
        keys = cache.layers[layer].keys[0]
        for head in range(KV_HEADS):
            appended[layer][head][position] = keys[head, -1].clone()
            slots = slot_positions(keys[head], appended[layer][head])
            rows[layer, head, position, slots] = group_mean(output[1], KV_HEADS)[0, head, -1]
            before.setdefault(position, []).append(slots)

    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in model.model.layers]
    tokens, predictions = [int(forced[0])], []

    def forward() -> None:
        ids, at = torch.tensor([[tokens[-1]]]), torch.tensor([[len(tokens) - 1]])
        predictions.append(int(model(input_ids=ids, past_key_values=cache, position_ids=at).logits[0, -1].argmax()))

    forward()
    with DecodingPress(RMMPress(lag=lag), compression_interval=1, target_size=BUDGET)(model):
        for step in range(1, LENGTH):
            tokens.append(predictions[-1] if step % 2 else int(forced[step]))
            forward()
    for hook in hooks:
        hook.remove()
    correct = torch.tensor([float(p == t) for p, t in zip(predictions, tokens[1:], strict=False)] + [1.0])
    kept = {t - 1: [sorted(slots[:-1]) for slots in held] for t, held in before.items() if t > BUDGET}
    kept[LENGTH - 1] = [
        sorted(slot_positions(cache.layers[layer].keys[0, head], appended[layer][head]))
        for layer in range(layers)
        for head in range(KV_HEADS)
    ]
    return LayerTrace(rows.flatten(0, 1), correct), kept


def held_after(trace: LayerTrace, policy: StreamedPolicy, step: int) -> list[list[int]]:
    """What ``policy`` holds after ``step``: the replay of the trace's first step + 1 rows."""
    n = step + 1
    return held(LayerTrace(trace.rows[:, :n, :n], trace.correct[:n]), policy, BUDGET)


@pytest.mark.parametrize("lag", [None, 4])
def test_the_lab_holds_what_the_press_holds_decoding_a_tiny_model(lag):
    """The press on a model records the tokens and predictions itself (its transcript's hooks) and counts each
    row as correct until the next token arrives; the lab replays the rows it saw with the trace's correctness and
    holds the same positions after every step, in every layer and KV head. Knowing each row's correctness on
    arrival holds other positions at some steps."""
    trace, pressed = decode_under_rmm(lag)
    assert 0.3 < float(trace.correct[:-1].mean()) < 0.7
    assert sorted(pressed) == list(range(BUDGET, LENGTH))
    name = sweep_name(lag)
    for step, expected in pressed.items():
        assert held_after(trace, StreamedPolicy(name, lag), step) == expected, step
    differ = [step for step in pressed if held_after(trace, KnownOnArrival(name, lag), step) != pressed[step]]
    assert len(differ) > len(pressed) // 4


def test_a_run_recorded_when_the_lab_knew_correctness_on_arrival_is_not_resumed(tmp_path):
    """A traces run.json without ``rmm_correctness_known`` was made when the replay read each row's correctness on
    its arrival: it stands for "on arrival", so this code refuses to add its rows to that folder (or to pool it)."""
    config = TracesConfig(
        model=ModelSettings(),
        texts=["multi_news:0"],
        length=160,
        budgets=[64],
        threshold=0.01,
        data_root=SHARED_DATA,
        output=tmp_path,
    )
    defining = tuple(results_defining(config))
    assert "rmm_correctness_known" in defining
    older = {"length": 160, "per_kv_group": False, "threshold": 0.01, "h2o_window": 32, **ModelSettings().record()}
    (tmp_path / "run.json").write_text(json.dumps({"config": older, "sessions": []}))
    now = {**older, "rmm_correctness_known": RMM_CORRECTNESS_KNOWN}
    asked = "rmm_correctness_known: stored 'on arrival', asked 'at the next position'"
    with pytest.raises(EvaluationError, match=asked):
        RunRecord(tmp_path, now, defining, TRACES.record_defaults())
    (tmp_path / "run.json").write_text(json.dumps({"config": now, "sessions": []}))
    with RunRecord(tmp_path, now, defining, TRACES.record_defaults()):
        pass
