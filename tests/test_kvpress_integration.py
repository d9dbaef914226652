"""Both presses as drop-ins: KVPress's pipeline and every wrapper press KVPress's own tests exercise, on Llama and
Qwen2. The wrapper matrix holds each wrapper around each of our presses to what the same wrapper does around
KVPress's own ``KnormPress``: the same cache lengths after every forward (or, for a press that masks keys instead of
evicting them, the same number masked), and no hook left on the model."""

from __future__ import annotations

import warnings

import pytest
import torch
from kvpress import (
    AdaKVPress,
    BlockPress,
    CAMPress,
    ChunkKVPress,
    ChunkPress,
    ComposedPress,
    CompressionRatioDecodingPress,
    CriticalAdaKVPress,
    CriticalKVPress,
    DecodingPress,
    DMSPress,
    KeyRerotationPress,
    KnormPress,
    MergingPress,
    PerLayerCompressionPress,
    PrefillDecodingPress,
)
from kvpress.utils import compute_n_kept
from transformers import AttentionInterface, DynamicCache, pipeline
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from presses import RMMPress, TOVAPress
from tests.helpers import byte_tokenizer, confidence_weights, tiny_model

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
    # head_dim spelled out: KVPress's CriticalKVPress reads it from the config, which Qwen2's does not hold
    model = tiny_model(
        arch, attn_implementation, hidden_size=hidden_size, vocab_size=260, context=2048, head_dim=hidden_size // 4
    )
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


@pytest.mark.parametrize("correctness", ["teacher_forced", "confidence", "uniform"])
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


WRAPPERS = {
    "composed": lambda press: ComposedPress([press]),
    "key_rerotation": KeyRerotationPress,
    "adakv": lambda press: AdaKVPress(press, alpha_safeguard=0.2),
    "critical": CriticalKVPress,
    "critical_adakv": lambda press: CriticalAdaKVPress(press),
    "chunk": lambda press: ChunkPress(press, chunk_length=40),
    "chunkkv": lambda press: ChunkKVPress(press, chunk_length=8),
    "block": lambda press: BlockPress(press, block_size=48),
    "merging": lambda press: MergingPress(press),
    "per_layer": lambda press: PerLayerCompressionPress(press, compression_ratios=[0.25, 0.75]),
    "dms": lambda press: DMSPress(press, threshold=-0.5, sliding_window_size=32, decoding=True),
    "decoding": lambda press: DecodingPress(press, compression_interval=2, target_size=48),
    "cam": lambda press: CAMPress(press, compression_interval=2, target_size=48),
    "ratio_decoding": lambda press: CompressionRatioDecodingPress(press, compression_interval=2),
    "prefill_decoding": lambda press: PrefillDecodingPress(press, DecodingPress(press, 2, target_size=48)),
    "decoding_only": lambda press: PrefillDecodingPress(None, DecodingPress(press, 2, target_size=48)),
}
OURS = {
    "tova": lambda: TOVAPress(compression_ratio=0.5),
    "rmm": lambda: RMMPress(compression_ratio=0.5),
    "rmm-lag": lambda: RMMPress(compression_ratio=0.5, lag=4),
    "rmm-confidence": lambda: RMMPress(compression_ratio=0.5, lag=4, correctness="confidence"),
}
WIDE = {"adakv", "critical_adakv", "dms"}  # a fake key every query ignores needs head_dim 64 (test_inside_adakv_press)


def masked_count(model) -> int:
    return sum(
        len(indices[0])
        for layer in model.model.layers
        if (indices := getattr(layer.self_attn, "masked_key_indices", None)) is not None
    )


def lengths_under(generator, press) -> tuple[list[list[int]], int]:
    """The cache length of every layer after every forward in the pipeline (one question, 8 new tokens), and
    how many keys are masked at the end."""
    lengths: list[list[int]] = []

    def record(module, args, kwargs, output):
        lengths.append([layer.keys.shape[2] for layer in kwargs["past_key_values"].layers])

    for layer in generator.model.model.layers:
        layer.self_attn.masked_key_indices = None
    handle = generator.model.model.register_forward_hook(record, with_kwargs=True)
    try:
        generator(CONTEXT, question=QUESTIONS[0], press=press, max_new_tokens=8, cache=DynamicCache())
    finally:
        handle.remove()
    return lengths, masked_count(generator.model)


