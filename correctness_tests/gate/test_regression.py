"""gpuengine.gate.rules.regression: the stored-run rule's false alarms and power on synthetic runs of known noise.

Runs follow the model the rule assumes (noise.py): each run has its own
offset (run-to-run noise) and each round its own noise; the engine and the
reference share the machine's drift, which the ratio cancels and the engine's
own times do not. Seeded, so every rate is the same on every run of the suite.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from gpuengine.gate.rules.regression import (MIN_ROUNDS, GOAL_SLOWDOWN, NoiseLevels, RunSamples, choose_reference, decide,
                                        detectable_slowdown, recommend_rounds)
from gpuengine.gate.rules.verdicts import IMPROVED, NOT_COMPARABLE, NOT_SIGNIFICANT, REGRESSED


def synthetic_run(rng, slowdown=0.0, between=0.004, round_sd=0.002, rounds=7, reference_speedup=0.0,
                  machine_drift=0.01) -> RunSamples:
    """One run: engine `slowdown` slower, the reference `reference_speedup` faster, the machine drifting."""
    drift = rng.normal(0, machine_drift)               # hits engine and reference alike
    offset = rng.normal(0, between)                    # this run's own offset of the engine vs the reference
    engine = math.log1p(slowdown) + drift + offset + rng.normal(0, round_sd, rounds)
    reference = math.log(2.0) - math.log1p(reference_speedup) + drift + rng.normal(0, round_sd, rounds)
    return RunSamples("torch_graph", engine - reference, engine)


def noise(between=0.004) -> NoiseLevels:
    return NoiseLevels(between, between, f"test noise {between:.1%}")


def regression_rate(seed, pairs, noise_levels, **run) -> float:
    rng = np.random.default_rng(seed)
    baseline_kw = {k: v for k, v in run.items() if k not in ("slowdown", "reference_speedup")}
    flagged = [decide(synthetic_run(rng, **run), synthetic_run(rng, **baseline_kw), noise_levels).verdict == REGRESSED
               for _ in range(pairs)]
    return float(np.mean(flagged))


def test_unchanged_engine_rarely_fails():
    assert regression_rate(1, 400, noise()) <= 0.01


def test_a_five_percent_slowdown_is_caught_at_least_95_percent_of_the_time():
    assert regression_rate(2, 300, noise(), slowdown=0.05) >= 0.95


def test_the_model_predicts_the_slowdown_the_rule_catches():
    between, round_sd, rounds = 0.006, 0.003, 7
    promised = detectable_slowdown(between, round_sd, rounds, round_sd)
    assert 0.02 < promised < 0.06
    caught = regression_rate(3, 300, noise(between), slowdown=promised, between=between, round_sd=round_sd,
                             rounds=rounds)
    assert caught >= 0.95


def test_learned_noise_is_what_keeps_a_noisy_test_quiet():
    noisy = dict(between=0.03, round_sd=0.002)
    assert regression_rate(4, 300, NoiseLevels.uncalibrated(), **noisy) > 0.05   # the 1% prior cries wolf
    # learned, the rate sits at ALPHA = 1%: 1000 pairs hold it to about +-0.3 points
    assert regression_rate(4, 1000, noise(0.03), **noisy) <= 0.02


def test_a_faster_reference_alone_is_not_an_engine_regression():
    rng = np.random.default_rng(5)
    decision = decide(synthetic_run(rng, reference_speedup=0.10, machine_drift=0.0),
                      synthetic_run(rng, machine_drift=0.0), noise())
    assert decision.verdict == NOT_SIGNIFICANT
    assert "did not rise" in decision.reason and decision.primary.shift > decision.primary.min_effect


def test_a_faster_engine_is_an_improvement():
    rng = np.random.default_rng(6)
    assert decide(synthetic_run(rng, slowdown=-0.10), synthetic_run(rng), noise()).verdict == IMPROVED


def test_the_failure_reads_like_pytest_benchmark():
    rng = np.random.default_rng(7)
    decision = decide(synthetic_run(rng, slowdown=0.10), synthetic_run(rng), noise())
    assert decision.verdict == REGRESSED
    line = decision.line("perf_tests/test_x.py::test_x[a]", "Linux-CPython-3.12-64bit/0004_abc.json")
    assert line.startswith("perf_tests/test_x.py::test_x[a] (Linux-CPython-3.12-64bit/0004_abc.json) - "
                           "Field 'engine time / torch_graph time' has failed RankTest+MinEffect: +")
    assert "95% CI" in line and "Mann-Whitney U, 7 vs 7 rounds" in line and "test noise 0.4%" in line
    record = decision.as_dict()
    assert record["verdict"] == REGRESSED and record["primary"]["slowdown"] == pytest.approx(0.10, abs=0.02)
    assert record["confirmation"]["signal"] == "engine time per sample"


def test_one_signal_is_enough_when_the_runs_share_only_one():
    rng = np.random.default_rng(8)
    slow, base = synthetic_run(rng, slowdown=0.10), synthetic_run(rng)
    older_format = RunSamples(base.reference, base.ratio_cost, None)       # a stored run without engine times
    assert decide(slow, older_format, noise()).confirmation is None
    assert decide(slow, older_format, noise()).verdict == REGRESSED
    no_reference = RunSamples(None, None, base.time_cost)
    decision = decide(slow, no_reference, noise())
    assert decision.primary.name == "engine time per sample" and decision.verdict == REGRESSED
    nothing = decide(RunSamples("torch_eager", slow.ratio_cost, None), older_format, noise())
    assert nothing.verdict == NOT_COMPARABLE


def test_samples_come_from_a_stored_extra_info():
    info = {"ratios": {"torch_eager": {"median": 3.0, "per_round": [3.0, 3.1]},
                       "torch_compile": {"median": 2.5, "per_round": [2.5, 2.4]}},
            "engine_round_ms": [2.0, 4.0], "engine_samples_per_round": 1000}
    samples = RunSamples.from_extra_info(info)
    assert samples.reference == "torch_compile"     # no torch_graph: the torch reference the engine is least ahead of
    assert samples.ratio_cost == pytest.approx(-np.log([2.5, 2.4]))
    assert samples.time_cost == pytest.approx(np.log([0.002, 0.004]))
    assert RunSamples.from_extra_info({"ratios": {}}).ratio_cost is None
    assert choose_reference({"torch_graph": 1.9, "torch_eager": 1.2}) == "torch_graph"
    assert choose_reference({"gpuengine_oneshot": 1.1}) is None


def test_rounds_follow_the_noise():
    steady, _ = recommend_rounds(0.002, 0.001, 0.001, MIN_ROUNDS, 40)
    noisy, caught = recommend_rounds(0.002, 0.02, 0.02, MIN_ROUNDS, 40)
    assert steady == MIN_ROUNDS and noisy > steady and caught <= GOAL_SLOWDOWN
    hopeless, best = recommend_rounds(0.05, 0.001, None, MIN_ROUNDS, 40)
    assert hopeless == 40 and best > GOAL_SLOWDOWN   # run-to-run noise does not shrink with rounds
    with pytest.raises(ValueError, match="min_rounds"):
        recommend_rounds(0.01, 0.01, None, 0, 40)
