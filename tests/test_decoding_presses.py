"""Decoding presses on the evaluation's per-cell path run as KVPress's pipeline runs them: the context prefilled
uncompressed (a ``PrefillDecodingPress`` prefills under its prefilling press), then the press compresses while the
question is appended and the answer generated, to the cell's budget as its target size. A press that re-rotates
the kept keys has the question start after them, as KVPress's pipeline puts it, on both paths."""

from __future__ import annotations

import pytest
from kvpress import DecodingPress, KeyRerotationPress, KnormPress, PrefillDecodingPress

from evaluation.catalogue.resolved import make_press
from evaluation.engine.decoding import eos_ids, generate
from presses import TOVAPress
from tests.test_kvpress_integration import CONTEXT, QUESTIONS, make_generator

RATIO = 0.5
MAX_NEW_TOKENS = 12


def kvpress_reference(name: str, target: int):
    return {
        "decoding(tova,compression_interval=2)": lambda: DecodingPress(
            TOVAPress(), compression_interval=2, target_size=target
        ),
        "decoding(knorm,compression_interval=3)": lambda: DecodingPress(
            KnormPress(), compression_interval=3, target_size=target
        ),
        "key_rerotation(knorm)": lambda: KeyRerotationPress(KnormPress(compression_ratio=RATIO)),
        "prefill_decoding(tova,decoding(tova,compression_interval=2))": lambda: PrefillDecodingPress(
            TOVAPress(compression_ratio=RATIO), DecodingPress(TOVAPress(), compression_interval=2, target_size=target)
        ),
    }[name]()


@pytest.mark.parametrize(
    "spec",
    [
        "decoding(tova,compression_interval=2)",
        "decoding(knorm,compression_interval=3)",
        "prefill_decoding(tova,decoding(tova,compression_interval=2))",
        "key_rerotation(knorm)",
    ],
)
def test_a_decoding_cell_answers_what_kvpress_pipeline_answers(spec):
    generator = make_generator("llama")
    tokenizer, model = generator.tokenizer, generator.model
    inputs = generator.preprocess(CONTEXT, QUESTIONS[:1], "", 10**6)
    context, question = inputs["context_ids"], inputs["questions_ids"][0]
    length = context.shape[1]
    press = make_press(spec, RATIO, length)
    ours = generate(model, context, question, press, MAX_NEW_TOKENS, eos_ids(model))
    reference = kvpress_reference(spec, int(length * (1 - RATIO)))
    answer = generator._forward(inputs, max_new_tokens=MAX_NEW_TOKENS, press=reference)[0]
    full = generator._forward(inputs, max_new_tokens=MAX_NEW_TOKENS, press=None)[0]
    assert tokenizer.decode(ours.token_ids, skip_special_tokens=True) == answer
    assert answer != full, "the budget changes the answer here, so the test tells the press ran"


def test_the_shared_path_starts_the_question_where_the_per_cell_path_does():
    """``key_rerotation(knorm)`` from the shared prefill decodes as its own prefill does; knorm beside it keeps
    the full context's positions (one batch, two starts)."""
    import torch

    from evaluation.catalogue.registry import question_position
    from evaluation.engine.decoding import decode_batch
    from evaluation.engine.history import History

    generator = make_generator("llama")
    model = generator.model
    inputs = generator.preprocess(CONTEXT, QUESTIONS[:1], "", 10**6)
    context, question = inputs["context_ids"], inputs["questions_ids"][0]
    length = context.shape[1]
    specs = ["key_rerotation(knorm)", "knorm"]
    presses = [make_press(spec, RATIO, length) for spec in specs]
    history = History(model, frozenset({"context"}), presses)
    history.extend(context[0].tolist(), "context")
    caches = [history.compress(press) for press in presses]
    starts = [question_position(p, length, c.cache.get_seq_length()) for p, c in zip(presses, caches, strict=True)]
    assert starts == [int(length * (1 - RATIO)), length]
    with torch.no_grad():
        shared = decode_batch(model, caches, question, starts, MAX_NEW_TOKENS, eos_ids(model))
    alone = [
        generate(model, context, question, make_press(s, RATIO, length), MAX_NEW_TOKENS, eos_ids(model)) for s in specs
    ]
    assert shared == [generation.token_ids for generation in alone]
