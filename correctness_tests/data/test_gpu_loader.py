"""On a GPU: the streamed loader's pinned ring, copy streams and events (gpuengine/data/uploads.py).

The ring's scheduling is checked on the NumPy backend (test_loader.py); these
tests carry it to the CUDA path: the batches that land in the device buffers,
training that equals resident training, a Python thread that never waits on
the compute stream, no steady-state allocation, and the copy benchmark's
runners.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from gpuengine.bench.injected_delay import StepDelay
from gpuengine.bench.loader import LoaderRunner, PinnedCopyRunner, measure_pinned_h2d_gbps
from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

from ..gpu_checks import assert_steady_state_allocates_nothing

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

SHAPE = MLPShape(inputs=256, hidden=64)


@pytest.mark.parametrize("precision,pool,workers", [("fp32", 1, 1), ("fp32", 3, 4), ("bf16", 4, 3)])
def test_the_device_batch_buffers_hold_each_steps_rows(precision, pool, workers):
    x, t = mlp_data(2000, SHAPE)
    loader = LoaderRunner(x, t, 300, EngineConfig(precision=precision, batch_pool=pool), 1, workers=workers)
    for _ in range(14):                      # 6 steps an epoch: crosses two epoch boundaries
        loader.run_round()
        bx, bt, rows = loader.delivered()
        np.testing.assert_array_equal(bt, t[rows])
        np.testing.assert_array_equal(bx, x[rows].astype(bx.dtype))
    loader.close()


@pytest.mark.parametrize("graph,pool", [(0, 3), (1, 2), (4, 8)])
def test_streamed_training_equals_resident_training(graph, pool):
    x, t = mlp_data(4096, SHAPE)
    resident = Trainer(build_mlp(SHAPE), x, t, 512, EngineConfig(precision="fp32", cuda_graph=graph)).train(3)
    trainer = Trainer(build_mlp(SHAPE), x, t, 512, EngineConfig(precision="fp32", cuda_graph=graph,
                                                                 resident_data=False, batch_pool=pool),
                      loader_workers=4)
    np.testing.assert_allclose(trainer.train(3), resident, rtol=1e-6)
    trainer.close()


def test_launches_are_queued_without_waiting_for_the_compute_stream():
    """Hand-over is by events: with the compute stream held up for 0.5 s, a whole ring of steps is acquired,
    read and released in far less, and the compute stream is still busy afterwards."""
    x, t = mlp_data(4096, SHAPE)
    loader = LoaderRunner(x, t, 512, EngineConfig(precision="fp32", batch_pool=4), 4, workers=2)
    loader.prepare()
    delay = StepDelay(loader.backend, 500_000)
    with loader.backend.activate():
        delay.wait()                         # 0.5 s of spinning on the compute stream
        start = time.perf_counter()
        loader.run_round()
        queued_s = time.perf_counter() - start
    assert not loader.backend.stream.done, "the compute stream finished: the loader waited on it"
    assert queued_s < 0.25, f"queueing 4 steps took {queued_s:.3f} s behind a 0.5 s kernel"
    bx, bt, rows = loader.delivered()
    np.testing.assert_array_equal(bt, t[rows])
    loader.close()


def test_streamed_steady_state_allocates_nothing():
    x, t = mlp_data(4096, SHAPE)
    assert_steady_state_allocates_nothing(build_mlp(SHAPE), x, t, 512, [
        EngineConfig(precision="fp32", cuda_graph=g, resident_data=False, batch_pool=p) for g, p in ((0, 3), (2, 4))])


def test_pinned_copies_report_a_bandwidth_and_move_the_bytes():
    loader = LoaderRunner(*mlp_data(1024, SHAPE), 256, EngineConfig(precision="fp32", batch_pool=2), 1)
    runner = PinnedCopyRunner(loader.backend, 8 << 20, 4)
    runner.prepare()
    np.testing.assert_array_equal(runner.device.get(), runner.host)
    assert 1 < runner.last_round_gbps() < 1000
    assert 1 < measure_pinned_h2d_gbps(loader.backend, total_bytes=256 << 20) < 1000
    loader.close()
