"""The A/B rule (gpuengine/gate/rules/paired.py): exact signed-rank p, the median interval, and the rule's
false alarms and power on simulated sessions with known process offsets."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpuengine.gate.rules.paired import (ALPHA, DEFAULT_PROCESS_SD, MIN_ROUNDS, PREFERRED_ROUNDS, RANK_ALPHA, decide_paired,
                                    detectable_slowdown, median_interval, power_summary, preferred_rounds,
                                    signed_rank_p_greater)
from gpuengine.gate.rules.verdicts import IMPROVED, NOT_SIGNIFICANT, REGRESSED


def brute_force_p(d):
    """P(W+ >= observed) by enumerating every sign pattern of the magnitudes."""
    d = [x for x in d if x != 0]
    magnitudes = sorted(abs(x) for x in d)
    ranks = {}
    for value in set(magnitudes):
        positions = [i + 1 for i, m in enumerate(magnitudes) if m == value]
        ranks[value] = sum(positions) / len(positions)
    observed = sum(ranks[abs(x)] for x in d if x > 0)
    sums = [sum(ranks[abs(x)] for x, s in zip(d, signs) if s)
            for signs in itertools.product((0, 1), repeat=len(d))]
    return sum(s >= observed - 1e-9 for s in sums) / len(sums)


@pytest.mark.parametrize("d", [[1, 2, 3, 4, 5, 6, 7], [1, -2, 3, 4, 5, 6, 7], [0.5, -0.5, 1, 1, -2, 3, 0, 4],
                               [-1, -2, -3], [0.1, 0.1, 0.1, -0.1, 0.2]])
def test_signed_rank_p_is_exact_ties_and_zeros_included(d):
    assert signed_rank_p_greater(d) == pytest.approx(brute_force_p(d))


def test_seven_rounds_pass_the_rank_test_with_one_small_stray_round_and_not_with_a_large_one():
    assert signed_rank_p_greater(range(1, MIN_ROUNDS + 1)) == 2.0 ** -MIN_ROUNDS
    assert signed_rank_p_greater([-1, 2, 3, 4, 5, 6, 7]) < RANK_ALPHA
    assert signed_rank_p_greater([1, 2, 3, 4, 5, 6, -7]) > RANK_ALPHA


def test_median_interval_uses_order_statistics_that_cover_the_median():
    assert median_interval(range(7)) == (0, 6)          # too few rounds for more: the whole range
    assert median_interval(range(20)) == (5, 14)        # the textbook k = 6 for n = 20 at 95%
    rng = np.random.default_rng(1)
    covered = np.mean([lo <= 0 <= hi for lo, hi in (median_interval(rng.standard_normal(15)) for _ in range(2000))])
    assert covered >= 0.95


def simulated_session(rng, slowdown, rounds, process_sd=DEFAULT_PROCESS_SD, round_sd=0.003):
    """Head and base round times of one session: each process with its own offset, each round its noise."""
    base_offset, head_offset = rng.normal(0, process_sd, 2)
    base = 100 * np.exp(base_offset + rng.normal(0, round_sd, rounds))
    head = 100 * (1 + slowdown) * np.exp(head_offset + rng.normal(0, round_sd, rounds))
    return head, base


def test_an_unchanged_engine_almost_never_fails_and_a_5_percent_slowdown_almost_always_does():
    rng = np.random.default_rng(2)
    sessions = 4000
    alarms = sum(decide_paired(*simulated_session(rng, 0.0, MIN_ROUNDS)).verdict == REGRESSED
                 for _ in range(sessions))
    assert alarms / sessions <= 2 * ALPHA   # ~40 tests: the tier green >= 95% of runs
    caught = sum(decide_paired(*simulated_session(rng, 0.05, MIN_ROUNDS)).verdict == REGRESSED
                 for _ in range(1000))
    assert caught / 1000 >= 0.95
    assert detectable_slowdown(DEFAULT_PROCESS_SD, 0.003, MIN_ROUNDS) < 0.05


def test_a_speed_up_is_an_improvement_and_a_small_shift_within_the_bar_passes():
    rng = np.random.default_rng(3)
    faster = decide_paired(*simulated_session(rng, -0.08, 9, process_sd=0.0))
    assert faster.verdict == IMPROVED
    assert f"signed-rank p(faster)={faster.p_faster:.2g}," in faster.describe() and faster.p_faster < 0.01
    assert decide_paired(*simulated_session(rng, 0.01, 9, process_sd=0.0)).verdict == NOT_SIGNIFICANT


def test_rounds_are_compared_per_sample_and_the_line_names_the_slowdown_interval_and_bar():
    head = [210.0, 212.0, 211.0, 209.0, 213.0, 210.0, 211.0]   # twice the samples a round
    base = [100.0, 100.5, 100.2, 99.8, 100.1, 100.3, 100.0]
    decision = decide_paired(head, base, head_samples=2, base_samples=1, process_sd=0.002, source="A/A, 3 runs")
    assert decision.verdict == REGRESSED and decision.slowdown == pytest.approx(0.0535, abs=0.003)
    line = decision.describe()
    assert "+5.3%" in line and "95% CI" in line and "bar 2.0%" in line and "A/A, 3 runs" in line
    assert f"signed-rank p(slower)={decision.p_slower:.2g}," in line
    low, high = decision.interval
    assert low <= decision.slowdown <= high
    assert decision.as_dict()["verdict"] == REGRESSED and math.isclose(decision.as_dict()["bar"], 0.02, abs_tol=1e-4)


@pytest.mark.parametrize("head, base, message", [([1.0, 2.0], [1.0], "same non-zero number"), ([], [], "non-zero"),
                                                 ([0.0], [1.0], "no measurable time"),
                                                 ([float("nan")], [1.0], "not finite")])
def test_unpaired_or_empty_or_zero_rounds_are_refused(head, base, message):
    with pytest.raises(ValueError, match=message):
        decide_paired(head, base)


def test_a_b_tests_ask_for_more_rounds_where_rounds_are_cheap():
    low, high = PREFERRED_ROUNDS
    assert preferred_rounds(None) == low and preferred_rounds(500.0) == low   # ResNet's 0.5 s round sets
    assert preferred_rounds(10.0) == high and low < preferred_rounds(150.0) < high
    # the fewest it asks for still tolerates one stray round of the largest rank at the rank test's level
    assert signed_rank_p_greater([-100.0] + [float(i) for i in range(1, low)]) < RANK_ALPHA
    assert signed_rank_p_greater([-100.0, -99.0, -98.0] + [float(i) for i in range(1, high - 2)]) < RANK_ALPHA


def test_each_decision_says_what_slowdown_its_noise_lets_it_catch():
    rng = np.random.default_rng(3)
    steady = decide_paired(*simulated_session(rng, 0.0, 21))
    noisy_head = np.exp(rng.normal(0, 0.2, 21))
    noisy = decide_paired(noisy_head, np.ones(21))
    assert steady.catches < 0.05 < noisy.catches and "catches" in steady.describe()
    assert steady.as_dict()["catches_95pct"] == round(steady.catches, 5)


def test_the_power_summary_counts_the_tests_that_would_catch_each_slowdown():
    lines = power_summary({"a": 0.03, "b": 0.07, "c": 0.26})
    assert lines[0].startswith("a 5% slowdown: caught 95% of the time by 1 of 3")
    assert lines[1].startswith("a 10% slowdown: caught 95% of the time by 2 of 3")
    assert lines[2:] == ["    not by c: catches 26.0%"]
    assert power_summary({}) == []
