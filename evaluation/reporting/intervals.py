"""Seeded bootstrap confidence intervals over examples, paired comparisons against a reference press with their
p-values and power, and Holm's correction over a family of comparisons."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED

BATCH = 1_000  # resamples drawn at a time, so memory stays O(batch x examples)
MIN_EXAMPLES_FOR_INTERVAL = 2  # one example has no spread: its bootstrap interval would be a point
MIN_PAIRS = 10  # fewer pairs than this get "too few" instead of win / tie / loss: two values give three means
ALPHA = 0.05  # two-sided, as the 95% intervals
POWER = 0.80
# z_(1 - alpha / 2) + z_power = 1.95996 + 0.84162: the normal approximation behind the minimum detectable effect
POWER_FACTOR = NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% percentile-bootstrap interval."""

    mean: float
    low: float
    high: float

    def scaled(self, factor: float) -> Interval:
        return Interval(self.mean * factor, self.low * factor, self.high * factor)

    def verdict(self, higher_is_better: bool = True) -> str:
        """For a paired difference: ``tie`` when the interval contains 0, else ``win`` or ``loss`` (a win is a
        positive difference where higher is better, a negative one where lower is)."""
        if self.low <= 0 <= self.high:
            return "tie"
        return "win" if (self.low > 0) == higher_is_better else "loss"


@dataclass(frozen=True)
class Difference(Interval):
    """A paired difference: its interval, the bootstrap's two-sided p-value for a mean difference of 0, the
    standard deviation of the per-example differences (ddof 1) and the number of pairs."""

    p: float
    sd: float
    n: int

    @property
    def detectable(self) -> float:
        """The smallest mean difference these pairs detect with 80% power at a two-sided 5% level, by the normal
        approximation: (z_0.975 + z_0.8) x sd / sqrt(n)."""
        return minimum_detectable(self.sd, self.n)


def minimum_detectable(sd: float, n: int) -> float:
    return POWER_FACTOR * sd / np.sqrt(n)


def resampled_means(values: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> np.ndarray:
    """The means of ``resamples`` resamples of ``values`` with replacement, seeded."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot bootstrap an empty set of examples")
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [
            values[rng.integers(0, values.size, size=(min(BATCH, resamples - start), values.size))].mean(axis=1)
            for start in range(0, resamples, BATCH)
        ]
    )


def bootstrap(values: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> Interval:
    """Mean of ``values`` and the 2.5th and 97.5th percentiles of the means of ``resamples`` resamples of the
    examples with replacement. Paired data are bootstrapped as their per-example differences, so both sides of
    a pair are always drawn together."""
    means = resampled_means(values, resamples, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(float(np.mean(values)), float(low), float(high))


def bootstrap_p(means: np.ndarray) -> float:
    """The two-sided p-value of a mean of 0 from the same resampled means as the interval: twice the smaller
    share of them on either side of 0, at most 1. It is under 5% about when the 95% percentile interval leaves
    out 0."""
    return float(min(1.0, 2 * min(np.mean(means <= 0), np.mean(means >= 0))))


def paired(
    scores: dict[object, float], reference: dict[object, float], label: str, resamples: int, seed: int
) -> Difference:
    """The bootstrap interval of the per-example difference ``scores - reference``, paired by example id, with
    its p-value, the differences' standard deviation and n.

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
    differences = differences[~np.isnan(differences)]
    means = resampled_means(differences, resamples, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    sd = float(np.std(differences, ddof=1)) if differences.size > 1 else float("nan")
    return Difference(float(differences.mean()), float(low), float(high), bootstrap_p(means), sd, int(differences.size))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest times (m - i + 1), made
    non-decreasing along that order, at most 1."""
    order = np.argsort(p_values, kind="stable")
    m = len(p_values)
    adjusted = np.empty(m)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def holm_verdict(mean: float, adjusted_p: float, higher_is_better: bool = True) -> str:
    """``tie`` unless the Holm-adjusted p-value is under 5%, else ``win`` or ``loss`` by the difference's sign."""
    if adjusted_p >= ALPHA:
        return "tie"
    return "win" if (mean > 0) == higher_is_better else "loss"
