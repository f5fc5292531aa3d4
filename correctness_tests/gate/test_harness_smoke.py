"""The perf harness on any machine: compare -> extra_info -> ratios -> thresholds -> stored run.

Two NumPy runners stand in for engine and reference: each multiplies random
matrices in a loop, the "engine" smaller ones, so it is clearly the faster and
every ratio is far above 1 however noisy the machine.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from correctness_tests.inner_sessions import leave_xdist
from gpuengine.bench import thresholds
from gpuengine.bench.benchmarking import Comparison
from gpuengine.bench.machine_info import CPU_TIER, NO_GPU, Tier
from gpuengine.reference import ReferenceUnavailable

from gpuengine.gate.harness import (UNAVAILABLE, Targets, TargetShortfall, TargetsMissed, alternate_rounds,
                                    ready_references, record_and_gate)

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 5


class MatmulLoopRunner:
    """A runner whose round is `loops` products of two random size x size matrices.

    einsum without `optimize` multiplies in NumPy's own single-threaded loop: a
    multithreaded BLAS on an oversubscribed CPU can make small products slower
    than large ones, and the order of the runners must not depend on that.
    """

    def __init__(self, name: str, size: int, loops: int = 8, log: list | None = None):
        rng = np.random.default_rng(size)
        self.a, self.b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
        self.name, self.loops, self.log = name, loops, log
        self.samples_per_round = 100
        self.prepared = False

    def prepare(self):
        self.prepared = True

    def run_round(self):
        assert self.prepared, "prepare() must come before any round"
        if self.log is not None:
            self.log.append(self.name)
        for _ in range(self.loops):
            np.einsum("ij,jk->ik", self.a, self.b)

    def synchronize(self):
        pass


def engine_and_references(log=None):
    # Work per round 1 : 27 : 512, so the order survives a busy machine; 64 products a round (about 0.3, 2 and
    # 22 ms) so that one preemption of a round (a few ms on 2 busy cores) cannot reorder them.
    engine = MatmulLoopRunner("gpuengine", 16, loops=64, log=log)
    references = [MatmulLoopRunner("torch_eager", 128, loops=64, log=log),
                  MatmulLoopRunner("torch_graph", 48, loops=64, log=log)]
    return engine, references


def write_rules(path: Path, rules: list[dict]) -> Path:
    path.write_text(json.dumps(rules))
    return path


def test_compare_stores_the_engine_rounds_and_records_ratios(benchmark, compare, run_settings, tmp_path, monkeypatch):
    cpu_only_miss = {"gpu": "none (CPU tier*", "test": "test_compare_*", "reference": "torch_eager",
                     "min_ratio": 1e6, "kind": "claim", "why": "unreachable: recorded, never gating on the CPU tier"}
    # 0.1x: with 1/27 of the work the engine holds it on a busy CI machine, and a ratio taken the wrong way round
    # (about 0.04x) fails it
    torch_best = {"gpu": "*", "test": "test_compare_*", "reference": "torch_best", "min_ratio": 0.1, "kind": "claim",
                  "why": "the small-matrix engine stays within 10x of both fakes"}
    monkeypatch.setattr(thresholds, "RULES_PATH", write_rules(tmp_path / "rules.json", [cpu_only_miss, torch_best]))
    engine, references = engine_and_references()

    # a stated rate, not NumPy's: high enough that the run's TFLOPS (two decimals) are not rounded to 0
    result = compare(benchmark, engine, references, rounds=ROUNDS, precision="fp32", flops_per_sample=2 * 16 ** 3 * 64)

    assert isinstance(result, Comparison)
    assert {name: len(ms) for name, ms in result.times_ms.items()} == dict.fromkeys(result.times_ms, ROUNDS)
    assert result.ratios["torch_eager"].median > 0.1 and result.ratios["torch_graph"].median > 0.1
    info = benchmark.extra_info
    assert info["tier"] == run_settings.tier.name and info["precision"] == "fp32"
    assert info["timing_gated"] is run_settings.tier.on_gpu
    assert set(info["ratios"]) == {"torch_eager", "torch_graph"}
    assert info["achieved_tflops"]["gpuengine"] > 0
    checks = {check["reference"]: check for check in info["ratio_checks"]}
    assert checks["torch_best"]["compared_with"] == "torch_graph" and checks["torch_best"]["passed"]
    if not run_settings.tier.on_gpu:
        assert checks["torch_eager"]["passed"] is False
    if not benchmark.disabled:
        # pytest-benchmark timed the same engine rounds from outside: each of its rounds contains ours.
        stored_ms = [seconds * 1e3 for seconds in benchmark.stats.stats.data]
        assert len(stored_ms) == ROUNDS
        assert all(outer >= inner for outer, inner in zip(stored_ms, result.times_ms["gpuengine"]))


def test_references_alternate_with_the_engine_round_by_round(benchmark):
    log = []
    engine, references = engine_and_references(log)
    alternate_rounds(benchmark, engine, references, rounds=3, warmup_rounds=1)
    assert log == ["torch_eager", "torch_graph", "gpuengine"] * 4


def test_disabled_benchmarks_still_measure_every_round():
    log = []
    engine, references = engine_and_references(log)
    times = alternate_rounds(SimpleNamespace(disabled=True), engine, references, rounds=3, warmup_rounds=2)
    assert log == ["torch_eager", "torch_graph", "gpuengine"] * 5
    assert {name: len(ms) for name, ms in times.items()} == {"gpuengine": 3, "torch_eager": 3, "torch_graph": 3}


def test_alternate_rounds_refuses_duplicate_names():
    engine = MatmulLoopRunner("gpuengine", 8)
    with pytest.raises(ValueError, match="unique"):
        alternate_rounds(SimpleNamespace(disabled=True), engine, [MatmulLoopRunner("gpuengine", 8)], 1, 0)


def scripted_comparison() -> Comparison:
    times = {"gpuengine": [1.0] * 3, "torch_graph": [1.1] * 3}
    return Comparison.from_times("gpuengine", times, {"gpuengine": 10, "torch_graph": 10})


MISSED_RULE = thresholds.ThresholdRule("*", "test_x*", "torch_graph", 1.2, "a lead", thresholds.CLAIM)


def test_a_missed_threshold_fails_on_a_gpu_tier():
    bench = SimpleNamespace(extra_info={})
    gpu = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")
    with pytest.raises(pytest.fail.Exception, match=r"torch_graph: 1\.100x, claim 1\.2x \(a lead\)"):
        record_and_gate(bench, scripted_comparison(), "test_x[tf32]", "tf32", gpu, [MISSED_RULE])
    assert bench.extra_info["timing_gated"] is True


def test_a_missed_threshold_can_be_deferred_to_the_end_of_the_test():
    bench, deferred = SimpleNamespace(extra_info={}), []
    gpu = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")
    missed = record_and_gate(bench, scripted_comparison(), "test_x[tf32]", "tf32", gpu, [MISSED_RULE],
                             defer_to=deferred)
    assert [check.reference for check in missed] == ["torch_graph"]
    assert len(deferred) == 1 and "torch_graph: 1.100x, claim 1.2x (a lead)" in deferred[0]


TARGET_RULE = thresholds.ThresholdRule("*", "test_x*", "torch_graph", 1.2, "the goal", thresholds.TARGET)
GPU = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")


def test_a_missed_target_is_recorded_and_listed_but_fails_nothing_by_default():
    bench, targets = SimpleNamespace(extra_info={}), Targets()
    missed = record_and_gate(bench, scripted_comparison(), "test_x[tf32]", "tf32", GPU, [TARGET_RULE],
                             targets=targets)
    assert [check.kind for check in missed] == [thresholds.TARGET]
    (check,) = bench.extra_info["ratio_checks"]
    assert (check["kind"], check["passed"], check["min_ratio"]) == ("target", False, 1.2)
    (listed,) = targets.missed
    assert listed.describe() == ("test_x[tf32] vs torch_graph on NVIDIA H100 80GB HBM3: target 1.2x, measured 1.10x: "
                                 "not met")
    record_and_gate(SimpleNamespace(extra_info={}), scripted_comparison(), "test_x[tf32]", "tf32", GPU, [TARGET_RULE])
    cpu = Targets(fail=True)
    record_and_gate(SimpleNamespace(extra_info={}), scripted_comparison(), "test_x[tf32]", "tf32",
                    Tier(CPU_TIER, None), [TARGET_RULE], targets=cpu)
    assert cpu.missed == []   # the CPU tier never gates timing: nothing to list either


def test_with_claims_a_missed_target_fails_and_says_it_is_only_targets():
    targets = Targets(fail=True)
    with pytest.raises(TargetsMissed, match=r"test_x\[tf32\] on NVIDIA H100 80GB HBM3: targets not met yet, which "
                                            r"fail with --claims:\n  torch_graph: target 1\.2x, measured 1\.10x: not "
                                            r"met \(the goal\)"):
        record_and_gate(SimpleNamespace(extra_info={}), scripted_comparison(), "test_x[tf32]", "tf32", GPU,
                        [TARGET_RULE], targets=targets)
    assert len(targets.missed) == 1
    both = [MISSED_RULE, thresholds.ThresholdRule("*", "test_x*", "torch_eager", 1.2, "goal", thresholds.TARGET)]
    times = {"gpuengine": [1.0] * 3, "torch_graph": [1.1] * 3, "torch_eager": [1.1] * 3}
    comparison = Comparison.from_times("gpuengine", times, dict.fromkeys(times, 10))
    with pytest.raises(pytest.fail.Exception) as failure:   # a missed claim besides: an ordinary failure
        record_and_gate(SimpleNamespace(extra_info={}), comparison, "test_x[tf32]", "tf32", GPU, both, targets=targets)
    assert not isinstance(failure.value, TargetsMissed) and "claim 1.2x (a lead)" in str(failure.value)
    deferred = []
    record_and_gate(SimpleNamespace(extra_info={}), scripted_comparison(), "test_x[tf32]", "tf32", GPU,
                    [TARGET_RULE], targets=targets, defer_to=deferred)
    assert [type(failure) for failure in deferred] == [TargetShortfall]


DEFERRED_TEST = textwrap.dedent("""
    from perf_tests.conftest import GATE_FAILURES
    from gpuengine.gate.harness import TargetShortfall

    def test_missed_a_ratio(request):
        request.node.stash.setdefault(GATE_FAILURES, []).append("engine below a claim that has held")
        print("the body's own checks ran")

    def test_met_every_ratio(request):
        request.node.stash.setdefault(GATE_FAILURES, [])

    def test_missed_a_target_only(request):
        request.node.stash.setdefault(GATE_FAILURES, []).append(TargetShortfall("target 9x, measured 1x: not met"))
