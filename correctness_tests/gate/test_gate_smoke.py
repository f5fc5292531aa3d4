"""The gate on any machine: tiers and rounds (tiers.py), and stored baselines as a user meets them.

The plugin tests run small pytest sessions of their own (as test_harness_smoke
does) on the CPU tier, with the suite's two conftests and tiny NumPy runners:
a partial run, a failing run, a corrupt stored run, a corrupt thresholds.json,
each as a user would meet them.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuengine.bench.benchmarking import Comparison
from gpuengine.bench.machine_info import Tier
from gpuengine.gate.rules.noise import NoiseTable
from gpuengine.gate.rules.regression import MIN_ROUNDS
from gpuengine.bench.stack_lock import NO_LOCK, StackId, stack_of
from gpuengine.gate.store.stored_runs import StoredRun
from gpuengine.gate.rules.verdicts import REGRESSED

from correctness_tests.inner_sessions import leave_xdist
from gpuengine.gate import tiers
from gpuengine.gate.check import GateTest
from gpuengine.gate.plugin import GateState
from gpuengine.gate.harness import record_and_gate

REPO = Path(__file__).resolve().parents[2]


def ids(case):
    return f"c{case}"


def test_cases_mark_the_quick_tier_the_nightly_rest_and_one_study_case():
    params = tiers.cases("w", [1, 2, 3, 4], quick=lambda c: c % 2 == 0, ids=ids, budget_s=30)
    marks = {p.id: sorted(m.name for m in p.marks) for p in params}
    assert marks == {"c1": [tiers.NIGHTLY, tiers.WORKLOAD], "c2": [tiers.STUDY, tiers.WORKLOAD],
                     "c3": [tiers.NIGHTLY, tiers.WORKLOAD], "c4": [tiers.WORKLOAD]}
    workload = next(m for m in params[0].marks if m.name == tiers.WORKLOAD)
    assert workload.args == ("w",) and workload.kwargs == {"budget_s": 30, "quick_cases": 2}
    chosen = tiers.cases("w", [1, 2, 3], quick=[2, 3], ids=ids, budget_s=30, study=3)
    assert [p.id for p in chosen if any(m.name == tiers.STUDY for m in p.marks)] == ["c3"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(quick=[]), "keeps none"),
    (dict(quick=[1], study=2), "not one of its quick cases"),
    (dict(quick=[1], budget_s=0), "budget_s must be > 0"),
])
def test_cases_refuse_a_tier_that_cannot_work(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiers.cases("w", [1, 2], ids=ids, **{"budget_s": 10, **kwargs})


def test_rounds_come_from_noise_then_budget_then_tier():
    def rounds(requested=7, **kw):
        return tiers.rounds_for(requested, **{"recommended": None, "full": False, "test_budget_s": None,
                                             "round_set_ms": None, **kw}).rounds

    assert rounds() == 7
    assert rounds(recommended=12) == 12
    assert rounds(recommended=12, test_budget_s=1.0, round_set_ms=100) == 10     # 1 s of 100 ms round sets
    assert rounds(recommended=12, test_budget_s=0.1, round_set_ms=100) == MIN_ROUNDS   # never below the rank test's
    assert rounds(requested=2, test_budget_s=0.1, round_set_ms=100) == 2     # the CPU tier's own smoke rounds
    assert rounds(recommended=12, full=True) == 24 and rounds(full=True) == 14
    assert rounds(recommended=12, forced=3) == 3
    assert rounds(requested=5, min_rounds=7, preferred=21) == 21                 # A/B: cheap rounds, more of them
    assert rounds(requested=5, min_rounds=7, preferred=21, test_budget_s=1.0, round_set_ms=100) == 10
    assert rounds(requested=5, min_rounds=7, preferred=11, test_budget_s=0.1, round_set_ms=100) == 7
    with pytest.raises(ValueError, match="at least one"):
        rounds(requested=0)


def test_the_quick_tier_times_torch_compile_graph_in_the_mlp_headline_cases_only():
    names = ["torch_eager", "torch_graph", "torch_compile_graph"]
    quick = dict(full=False, on_gpu=True)
    assert tiers.references(names, **quick, test="test_resnet_train[cifar10-tf32-graph8-resident-b128]") == \
        ["torch_graph"]
    assert tiers.references(names, **quick, test="test_mlp_train[tf32-graph8-resident-bpe1]") == \
        ["torch_graph", "torch_compile_graph"]
    assert tiers.references(names, **quick, test="test_mlp_train[tf32-graph8-resident-bpe12]") == ["torch_graph"]
    for tier in (dict(full=True, on_gpu=True), dict(full=False, on_gpu=False)):   # nightly; the CPU tier's smoke
        assert tiers.references(names, **tier, test="test_resnet_train[x]") == names


def test_the_quick_compile_graph_tests_are_spelled_as_the_mlp_module_names_its_cases():
    pytest.importorskip("torch", reason="the MLP perf module needs torch")
    from perf_tests import test_mlp
    assert tiers.QUICK_COMPILE_GRAPH_TESTS == {f"test_mlp_train[{test_mlp.train_id(('tf32', 8, True, 1))}]",
                                              "test_mlp_infer[tf32-resident-b8000]"}


SESSION_TESTS = textwrap.dedent("""
    import os
    from correctness_tests.gate.test_harness_smoke import engine_and_references

    def test_a(benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")

    def test_b(benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")

    def test_c(benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")
        assert os.environ.get("FAIL_C") != "1", "test_c fails on request"
        if os.environ.get("INTERRUPT_C") == "1":
            raise KeyboardInterrupt   # what Ctrl-C raises in the test running at the time
""")


@pytest.fixture
def session(pytester, monkeypatch):
    """run(*args) -> result of a pytest session of SESSION_TESTS on the CPU tier, saving and comparing."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in [k for k in os.environ if k.startswith(("GPUENGINE_", "GATEPOWER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUENGINE_DEVICE", "cpu")
    leave_xdist(monkeypatch)
    pytester.makeconftest((REPO / "conftest.py").read_text()
                          + "\nfrom perf_tests.conftest import compare, gemm_peak_tflops  # noqa: F401\n")
    pytester.makepyfile(test_gate=SESSION_TESTS)

    def run(*args):
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-autosave",
                                             "--benchmark-compare", "-rA", *args)
    return run


def stored(folder: Path) -> dict[str, dict]:
    """File name -> {test name: stored_run_check} of every run file under `folder`."""
    out = {}
    for path in sorted(folder.rglob("[0-9][0-9][0-9][0-9]_*.json")):
        run = json.loads(path.read_text())
        out[str(path.relative_to(folder))] = {b["name"]: b["extra_info"].get("stored_run_check", {}).get("baseline_run")
                                              for b in run["benchmarks"]}
    return out


def test_partial_failing_and_corrupt_runs_do_not_spoil_the_baselines(session, pytester, monkeypatch):
    from pytest_benchmark.utils import get_machine_id
    tier = pytester.path / "baselines_store" / "cpu-tier"
    machine = get_machine_id()

    session("-k", "test_a or test_b").assert_outcomes(passed=2)          # 0001: a, b
    session("-k", "test_a").assert_outcomes(passed=1)                    # 0002: a only, a partial run
    runs = sorted((tier / machine).glob("*.json"))
    assert [p.name[:4] for p in runs] == ["0001", "0002"]
    (tier / machine / "0003_corrupt.json").write_text('{"benchmarks": [')   # a run cut short

    monkeypatch.setenv("FAIL_C", "1")
    failing = session()
    failing.assert_outcomes(passed=2, failed=1)
    failing.stdout.fnmatch_lines(["FAILED *test_gate.py::test_c: AssertionError: test_c fails on request*",
                                  "*short test summary info*"])   # named as it failed, before the summary
    failing.stdout.fnmatch_lines([
        f"gpuengine gate: stored run {machine}/0003_corrupt.json is unreadable and skipped: *not valid JSON at line 1*",
        "*gpuengine regression check*",
        f"not significant*test_gate.py::test_a ({machine}/0002_*",   # its own newest result: the partial run
        f"not significant*test_gate.py::test_b ({machine}/0001_*",   # the partial run did not hide b's baseline
        "no baseline*test_gate.py::test_c: no stored baseline run has this test yet",
        "this run did not pass: saved under *history*, not as a baseline*"])
    (history,) = (tier / "history" / machine).glob("*.json")            # kept, apart from the baselines
    assert stored(tier / "history")[f"{machine}/{history.name}"] == {
        "test_a": f"{machine}/{runs[1].name}", "test_b": f"{machine}/{runs[0].name}", "test_c": None}
    assert len(list((tier / machine).glob("*.json"))) == 3               # 0001, 0002, the corrupt 0003

    session("-k", "test_c", "--save-baseline").assert_outcomes(failed=1)   # stored as a baseline on purpose
    assert [p.name[:4] for p in sorted((tier / machine).glob("*.json"))] == ["0001", "0002", "0003", "0004"]
    monkeypatch.delenv("FAIL_C")
    session("-k", "test_c").stdout.fnmatch_lines([f"not significant*test_gate.py::test_c ({machine}/0004_*"])


def test_the_run_is_summarised_in_markdown_for_a_pull_request_and_the_ci_step(session, pytester, monkeypatch):
    step = pytester.path / "step_summary.md"
    step.write_text("## the step before\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    summary = pytester.path / "build" / "summary.md"
    session("--gate-summary", "build/summary.md").stdout.fnmatch_lines(
        [f"gpuengine: the run's summary for a pull request: {summary}, {step}"])
    first = summary.read_text()
    assert first.startswith("## gpuengine perf gate: passed\n")
    assert "3 tests measured: 3 compared with nothing" in first   # no stored run yet: this one is the first
    assert "saved as a baseline: `baselines_store/cpu-tier/" in first

    monkeypatch.setenv("FAIL_C", "1")
    session("--gate-summary", "build/summary.md").assert_outcomes(passed=2, failed=1)
    second = summary.read_text()
    assert second.startswith("## gpuengine perf gate: FAILED (exit status 1)\n")
    assert "3 tests not significant" in second and "saved under history/, not as a baseline" in second
    assert "**`test_gate.py::test_c`**: AssertionError: test_c fails on request\n" in second   # no assert rewriting
    (command,) = [line for line in second.splitlines() if line.startswith("./gate perf")]
    assert command == "./gate perf --against none -k 'test_gate.py and test_c'"
    chosen = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", *shlex.split(command)[2:])
    assert [line for line in chosen.stdout.lines if "::" in line] == ["test_gate.py::test_c"]   # that test alone
    assert step.read_text() == "## the step before\n\n" + first + "\n" + second   # appended, never overwritten
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    session("-k", "test_a")   # without --gate-summary (a plain pytest session) nothing is written
    assert summary.read_text() == second


def test_the_summary_lists_the_change_points_the_newest_runs_started(session, pytester):
    from gpuengine.gate import changepoints
    from correctness_tests.gate.test_changepoints import make_store
    pytest.importorskip(changepoints.LIBRARY, reason=changepoints.MISSING)
    make_store(pytester.path / "baselines_store", tier="cpu-tier", step_at=12, other_lock=False)   # 0013 on: 5%
    result = session("-k", "test_a", "--gate-summary", "build/summary.md")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*gpuengine change points (newest 5 stored runs)*",
        "test_mlp_train[[]tf32-b1[]]: time per sample +5.*% (slower) between runs 0012 bbbbbbb and 0013 ccccccc *",
        "2 change points started in the newest 5 of the 17 baselines of cpu-tier; 2 in the whole history *"])
    markdown = (pytester.path / "build" / "summary.md").read_text()   # the pull request's summary says the same
    assert "### Change points (newest 5 stored runs)\n\n- test_mlp_train[tf32-b1]: time per sample +5." in markdown


def test_an_interrupted_run_is_no_verdict_and_nothing_of_it_is_saved(session, pytester, monkeypatch):
    store = pytester.path / "baselines_store" / "cpu-tier"
    monkeypatch.setenv("INTERRUPT_C", "1")   # test_a and test_b ran and were timed, then Ctrl-C in test_c
    for args in ((), ("--save-baseline",)):
        result = session(*args)
        assert result.ret == pytest.ExitCode.INTERRUPTED
        result.stdout.fnmatch_lines(["*gpuengine: this run was interrupted*",
                                     "interrupted before its tests ended: no verdict, so nothing was saved (neither "
                                     "as a baseline nor under history/)*"])
        assert "saved under" not in result.stdout.str()
    assert sorted(store.rglob("[0-9][0-9][0-9][0-9]_*.json")) == []


def test_a_newer_stored_result_without_timings_does_not_hide_an_older_one_with_them(session, pytester):
    from pytest_benchmark.utils import get_machine_id
    folder = pytester.path / "baselines_store" / "cpu-tier" / get_machine_id()
    session("-k", "test_a").assert_outcomes(passed=1)
    (first,) = folder.glob("0001_*.json")
    run = json.loads(first.read_text())
    run["datetime"] = run["datetime"].replace(run["datetime"][:4], str(int(run["datetime"][:4]) + 1), 1)
    for bench in run["benchmarks"]:
        bench["extra_info"] = {}
    (folder / "0002_emptied.json").write_text(json.dumps(run))
    result = session("-k", "test_a")
    result.stdout.fnmatch_lines(["*1 test(s) have a newer stored result without timings*",
                                 f"not significant*test_gate.py::test_a (*/{first.name})*"])


def test_a_run_that_cannot_be_written_leaves_nothing_behind_and_fails_with_its_summary(session, pytester):
    pytester.makeconftest((REPO / "conftest.py").read_text()
                          + "\nfrom perf_tests.conftest import compare, gemm_peak_tflops  # noqa\n"
                          + "import gpuengine.gate.store.run_storage as _storage\n"
                          + "def _disk_full(path, text, new=False):\n    raise OSError(28, 'No space left on device')\n"
                          + "_storage.write_text = _disk_full\n")
    result = session("-k", "test_a")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*gpuengine: this run was NOT saved*",
                                 "*0001_*.json: No space left on device; nothing half-written was left*"])
    assert not list((pytester.path / "baselines_store").rglob("*.json"))


