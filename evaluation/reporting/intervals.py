"""Seeded bootstrap confidence intervals over examples (over clusters where examples share a unit), paired
comparisons against a reference press tested by sign-flip permutation (exact up to ``EXACT_UP_TO`` non-zero
differences, else Monte Carlo with its error), their power, and Holm's correction over a family of comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED

BATCH = 1_000  # resamples drawn at a time, so memory stays O(batch x examples)
MIN_EXAMPLES_FOR_INTERVAL = 2  # one example has no spread: its bootstrap interval would be a point
MIN_PAIRS = 10  # fewer clusters (pairs, unclustered) than this get "too few": two values give three means
ALPHA = 0.05  # two-sided, as the 95% intervals
POWER = 0.80
# z_(1 - alpha / 2) + z_power = 1.95996 + 0.84162: the normal approximation behind the minimum detectable effect
POWER_FACTOR = NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)
EXACT_UP_TO = 20  # the sign-flip test enumerates every assignment of at most this many non-zero differences
MIN_FLIPS = 10_000  # above that, at least this many seeded random sign flips
MAX_FLIPS = 1_000_000  # a test whose Holm decision its Monte Carlo error leaves open is redrawn with up to this many
EXACT_TO_SETTLE = 40  # or, with at most this many non-zero differences, enumerated (two halves of 2^20 totals)
MC_ERROR_SE = 3.0  # a Monte Carlo p-value's stated error, in standard errors sqrt(p (1 - p) / flips)
TOLERANCE = 1e-9  # relative: a flipped |sum| this close to the observed one counts as reaching it (rounding)


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
class Permutation:
    """A paired sign-flip permutation test of a mean difference of 0: its two-sided p-value, whether it enumerated
    every sign flip (``exact``) or drew ``flips`` of them, and then ``error``, the Monte Carlo error of ``p``
    (``MC_ERROR_SE`` standard errors, sqrt(p (1 - p) / flips); 0 when exact)."""

    p: float
    exact: bool
    flips: int
    error: float = 0.0
    sums: tuple[float, ...] = field(default=(), repr=False)  # the non-zero cluster sums a redraw flips


@dataclass(frozen=True)
class Difference(Interval):
    """A paired difference: its (cluster) bootstrap interval, the sign-flip permutation test's two-sided p-value
    for a mean difference of 0 (``test``), the standard deviation of the per-pair differences (ddof 1), the number
    of pairs and of the clusters they come from, and the mean's standard error (cluster-robust; sd / sqrt(n) when
    every pair is its own cluster)."""

    p: float
    sd: float
    n: int
    clusters: int = 0
    se: float = float("nan")
    test: Permutation | None = None

    @property
    def detectable(self) -> float:
        """The smallest mean difference these pairs detect with 80% power at a two-sided 5% level, by the normal
        approximation: (z_0.975 + z_0.8) x the mean's standard error (sd / sqrt(n) without clusters)."""
        return POWER_FACTOR * self.se

    @property
    def p_error(self) -> float:
        return self.test.error if self.test else 0.0


