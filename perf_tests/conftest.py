"""perf_tests fixtures: `compare` (engine vs references in one run, through pytest-benchmark) and the GEMM peak.

A perf test builds its engine runner and reference runners, then calls

    result = compare(benchmark, engine, [ref, ...], rounds=R, precision="tf32", flops_per_sample=F)

and gets a `gpuengine.bench.benchmarking.Comparison`; the engine's rounds are what
pytest-benchmark stores and compares, everything else goes into the run's
`extra_info`, and a missed ratio threshold fails the test on a GPU tier.
"""
from __future__ import annotations

import pytest

from gpuengine.bench.benchmarking import Comparison

from .gemm_peak import measure_gemm_peak_tflops
from .harness import alternate_rounds, record_and_gate


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


@pytest.fixture
def compare(request, run_target, gemm_peak_tflops):
    """compare(benchmark, engine, references, *, rounds, precision=None, flops_per_sample=None, warmup_rounds=1)."""

    def run(benchmark, engine, references, *, rounds: int, precision: str | None = None,
            flops_per_sample: float | None = None, warmup_rounds: int = 1) -> Comparison:
        precision = precision or run_target.config.precision
        times = alternate_rounds(benchmark, engine, references, rounds, warmup_rounds)
        samples = {runner.name: runner.samples_per_round for runner in (engine, *references)}
        # Measured after the timed rounds, so the peak's heat and allocations never sit inside them.
        peak = gemm_peak_tflops(precision) if flops_per_sample else None
        comparison = Comparison.from_times(engine.name, times, samples, flops_per_sample, peak)
        record_and_gate(benchmark, comparison, request.node.name, precision, run_target.tier)
        return comparison

    return run
