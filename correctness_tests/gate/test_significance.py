"""gpuengine.gate.rules.significance: Mann-Whitney U against its exact distribution, the bootstrap's coverage, power.

Seeded simulations: each rate is a property of the statistic, checked on
enough draws that the bound holds with a wide margin, and the same every run.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuengine.gate.rules.significance import (average_ranks, bootstrap_median_shift, mann_whitney_less,
    rank_test_detectable_shift, rank_test_power, robust_sd)


def exact_p_value(x, y) -> float:
    """P(U <= observed U) over every relabelling of the pooled sample: the exact null distribution."""
    pooled = np.concatenate([x, y])
    observed = mann_whitney_less(x, y).u
    us = [mann_whitney_less(pooled[list(c)], np.delete(pooled, list(c))).u
          for c in itertools.combinations(range(len(pooled)), len(x))]
    return float(np.mean(np.array(us) <= observed + 1e-9))


@pytest.mark.parametrize("seed", range(4))
def test_normal_approximation_is_close_to_the_exact_p_value(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(0, 1, 6), rng.normal(0.8, 1, 7)
    assert mann_whitney_less(x, y).p_value == pytest.approx(exact_p_value(x, y), abs=0.02)


def test_tie_corrected_variance_matches_the_exact_permutation_variance():
    x, y = np.array([1.0, 1.0, 2.0, 3.0]), np.array([2.0, 2.0, 3.0, 3.0, 4.0])
    pooled = np.concatenate([x, y])
    us = np.array([mann_whitney_less(pooled[list(c)], np.delete(pooled, list(c))).u
                   for c in itertools.combinations(range(9), 4)])
    test = mann_whitney_less(x, y)
    # z = (U - mean + 1/2) / sd: recover sd and compare with the exact one
    implied_sd = (test.u - 4 * 5 / 2 + 0.5) / test.z
    assert us.mean() == pytest.approx(10.0)
    assert implied_sd == pytest.approx(us.std(), rel=1e-9)


def test_average_ranks_share_ties():
    ranks, ties = average_ranks(np.array([3.0, 1.0, 3.0, 2.0]))
    assert ranks.tolist() == [3.5, 1.0, 3.5, 2.0] and sorted(ties.tolist()) == [1, 1, 2]


def test_direction_and_degenerate_samples():
    assert mann_whitney_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]).p_value < 0.01
    assert mann_whitney_less([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]).p_value > 0.99
    assert mann_whitney_less([2, 2, 2], [2, 2]).p_value == 1.0   # every value ties: no evidence either way


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_less([], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        mann_whitney_less([1.0, float("nan")], [1.0])


def test_false_alarm_rate_under_the_null_stays_at_alpha():
    rng = np.random.default_rng(11)
    p = [mann_whitney_less(rng.normal(0, 1, 7), rng.normal(0, 1, 7)).p_value for _ in range(4000)]
    assert np.mean(np.array(p) < 0.01) <= 0.015
    assert np.mean(np.array(p) < 0.05) == pytest.approx(0.05, abs=0.015)


@pytest.mark.parametrize("rounds", [5, 7, 12])
def test_detectable_shift_gives_the_power_it_promises(rounds):
    rng = np.random.default_rng(12)
    shift = rank_test_detectable_shift(round_sd=1.0, rounds=rounds, alpha=0.01, power=0.9)
    p = [mann_whitney_less(rng.normal(0, 1, rounds), rng.normal(shift, 1, rounds)).p_value for _ in range(2000)]
    assert np.mean(np.array(p) < 0.01) == pytest.approx(0.9, abs=0.03)


def test_four_rounds_a_side_can_never_reach_one_percent():
    assert rank_test_detectable_shift(round_sd=1.0, rounds=4, alpha=0.01, power=0.5) == float("inf")
    assert rank_test_power(50.0, rounds=4, alpha=0.01) == 0.0


def test_bootstrap_interval_covers_the_true_shift_about_95_percent_of_the_time():
    rng = np.random.default_rng(13)
    covered = []
    for seed in range(200):
        base, current = rng.normal(0, 1, 25), rng.normal(0.5, 1, 25)
        _, low, high = bootstrap_median_shift(base, current, seed=seed)
        covered.append(low <= 0.5 <= high)
    assert 0.88 <= np.mean(covered) <= 0.99


def test_bootstrap_is_repeatable_and_centred_on_the_median_shift():
    base, current = [1.0, 1.1, 0.9, 1.05, 0.95], [1.2, 1.3, 1.1, 1.25, 1.15]
    first, second = bootstrap_median_shift(base, current), bootstrap_median_shift(base, current)
    assert first == second
    assert first[0] == pytest.approx(0.2) and first[1] <= 0.2 <= first[2]


def test_robust_sd_ignores_one_stray_round():
    steady = np.array([1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01])
    assert robust_sd(np.append(steady, 50.0)) < 3 * robust_sd(steady)
    assert robust_sd([1.0]) == 0.0
