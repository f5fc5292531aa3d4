"""The stored-run rule's noise learned from stored runs of the same code (gpuengine/gate/rules/stored_noise.py)."""
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from gpuengine.gate.rules.regression import DEFAULT_BETWEEN_RUN_SD, NoiseLevels, RunSamples, decide
from gpuengine.gate.rules.stored_noise import StoredNoise, between_run_sd, same_code_groups
from gpuengine.gate.store.stored_runs import StoredRun
from gpuengine.gate.rules.verdicts import REGRESSED

TEST = "perf_tests/test_x.py::test_x[a]"


def run(commit, offset=0.0, rng=None, dirty=False, head_code=None, rounds=15, name="r", round_sd=0.002):
    """A stored run whose engine is exp(offset) slower than the long-run value, rounds spread by `round_sd`."""
    rng = rng or np.random.default_rng(0)
    ms = 10.0 * np.exp(offset + rng.normal(0, round_sd, rounds))
    torch_ms = 20.0 * np.exp(rng.normal(0, round_sd, rounds))
    info = {"ratios": {"torch_graph": {"median": float(np.median(torch_ms / ms)),
                                       "per_round": list(map(float, torch_ms / ms))}},
            "engine_round_ms": list(map(float, ms)), "engine_samples_per_round": 100}
    if head_code:
        info["ab"] = {"head_code": head_code}
    return StoredRun(Path(name), name, datetime(2026, 11, 27), {TEST: {"extra_info": info}}, {}, commit, dirty)


def test_runs_group_by_code_hash_else_by_clean_commit():
    a1, a2 = run("a", name="a1"), run("a", name="a2", head_code="h")   # the A/B run names commit a's code
    b1, b2 = run("b", name="b1", head_code="h"), run("b", name="b2")  # another commit of the same code
    c1, c2 = run("c", name="c1"), run("c", name="c2", dirty=True)     # a dirty run without a hash: no group
    lone = run("d", name="d1")
    groups = same_code_groups([a1, a2, b1, b2, c1, c2, lone])
    assert [sorted(r.label for r in g) for g in groups] == [["a1", "a2", "b1", "b2"]]


def test_no_same_code_runs_give_the_prior():
    noise = StoredNoise([run("a", name="a1"), run("b", name="b1")])
    assert noise.levels(TEST) == NoiseLevels.uncalibrated()
    assert between_run_sd([], TEST, "ratio") == (DEFAULT_BETWEEN_RUN_SD, 0)


def test_learned_sd_follows_the_runs_offsets_and_leans_on_the_prior_when_few():
    rng = np.random.default_rng(1)
    true_sd = 0.03
    runs = [run(f"c{g}", rng.normal(0, true_sd), rng, name=f"c{g}-{k}") for g in range(10) for k in range(4)]
    sd, dof = between_run_sd(same_code_groups(runs), TEST, "time")
    assert dof == 30
    assert 0.022 < sd < 0.038
    few = [run("c", rng.normal(0, true_sd), rng, name=f"few{k}") for k in range(2)]
    sd_few, dof_few = between_run_sd(same_code_groups(few), TEST, "time")
    assert dof_few == 1 and sd_few < 0.03   # one degree of freedom beside two runs' worth of the 1% prior


def test_learned_noise_keeps_false_alarms_near_alpha_and_still_catches_a_large_slowdown():
    rng = np.random.default_rng(2)
    true_sd = 0.025   # runs of one code on two machines differ by this much; their rounds by 0.2%
    history = [run(f"h{g}", rng.normal(0, true_sd), rng, name=f"h{g}-{k}") for g in range(15) for k in range(3)]
    learned = StoredNoise(history).levels(TEST, "torch_graph")
    assert 0.02 < learned.ratio_between_sd < 0.03 and "stored runs" in learned.source
    flagged_prior = flagged_learned = caught = 0
    trials = 60
    for _ in range(trials):
        base = RunSamples.from_extra_info(run("x", rng.normal(0, true_sd), rng).benchmarks[TEST]["extra_info"])
        same = RunSamples.from_extra_info(run("x", rng.normal(0, true_sd), rng).benchmarks[TEST]["extra_info"])
        slower = RunSamples.from_extra_info(
            run("y", np.log(1.15) + rng.normal(0, true_sd), rng).benchmarks[TEST]["extra_info"])
        flagged_prior += decide(same, base, NoiseLevels.uncalibrated()).verdict == REGRESSED
        flagged_learned += decide(same, base, learned).verdict == REGRESSED
        caught += decide(slower, base, learned).verdict == REGRESSED
    assert flagged_prior >= 6           # the 1% prior cries wolf on runs that differ by 2.5%
    assert flagged_learned <= 3         # the learned noise does not (1% of 60 expected)
    assert caught >= trials * 0.8       # and a 15% slowdown is still caught


@pytest.mark.parametrize("signal", ["ratio", "time"])
def test_runs_without_the_signal_are_left_out(signal):
    bare = run("a", name="a1")
    bare.benchmarks[TEST]["extra_info"] = {}
    assert between_run_sd(same_code_groups([bare, run("a", name="a2")]), TEST, signal) == (DEFAULT_BETWEEN_RUN_SD, 0)


def test_the_gate_takes_a_calibration_first_then_the_stored_runs():
    from types import SimpleNamespace

    from gpuengine.gate.rules.noise import NoiseTable
    from gpuengine.gate.plugin import GateTest

    rng = np.random.default_rng(3)
    stored = StoredNoise([run(f"h{g}", rng.normal(0, 0.03), rng, name=f"h{g}-{k}") for g in range(4) for k in range(3)])
    gate_test = GateTest.__new__(GateTest)
    gate_test.fullname = TEST
    gate_test.state = SimpleNamespace(noise=NoiseTable(Path("noise.json"), {}, {}), stored_noise=stored)
    assert gate_test.noise_levels("torch_graph") == stored.levels(TEST, "torch_graph")
    calibrated = SimpleNamespace(levels=lambda: NoiseLevels(0.005, 0.005, "noise.json"))
    gate_test.state.noise = NoiseTable(Path("noise.json"), {TEST: calibrated}, {})
    assert gate_test.noise_levels("torch_graph").source == "noise.json"
