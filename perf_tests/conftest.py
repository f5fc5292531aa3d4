"""perf_tests fixtures: `compare` (engine vs references in one run, through pytest-benchmark) and the GEMM peak.

A perf test builds its engine runner and reference runners, then calls

    result = compare(benchmark, engine, [ref, ...], rounds=R, precision="tf32", flops_per_sample=F)

and gets a `gpuengine.bench.benchmarking.Comparison`; the engine's rounds are what
pytest-benchmark stores, everything else goes into the run's `extra_info`, and
on a GPU tier a missed ratio threshold or a regression against the test's
stored baseline fails the test, as does a missed claim; a missed target goes to
the summary (and fails with --claims). In a gatepower study session the same
test then runs the study's trials (gpuengine/gate/gatepower/trials.py).
Every round is timed on the session's timing core (GATE_TIMING_CPU, else the
last core of the process: gpuengine/gate/ab/worker.py's `timing_cpu`), which the
stored run records in machine_info["timing_cpu"].
"""
from __future__ import annotations

import os
import traceback

import pytest

from gpuengine.bench import oom
from gpuengine.bench.benchmarking import Comparison
from gpuengine.gate.gatepower import trials as study_trials
from gpuengine.bench.gpu_memory import is_out_of_memory
from gpuengine.gate.rules.regression import choose_reference

from gpuengine.gate.ab.session import ab_record
from gpuengine.gate.ab.sides import EnginePair
from gpuengine.gate.ab.worker import TIMING_CPU_ENV, timing_cpu
from gpuengine.gate.gemm_peak import measure_gemm_peak_tflops
from gpuengine.gate.harness import alternate_rounds, fail_with, record_and_gate, round_ms, unavailable_references, warm_up
from gpuengine.gate import tiers
from gpuengine.gate.tiers import RoundsChoice


TIMING_CPU = pytest.StashKey[object]()   # the session's timing core: a core number, or None where none can be pinned


def pytest_configure(config):
    """The session's timing core, settled before anything runs: a bad GATE_TIMING_CPU stops the session."""
    try:
        config.stash[TIMING_CPU] = timing_cpu()
    except ValueError as exc:
        raise pytest.UsageError(f"gpuengine: {exc}") from None


@pytest.hookimpl(optionalhook=True)   # a pytest-benchmark hook: which core timed this run's rounds
def pytest_benchmark_update_machine_info(config, machine_info):
    chosen = os.environ.get(TIMING_CPU_ENV, "").strip()
    machine_info["timing_cpu"] = {"cpu": config.stash.get(TIMING_CPU, None),
                                  "set_by": TIMING_CPU_ENV if chosen else "the last core of the process's affinity"}


@pytest.fixture(scope="session")
def gemm_peak_tflops(on_gpu):
    """peak(precision) -> TFLOP/s measured once per precision and session; None on the CPU tier."""
    measured: dict[str, float | None] = {}

    def peak(precision: str) -> float | None:
        if not on_gpu:
            return None
        if precision not in measured:
            measured[precision] = measure_gemm_peak_tflops(precision)
        return measured[precision]

    return peak


GATE_FAILURES = pytest.StashKey[list]()   # a test's missed thresholds and regressions, raised after its body


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Fail a perf test on what `compare` found only after the test's own checks ran: a test that missed a
    ratio still asserts, and records, that its loss descended. A device out-of-memory fails this test alone,
    with the sizes, and its memory goes back before the next test (gpuengine/bench/oom.py)."""
    out_of_memory = None
    try:
        result = yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        out_of_memory = oom.describe(exc)
        traceback.clear_frames(exc.__traceback__)   # the frames hold the test's arrays
    if out_of_memory is not None:
        after = oom.release()
        pytest.fail(f"{out_of_memory}; the test's memory was released ({after or 'no device'}) and the session "
                    "goes on", pytrace=False)
    failures = item.stash.get(GATE_FAILURES, [])
    if failures:
        fail_with(failures)
    return result


@pytest.fixture
def references(request, run_settings):
    """references(names) -> the names this test times (gpuengine/gate/tiers.py: the GPU quick tier leaves some
    to the nightly tier)."""
    full = bool(request.config.getoption("full", False))
    on_gpu = run_settings.tier.on_gpu
    return lambda names: tiers.references(names, full=full, on_gpu=on_gpu, test=request.node.name)


@pytest.fixture
def compare(request, run_settings, gemm_peak_tflops, gate_test, gate_targets):
    """compare(benchmark, engine, references, *, rounds, precision=None, flops_per_sample=None, warmup_rounds=1).

    `rounds` is the test's default: the gate plugin may choose others (noise.json, budget, --full, A/B).
    `engine` may be an A/B pair (the `engine_for` fixture in an A/B session): its base's rounds go into
    extra_info["ab"], which the gate reads instead of the stored run. `references` are the ones that run here
    (harness.ready_references); those it left out settle torch_graph_best and go to the summary.
    """

    def run(benchmark, engine, references, *, rounds: int, precision: str | None = None,
            flops_per_sample: float | None = None, warmup_rounds: int = 1) -> Comparison:
        precision = precision or run_settings.config.precision
        cpu = request.config.stash.get(TIMING_CPU, None)
        round_set_ms = warm_up(engine, references, warmup_rounds, cpu)
        paired = isinstance(engine, EnginePair)
        choice = (gate_test.rounds(rounds, round_set_ms, paired_rounds=paired) if gate_test
                  else RoundsChoice(rounds, "the test's default"))
        times = alternate_rounds(benchmark, engine, references, choice.rounds, warmup_rounds=0, timing_cpu=cpu)
        if isinstance(engine, EnginePair):   # A/B: the base's rounds are the gate's, not the comparison's
            benchmark.extra_info["ab"] = ab_record(request.config, engine, times)
            del times[engine.base.name]
        samples = {runner.name: runner.samples_per_round for runner in (engine, *references)}
        # Measured after the timed rounds, so the peak's heat and allocations never sit inside them.
        peak = gemm_peak_tflops(precision) if flops_per_sample else None
        unavailable = unavailable_references(benchmark)   # what ready_references left out of this test
        if gate_test:   # for the session's summary
            gate_test.state.unavailable += [f"{gate_test.fullname}: {name}: {why}" for name, why in unavailable.items()]
        comparison = Comparison.from_times(engine.name, times, samples, flops_per_sample, peak, unavailable)
        benchmark.extra_info["rounds_choice"] = choice.as_dict()
        record_and_gate(benchmark, comparison, request.node.name, precision, run_settings.tier, gate_test=gate_test,
                        defer_to=request.node.stash.setdefault(GATE_FAILURES, []), targets=gate_targets)
        if gate_test and gate_test.study:
            read = choose_reference({name: summary.median for name, summary in comparison.ratios.items()})
            run = study_trials.run_paired_trials if isinstance(engine, EnginePair) else study_trials.run_trials
            try:
                run(gate_test.fullname, gate_test.workload, engine, [ref for ref in references if ref.name == read],
                    choice.rounds, gate_test.study, timer=lambda runner: round_ms(runner, cpu))
            except study_trials.DelayUnreachable as exc:   # no trials: the study says so, the session goes on
                pytest.skip(f"gatepower: no trials: {exc}")
        return comparison

    return run
