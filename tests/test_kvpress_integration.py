"""Both presses as drop-ins: KVPress's pipeline and its wrapper presses, on Llama and Qwen2."""

from __future__ import annotations

import pytest
import torch
from kvpress import (
    AdaKVPress,
    ComposedPress,
    DecodingPress,
    KeyRerotationPress,
    PerLayerCompressionPress,
    PrefillDecodingPress,
)
from kvpress.utils import compute_n_kept
from transformers import AttentionInterface, DynamicCache, pipeline
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from presses import RMMPress, TOVAPress
from tests.helpers import byte_tokenizer, tiny_model

CONTEXT = "The lighthouse keeper counted ships every night and wrote their names in a blue ledger. " * 3
QUESTIONS = ["Who counted ships?", "Where were the names written?", "When did he count?"]
PRESSES = {"tova": lambda: TOVAPress(), "rmm": lambda: RMMPress(lag=4)}


def per_layer_sdpa(module, query, key, value, attention_mask, **kwargs):
    """sdpa with the mask cut to this layer's key length.

    Layers compressed to different lengths need it: transformers builds one mask from layer 0's length, which
    KVPress's PerLayerCompressionPress only tolerates under flash attention (documented there), absent on CPU.
    No padding is used, so the last ``k_len`` mask columns are exactly this layer's causal mask.
    """
    if attention_mask is not None:
        attention_mask = attention_mask[..., -key.shape[-2] :]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


PER_LAYER_SDPA = "sdpa_per_layer_lengths"
AttentionInterface.register(PER_LAYER_SDPA, per_layer_sdpa)
AttentionMaskInterface.register(PER_LAYER_SDPA, sdpa_mask)


def make_generator(arch: str, hidden_size: int = 64, attn_implementation: str = "sdpa"):
    model = tiny_model(arch, attn_implementation, hidden_size=hidden_size, vocab_size=260, context=2048)
    return pipeline("kv-press-text-generation", model=model, tokenizer=byte_tokenizer(), device="cpu")


@pytest.fixture
def generator(arch):
    return make_generator(arch)


def context_length(generator) -> int:
    return len(generator.tokenizer.encode(generator.tokenizer.bos_token + CONTEXT, add_special_tokens=False))


def run(generator, press, questions=QUESTIONS) -> tuple[list[str], DynamicCache]:
    cache = DynamicCache()
    out = generator(CONTEXT, questions=questions, press=press, max_new_tokens=5, cache=cache)
    assert len(out["answers"]) == len(questions)
    assert all(isinstance(answer, str) for answer in out["answers"])
    return out["answers"], cache


@pytest.mark.parametrize("name", PRESSES)
def test_alone_in_the_pipeline_with_several_questions(generator, name):
    press = PRESSES[name]()
    press.compression_ratio = 0.5
    _, cache = run(generator, press)
    expected = compute_n_kept(context_length(generator), 0.5)
    assert [layer.keys.shape[2] for layer in cache.layers] == [expected, expected]


@pytest.mark.parametrize("name", PRESSES)
def test_inside_key_rerotation_press(generator, name):
    press = KeyRerotationPress(PRESSES[name]())
    press.compression_ratio = 0.4
    _, cache = run(generator, press)
    expected = compute_n_kept(context_length(generator), 0.4)
    assert [layer.keys.shape[2] for layer in cache.layers] == [expected, expected]


@pytest.mark.parametrize("name", PRESSES)
def test_inside_composed_press(generator, name):
    inner = PRESSES[name]()
    inner.compression_ratio = 0.5
    press = ComposedPress([inner])
    _, cache = run(generator, press)
    expected = compute_n_kept(context_length(generator), 0.5)
    assert [layer.keys.shape[2] for layer in cache.layers] == [expected, expected]
    assert press.compression_ratio == pytest.approx(0.5)


@pytest.mark.parametrize("name", PRESSES)
def test_inside_adakv_press(arch, name):
    # AdaKV masks evicted keys with a fake key that every query must ignore; KVPress's search for it needs
    # the queries to fit in a half-space, which random 16-dimensional heads do not, hence head_dim 64 here.
    generator = make_generator(arch, hidden_size=256)
    press = AdaKVPress(PRESSES[name](), alpha_safeguard=0.2)
    press.compression_ratio = 0.5
    run(generator, press)
    length = context_length(generator)
    for layer in generator.model.model.layers:
        _, heads, _ = layer.self_attn.masked_key_indices
        assert len(heads) == 2 * (length - compute_n_kept(length, 0.5)), "AdaKV masks the evicted share"