""")

CLASSIFY_FAILURES = textwrap.dedent("""
    import pytest
    from perf_tests.conftest import pytest_runtest_call  # noqa: F401
    from gpuengine.gate.harness import TargetsMissed

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
        report = yield
        if report.when == "call" and report.failed:
            print(f"{item.name}: {call.excinfo.typename}")
        return report
""")


def test_deferred_gate_failures_fail_the_test_after_its_body_ran(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    leave_xdist(monkeypatch)
    pytester.makeconftest(CLASSIFY_FAILURES)
    pytester.makepyfile(test_deferred=DEFERRED_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-p", "no:benchmark")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*the body's own checks ran*", "*engine below a claim that has held*"])
    result.stdout.fnmatch_lines(["*test_missed_a_ratio: Failed", "*test_missed_a_target_only: TargetsMissed"])


def test_a_missed_threshold_is_only_recorded_on_the_cpu_tier():
    bench = SimpleNamespace(extra_info={})
    missed = record_and_gate(bench, scripted_comparison(), "test_x[tf32]", "tf32", Tier(CPU_TIER, None), [MISSED_RULE])
    assert [check.reference for check in missed] == ["torch_graph"]
    assert bench.extra_info["timing_gated"] is False
    assert bench.extra_info["ratio_checks"][0]["passed"] is False


STORED_TEST = textwrap.dedent("""
    from correctness_tests.gate.test_harness_smoke import engine_and_references

    def test_tiny_comparison(benchmark, compare):
        engine, references = engine_and_references()
        compare(benchmark, engine, references, rounds=3, precision="fp32")
