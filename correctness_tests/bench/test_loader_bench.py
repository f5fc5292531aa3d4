"""The loader micro-benchmark's runners on the NumPy backend: what they count and what they deliver."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.bench.benchmarking import Comparison, time_round
from gpuengine.bench.loader import LoaderRunner, PinnedCopyRunner, measure_pinned_h2d_gbps
from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import Backend
from gpuengine.workloads.mlp import MLPShape, mlp_data

SHAPE = MLPShape(inputs=31, hidden=8)     # 31 float32 inputs + 1 target: 128 bytes a sample
CPU = EngineConfig(device="cpu", precision="fp32", batch_pool=2)


def test_the_loader_runner_counts_bytes_and_delivers_each_steps_rows():
    x, t = mlp_data(1000, SHAPE)
    loader = LoaderRunner(x, t, 100, CPU, steps_per_round=7)
    assert loader.data.bytes_per_step == 100 * 128
    assert loader.samples_per_round == loader.bytes_per_round == 7 * 100 * 128
    loader.prepare()
    for _ in range(2):
        loader.run_round()
        bx, bt, rows = loader.delivered()
        np.testing.assert_array_equal(bt, t[rows])
        np.testing.assert_array_equal(bx, x[rows])
    assert loader.steps_done == 21


def test_the_ratio_against_pinned_copies_is_a_bandwidth_ratio():
    x, t = mlp_data(1000, SHAPE)
    loader = LoaderRunner(x, t, 100, CPU, steps_per_round=4)
    pinned = PinnedCopyRunner(loader.backend, loader.data.bytes_per_step, copies=8)
    assert pinned.samples_per_round == pinned.bytes_per_round == 8 * 100 * 128
    for runner in (loader, pinned):
        runner.prepare()
    times = {r.name: [time_round(r)] for r in (loader, pinned)}
    comparison = Comparison.from_times(loader.name, times, {r.name: r.samples_per_round for r in (loader, pinned)})
    expected = (times[pinned.name][0] / pinned.bytes_per_round) / (times[loader.name][0] / loader.bytes_per_round)
    assert comparison.ratios[pinned.name].median == pytest.approx(expected)
    np.testing.assert_array_equal(pinned.device, pinned.host)
    assert pinned.host.any()                 # never timed on zeros


def test_a_bound_runner_counts_the_engines_samples():
    runner = PinnedCopyRunner(Backend("cpu"), 4096, 3, name="copy_bound", samples_per_round=96)
    assert (runner.name, runner.samples_per_round, runner.bytes_per_round) == ("copy_bound", 96, 3 * 4096)


def test_no_bandwidth_without_a_copy_engine_and_bad_sizes_refused():
    backend = Backend("cpu")
    assert measure_pinned_h2d_gbps(backend) is None
    assert PinnedCopyRunner(backend, 64, 1).last_round_gbps() is None
    with pytest.raises(ValueError, match="chunk_bytes=0 and copies=2 must both be >= 1"):
        PinnedCopyRunner(backend, 0, 2)