def test_a_store_that_cannot_take_the_run_stops_the_session_before_the_first_test(session, pytester):
    blocker = pytester.path / "a-file"
    blocker.write_text("not a folder")
    result = session(f"--benchmark-storage=file://{blocker}/store")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*gpuengine: this run could not be saved, so nothing ran: {blocker} is not a folder*"])
    real = pytester.path / "real-store"
    real.mkdir()
    (pytester.path / "linked-store").symlink_to(real)
    result = session(f"--benchmark-storage=file://{pytester.path / 'linked-store'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*linked-store is a symbolic link, which pytest-benchmark cannot save through*"])
    assert not any(real.iterdir())


def test_a_corrupt_thresholds_or_noise_file_is_one_error_naming_it(session, pytester):
    bad = pytester.path / "bad.json"
    bad.write_text('[\n  {"gpu": "*",,}\n]')
    pytester.makeconftest((REPO / "conftest.py").read_text()
                          + "\nimport gpuengine.bench.thresholds as _t; _t.RULES_PATH = __import__('pathlib').Path("
                          + repr(str(bad)) + ")\nfrom perf_tests.conftest import compare, gemm_peak_tflops  # noqa\n")
    result = session()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*gpuengine: {bad}: not valid JSON at line 2, column 15: *"])
    assert "Traceback" not in result.stderr.str() and "JSONDecodeError" not in result.stdout.str()
    bad.write_text("[]")
    noise = pytester.path / "noise.json"
    noise.write_text('{"format": 1, "calibration": {}, "tests": {"x": 3}}')
    result = session("--noise-file", str(noise))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"gpuengine: {noise}: tests['x'] must be an object with exactly the keys" in result.stderr.str()


