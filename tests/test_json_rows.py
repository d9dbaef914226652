"""One reader of JSON rows (evaluation.runs.json_rows): data files and result files, errors naming file and line."""

from __future__ import annotations

import json

import pytest

from evaluation.errors import EvaluationError
from evaluation.runs.json_rows import load_json_rows, read_rows
from evaluation.runs.store import ResultStore
from tests.helpers import SHARED_DATA


def test_the_shared_files_read_as_json_reads_them():
    longbench, locomo = SHARED_DATA / "longbench" / "multi_news.jsonl", SHARED_DATA / "locomo" / "locomo10.json"
    assert load_json_rows(longbench) == [json.loads(line) for line in longbench.read_text().splitlines()]
    assert load_json_rows(locomo) == json.loads(locomo.read_text())


@pytest.mark.parametrize(
    "text",
    ['[{"a": 1, "b": [2]},\n {"a": 3}]', '{"a": 1, "b": [2]}\n\n{"a": 3}\n', '\ufeff{"a": 1, "b": [2]}\r\n{"a": 3}'],
)
def test_an_array_or_json_lines_give_a_table_whose_missing_keys_are_none(tmp_path, text):
    path = tmp_path / "rows.json"
    path.write_text(text, encoding="utf-8")
    assert read_rows(path) == [{"a": 1, "b": [2]}, {"a": 3}]
    assert [list(row.items()) for row in load_json_rows(path)] == [[("a", 1), ("b", [2])], [("a", 3), ("b", None)]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a": 1}\n{"a": "\xff"}\n', "not a readable JSON file (line 2: not UTF-8 text, invalid start byte)"),
        (b'{"a": 1}\n\n{"a": \n', "not a readable JSON file (line 3, column 7: Expecting value)"),
        (b'[{"a": 1},\n {"a": }]', "not a readable JSON file (line 2, column 8: Expecting value)"),
        (b'{"a": 1}\n[1]\n', "line 2 is not a JSON object"),
        (b'[{"a": 1}, 2]', "item 2 of the array is not a JSON object"),
        (b"\n \n", "holds no rows"),
    ],
)
def test_a_bad_file_is_a_one_line_error_naming_it_and_the_line(tmp_path, data, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    with pytest.raises(EvaluationError) as error:
        load_json_rows(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


def test_a_result_store_reads_through_the_same_reader_and_says_what_to_do(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_bytes(b'{"k": "a"}\n{"k": \n')
    with pytest.raises(EvaluationError, match=r"\(line 2, column 7: Expecting value\); the folder was edited"):
        ResultStore(path, lambda row: row["k"])
