"""Why an A/B test regressed (gpuengine/gate/regression_profiles.py): which tests are profiled, as which case, and
what is printed, with a stand-in profiler (the real one needs a GPU)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuengine.bench.machine_info import Tier
from gpuengine.bench.profile.diff import diff_profiles, load_profile
from gpuengine.bench.profile.record import ProfileCase, read_profile
from gpuengine.gate import regression_profiles as rp
from gpuengine.gate.ab.session import AB
from gpuengine.gate.plugin import GATE
from gpuengine.gate.summary import EXTRA_SECTIONS

from ..bench.test_profile_diff import MLP, planted

TRAIN = "perf_tests/test_mlp.py::test_mlp_train[tf32-graph8-resident-bpe1]"
INFER = "perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b8000]"
ZOO = "perf_tests/test_zoo.py::test_zoo_train[alexnet-tf32-streamed-b16]"
H100 = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("test, case, differs", [
    (TRAIN, ProfileCase("mlp", "tf32", 8000, 8), []),
    ("perf_tests/test_cnn.py::test_cnn_train[bf16-graph8-resident-b1024]", ProfileCase("cnn", "bf16", 1024, 8), []),
    ("perf_tests/test_resnet.py::test_resnet_train[cifar10-tf32-graph8-resident-b128]",
     ProfileCase("resnet", "tf32", 128, 8), []),
    ("perf_tests/test_transformer.py::test_transformer_train[seq256-tf32-graph8-b16]",
     ProfileCase("transformer", "tf32", 16, 8, length=256), []),
    ("perf_tests/test_transformer.py::test_transformer_train[seq128-bf16-graph8-b16]",
     ProfileCase("transformer", "bf16", 16, 8), []),
    ("perf_tests/test_loader.py::test_mlp_streamed[tf32-graph1-pool2-b8000]", ProfileCase("mlp", "tf32", 8000, 1),
     []),
    (ZOO, ProfileCase("zoo:alexnet", "tf32", 16, 1),
     ["its case id names no steps per launch: profiled at 1",
      "profiled with resident data: the test streams its batches from the host"]),
])
def test_a_perf_test_maps_onto_the_profile_case_nearest_it_saying_what_differs(test, case, differs):
    assert rp.profile_case(test) == (case, differs)


def test_tests_the_profile_cannot_build_are_named_with_why():
    case, (why,) = rp.profile_case(INFER)
    assert case is None and why.startswith("the profile command has no case for test_mlp_infer (it profiles "
                                           "training steps: test_cnn_streamed, test_cnn_train, ")
    assert rp.profile_case("perf_tests/test_zoo.py::test_zoo_train[lenet-tf32-b16]")[0] is None


def ab_bench(test: str, verdict: str, slowdown: float) -> dict:
    return {"fullname": test, "extra_info": {
        "stored_run_check": {"mode": "A/B", "base": "66b85b0", "verdict": verdict, "slowdown": slowdown},
        "ab": {"base_commit": "66b85b0d8578", "base_why": "--against main"}}}


RUN = {"machine_info": {"tier": H100.name}, "benchmarks": [
    ab_bench(TRAIN, "regressed", 0.06), ab_bench(INFER, "regressed", 0.09), ab_bench(ZOO, "regressed", 0.04),
    ab_bench("perf_tests/test_cnn.py::test_cnn_train[tf32-graph8-resident-b128]", "not significant", 0.01),
    {"fullname": "perf_tests/test_x.py::test_x[tf32]", "extra_info": {"stored_run_check": {"verdict": "regressed"}}}]}


def planted_diff(case: ProfileCase):
    """What the real profiler would give for a head with a 50 us kernel planted in each step."""
    return diff_profiles(load_profile(MLP), read_profile(planted(json.loads(MLP.read_text())), "head.json"))


def test_regressed_ab_tests_are_profiled_largest_slowdown_first_up_to_the_limit():
    regressed = rp.regressed_ab_tests(RUN)
    assert [(r.test, r.slowdown) for r in regressed] == [(INFER, 0.09), (TRAIN, 0.06), (ZOO, 0.04)]   # A/B only
    asked = []

    def profile(case):
        asked.append(case)
        if case.workload == "zoo:alexnet":
            raise RuntimeError("the base's profile exited with status 1")
        return planted_diff(case)
    lines = rp.explain(regressed, profile, limit=3, top=2)
    assert asked == [ProfileCase("mlp", "tf32", 8000, 8), ProfileCase("zoo:alexnet", "tf32", 16, 1)]
    text = "\n".join(lines)
    assert lines[0].startswith(f"{INFER}: head +9.0% against 66b85b0: not profiled: the profile command has no case")
    assert f"{TRAIN}: head +6.0% against 66b85b0; profiled: mlp (tf32, batch 8000, cuda_graph 8)" in text
    assert "kernels whose time moved most (2 of 10), largest change first:" in text
    spin = next(line for line in lines if line.lstrip().startswith("spin"))
    assert "+50.0 µs (new)" in spin
    assert (f"{ZOO}: head +4.0% against 66b85b0: profiling zoo:alexnet (tf32, batch 16, cuda_graph 1) failed: "
            "RuntimeError: the base's profile exited with status 1") in text   # the others are kept
    limited = rp.explain(regressed, profile, limit=1)
    assert limited[-1] == f"2 more regressed test(s) not profiled (--profile-regressions 1): {TRAIN}, {ZOO}"


def test_nothing_is_profiled_off_a_gpu_or_against_another_stack_and_it_is_said_once():
    regressed = rp.regressed_ab_tests(RUN)
    assert rp.not_profiled(regressed, on_gpu=False, stack_base=False) == [
        "3 A/B test(s) regressed; not profiled: the CPU tier has no GPU to profile on"]
    assert "(--against-stack)" in rp.not_profiled(regressed, on_gpu=True, stack_base=True)[0]
    assert rp.not_profiled(regressed, on_gpu=True, stack_base=False) == []
    assert rp.explain_spread_run({**RUN, "machine_info": {"tier": "cpu-tier"}}, None, Path("."))[0].endswith(
        "the CPU tier has no GPU to profile on")
    nameless = {**RUN, "benchmarks": [{**b, "extra_info": {**b["extra_info"], "ab": {}}} for b in RUN["benchmarks"]]}
    assert rp.explain_spread_run(nameless, None, Path(".")) == [
        "3 A/B test(s) regressed; not profiled: the run's A/B tests name no base commit"]
    assert rp.explain_spread_run(RUN, None, Path("."), limit=0) == []


def test_the_session_profiles_its_regressions_at_its_end_and_adds_them_to_the_summary(monkeypatch, tmp_path):
    stash = pytest.Stash()
    stash[GATE] = SimpleNamespace(tier=H100, study=None, run=RUN)
    stash[AB] = SimpleNamespace(base=SimpleNamespace(root=tmp_path, commit="66b85b0d8578", label="66b85b0"),
                                stack=None)
    config = SimpleNamespace(stash=stash, rootpath=tmp_path, getoption=lambda name, default=None: 1,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    made = []

    def profiler(base, root, tier_name, log):
        made.append((base.label, root, tier_name))
        return planted_diff
    monkeypatch.setattr(rp, "profiler", profiler)
    rp.finish(SimpleNamespace(config=config), pytest.ExitCode.TESTS_FAILED)
    assert made == [("66b85b0", tmp_path, H100.name)]
    lines = stash[rp.LINES]
    assert lines[0].startswith(f"{INFER}: head +9.0% against 66b85b0: not profiled")
    assert lines[-1] == f"2 more regressed test(s) not profiled (--profile-regressions 1): {TRAIN}, {ZOO}"
    (section,) = stash[EXTRA_SECTIONS]
    assert section.title.startswith("Why it regressed") and section.lines[1:-1] == lines

    stash[GATE] = SimpleNamespace(tier=Tier("cpu-tier", None), study=None, run=RUN)   # the CPU tier: said, not run
    stash[rp.LINES], made[:] = [], []
    rp.finish(SimpleNamespace(config=config), pytest.ExitCode.TESTS_FAILED)
    assert made == [] and stash[rp.LINES] == ["3 A/B test(s) regressed; not profiled: the CPU tier has no GPU to "
                                              "profile on"]
    stash[GATE], stash[rp.LINES] = SimpleNamespace(tier=H100, study=None, run=RUN), []
    rp.finish(SimpleNamespace(config=config), pytest.ExitCode.INTERRUPTED)   # Ctrl-C: nothing
    assert made == [] and stash[rp.LINES] == []