def test_the_injected_delay_is_refused_outside_a_study_and_a_study_never_saves(session, monkeypatch, tmp_path):
    monkeypatch.setenv("GATEPOWER_INJECT_DELAY_US", "10")
    refused = session()
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*GATEPOWER_INJECT_DELAY_US is set but GATEPOWER_STUDY is not*"])
    monkeypatch.setenv("GATEPOWER_STUDY", str(tmp_path))
    saving = session()
    assert saving.ret == pytest.ExitCode.USAGE_ERROR
    saving.stderr.fnmatch_lines(["*a gatepower study session injects slowdowns; its runs are never saved*"])


TARGET_TESTS = textwrap.dedent("""
    from correctness_tests.gate.test_harness_smoke import engine_and_references

    def test_meets_all(benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")

    def test_misses_a_target(benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")
""")

FAKE_GPU_TIER = textwrap.dedent("""
    # A GPU tier on any machine, so that ratios gate as on a GPU (the runners are still NumPy's), and the rules
    # of rules.json beside this file.
    import pathlib as _pathlib
    import gpuengine.bench.thresholds as _thresholds
    from gpuengine.bench.machine_info import Tier as _Tier

    def current_tier(on_gpu):
        return _Tier("fake-gpu", "FAKE GPU (pytester)")

    _thresholds.RULES_PATH = _pathlib.Path(__file__).parent / "rules.json"
    from perf_tests.conftest import compare, gemm_peak_tflops, pytest_runtest_call  # noqa: F401
""")

