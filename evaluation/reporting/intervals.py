"""Seeded bootstrap confidence intervals over examples, and paired comparisons against a reference press."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED

BATCH = 1_000  # resamples drawn at a time, so memory stays O(batch x examples)
MIN_EXAMPLES_FOR_INTERVAL = 2  # one example has no spread: its bootstrap interval would be a point
MIN_PAIRS = 10  # fewer pairs than this get "too few" instead of win / tie / loss: two values give three means


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% percentile-bootstrap interval."""

    mean: float
    low: float
    high: float

    def scaled(self, factor: float) -> Interval:
        return Interval(self.mean * factor, self.low * factor, self.high * factor)

    def verdict(self) -> str:
        """For a paired difference: ``tie`` when the interval contains 0, else ``win`` or ``loss``."""
        if self.low <= 0 <= self.high:
            return "tie"
        return "win" if self.low > 0 else "loss"


def bootstrap(values: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> Interval:
    """Mean of ``values`` and the 2.5th and 97.5th percentiles of the means of ``resamples`` resamples of the
    examples with replacement. Paired data are bootstrapped as their per-example differences, so both sides of
    a pair are always drawn together."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot bootstrap an empty set of examples")
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [
            values[rng.integers(0, values.size, size=(min(BATCH, resamples - start), values.size))].mean(axis=1)
            for start in range(0, resamples, BATCH)
        ]
    )
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(float(values.mean()), float(low), float(high))


def paired(
    scores: dict[object, float], reference: dict[object, float], label: str, resamples: int, seed: int
) -> Interval:
    """The bootstrap interval of the per-example difference ``scores - reference``, paired by example id.

    Both sides must cover exactly the same examples: unpaired ones are reported, never silently dropped. A
    cell that failed on either side (NaN) leaves its pair out.
    """
    missing, extra = sorted(set(reference) - set(scores), key=str), sorted(set(scores) - set(reference), key=str)
    if missing or extra:
        raise ValueError(
            f"{label}: the runs disagree on examples ({len(missing)} only in the reference, e.g. {missing[:3]}; "
            f"{len(extra)} only in the compared press, e.g. {extra[:3]}); pair runs over the same examples"
        )
    ids = sorted(scores, key=str)
    differences = np.array([scores[i] - reference[i] for i in ids], dtype=np.float64)
    return bootstrap(differences[~np.isnan(differences)], resamples, seed)