""")


def cpu_tier_session(pytester, monkeypatch):
    """A session of its own, on the CPU tier whatever this machine has, with the suite's two conftests."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in [k for k in os.environ if k.startswith("GPUENGINE_")]:
        monkeypatch.delenv(name)   # a tox matrix env's toggles would move the storage folder
    monkeypatch.setenv("GPUENGINE_DEVICE", "cpu")
    leave_xdist(monkeypatch)
    pytester.makeconftest((REPO / "conftest.py").read_text()
                          + "\nfrom perf_tests.conftest import compare, gemm_peak_tflops  # noqa: F401\n")


def test_runs_are_stored_per_tier_with_machine_info(pytester, monkeypatch):
    from pytest_benchmark.utils import get_machine_id
    cpu_tier_session(pytester, monkeypatch)
    pytester.makepyfile(test_stored=STORED_TEST)
    args = ["-p", "no:cacheprovider", "--benchmark-autosave", "--benchmark-compare",
            "--benchmark-compare-fail=median:25%"]

    first = pytester.runpytest_subprocess(*args)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["gpuengine tier cpu-tier: CPU tier (NumPy backend)*not gated",
                                "gpuengine: no stored run in baselines_store/cpu-tier yet*"])
    stored = sorted((pytester.path / "baselines_store" / CPU_TIER / get_machine_id()).glob("*.json"))
    assert [path.name[:4] for path in stored] == ["0001"]
    run = json.loads(stored[0].read_text())
    assert run["machine_info"]["tier"] == CPU_TIER and run["machine_info"]["gpu"] == NO_GPU
    assert "precision=" in run["machine_info"]["gpuengine_config"]
    assert run["machine_info"]["series"] == ""   # the tier's own runs (a spread run is merged into the same folder)
    (bench,) = run["benchmarks"]
    assert bench["name"] == "test_tiny_comparison"
    assert set(bench["extra_info"]["ratios"]) == {"torch_eager", "torch_graph"}

    run["machine_info"]["torch"] = "0.1"  # as if the stored run had an older torch
    stored[0].write_text(json.dumps(run))
    second = pytester.runpytest_subprocess(*args)
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines(["gpuengine: CPU tier: --benchmark-compare-fail ignored*",
                                 "gpuengine: the stored run compared against differs: torch 0.1 -> *"])
    assert "machine_info is different" not in second.stderr.str()
    assert "no stored run" not in second.stdout.str()
    assert len(list(stored[0].parent.glob("*.json"))) == 2

    toggled = pytester.runpytest_subprocess(*args, "--gpuengine-cuda-graph", "4")   # a series of its own
    toggled.assert_outcomes(passed=1)
    (series_run,) = (pytester.path / "baselines_store" / CPU_TIER / "config-cuda_graph-4").glob("*/*.json")
    assert json.loads(series_run.read_text())["machine_info"]["series"] == "config-cuda_graph-4"