GOAL = {"gpu": "FAKE*", "test": "test_misses_a_target", "reference": "torch_eager", "min_ratio": 10000,
        "kind": "target", "why": "a goal far off"}
# 0.1x, not 1x: a busy 2-core CI machine once slowed two of the engine's three 0.3 ms rounds to 4.7 ms (0.62x)
HELD = {"gpu": "FAKE*", "test": "test_*", "reference": "torch_graph", "min_ratio": 0.1, "kind": "claim",
        "why": "the small-matrix engine stays within 10x"}
LOST = {"gpu": "FAKE*", "test": "test_meets_all", "reference": "torch_eager", "min_ratio": 10000, "kind": "claim",
        "why": "a claim this engine cannot hold"}


def test_targets_not_met_are_listed_fail_only_with_claims_and_the_run_is_still_a_baseline(session, pytester):
    from pytest_benchmark.utils import get_machine_id
    pytester.makeconftest((REPO / "conftest.py").read_text() + FAKE_GPU_TIER)
    pytester.makepyfile(test_targets=TARGET_TESTS)
    tier = pytester.path / "baselines_store" / "fake-gpu"

    def run(rules, *args):
        """A session under `rules`; returns it with its stored run (where, and the JSON), none compared with."""
        shutil.rmtree(tier, ignore_errors=True)
        (pytester.path / "rules.json").write_text(json.dumps(rules))
        result = session("test_targets.py", *args)
        (path,) = tier.rglob("0001_*.json")
        return result, path.relative_to(tier).parts[0], json.loads(path.read_text())

    quick, folder, stored = run([GOAL, HELD])
    quick.assert_outcomes(passed=2)
    quick.stdout.fnmatch_lines([
        "gpuengine tier fake-gpu: GPU FAKE GPU (pytester): same-run ratios and stored-run regressions gate",
        "gpuengine gate: missed claims and regressions fail; targets not met yet are listed, not failed (--claims*",
        "*gpuengine targets not met*",
        "test_misses_a_target vs torch_eager on FAKE GPU (pytester): target 10000x, measured *x: not met",
        "1 target(s) not met: goals, not failures (./gate perf --claims, and the nightly tier, fail on them)*"])
    assert folder == get_machine_id()   # a baseline
    checks = {b["name"]: b["extra_info"]["ratio_checks"] for b in stored["benchmarks"]}
    assert [(c["kind"], c["passed"]) for c in checks["test_misses_a_target"]] == [("target", False), ("claim", True)]
    assert stored["gpuengine_gate"] == {"targets_fail": False, "targets_not_met": 1, "failed_on_targets_only": [],
                                        "failed_otherwise": [], "failures": {}}

    claims, folder, stored = run([GOAL, HELD], "--claims")
    claims.assert_outcomes(passed=1, failed=1)
    claims.stdout.fnmatch_lines([
        "gpuengine gate: missed claims and regressions fail; targets not met yet fail too (--claims)",
        "*test_misses_a_target on FAKE GPU (pytester): targets not met yet, which fail with --claims:",
        "  torch_eager: target 10000x, measured *x: not met (a goal far off)",
        "*gpuengine targets not met*",
        "1 target(s) not met: their tests failed (--claims)*",
        "this run failed only on targets not met (1 test(s)): saved as a baseline all the same*",
        "FAILED test_targets.py::test_misses_a_target - TargetsMissed: *"])
    assert folder == get_machine_id() and claims.ret == pytest.ExitCode.TESTS_FAILED
    assert stored["gpuengine_gate"]["failed_on_targets_only"] == ["test_targets.py::test_misses_a_target"]
    assert stored["gpuengine_gate"]["failures"]["test_targets.py::test_misses_a_target"].startswith(
        "TargetsMissed: test_misses_a_target on FAKE GPU (pytester): targets not met yet, which fail with --claims: "
        "torch_eager: target 10000x, measured ")

    nightly, folder, _ = run([GOAL, HELD, LOST], "--full")   # the nightly tier fails targets too; a lost claim
    nightly.assert_outcomes(failed=2)
    nightly.stdout.fnmatch_lines([
        "gpuengine gate: missed claims and regressions fail; targets not met yet fail too (the nightly tier, --full)",
        "*test_meets_all on FAKE GPU (pytester): engine below a claim that has held (same-run ratio):",
        "  torch_eager: *x, claim 10000x (a claim this engine cannot hold)",
        "this run did not pass: saved under *history*"])
    assert folder == "history"


