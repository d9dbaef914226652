"""The synthetic families' and the probe's rule: whether the answer stands in the prediction as a whole word."""

from __future__ import annotations

import re


def string_match(prediction: str, answer: str) -> float:
    """1 when the answer appears in the prediction as a whole word or number (case-insensitive), else 0:
    RULER's containment rule, except that "48213" does not count as holding "4821"."""
    return float(re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", prediction, re.IGNORECASE) is not None)
