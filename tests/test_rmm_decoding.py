"""RMMPress as DecodingPress's base press: the smoother against a reference written here from Eq. 1 and the
commit rule (section 5), replayed on the attention the model actually computed at every decoding step."""

from __future__ import annotations

import pytest
import torch
from kvpress import DecodingPress
from transformers import DynamicCache

from presses import RMMPress
from tests.helpers import confident_model, tiny_model

CONTEXT, QUESTION, STEPS, LAG, TARGET = 40, 8, 64, 4, 24


def decode_under(model, press, forced: bool) -> dict:
    """Prefill a context without compression, then under ``press`` a teacher-forced question and 64 steps, each
    feeding the argmax (greedy) or, when ``forced``, every other step a token of a fixed random continuation.

    Records, per forward: its positions, tokens, predictions and their probabilities, each layer's eager attention
    over the cache (before compression), and the keys it appended (to read back which positions the press kept)."""
    generator = torch.Generator().manual_seed(2)
    context = torch.randint(3, 256, (1, CONTEXT), generator=generator)
    question = torch.randint(3, 256, (1, QUESTION), generator=generator)
    continuation = torch.randint(3, 256, (STEPS,), generator=generator)
    record = {"forwards": [], "keys": {layer: {} for layer in range(2)}}

    def capture(module, args, kwargs, output):
        cache, q_len = kwargs["past_key_values"], kwargs["hidden_states"].shape[1]
        new_keys = cache.layers[module.layer_idx].keys[0, :, -q_len:]
        for offset, position in enumerate(kwargs["position_ids"][0].tolist()):
            record["keys"][module.layer_idx][position] = new_keys[:, offset]
        if output[1] is not None:
            record["forwards"][-1]["attention"][module.layer_idx] = output[1][0]

    def forward(ids: torch.Tensor, start: int) -> torch.Tensor:
        positions = list(range(start, start + ids.shape[1]))
        record["forwards"].append({"positions": positions, "tokens": ids[0].tolist(), "attention": {}})
        logits = model(input_ids=ids, past_key_values=cache, position_ids=torch.tensor([positions])).logits
        record["forwards"][-1]["predictions"] = logits[0].argmax(-1).tolist()
        record["forwards"][-1]["confidences"] = logits[0].float().softmax(-1).amax(-1).tolist()
        return logits

    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in model.model.layers]
    cache = DynamicCache()
    with torch.no_grad():
        forward(context, 0)
        with press(model):
            ids, start = question, CONTEXT
            for step in range(STEPS + 1):
                logits = forward(ids, start)
                forcing = forced and step < STEPS and step % 2 == 0
                following = continuation[step] if forcing else logits[0, -1].argmax()
                ids, start = following.view(1, 1), start + ids.shape[1]
    for hook in hooks:
        hook.remove()
    record["cache"] = cache
    return record


def kept_by_press(record: dict) -> list[list[list[int]]]:
    """Per layer and KV head, the positions left in the cache, read back from their keys."""
    kept = []
    for layer, cache_layer in enumerate(record["cache"].layers):
        by_position = record["keys"][layer]
        heads = []
        for head in range(cache_layer.keys.shape[1]):
            positions = []
            for key in cache_layer.keys[0, head]:
                matches = [p for p, keys in by_position.items() if torch.allclose(keys[head], key, atol=1e-5)]
                assert len(matches) == 1
                positions.append(matches[0])
            heads.append(sorted(positions))
        kept.append(heads)
    return kept