TIMED_TESTS = textwrap.dedent("""
    import time
    import pytest
    from gpuengine.gate import tiers
    from correctness_tests.gate.test_harness_smoke import engine_and_references

    @pytest.fixture(scope="module")
    def slow_build():
        time.sleep(0.4)   # what building and compiling costs a workload before its first timed round

    @pytest.mark.parametrize("case", tiers.cases("w", [1, 2], quick=[1, 2], ids=lambda c: f"c{c}", budget_s=5))
    def test_w(case, slow_build, benchmark, compare):
        compare(benchmark, *engine_and_references(), rounds=3, precision="fp32")
""")


def test_the_run_keeps_how_long_each_test_and_workload_took(session, pytester):
    from pytest_benchmark.utils import get_machine_id
    pytester.makepyfile(test_timed=TIMED_TESTS)
    result = session("test_timed.py")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*gpuengine tier time*", "w * 2 tests * s   (timed rounds budget 5 s)",
                                 "quick tier: * min in all (CPU tier: this machine's time, not a GPU's)"])
    (path,) = (pytester.path / "baselines_store" / "cpu-tier" / get_machine_id()).glob("0001_*.json")
    run = json.loads(path.read_text())
    per_test = [b["extra_info"]["test_seconds"] for b in run["benchmarks"]]
    tier_time = run["gpuengine_tier_time"]
    assert tier_time["tier"] == "quick" and tier_time["on_gpu"] is False and tier_time["quick_tier_target_s"] == 600
    assert tier_time["per_workload"]["w"]["tests"] == 2 and tier_time["per_workload"]["w"]["timed_rounds_budget_s"] == 5
    assert max(per_test) >= 0.4                                 # the module's build is charged to its first test
    assert abs(sum(per_test) - tier_time["per_workload"]["w"]["seconds"]) <= 0.2
    assert tier_time["session_seconds"] >= tier_time["per_workload"]["w"]["seconds"]


