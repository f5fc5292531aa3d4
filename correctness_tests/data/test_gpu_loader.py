"""On a GPU: the streamed data set read by the device from mapped pinned host memory (gpuengine/data/streamed.py).

The staging protocol is checked on the NumPy backend (test_loader.py); these
tests carry it to the CUDA path: the batches that land in the device buffers,
reads that really come from the host copy, a device that holds batches and
not the data set, training that equals resident training bit for bit, no
host wait on the compute stream, no steady-state allocation, and the copy
benchmark's runners.
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


@pytest.mark.parametrize("precision,pool,features", [("fp32", 1, 256), ("fp32", 2, 256), ("bf16", 2, 256),
                                                      ("fp32", 2, 37632)])   # 150 KB rows: chunked over warps
def test_the_device_batch_buffers_hold_each_steps_rows(precision, pool, features):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((400, features)).astype(np.float32)
    t = np.arange(400, dtype=np.float32)[:, None]
    loader = LoaderRunner(x, t, 60, EngineConfig(precision=precision, batch_pool=pool), 1)
    for _ in range(14):                      # 6 steps an epoch: crosses two epoch boundaries
        loader.run_round()
        bx, bt, rows = loader.delivered()
        np.testing.assert_array_equal(bt, t[rows])
        np.testing.assert_array_equal(bx, x[rows].astype(bx.dtype))


def test_the_gather_reads_the_host_copy_and_the_device_holds_only_batches():
    import cupy
    x, t = mlp_data(1 << 15, SHAPE)           # 32 MiB of inputs, 512 KiB a batch
    pool_memory = cupy.get_default_memory_pool()
    before = pool_memory.used_bytes()
    loader = LoaderRunner(x, t, 512, EngineConfig(precision="fp32", batch_pool=2), 1)
    assert pool_memory.used_bytes() - before < 4 * loader.bytes_per_step() + (1 << 20)
    loader.data.host_x.host[...] = 7.0       # written on the host after construction
    loader.run_round()
    loader.run_round()                       # the first round's batch was staged before the write
    bx, _, _ = loader.delivered()
    assert (bx == 7.0).all(), "the batch did not come from the pinned host copy"


@pytest.mark.parametrize("graph,pool", [(0, 1), (0, 2), (1, 2), (4, 2), (4, 1)])
def test_streamed_training_equals_resident_training_bit_for_bit(graph, pool):
    x, t = mlp_data(4096, SHAPE)
    resident = Trainer(build_mlp(SHAPE), x, t, 512, EngineConfig(precision="fp32", cuda_graph=graph)).train(3)
    trainer = Trainer(build_mlp(SHAPE), x, t, 512, EngineConfig(precision="fp32", cuda_graph=graph,
                                                                 resident_data=False, batch_pool=pool))
    assert trainer.train(3) == resident


def test_steps_are_queued_without_waiting_for_the_compute_stream():
    """No host wait anywhere in the streamed step: with the compute stream held up for 0.5 s, a round of
    steps is queued in far less, and the compute stream is still busy afterwards."""
    x, t = mlp_data(4096, SHAPE)
    loader = LoaderRunner(x, t, 512, EngineConfig(precision="fp32", batch_pool=2), 4)
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


def test_streamed_steady_state_allocates_nothing():
    x, t = mlp_data(4096, SHAPE)
    assert_steady_state_allocates_nothing(build_mlp(SHAPE), x, t, 512, [
        EngineConfig(precision="fp32", cuda_graph=g, resident_data=False, batch_pool=p) for g, p in ((0, 2), (2, 1))])


def test_pinned_copies_report_a_bandwidth_and_move_the_bytes():
    loader = LoaderRunner(*mlp_data(1024, SHAPE), 256, EngineConfig(precision="fp32", batch_pool=2), 1)
    runner = PinnedCopyRunner(loader.backend, 8 << 20, 4)
    runner.prepare()
    np.testing.assert_array_equal(runner.device.get(), runner.host)
    assert 1 < runner.last_round_gbps() < 1000
    assert 1 < measure_pinned_h2d_gbps(loader.backend, total_bytes=256 << 20) < 1000