class UncapturableRunner(MatmulLoopRunner):
    def prepare(self):
        raise ReferenceUnavailable("torch_compile_graph: Inductor's compiled step could not be captured here: boom")


def test_a_reference_that_cannot_run_here_is_left_out_and_recorded():
    bench = SimpleNamespace(extra_info={})
    refs = ready_references(bench, {"torch_graph": lambda: MatmulLoopRunner("torch_graph", 8),
                                    "torch_compile_graph": lambda: UncapturableRunner("torch_compile_graph", 8),
                                    "torch_eager": lambda: MatmulLoopRunner("torch_eager", 8)})
    assert [(ref.name, ref.prepared) for ref in refs] == [("torch_graph", True), ("torch_eager", True)]
    assert bench.extra_info[UNAVAILABLE] == {
        "torch_compile_graph": "torch_compile_graph: Inductor's compiled step could not be captured here: boom"}


def test_any_other_failure_of_a_reference_fails_the_test():
    def broken():
        raise RuntimeError("a bug, not a machine without CUDA")
    with pytest.raises(RuntimeError, match="a bug"):
        ready_references(SimpleNamespace(extra_info={}), {"torch_graph": broken})
    with pytest.raises(ValueError, match="the reference built as 'torch_graph' is named 'torch_eager'"):
        ready_references(SimpleNamespace(extra_info={}), {"torch_graph": lambda: MatmulLoopRunner("torch_eager", 8)})