def reference_smoother(
    record: dict, interval: int, num_kv_heads: int = 2, correctness: str = "teacher_forced"
) -> list[list[list[int]]]:
    """Eq. 1 and the commit rule, step by step. Each row t adds w(t) a(t -> k) to every held k with
    t_k < t <= t_k + H, where w(t) is 1 when the prediction at t is the token at t + 1 (``confidence``: the
    probability of the prediction at t, known with t's logits). At every ``interval``-th forward under the press
    the buffered rows are scored: rows of earlier forwards with their weights (the context's too, prefilled
    before the press, which replays them); rows of the forward in progress, whose predictions come only at its
    end, as correct until the next scoring settles them. A cache over TARGET then keeps its H newest positions and
    the best TARGET - H others (a newcomer must outrank an incumbent: ties keep the older)."""
    forwards = record["forwards"]
    tokens = [token for forward in forwards for token in forward["tokens"]]
    predictions, confidences = {}, {}
    for forward in forwards:
        predictions.update(zip(forward["positions"], forward["predictions"], strict=True))
        confidences.update(zip(forward["positions"], forward["confidences"], strict=True))

    def weight(t: int) -> float:
        if correctness == "confidence":
            return confidences[t]
        return float(predictions[t] == tokens[t + 1]) if t + 1 < len(tokens) else 1.0

    kept = []
    for layer in range(2):
        heads = []
        for head in range(num_kv_heads):
            held, utility, pending, buffered = [], {}, {}, []
            for step, forward in enumerate(forwards):
                attention = forward["attention"][layer]  # (heads, q_len, cache length)
                group = attention.view(num_kv_heads, -1, *attention.shape[1:])[head].mean(0).double()
                for row, t in enumerate(forward["positions"]):
                    held.append(t)
                    utility[t] = 0.0
                    buffered.append(
                        (t, {k: float(group[row, slot]) for slot, k in enumerate(held) if k < t <= k + LAG})
                    )
                if not step or step % interval:
                    continue
                for t, contributions in pending.items():
                    for k, share in contributions.items():
                        if k in utility:
                            utility[k] += weight(t) * share
                pending = {}
                for t, contributions in buffered:
                    if t in forward["positions"]:
                        pending[t] = contributions
                    else:
                        for k, share in contributions.items():
                            utility[k] += weight(t) * share
                buffered = []
                if len(held) > TARGET:
                    ranking = dict(utility)
                    for contributions in pending.values():
                        for k, share in contributions.items():
                            ranking[k] += share
                    newest = held[-1]
                    provisional = [k for k in held if newest - k < LAG]
                    others = sorted((k for k in held if newest - k >= LAG), key=lambda k: (ranking[k], -k))
                    held = sorted(provisional + others[-(TARGET - len(provisional)) :])
                    utility = {k: utility[k] for k in held}
            heads.append(sorted(held))
        kept.append(heads)
    return kept


def press_for(interval: int, correctness: str = "teacher_forced") -> DecodingPress:
    return DecodingPress(RMMPress(lag=LAG, correctness=correctness), compression_interval=interval, target_size=TARGET)


@pytest.fixture(scope="module")
def greedy_run():
    return decode_under(tiny_model("llama", "eager"), press_for(2), forced=False)


@pytest.mark.parametrize(("interval", "forced"), [(2, False), (1, True), (3, True)])
def test_the_smoother_follows_eq1_and_the_commit_rule_over_64_decoding_steps(greedy_run, interval, forced):
    record = greedy_run if (interval, forced) == (2, False) else None
    record = record or decode_under(tiny_model("llama", "eager"), press_for(interval), forced)
    tokens = [token for forward in record["forwards"] for token in forward["tokens"]]
    generated = [(p, tokens[f["positions"][0] + 1]) for f in record["forwards"][2:-1] for p in f["predictions"]]
    right = sum(p == t for p, t in generated)
    assert right == len(generated) if not forced else 0 < right < len(generated)
    assert kept_by_press(record) == reference_smoother(record, interval)


@pytest.mark.parametrize("interval", [1, 3])
def test_confidence_weights_follow_eq1_and_the_commit_rule_over_64_decoding_steps(interval):
    """w(t) the top-1 probability at t: a row of an earlier forward with its probability, the rows of the forward
    in progress as 1 until the next compression settles them (its logits come only at its end)."""
    record = decode_under(confident_model("llama", "eager"), press_for(interval, "confidence"), forced=True)
    kept = kept_by_press(record)
    assert kept == reference_smoother(record, interval, correctness="confidence")
    assert kept != reference_smoother(record, interval), "the two modes keep different sets here"