def resampled_means(values: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> np.ndarray:
    """The means of ``resamples`` resamples of ``values`` with replacement, seeded."""
    values = np.asarray(values, dtype=np.float64)
    return resampled_cluster_means(values, np.ones_like(values), resamples, seed)


def resampled_cluster_means(
    sums: np.ndarray, sizes: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> np.ndarray:
    """The cluster bootstrap: ``resamples`` times, as many clusters as there are drawn with replacement, and the
    mean over their pairs (the drawn clusters' summed values over their summed sizes). With every size 1 this is
    the ordinary bootstrap of the values, draw for draw."""
    sums, sizes = np.asarray(sums, dtype=np.float64), np.asarray(sizes, dtype=np.float64)
    if sums.size == 0:
        raise ValueError("cannot bootstrap an empty set of examples")
    rng, single = np.random.default_rng(seed), bool(np.all(sizes == 1))
    means = []
    for start in range(0, resamples, BATCH):
        drawn = rng.integers(0, sums.size, size=(min(BATCH, resamples - start), sums.size))
        means.append(sums[drawn].mean(axis=1) if single else sums[drawn].sum(axis=1) / sizes[drawn].sum(axis=1))
    return np.concatenate(means)


def bootstrap(values: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> Interval:
    """Mean of ``values`` and the 2.5th and 97.5th percentiles of the means of ``resamples`` resamples of the
    examples with replacement. Paired data are bootstrapped as their per-example differences, so both sides of
    a pair are always drawn together."""
    means = resampled_means(values, resamples, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(float(np.mean(values)), float(low), float(high))


def cluster_bootstrap(
    values: np.ndarray, clusters: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> Interval:
    """Mean of ``values`` and the 95% percentile interval of the cluster bootstrap's means (``clusters``: each
    value's cluster id)."""
    sums, sizes = cluster_sums(values, clusters)
    low, high = np.percentile(resampled_cluster_means(sums, sizes, resamples, seed), [2.5, 97.5])
    return Interval(float(np.mean(values)), float(low), float(high))


def cluster_sums(values: np.ndarray, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster (in order of first appearance), the sum of its values and how many it holds."""
    values = np.asarray(values, dtype=np.float64)
    index: dict[str, int] = {}
    inverse = np.array([index.setdefault(str(cluster), len(index)) for cluster in clusters], dtype=np.int64)
    sums = np.bincount(inverse, weights=values, minlength=len(index))
    sizes = np.bincount(inverse, minlength=len(index)).astype(np.float64)
    return sums, sizes


def clustered_se(sums: np.ndarray, sizes: np.ndarray) -> float:
    """The cluster-robust standard error of the mean over all pairs: sqrt(G / (G - 1) x sum over clusters of
    (sum_c - n_c x mean)^2) / n; sd / sqrt(n) when every cluster holds one pair. NaN under two clusters."""
    if sums.size < 2:
        return float("nan")
    residuals = sums - sizes * sums.sum() / sizes.sum()
    return float(np.sqrt(sums.size / (sums.size - 1) * np.sum(residuals**2)) / sizes.sum())


def sign_flip_test(
    sums: np.ndarray, flips: int = MIN_FLIPS, seed: int = DEFAULT_SEED, exact_up_to: int = EXACT_UP_TO
) -> Permutation:
    """The paired sign-flip permutation test of a mean difference of 0, on per-cluster sums of differences (one
    per pair without clusters): the share of sign assignments whose |sum| is at least the observed |sum|. Exact
    over all 2^k assignments of the k non-zero sums when k <= ``exact_up_to`` (a zero sum flips to itself);
    otherwise ``max(flips, MIN_FLIPS)`` seeded random flips, p = (hits + 1) / (flips + 1), with its error."""
    sums = np.asarray(sums, dtype=np.float64)
    sums = sums[sums != 0]
    if sums.size == 0:
        return Permutation(1.0, True, 1)
    observed = abs(sums.sum()) - TOLERANCE * np.abs(sums).sum()
    if observed <= 0:
        return Permutation(1.0, True, 1)
    if sums.size <= exact_up_to:
        return Permutation(exact_share(sums, observed), True, 2**sums.size)
    return monte_carlo(sums, observed, min(max(flips, MIN_FLIPS), MAX_FLIPS), seed)


def signed_totals(values: np.ndarray) -> np.ndarray:
    """Every sum of ``values`` with each sign flipped or not (2^len of them)."""
    totals = np.zeros(1)
    for value in values:
        totals = np.concatenate([totals + value, totals - value])
    return totals


def exact_share(sums: np.ndarray, observed: float) -> float:
    """The share of all 2^k sign assignments of ``sums`` whose |total| reaches ``observed``: the two halves'
    signed totals enumerated apart and met by sorting (2 x 2^(k/2) totals instead of 2^k)."""
    half = sums.size // 2
    first, second = signed_totals(sums[:half]), np.sort(signed_totals(sums[half:]))
    above = second.size - np.searchsorted(second, observed - first, side="left")
    below = np.searchsorted(second, -observed - first, side="right")
    return float((above + below).sum() / (first.size * second.size))


def monte_carlo(sums: np.ndarray, observed: float, flips: int, seed: int) -> Permutation:
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, flips, BATCH):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(min(BATCH, flips - start), sums.size))
        hits += int(np.sum(np.abs(signs @ sums) >= observed))
    p = (hits + 1) / (flips + 1)
    return Permutation(p, False, flips, MC_ERROR_SE * float(np.sqrt(p * (1 - p) / flips)), tuple(sums.tolist()))


def paired(
    scores: dict[object, float],
    reference: dict[object, float],
    label: str,
    resamples: int,
    seed: int,
    clusters: dict[object, object] | None = None,
) -> Difference:
    """The paired difference ``scores - reference``, paired by example id: its mean, the (cluster) bootstrap
    interval, the sign-flip test of its cluster sums, the differences' standard deviation, n, the clusters and the
    clustered standard error. ``clusters`` maps an example id to the unit it shares with others (a conversation,
    an episode); None: every example is its own.

    Both sides must cover exactly the same examples: unpaired ones are reported, never silently dropped. A
    cell that failed on either side (NaN) leaves its pair out.
    """
    missing, extra = sorted(set(reference) - set(scores), key=str), sorted(set(scores) - set(reference), key=str)
    if missing or extra:
        raise ValueError(
            f"{label}: the runs disagree on examples ({len(missing)} only in the reference, e.g. {missing[:3]}; "
            f"{len(extra)} only in the compared press, e.g. {extra[:3]}); pair runs over the same examples"
        )
    ids = [i for i in sorted(scores, key=str) if not np.isnan(scores[i] - reference[i])]
    differences = np.array([scores[i] - reference[i] for i in ids], dtype=np.float64)
    units = np.array([str(clusters[i]) if clusters else str(i) for i in ids], dtype=object)
    sums, sizes = cluster_sums(differences, units) if clusters else (differences, np.ones_like(differences))
    means = resampled_cluster_means(sums, sizes, resamples, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    sd = float(np.std(differences, ddof=1)) if differences.size > 1 else float("nan")
    test = sign_flip_test(sums, resamples, seed)
    mean = float(differences.mean())
    return Difference(
        mean,
        float(low),
        float(high),
        test.p,
        sd,
        int(differences.size),
        int(sums.size),
        clustered_se(sums, sizes),
        test,
    )


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


def settled(tests: list[Permutation], seed: int = DEFAULT_SEED) -> list[Permutation]:
    """``tests`` (one Holm family), each Monte Carlo one whose Holm decision at ``ALPHA`` differs between every p
    at its low and every p at its high end of the Monte Carlo error enumerated exactly where it has at most
    ``EXACT_TO_SETTLE`` non-zero differences, else redrawn with ten times its flips (up to ``MAX_FLIPS``), until
    none differs: Holm is monotone in each p, so then no redraw within the errors (another seed) changes a
    decision. (A million flips leave a p within about 3 x 1.4e-5 of 2e-4, which Holm over 250 tests still puts
    either side of 0.05: RULER's answer NLL did, before the enumeration.)"""
    tests = list(tests)
    while True:
        low = holm([max(0.0, t.p - t.error) for t in tests])
        high = holm([min(1.0, t.p + t.error) for t in tests])
        open_ = [
            i
            for i, t in enumerate(tests)
            if (low[i] < ALPHA) != (high[i] < ALPHA) and not t.exact and t.flips < MAX_FLIPS
        ]
        if not open_:
            return tests
        for i in open_:
            tests[i] = sign_flip_test(np.array(tests[i].sums), 10 * tests[i].flips, seed, EXACT_TO_SETTLE)


def holm_verdict(mean: float, adjusted_p: float, higher_is_better: bool = True) -> str:
    """``tie`` unless the Holm-adjusted p-value is under 5%, else ``win`` or ``loss`` by the difference's sign."""
    if adjusted_p >= ALPHA:
        return "tie"
    return "win" if (mean > 0) == higher_is_better else "loss"