def gate_state(tier: Tier, *baseline_infos: dict, locks=(), stack: StackId = NO_LOCK) -> GateState:
    """A gate on `stack` whose store holds one run per extra_info given, oldest first (0004, 0005, ...), each
    stored under the stack_lock record of `locks` at its place (none: stored before locks)."""
    runs = [StoredRun(Path(f"run{i}.json"), f"Linux-CPython-3.12-64bit/000{4 + i}_abc.json", datetime(2026, 11, 21 + i),
                      {FULLNAME: {"fullname": FULLNAME, "stats": {}, "extra_info": info}},
                      {"stack_lock": locks[i]} if i < len(locks) else {})
            for i, info in enumerate(baseline_infos)]
    return GateState(tier, None, False, True, NoiseTable(Path("noise.json"), {}, {}), None, runs=runs, stack=stack)


FULLNAME = "perf_tests/test_x.py::test_x[tf32]"
GPU = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")


def comparison_at(engine_ms: float) -> Comparison:
    """Seven rounds: the engine at `engine_ms` (+-0.2%), torch_graph steady at 2 ms."""
    jitter = [1.0, 1.002, 0.998, 1.001, 0.999, 1.0015, 0.9985]
    return Comparison.from_times("gpuengine", {"gpuengine": [engine_ms * j for j in jitter],
                                               "torch_graph": [2.0 * j for j in reversed(jitter)]},
                                 {"gpuengine": 1000, "torch_graph": 1000})


def test_a_regression_against_the_stored_run_fails_a_gpu_test_in_pytest_benchmark_style():
    node = SimpleNamespace(nodeid=FULLNAME, originalname="test_x", get_closest_marker=lambda name: None)
    gate = GateTest(gate_state(GPU, comparison_at(1.0).extra_info()), node)
    bench = SimpleNamespace(extra_info={})
    with pytest.raises(pytest.fail.Exception) as failure:
        record_and_gate(bench, comparison_at(1.10), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=gate)
    assert str(failure.value).startswith(
        f"Performance has regressed:\n\t{FULLNAME} (Linux-CPython-3.12-64bit/0004_abc.json) - "
        "Field 'engine time / torch_graph time' has failed RankTest+MinEffect: +10.0%")
    check = bench.extra_info["stored_run_check"]
    assert check["verdict"] == REGRESSED and check["baseline_run"] == "Linux-CPython-3.12-64bit/0004_abc.json"
    steady = SimpleNamespace(extra_info={})
    record_and_gate(steady, comparison_at(1.0), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=gate)
    assert steady.extra_info["stored_run_check"]["verdict"] == "not significant"   # a pass, said as such


