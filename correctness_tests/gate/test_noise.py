"""gpuengine.gate.rules.noise: the run-to-run noise estimate, its prior, and noise.json's format and errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gpuengine.bench.json_files import JsonFileError
from gpuengine.gate.rules.noise import PRIOR_RUNS, NoiseTable, estimate, signal_noise
from gpuengine.gate.rules.regression import DEFAULT_BETWEEN_RUN_SD, MIN_ROUNDS, RunSamples

NAME = "perf_tests/test_mlp.py::test_mlp_train[tf32-graph8-resident-bpe1]"


def sessions_of(rng, sessions, trials, session_sd, trial_sd, round_sd, rounds=7):
    """Per-round log samples: a session offset, a trial offset, round noise (the random-effects model)."""
    out = []
    for _ in range(sessions):
        s = rng.normal(0, session_sd)
        out.append([s + rng.normal(0, trial_sd) + rng.normal(0, round_sd, rounds) for _ in range(trials)])
    return out


def test_the_estimate_recovers_session_and_trial_noise():
    rng = np.random.default_rng(0)
    runs = sessions_of(rng, sessions=12, trials=4, session_sd=0.008, trial_sd=0.004, round_sd=0.002)
    noise = signal_noise(runs, rounds=7)
    assert noise.round_sd == pytest.approx(0.002, rel=0.25)
    true_run_sd = math.sqrt(0.008 ** 2 + 0.004 ** 2 + math.pi / 2 * 0.002 ** 2 / 7)
    assert noise.observed_run_sd == pytest.approx(true_run_sd, rel=0.35)
    assert noise.between_run_sd == pytest.approx(math.sqrt(0.008 ** 2 + 0.004 ** 2), rel=0.35)


def test_trials_of_one_process_alone_would_miss_the_session_noise():
    rng = np.random.default_rng(1)
    runs = sessions_of(rng, sessions=8, trials=4, session_sd=0.02, trial_sd=0.001, round_sd=0.001)
    pooled_within = float(np.mean([np.var([np.median(t) for t in s], ddof=1) for s in runs])) ** 0.5
    assert pooled_within < 0.003 < 0.01 < signal_noise(runs, rounds=7).between_run_sd


def test_few_agreeing_runs_are_pulled_towards_the_prior():
    same = [[np.full(7, 0.1)], [np.full(7, 0.1)]]     # two runs that agree exactly
    noise = signal_noise(same, rounds=7)
    assert noise.observed_run_sd == 0.0
    assert noise.between_run_sd == pytest.approx(DEFAULT_BETWEEN_RUN_SD * math.sqrt(PRIOR_RUNS / (1 + PRIOR_RUNS)))
    with pytest.raises(ValueError, match="at least two runs"):
        signal_noise([[np.zeros(7)]], rounds=7)


def runs_of(rng, sessions=3, trials=3, round_sd=0.002):
    return [[RunSamples("torch_graph", c, c + 1.0) for c in s]
            for s in sessions_of(rng, sessions, trials, 0.003, 0.002, round_sd)]


def test_estimate_recommends_rounds_for_the_power_target():
    rng = np.random.default_rng(2)
    steady = estimate(runs_of(rng), rounds=7, calibrated="2026-11-24 at abc")
    assert steady.reference == "torch_graph" and steady.runs == 9 and steady.sessions == 3
    assert steady.recommended_rounds == MIN_ROUNDS and steady.detectable_slowdown < 0.05
    noisy = estimate(runs_of(rng, round_sd=0.03), rounds=7, calibrated="2026-11-24 at abc")
    assert noisy.recommended_rounds > steady.recommended_rounds


def test_a_table_round_trips_through_noise_json(tmp_path):
    rng = np.random.default_rng(3)
    table = NoiseTable.load(tmp_path / "noise.json")
    assert table.tests == {} and table.levels(NAME).source.startswith("not calibrated")
    entry = estimate(runs_of(rng), rounds=7, calibrated="2026-11-24 at abc")
    path = table.updated({NAME: entry}, {"date": "2026-11-24", "commit": "abc"}).save("cpu-tier")
    again = NoiseTable.load(path)
    assert again.tests[NAME] == entry
    levels = again.levels(NAME)
    assert levels.ratio_between_sd == entry.ratio.between_run_sd
    assert "noise.json" in levels.source and "9 runs in 3 sessions" in levels.source


def test_a_broken_noise_json_names_the_file_and_the_place(tmp_path):
    path = tmp_path / "noise.json"
    path.write_text('{"format": 1,\n "tests": {,}}')
    with pytest.raises(JsonFileError, match=r"noise.json: not valid JSON at line 2, column 12"):
        NoiseTable.load(path)
    rng = np.random.default_rng(4)
    entry = estimate(runs_of(rng), rounds=7, calibrated="x")
    NoiseTable(path, {NAME: entry}, {}).save("cpu-tier")
    content = json.loads(path.read_text())
    content["tests"][NAME]["ratio"]["between_run_sd"] = "small"
    path.write_text(json.dumps(content))
    with pytest.raises(JsonFileError, match=r"tests\['perf_tests/test_mlp.py::.*'\]\.ratio\.between_run_sd must be"):
        NoiseTable.load(path)
    path.write_text(json.dumps({"format": 2, "tests": {}, "calibration": {}}))
    with pytest.raises(JsonFileError, match='"format": 1'):
        NoiseTable.load(path)