@pytest.mark.parametrize("name", ["tova", "rmm-uniform"])
def test_inside_per_layer_compression_press(arch, name):
    generator = make_generator(arch, attn_implementation=PER_LAYER_SDPA)
    inner = TOVAPress() if name == "tova" else RMMPress(correctness="uniform")
    press = PerLayerCompressionPress(inner, compression_ratios=[0.25, 0.75])
    _, cache = run(generator, press)
    length = context_length(generator)
    assert [layer.keys.shape[2] for layer in cache.layers] == [
        compute_n_kept(length, 0.25),
        compute_n_kept(length, 0.75),
    ]


@pytest.mark.parametrize("name", PRESSES)
def test_inside_decoding_press(generator, name):
    lengths: list[int] = []

    def record(module, args, kwargs, output):
        lengths.append(kwargs["past_key_values"].get_seq_length())

    press = DecodingPress(base_press=PRESSES[name](), compression_interval=2, target_size=48)
    handle = generator.model.register_forward_hook(record, with_kwargs=True)
    try:
        run(generator, press, questions=QUESTIONS[:1])
    finally:
        handle.remove()
    question_step, *decode_steps = lengths
    assert question_step > 48, "the question step is the first decoding step: nothing compressed yet"
    assert decode_steps == [48, 49, 48, 49], "compressed to the target every second step"


@pytest.mark.parametrize("correctness", ["teacher_forced", "uniform"])
def test_one_rmm_press_for_the_prefill_and_the_decoding_of_the_pipeline(generator, correctness):
    # kvpress's pipeline enters the press once to prefill and again to decode the same cache: the smoother of
    # the prefill must carry on into decoding (a fresh one could not know the positions the prefill kept)
    lengths: list[int] = []

    def record(module, args, kwargs, output):
        lengths.append(kwargs["past_key_values"].get_seq_length())

    rmm = RMMPress(compression_ratio=0.5, lag=4, correctness=correctness)
    press = PrefillDecodingPress(prefilling_press=rmm, decoding_press=DecodingPress(rmm, 2, target_size=48))
    handle = generator.model.model.register_forward_hook(record, with_kwargs=True)  # the prefill runs it alone
    try:
        run(generator, press, questions=QUESTIONS[:1])
    finally:
        handle.remove()
    prefill, question_step, *decode_steps = lengths
    assert prefill == compute_n_kept(context_length(generator), 0.5), "the prefill at the matched budget"
    assert question_step > 48 and decode_steps == [48, 49, 48, 49], "then DecodingPress's target, every second step"


def test_a_reused_prefill_decoding_rmm_starts_each_sample_afresh(generator):
    def make() -> PrefillDecodingPress:
        rmm = RMMPress(compression_ratio=0.5, lag=4)
        return PrefillDecodingPress(prefilling_press=rmm, decoding_press=DecodingPress(rmm, 2, target_size=48))

    def kept(press, context: str) -> torch.Tensor:
        cache = DynamicCache()
        generator(context, question=QUESTIONS[0], press=press, max_new_tokens=8, cache=cache)
        return torch.cat([layer.keys for layer in cache.layers], dim=2)

    reused = make()
    kept(reused, CONTEXT)
    other = "A baker in the valley sold bread to travellers and counted loaves before dawn. " * 3
    assert torch.equal(kept(reused, other), kept(make(), other))


def test_a_reused_decoding_rmm_answers_each_question_as_a_fresh_one(generator):
    # the pipeline takes one question per call under DecodingPress: a reused press must forget the last answer
    def make() -> DecodingPress:
        return DecodingPress(RMMPress(lag=4), 2, target_size=48)

    def kept(press, question: str) -> torch.Tensor:
        cache = DynamicCache()
        generator(CONTEXT, question=question, press=press, max_new_tokens=8, cache=cache)
        return torch.cat([layer.keys for layer in cache.layers], dim=2)

    reused = make()
    kept(reused, QUESTIONS[0])
    assert torch.equal(kept(reused, QUESTIONS[1]), kept(make(), QUESTIONS[1]))