UNAVAILABLE_TEST = textwrap.dedent("""
    from gpuengine.gate.harness import ready_references
    from correctness_tests.gate.test_harness_smoke import MatmulLoopRunner, UncapturableRunner

    def test_one_reference_cannot_run(benchmark, compare):
        refs = ready_references(benchmark, {
            "torch_graph": lambda: MatmulLoopRunner("torch_graph", 48),
            "torch_compile_graph": lambda: UncapturableRunner("torch_compile_graph", 48)})
        compare(benchmark, MatmulLoopRunner("gpuengine", 16), refs, rounds=3, precision="fp32")
""")


def test_a_session_lists_the_references_left_out_and_stores_why(pytester, monkeypatch):
    from pytest_benchmark.utils import get_machine_id
    cpu_tier_session(pytester, monkeypatch)
    pytester.makepyfile(test_unavailable=UNAVAILABLE_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-autosave")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*gpuengine references unavailable*",
                                 "test_unavailable.py::test_one_reference_cannot_run: torch_compile_graph: "
                                 "torch_compile_graph: Inductor's compiled step could not be captured here: boom",
                                 "left out of their tests; kept in the run's references_unavailable"])
    (stored,) = (pytester.path / "baselines_store" / CPU_TIER / get_machine_id()).glob("*.json")
    (bench,) = json.loads(stored.read_text())["benchmarks"]
    assert set(bench["extra_info"][UNAVAILABLE]) == {"torch_compile_graph"}
    # torch_graph alone is PyTorch's strongest captured step where the compiled one cannot be captured.
    stronger = bench["extra_info"]["ratios"]["torch_graph_best"]
    assert stronger["label"] == "torch_graph in 3 of 3 rounds; torch_compile_graph unavailable"
    assert stronger["per_round"] == bench["extra_info"]["ratios"]["torch_graph"]["per_round"]


class Held:
    """Stands in for a test's device arrays: what the failed test's frames keep alive."""


def drive_call_hook(body):
    """Run perf_tests/conftest.py's pytest_runtest_call wrapper around `body` as pytest would (a new-style
    wrapper: the test's exception comes back at its yield)."""
    from perf_tests import conftest
    item = SimpleNamespace(stash={})
    hook = conftest.pytest_runtest_call(item)
    next(hook)
    try:
        body()
    except Exception as exc:
        return hook.throw(exc)
    try:
        hook.send(None)
    except StopIteration as done:
        return done.value


def test_a_device_out_of_memory_fails_its_test_with_the_sizes_and_frees_what_the_test_held():
    import weakref
    kept = []

    def test_body():
        arrays = Held()
        kept.append(weakref.ref(arrays))
        raise RuntimeError("Out of memory allocating 4,294,967,296 bytes (allocated so far: 75,161,927,680 bytes).")

    with pytest.raises(pytest.fail.Exception) as failed:
        drive_call_hook(test_body)
    message = str(failed.value)
    assert message.startswith("device out of memory: RuntimeError: Out of memory allocating 4,294,967,296 bytes")
    assert "the test's memory was released" in message and "the session goes on" in message
    assert kept[0]() is None, "the failed test's frames still hold its arrays"


def test_any_other_error_of_a_perf_test_passes_through_unchanged():
    def test_body():
        raise ValueError("shapes differ")

    with pytest.raises(ValueError, match="^shapes differ$"):
        drive_call_hook(test_body)
    assert drive_call_hook(lambda: None) is None