def test_an_early_high_utility_position_outlives_a_recency_window(greedy_run):
    newest = greedy_run["forwards"][-1]["positions"][-1]
    recency = set(range(newest - TARGET + 1, newest + 1))
    for heads in kept_by_press(greedy_run):
        for held in heads:
            early = [k for k in held if k not in recency]
            assert early, "a recency window would hold exactly the newest positions"
            assert min(early) < newest - STEPS // 2, "an item committed early in decoding is still held at the end"


@pytest.mark.parametrize("interval", [1, 3])
def test_eager_and_sdpa_keep_the_same_sets_inside_decoding_press(interval):
    eager = decode_under(tiny_model("llama", "eager"), press_for(interval), forced=True)
    sdpa = decode_under(tiny_model("llama", "sdpa"), press_for(interval), forced=True)
    assert kept_by_press(sdpa) == kept_by_press(eager)


def test_decoding_leaves_no_hook():
    model = tiny_model("qwen2", "sdpa")
    decode_under(model, press_for(2), forced=True)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


def test_rows_lost_by_a_short_buffer_are_refused():
    press = DecodingPress(RMMPress(lag=LAG), compression_interval=4, target_size=TARGET, hidden_states_buffer_size=2)
    with pytest.raises(ValueError, match="set hidden_states_buffer_size >= compression_interval"):
        decode_under(tiny_model("llama", "sdpa"), press, forced=False)


@pytest.mark.parametrize("correctness", ["teacher_forced", "confidence"])
def test_the_transcript_reads_each_forwards_own_logits_with_no_second_pass_of_the_head(correctness):
    """The model's LM head runs once per forward (its own logits give the predictions), besides one pass over the
    context the press replays (it met the cache already filled), and the press's recorded predictions and
    probabilities are the logits' argmax and top-1 softmax at every position."""
    model, calls = confident_model("llama", "sdpa"), []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, out: calls.append(out.shape[1]))
    press = press_for(1, correctness)
    record = decode_under(model, press, forced=True)
    hook.remove()
    forwards = record["forwards"]
    assert calls == [CONTEXT, CONTEXT] + [len(forward["positions"]) for forward in forwards[1:]]
    transcript = press.base_press._transcript
    under_press = forwards[1:]
    positions = [p for forward in under_press for p in forward["positions"]]
    expected = [p for forward in under_press for p in forward["predictions"]]
    assert transcript.predictions[0, positions].tolist() == expected
    if correctness == "confidence":
        confidences = torch.tensor([c for forward in under_press for c in forward["confidences"]])
        torch.testing.assert_close(transcript.probabilities[0, positions], confidences)


def test_a_forward_whose_head_sees_fewer_rows_still_records_every_rows_prediction_by_its_end():
    """The stack alone (KVPress's pipeline prefills so) and a forward whose head computes the last row's logits only
    (``generate``'s ``logits_to_keep``) both leave every row's prediction recorded when they end: the argmax of the
    head over that row, as a plain forward's logits give it."""
    model = tiny_model("llama", "sdpa")
    ids = torch.randint(3, 256, (1, 30), generator=torch.Generator().manual_seed(5))
    expected = model(input_ids=ids).logits.argmax(-1)[0]
    press, cache = press_for(1), DynamicCache()
    transcript = press.base_press._transcript
    with torch.no_grad(), press(model):
        model.model(input_ids=ids[:, :20], past_key_values=cache)
        assert transcript.predictions[0, :20].tolist() == expected[:20].tolist()
        positions = torch.arange(20, 30)[None]
        model(input_ids=ids[:, 20:], past_key_values=cache, position_ids=positions, logits_to_keep=1)
        assert transcript.predictions[0, 20:30].tolist() == expected[20:].tolist()


def test_after_a_forward_the_newest_rows_correctness_waits_for_the_next_token_and_the_others_are_settled():
    """Teacher forcing: row t is judged by token t + 1, so after a forward of the whole model only its last row is
    unsettled; the host's record says so without asking the device, and a new context forgets it."""
    model = tiny_model("llama", "sdpa")
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(6))
    press = press_for(1)
    transcript = press.base_press._transcript
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=DynamicCache())
        assert [transcript.settled_at(p, "teacher_forced") for p in range(12)] == [True] * 11 + [False]
    transcript.clear()
    assert transcript.extent is not None and not transcript.extent[0].ranges and not transcript.extent[1].ranges
