"""Two-sample statistics of per-round timings in NumPy: Mann-Whitney U and a bootstrap CI of the median shift.

Mann-Whitney U (Mann & Whitney 1947) uses the normal approximation with the
tie-corrected variance and a continuity correction (Hollander & Wolfe,
"Nonparametric Statistical Methods", ch. 4). The confidence interval of the
shift of medians is the percentile bootstrap (Efron & Tibshirani 1993,
ch. 13) with a fixed seed, so the same samples always give the same verdict.
The rank test's power is simulated on normal rounds (seeded): at 5-10 rounds
the asymptotic formulas (relative efficiency 3/pi, Noether's sample size) are
off by 10-15 points either way. A sample median of normal data has the
asymptotic variance pi/2 * sd^2 / n. Each is checked against scipy.stats
over many random samples (correctness_tests/gate/test_statistics_vs_scipy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

STANDARD_NORMAL = NormalDist()
MEDIAN_VARIANCE_FACTOR = math.pi / 2   # var(sample median) = pi/2 * sd^2 / n for normal data
BOOTSTRAP_SEED = 20261123
MAD_TO_SD = 1.4826                     # median absolute deviation -> sd for normal data


def normal_cdf(z: float) -> float:
    return STANDARD_NORMAL.cdf(z)


def normal_quantile(p: float) -> float:
    return STANDARD_NORMAL.inv_cdf(p)


@dataclass(frozen=True)
class RankTest:
    """One-sided Mann-Whitney test that the first sample tends to lie below the second."""

    u: float          # U of the first sample: pairs (x, y) with x > y, ties counting 1/2
    z: float
    p_value: float
    n: int
    m: int


def average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..N with ties given their average rank, and the size of each group of ties."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2)[inverse], counts


def mann_whitney_less(x, y) -> RankTest:
    """p-value of "x tends to be smaller than y" (one-sided); p = 1 when every value ties."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    n, m = len(x), len(y)
    if n < 1 or m < 1:
        raise ValueError(f"Mann-Whitney needs at least one value on each side, got {n} and {m}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("Mann-Whitney got a non-finite value")
    ranks, ties = average_ranks(np.concatenate([x, y]))
    u = float(ranks[:n].sum() - n * (n + 1) / 2)
    total = n + m
    tie_term = float((ties ** 3 - ties).sum()) / (total * (total - 1)) if total > 1 else 0.0
    variance = n * m / 12 * ((total + 1) - tie_term)
    if variance <= 0:
        return RankTest(u, 0.0, 1.0, n, m)
    z = (u - n * m / 2 + 0.5) / math.sqrt(variance)   # +0.5: continuity correction towards the null
    return RankTest(u, z, normal_cdf(z), n, m)


def bootstrap_median_shift(baseline, current, level: float = 0.95, resamples: int = 1000,
                           seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """median(current) - median(baseline) and its percentile-bootstrap interval at `level`."""
    baseline = np.asarray(baseline, dtype=np.float64).ravel()
    current = np.asarray(current, dtype=np.float64).ravel()
    if len(baseline) < 1 or len(current) < 1:
        raise ValueError("the bootstrap needs at least one value on each side")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    base_medians = np.median(baseline[rng.integers(0, len(baseline), (resamples, len(baseline)))], axis=1)
    current_medians = np.median(current[rng.integers(0, len(current), (resamples, len(current)))], axis=1)
    shifts = current_medians - base_medians
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(shifts, [tail, 100 - tail])
    return float(np.median(current) - np.median(baseline)), float(low), float(high)


def robust_sd(values) -> float:
    """Spread of a sample that one stray round cannot inflate: 1.4826 x median absolute deviation."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if len(values) < 2:
        return 0.0
    return float(MAD_TO_SD * np.median(np.abs(values - np.median(values))))


def rank_test_power(shift_sd: float, rounds: int, alpha: float, draws: int = 2000) -> float:
    """Chance that `mann_whitney_less(baseline, current)` at `alpha`, `rounds` a side, sees `current` shifted
    up by `shift_sd` round sds: simulated on normal rounds with a fixed seed (the asymptotic formulas
    promise too much at 5-10 rounds), so it is monotone in the shift and repeatable."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    baseline = rng.standard_normal((draws, rounds))
    current = rng.standard_normal((draws, rounds)) + shift_sd
    u = (baseline[:, :, None] > current[:, None, :]).sum(axis=(1, 2))   # U of the baseline; no ties
    sd = math.sqrt(rounds * rounds * (2 * rounds + 1) / 12)
    critical = rounds * rounds / 2 - 0.5 + normal_quantile(alpha) * sd   # p < alpha  <=>  U < critical
    return float(np.mean(u < critical))


def rank_test_detectable_shift(round_sd: float, rounds: int, alpha: float, power: float) -> float:
    """Smallest shift the rank test at `alpha`, `rounds` a side, sees with `power`; inf when it never can
    (too few rounds for `alpha`: 4 a side cannot reach p < 0.01)."""
    if round_sd <= 0:
        return 0.0
    low, high = 0.0, 20.0
    if rank_test_power(high, rounds, alpha) < power:
        return float("inf")
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (low, mid) if rank_test_power(mid, rounds, alpha) >= power else (mid, high)
    return high * round_sd
