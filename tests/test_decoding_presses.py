"""Decoding presses on the evaluation's per-cell path run as KVPress's pipeline runs them: the context prefilled
uncompressed (a ``PrefillDecodingPress`` prefills under its prefilling press), then the press compresses while the
question is appended and the answer generated, to the cell's budget as its target size."""

from __future__ import annotations

import pytest
from kvpress import DecodingPress, KnormPress, PrefillDecodingPress

from evaluation.generation import eos_ids, generate
from evaluation.press_specs import make_press
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
