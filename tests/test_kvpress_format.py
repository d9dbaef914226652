"""KVPress-format examples: the prompt is KVPress's pipeline's own split of context and question (tokens equal to
its ``preprocess``), an exported parquet reads back with KVPress's columns and values, and a file without them is
one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from kvpress import KVPressTextGenerationPipeline

from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import COLUMNS, KVPressExample, export_parquet, read_examples
from evaluation.protocols.kvpress.prompt import build_prompt, prompt_tokens
from tests.helpers import CHAT_TEMPLATE, byte_tokenizer, tiny_model

EXAMPLE = KVPressExample(
    id="niah/0",
    task="niah_single_1",
    context="Some text. One of the special magic numbers for amber-river is: 1234567. More text.\n",
    question="What is the special magic number for amber-river mentioned in the provided text?",
    answer_prefix=" The special magic number for amber-river mentioned in the provided text is",
    answers=("1234567",),
    max_new_tokens=16,
    length=256,
    depth=0.12,
)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None])
@pytest.mark.parametrize("aware", [False, True])
def test_the_prompt_is_kvpress_pipelines_own(template, aware):
    tokenizer = byte_tokenizer(template)
    pipe = KVPressTextGenerationPipeline(model=tiny_model("llama", "sdpa", vocab_size=260), tokenizer=tokenizer)
    context, question = (EXAMPLE.context + EXAMPLE.question, "") if aware else (EXAMPLE.context, EXAMPLE.question)
    expected = pipe.preprocess(context, [question], EXAMPLE.answer_prefix, 10_000)
    prompt = build_prompt(EXAMPLE, tokenizer, 10_000, aware)
    assert torch.equal(prompt.context_ids, expected["context_ids"])
    assert torch.equal(prompt.question_ids, expected["questions_ids"][0])
    assert not prompt.truncated
    whole = prompt.context_ids.shape[1] + prompt.question_ids.shape[1]
    assert prompt_tokens(tokenizer, EXAMPLE.context, EXAMPLE.question, EXAMPLE.answer_prefix) == whole
    cut = build_prompt(EXAMPLE, tokenizer, 20, aware)
    assert cut.truncated and torch.equal(cut.context_ids, expected["context_ids"][:, :20])


def test_an_exported_parquet_has_kvpress_columns_and_reads_back(tmp_path):
    path = tmp_path / "examples.parquet"
    export_parquet([EXAMPLE], path)
    frame = pd.read_parquet(path)
    assert set(COLUMNS) <= set(frame.columns)
    row = frame.iloc[0]
    assert row["context"] == EXAMPLE.context and row["question"] == EXAMPLE.question
    assert row["answer_prefix"] == EXAMPLE.answer_prefix and list(row["answer"]) == ["1234567"]
    assert row["task"] == "niah_single_1" and row["max_new_tokens"] == 16
    back = read_examples(path)[0]
    assert (back.context, back.question, back.answers, back.id) == (
        EXAMPLE.context,
        EXAMPLE.question,
        ("1234567",),
        "niah/0",
    )


def test_a_file_without_kvpress_columns_is_one_line(tmp_path):
    path = tmp_path / "bad.parquet"
    pd.DataFrame([{"context": "x", "question": "y"}]).to_parquet(path)
    with pytest.raises(EvaluationError, match="lacks KVPress's column") as error:
        read_examples(path)
    assert "\n" not in str(error.value)
    jsonl = tmp_path / "answer.jsonl"
    row = {**EXAMPLE.columns(), "answer": 7}
    pd.DataFrame([row]).to_json(jsonl, orient="records", lines=True)
    with pytest.raises(EvaluationError, match="row 1: answer must be a string or a list of strings"):
        read_examples(jsonl)