def hooks_on(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("ours", OURS)
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_every_wrapper_around_our_presses_holds_knorms_budget_and_leaves_no_hook(arch, wrapper, ours):
    attention = PER_LAYER_SDPA if wrapper == "per_layer" else "sdpa"
    generator = make_generator(arch, hidden_size=256 if wrapper in WIDE else 64, attn_implementation=attention)
    reference = lengths_under(generator, WRAPPERS[wrapper](KnormPress(compression_ratio=0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PerLayerCompressionPress hides the model: RMM warns it goes uniform
        lengths = lengths_under(generator, WRAPPERS[wrapper](OURS[ours]()))
    if wrapper == "chunkkv":  # keeps whole chunks, so its length depends on which chunks the scores pick
        steps = zip(lengths[0], reference[0], strict=True)
        assert all(abs(a - b) < 8 for step, knorm in steps for a, b in zip(step, knorm, strict=True))
    else:
        assert lengths[0] == reference[0], "the same cache lengths as the wrapper around KnormPress"
    if wrapper != "dms":  # DMS masks by a score threshold, so how many depends on the scores
        assert lengths[1] == reference[1], "the same number of masked keys"
    assert hooks_on(generator.model) == 0


def teacher_forced_weights(model, ids: torch.Tensor) -> torch.Tensor:
    """1 where the model's top-1 prediction at t is the token t + 1 (the last row: 1), from one plain forward."""
    with torch.no_grad():
        predicted = model(input_ids=ids).logits.argmax(-1)[0]
    return torch.cat([(predicted[:-1] == ids[0, 1:]).float(), torch.ones(1)])


@pytest.mark.parametrize("correctness", ["teacher_forced", "confidence"])
@pytest.mark.parametrize("wrapper", ["composed", "key_rerotation", "critical", "chunk", "adakv", "merging"])
def test_weights_from_predictions_inside_wrappers_that_show_the_press_the_model(wrapper, correctness):
    """Inside every prefill wrapper that passes ``post_init_from_model`` on, RMM keeps what it keeps with the
    weights of the context supplied from a plain forward: teacher-forced (its last row: 1, its next token unknown)
    or the top-1 probabilities (of a head scaled so that they spread)."""
    generator = make_generator("llama", hidden_size=256 if wrapper in WIDE else 64)
    context = generator.preprocess(CONTEXT, questions=QUESTIONS[:1], answer_prefix="", max_context_length=4096)
    if correctness == "confidence":
        with torch.no_grad():
            generator.model.get_output_embeddings().weight.mul_(20.0)
        weights = confidence_weights(generator.model, context["context_ids"])[0]
        assert weights.min() < 0.5 < weights.max() < 1
    else:
        weights = teacher_forced_weights(generator.model, context["context_ids"])
        assert 0 < weights.mean() < 1
    ours = lengths_and_keys(generator, WRAPPERS[wrapper](RMMPress(0.5, lag=4, correctness=correctness)))
    supplied = lengths_and_keys(generator, WRAPPERS[wrapper](RMMPress(0.5, lag=4, correctness=weights)))
    assert all(torch.equal(a, b) for a, b in zip(ours, supplied, strict=True))


def lengths_and_keys(generator, press) -> list[torch.Tensor]:
    """Each layer's keys after one question with 8 new tokens (the masked ones set to zero)."""
    for layer in generator.model.model.layers:
        layer.self_attn.masked_key_indices = None
    cache = DynamicCache()
    generator(CONTEXT, question=QUESTIONS[0], press=press, max_new_tokens=8, cache=cache)
    keys = []
    for layer, cached in zip(generator.model.model.layers, cache.layers, strict=True):
        indices = getattr(layer.self_attn, "masked_key_indices", None)
        kept = cached.keys.clone()
        if indices is not None:
            kept[indices] = 0
        keys.append(kept)
    return keys


@pytest.mark.parametrize("correctness", ["teacher_forced", "confidence", "uniform"])
def test_inside_decoding_press_alone_rmm_observes_the_prefill_it_never_saw(generator, correctness):
    """KVPress's pipeline prefills outside a ``DecodingPress``: RMM replays that prefix (its token ids read back
    from the cache) and keeps what it keeps when it watched the prefill itself (as ``PrefillDecodingPress``'s
    prefilling press, at ratio 0)."""

    def final_keys(press) -> list[torch.Tensor]:
        cache = DynamicCache()
        generator(CONTEXT, question=QUESTIONS[0], press=press, max_new_tokens=12, cache=cache)
        return [layer.keys for layer in cache.layers]

    alone = final_keys(DecodingPress(RMMPress(lag=4, correctness=correctness), 2, target_size=48))
    rmm = RMMPress(lag=4, correctness=correctness)
    watched = final_keys(PrefillDecodingPress(prefilling_press=rmm, decoding_press=DecodingPress(rmm, 2, 48)))
    assert all(torch.equal(a, b) for a, b in zip(alone, watched, strict=True))
    assert hooks_on(generator.model) == 0
