"""The gate's statistics, written in NumPy, against scipy.stats over many random samples.

The gate keeps its own: its exact signed-rank test counts tied magnitudes exactly (scipy's exact method
assumes none), its bootstrap is seeded for repeatable verdicts, and the GPU image's lock stays without
scipy. scipy is the CPU tier's (the `stats` extra), so these run in CI.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from gpuengine.gate.rules import paired, significance

stats = pytest.importorskip("scipy.stats", reason="scipy is the CPU tier's `stats` extra (./gate test installs it)")

SAMPLES = 300


def rounds_like(rng, n: int, ties: bool) -> np.ndarray:
    """Per-round times as the gate sees them: near 1 ms, with repeated values where `ties`."""
    values = 1.0 + 0.02 * rng.standard_normal(n)
    return np.round(values, 2) if ties else values


@pytest.mark.parametrize("ties", [False, True])
def test_mann_whitney_matches_scipys_asymptotic_test(ties):
    rng = np.random.default_rng(1)
    for _ in range(SAMPLES):
        n, m = rng.integers(2, 25, size=2)
        x, y = rounds_like(rng, n, ties), rounds_like(rng, m, ties) + rng.uniform(0, 0.03)
        ours = significance.mann_whitney_less(x, y)
        theirs = stats.mannwhitneyu(x, y, use_continuity=True, alternative="less", method="asymptotic")
        assert ours.u == pytest.approx(theirs.statistic)
        if np.isfinite(theirs.pvalue):
            assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9, abs=1e-12)
        else:   # every value tied: no evidence either way
            assert ours.p_value == 1.0


def test_signed_rank_matches_scipys_exact_test_without_ties():
    rng = np.random.default_rng(2)
    for _ in range(SAMPLES):
        d = rng.standard_normal(rng.integers(1, 26)) + rng.uniform(-0.5, 1.0)
        theirs = stats.wilcoxon(d, alternative="greater", method="exact")
        assert paired.signed_rank_p_greater(d) == pytest.approx(theirs.pvalue, rel=1e-9)


def test_signed_rank_with_tied_magnitudes_matches_every_sign_flip_counted():
    rng = np.random.default_rng(3)
    for _ in range(SAMPLES):
        n = rng.integers(2, 12)   # scipy's permutation test takes two or more
        d = rng.choice([-3, -2, -1, 1, 2, 3], size=n).astype(float) * 0.001   # ties, no zeros
        theirs = stats.wilcoxon(d, alternative="greater", method=stats.PermutationMethod(n_resamples=2 ** 12))
        assert paired.signed_rank_p_greater(d) == pytest.approx(theirs.pvalue, rel=1e-9)


def test_robust_sd_is_the_normal_scaled_median_absolute_deviation():
    rng = np.random.default_rng(4)
    for _ in range(SAMPLES):
        values = rounds_like(rng, rng.integers(2, 40), ties=bool(rng.integers(2)))
        assert significance.robust_sd(values) == pytest.approx(
            stats.median_abs_deviation(values, scale="normal"), rel=1e-4, abs=1e-15)


def test_the_bootstrap_interval_of_the_median_shift_agrees_with_scipys_percentile_bootstrap():
    # Both resample at random (ours 1000 times with a fixed seed): the ends agree to Monte Carlo error.
    rng = np.random.default_rng(5)
    for _ in range(60):
        n, m = rng.integers(8, 30, size=2)
        base, head = rounds_like(rng, n, False), rounds_like(rng, m, False) + rng.uniform(-0.02, 0.02)
        shift, low, high = significance.bootstrap_median_shift(base, head)
        theirs = stats.bootstrap((base, head), lambda b, h, axis: np.median(h, axis=axis) - np.median(b, axis=axis),
                                 paired=False, vectorized=True, method="percentile", n_resamples=4000,
                                 rng=np.random.default_rng(6)).confidence_interval
        assert shift == pytest.approx(np.median(head) - np.median(base))
        width = theirs.high - theirs.low
        assert abs(low - theirs.low) <= 0.2 * width and abs(high - theirs.high) <= 0.2 * width


@pytest.mark.parametrize("rounds, alpha", [(5, 0.05), (8, 0.01), (11, 0.05)])
def test_the_rank_tests_simulated_power_counts_scipys_rejections(rounds, alpha):
    draws, shift = 400, 1.2
    rng = np.random.default_rng(significance.BOOTSTRAP_SEED)   # the draws rank_test_power makes
    baseline = rng.standard_normal((draws, rounds))
    current = rng.standard_normal((draws, rounds)) + shift
    p = stats.mannwhitneyu(baseline, current, use_continuity=True, alternative="less", method="asymptotic",
                           axis=1).pvalue
    assert significance.rank_test_power(shift, rounds, alpha, draws=draws) == pytest.approx(np.mean(p < alpha))


def test_the_median_interval_takes_the_binomial_order_statistics():
    rng = np.random.default_rng(7)
    for n in range(1, 40):
        d = np.sort(rng.standard_normal(n))
        tail = (1 - paired.INTERVAL) / 2
        k = max(1, sum(1 for j in range(n // 2) if stats.binom.cdf(j, n, 0.5) <= tail))
        assert paired.median_interval(d) == (d[k - 1], d[n - k])


def test_the_normal_distribution_matches_scipys():
    for z in np.linspace(-5, 5, 41):
        assert significance.normal_cdf(z) == pytest.approx(stats.norm.cdf(z), rel=1e-12, abs=1e-15)
    for p in np.linspace(0.001, 0.999, 41):
        assert significance.normal_quantile(p) == pytest.approx(stats.norm.ppf(p), rel=1e-9)
    assert math.isclose(significance.MAD_TO_SD, 1 / stats.norm.ppf(0.75), rel_tol=1e-4)