def test_a_stored_run_that_timed_other_runners_is_not_the_baseline():
    node = SimpleNamespace(nodeid=FULLNAME, originalname="test_x", get_closest_marker=lambda name: None)
    quick = comparison_at(1.0).extra_info()
    nightly = {**quick, "median_round_ms": {**quick["median_round_ms"], "torch_eager": 9.0}}   # the --full tier
    gate = GateTest(gate_state(GPU, quick, nightly), node)   # the nightly run is the newer
    bench = SimpleNamespace(extra_info={})
    with pytest.raises(pytest.fail.Exception):   # compared with the older quick run, not the newer nightly one
        record_and_gate(bench, comparison_at(1.10), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=gate)
    assert bench.extra_info["stored_run_check"]["baseline_run"] == "Linux-CPython-3.12-64bit/0004_abc.json"
    alone = GateTest(gate_state(GPU, nightly), node)
    unmatched = SimpleNamespace(extra_info={})
    record_and_gate(unmatched, comparison_at(1.10), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=alone)
    check = unmatched.extra_info["stored_run_check"]
    assert check["verdict"] == "no baseline" and check["reason"].startswith(
        "no stored run timed it beside the same runners (gpuengine, torch_graph); its newest, "
        "Linux-CPython-3.12-64bit/0004_abc.json, timed gpuengine, torch_eager, torch_graph")


LOCK_A = {"tier": "cuda13", "file": "locks/cuda13.txt", "sha256": "1a2b3c4d5e6f", "matches": True, "differs": []}
LOCK_B = {**LOCK_A, "sha256": "0f0f0f0f0f0f"}


def test_a_stored_run_of_another_stack_is_not_comparable_never_a_regression():
    node = SimpleNamespace(nodeid=FULLNAME, originalname="test_x", get_closest_marker=lambda name: None)
    on_a = stack_of({"stack_lock": LOCK_A})
    gate = GateTest(gate_state(GPU, comparison_at(1.0).extra_info(), stack=on_a), node)   # stored before locks
    bench = SimpleNamespace(extra_info={})
    record_and_gate(bench, comparison_at(1.10), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=gate)   # no failure
    assert bench.extra_info["stored_run_check"] == {
        "verdict": "not comparable", "reason": "stack changed (no lock -> cuda13 lock 1a2b3c4d5e6f)",
        "stored_run": "Linux-CPython-3.12-64bit/0004_abc.json"}
    assert gate.state.checked == [(FULLNAME, "not comparable", f"not comparable  {FULLNAME}: stack changed (no lock "
                                   "-> cuda13 lock 1a2b3c4d5e6f); its newest stored run, "
                                   "Linux-CPython-3.12-64bit/0004_abc.json, is not compared with")]
    # the newest run of the same lock is the baseline, not a newer one of another lock or of other packages
    same = comparison_at(1.0).extra_info()
    differing = {**LOCK_A, "matches": False, "differs": ["nvidia-cudnn-frontend 1.22.1 -> 1.32.0"]}
    gate = GateTest(gate_state(GPU, same, same, same, locks=[LOCK_A, LOCK_B, differing], stack=on_a), node)
    slower = SimpleNamespace(extra_info={})
    with pytest.raises(pytest.fail.Exception, match="Performance has regressed"):
        record_and_gate(slower, comparison_at(1.10), "test_x[tf32]", "tf32", GPU, rules=[], gate_test=gate)
    assert slower.extra_info["stored_run_check"]["baseline_run"] == "Linux-CPython-3.12-64bit/0004_abc.json"


def test_a_run_on_another_stack_is_not_comparable_and_starts_the_baselines_of_its_own(session, pytester):
    from pytest_benchmark.utils import get_machine_id
    machine = get_machine_id()
    folder = pytester.path / "baselines_store" / "cpu-tier" / machine
    session("-k", "test_a").assert_outcomes(passed=1)
    (first,) = folder.glob("0001_*.json")
    run = json.loads(first.read_text())
    now = str(stack_of(run["machine_info"]))
    assert now.startswith("cpu lock ") or now.startswith("cpu (no lock file)")
    del run["machine_info"]["stack_lock"]   # as every run stored before locks
    first.write_text(json.dumps(run))
    result = session("-k", "test_a")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"gpuengine gate: stack {now}: only stored runs of the same stack are compared with",
        "gpuengine gate: 1 test(s) have stored runs of another stack only (no lock): not comparable with this one*",
        "*gpuengine regression check*",
        f"not comparable  test_gate.py::test_a: stack changed (no lock -> {now}); its newest stored run, "
        f"{machine}/{first.name}, is not compared with",
        "1 test(s) not comparable: their stored runs ran on another stack*"])
    assert "Performance has regressed" not in result.stdout.str()
    (second,) = folder.glob("0002_*.json")   # saved as a baseline: the next run on this stack compares with it
    session("-k", "test_a").stdout.fnmatch_lines([f"not significant*test_gate.py::test_a ({machine}/{second.name})*"])


def test_the_gate_starts_from_the_stored_cudnn_plans_and_a_saved_run_adds_its_new_ones(tmp_path, monkeypatch):
    from gpuengine.gate import kept_plans
    from gpuengine.bench import cudnn_plans
    from gpuengine.ops import autotune
    stack = {"cudnn": "91900", "cudnn_frontend": "1.22.1", "gpu": GPU.gpu_label}
    monkeypatch.setattr(cudnn_plans, "current_stack", lambda: stack)
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    path = tmp_path / "baselines_store" / GPU.name / cudnn_plans.PLAN_FILE
    cudnn_plans.load(path, stack).save({"k1": {"plan": "eng2", "ms": 0.1}})

    def session(exitstatus: int, retune=False, study=None, saving="tag"):
        state = GateState(GPU, None, False, True, NoiseTable(Path("noise.json"), {}, {}), study)
        config = SimpleNamespace(stash=pytest.Stash(), rootpath=tmp_path, getoption={"retune_cudnn": retune}.get,
                                 option=SimpleNamespace(benchmark_autosave=saving))
        config.stash[kept_plans.GATE] = state
        kept_plans.configure(config)
        presets = dict(autotune.PLAN_CHOICES.preset)
        autotune.PLAN_CHOICES.record(("new", len(presets)), "eng7", 0.3)   # a graph this run autotuned
        kept_plans.finish(SimpleNamespace(config=config))
        return presets, state.notices, cudnn_plans.load(path, stack).presets()

    presets, notices, stored = session(exitstatus=0, saving=None)
    assert presets == {"k1": "eng2"} and "cuDNN plans: 1 autotuned choices reused from cudnn_plans.json" in notices[0]
    assert stored == {"k1": "eng2"}                          # a run that is not saved keeps nothing
    assert session(exitstatus=0, study=object())[2] == {"k1": "eng2"}   # nor does a gatepower study session
    presets, _, stored = session(exitstatus=1)
    assert stored == {"k1": "eng2", "('new', 1)": "eng7"}    # a saved run adds its new choices, failing or not
    presets, notices, stored = session(exitstatus=0, retune=True)
    assert presets == {} and "--retune-cudnn" in notices[0] and stored["('new', 0)"] == "eng7"
    path.write_text("{")
    with pytest.raises(pytest.UsageError, match="cudnn_plans.json: not valid JSON at line 1"):
        session(exitstatus=0)


def working_tree_copy(dest: Path) -> Path:
    """A fresh git repository holding this checkout's working tree (tracked and untracked-but-not-ignored
    files, as they are now), committed: what a user's clean checkout looks like before `./gate perf`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():   # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git = ["git", "-c", "user.name=gate smoke", "-c", "user.email=gate-smoke@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout before ./gate perf"]):
        subprocess.run(git + args, cwd=dest, check=True, env=git_env())
    return dest


def git_env() -> dict:
    """The environment less what would point git or the engine somewhere else (hooks set GIT_DIR, say)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("GIT_", "GPUENGINE_", "GATEPOWER_", "PYTEST_")) and k != "PYTHONPATH"}


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                    reason="needs git and a git checkout of the repository")
def test_a_gate_perf_run_leaves_git_status_as_it_found_it_but_the_run_it_stored(tmp_path):
    """`./gate perf` on the CPU tier (one quick test) in a committed copy of this working tree: afterwards
    `git status` lists the one run it stored and nothing else; the report went to the ignored build/report/."""
    repo = working_tree_copy(tmp_path / "repo")
    env = dict(git_env(), GATE_NO_INSTALL="1", GPUENGINE_DEVICE="cpu", CUDA_VISIBLE_DEVICES="",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    gate = subprocess.run(["./gate", "perf", "-k", "test_mlp_infer and b64"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, env=git_env(),
                            capture_output=True, text=True, check=True).stdout.splitlines()
    stored = [line for line in status if line.startswith("?? baselines_store/cpu-tier/")
              and line.endswith(".json") and "/history/" not in line]
    assert len(stored) == 1 and status == stored, f"the gate left more than its stored run: {status}"
    run = json.loads((repo / stored[0][3:]).read_text())
    assert [b["name"] for b in run["benchmarks"]] == ["test_mlp_infer[fp32-resident-b64]"]
    assert run["commit_info"]["dirty"] is False
    report = repo / "build" / "report" / "index.html"
    assert report.is_file() and f"{report}" in gate.stdout
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/report/index.html"], cwd=repo, env=git_env())
    assert ignored.returncode == 0
