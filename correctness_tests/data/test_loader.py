"""The streamed loader's ring on the NumPy backend: order, shuffles, completeness, shutdown, errors.

The ring (gpuengine/data/batch_ring.py) runs the same threads and scheduling
on both backends; only the uploads differ (uploads.py). These tests use batches
large enough to be split into several workers' shares.
"""
from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.data.batch_ring import MIN_ROWS_PER_SHARE, BatchRing, LoaderError, shares
from gpuengine.data.checks import DataError
from gpuengine.data.shuffle import batch_rows
from gpuengine.data.streamed import StreamedDataset
from gpuengine.data.uploads import HostUploads
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.precision import policy_for
from gpuengine.runtime.step_state import StepState
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import SMOKE_SHAPE, build_mlp, mlp_data

from .test_data import delivered_batches


def row_numbered(samples: int, features: int = 5):
    """Inputs whose first feature is the row number, targets the row number: a batch says where it came from."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    x[:, 0] = np.arange(samples)
    return x, np.arange(samples, dtype=np.float32)[:, None]


def streamed(x, t, batch, seed=3, pool=3, workers=3) -> StreamedDataset:
    backend = Backend("cpu")
    allocator = Allocator(backend)
    state = StepState(backend, allocator, steps_per_epoch=len(x) // batch)
    return StreamedDataset(backend, allocator, policy_for("fp32"), state, x, t, batch, seed, pool=pool,
                           workers=workers)


def bare_ring(x, t, rows, batch, pool, workers) -> BatchRing:
    """A ring over NumPy slots with a row function of the test's choosing."""
    ring_x = np.zeros((pool * batch,) + x.shape[1:], x.dtype)
    ring_t = np.zeros((pool * batch,) + t.shape[1:], t.dtype)
    return BatchRing(HostUploads(None, ring_x, ring_t, batch), rows, x, t, batch, pool, workers)


def loader_threads(ring) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(ring.name + "-")]


def test_a_batch_is_split_into_one_share_per_worker_and_no_tiny_shares():
    assert shares(1000, 4) == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert shares(MIN_ROWS_PER_SHARE * 2, 8) == [(0, MIN_ROWS_PER_SHARE), (MIN_ROWS_PER_SHARE, 2 * MIN_ROWS_PER_SHARE)]
    assert shares(10, 4) == [(0, 10)]


@pytest.mark.parametrize("pool,workers,per_launch", [(1, 1, 1), (3, 3, 1), (3, 2, 3), (4, 4, 2), (6, 3, 3)])
def test_each_step_gets_its_rows_in_order(pool, workers, per_launch):
    x, t = row_numbered(1031)
    batch, seed, steps = 200, 3, 13          # 5 steps an epoch: crosses two epoch boundaries
    data = streamed(x, t, batch, seed, pool, workers)
    assert len(data.ring.shares) == min(workers, batch // MIN_ROWS_PER_SHARE)
    for step, (bx, bt) in enumerate(delivered_batches(data, steps, per_launch)):
        rows = batch_rows(len(x), seed, step, batch, len(x) // batch)
        np.testing.assert_array_equal(bt[:, 0], rows, err_msg=f"step {step}")
        np.testing.assert_array_equal(bx, x[rows], err_msg=f"step {step}")
    data.close()


def test_every_sample_once_per_epoch_and_a_new_order_each_epoch():
    x, t = row_numbered(1000)
    batch = 200                                # 5 steps an epoch, no remainder: every row every epoch
    data = streamed(x, t, batch, workers=4)
    batches = delivered_batches(data, 15, 1)
    epochs = [np.concatenate([bt[:, 0] for _, bt in batches[e * 5:(e + 1) * 5]]) for e in range(3)]
    for epoch, seen in enumerate(epochs):
        np.testing.assert_array_equal(np.sort(seen), np.arange(1000), err_msg=f"epoch {epoch}")
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    data.close()


def test_gathers_run_on_the_loader_threads_and_refill_without_the_caller():
    x, t = row_numbered(600)
    callers: dict[int, str] = {}
    refilled = threading.Event()

    def rows(step, lo, hi):
        callers[step] = threading.current_thread().name
        if step == 3:
            refilled.set()
        return batch_rows(600, 1, step, 100, 6, lo=lo, hi=hi)

    ring = bare_ring(x, t, rows, 100, 3, 2)
    ring.acquire(0, 1)
    ring.release(0, 1)                        # hands step 3 out to slot 0; nobody calls the ring again
    assert refilled.wait(10), "step 3 was not gathered in the background"
    assert all(name.startswith(ring.name) for name in callers.values()), callers
    ring.close()


def test_close_joins_every_worker_and_later_batches_are_refused():
    x, t = row_numbered(600)
    data = streamed(x, t, 100, workers=3)
    delivered_batches(data, 4, 1)
    ring = data.ring
    assert len(loader_threads(ring)) == 3
    data.close()
    assert loader_threads(ring) == [] and not any(thread.is_alive() for thread in ring.threads)
    data.close()                              # twice is harmless
    with pytest.raises(LoaderError, match="is closed"):
        data.before_launch(4, 1)


def test_a_dropped_data_set_stops_its_threads():
    x, t = row_numbered(600)
    data = streamed(x, t, 100, workers=2)
    delivered_batches(data, 2, 1)
    ring = data.ring
    del data
    gc.collect()
    assert loader_threads(ring) == []


def test_a_trainer_streams_without_leaving_threads_behind():
    x, t = mlp_data(1024, SMOKE_SHAPE)
    config = EngineConfig(device="cpu", precision="fp32", cuda_graph=2, resident_data=False, batch_pool=4)
    trainer = Trainer(build_mlp(SMOKE_SHAPE), x, t, 256, config, loader_workers=3)
    trainer.train(2)
    ring = trainer.data.ring
    assert len(loader_threads(ring)) == 3
    trainer.close()
    assert loader_threads(ring) == []


@pytest.mark.parametrize("workers", [1, 3])
def test_streamed_training_is_resident_training_bit_for_bit(workers):
    x, t = mlp_data(1024, SMOKE_SHAPE)
    base = EngineConfig(device="cpu", precision="fp32", cuda_graph=2)
    resident = Trainer(build_mlp(SMOKE_SHAPE), x, t, 256, base).train(3)
    trainer = Trainer(build_mlp(SMOKE_SHAPE), x, t, 256, base.replace(resident_data=False, batch_pool=4),
                      loader_workers=workers)
    assert trainer.train(3) == resident
    trainer.close()


def test_a_worker_error_surfaces_in_the_caller_with_its_cause_and_stops_the_ring():
    x, t = row_numbered(600)

    def rows(step, lo, hi):
        if step == 4:
            raise ValueError("disk read failed")
        return batch_rows(600, 1, step, 100, 6, lo=lo, hi=hi)

    ring = bare_ring(x, t, rows, 100, 3, 2)
    for step in range(4):
        ring.acquire(step, 1)
        ring.release(step, 1)
    with pytest.raises(LoaderError, match=r"failed gathering step 4 \(batch rows 0\.\.99\): ValueError: disk read"
                       ) as raised:
        ring.acquire(4, 1)
    assert isinstance(raised.value.__cause__, ValueError)
    deadline = time.monotonic() + 10
    while loader_threads(ring) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader_threads(ring) == []
    with pytest.raises(LoaderError, match="step 4"):   # the failure stays the answer
        ring.acquire(4, 1)


def test_a_row_outside_the_data_set_is_an_error_naming_the_step():
    x, t = row_numbered(600)
    ring = bare_ring(x, t, lambda step, lo, hi: np.arange(lo, hi) + 550, 100, 2, 1)
    with pytest.raises(LoaderError, match="step 0.*IndexError") as raised:
        ring.acquire(0, 1)
    assert isinstance(raised.value.__cause__, IndexError)


def test_a_launch_out_of_sequence_restarts_the_ring_there():
    x, t = row_numbered(1031)
    data = streamed(x, t, 200, seed=5, workers=2)
    for first in (7, 2):
        data.before_launch(first, 2)
        for step in (first, first + 1):
            data.state.step[0] = step
            data.load_batch()
            np.testing.assert_array_equal(data.batch_t[:, 0], batch_rows(1031, 5, step, 200, 5))
        data.after_launch(first, 2)
    data.close()


@pytest.mark.parametrize("pool,workers,message", [(0, 2, "batch_pool=0 is not accepted"),
                                                  (3, 0, "loader_workers=0 is not accepted"),
                                                  (3, True, "loader_workers=True is not accepted"),
                                                  (3, 1.5, "loader_workers=1.5 is not accepted")])
def test_bad_loader_configuration_is_refused_before_anything_is_built(pool, workers, message):
    x, t = row_numbered(600)
    allocator = Allocator(Backend("cpu"))
    state = StepState(allocator.backend, allocator, 6)
    with pytest.raises(DataError, match=message):
        StreamedDataset(allocator.backend, allocator, policy_for("fp32"), state, x, t, 100, pool=pool,
                        workers=workers)
    assert allocator.bytes_by_category["batch"] == 0


def test_a_trainer_refuses_zero_loader_workers():
    x, t = mlp_data(512, SMOKE_SHAPE)
    config = EngineConfig(device="cpu", resident_data=False, cuda_graph=0)
    with pytest.raises(DataError, match="loader_workers=0 is not accepted; use a whole number >= 1"):
        Trainer(build_mlp(SMOKE_SHAPE), x, t, 128, config, loader_workers=0)


def test_a_launch_longer_than_the_ring_is_refused():
    x, t = row_numbered(600)
    ring = bare_ring(x, t, lambda step, lo, hi: np.arange(lo, hi), 100, 2, 1)
    with pytest.raises(DataError, match="a launch of 3 steps cannot read from a ring of 2 slots"):
        ring.acquire(0, 3)
    ring.close()


def test_a_share_outside_the_batch_is_refused():
    with pytest.raises(ValueError, match="batch positions 5..12 are not within a batch of 10"):
        batch_rows(100, 0, 0, 10, 10, lo=5, hi=12)


def test_a_prefetch_horizon_stops_gathering_ahead_but_never_a_launch():
    # A benchmark round must not find its batches gathered (and uploaded) between rounds, off the clock.
    x, t = row_numbered(600)
    gathered = []

    def rows(step, lo, hi):
        gathered.append(step)
        return np.arange(lo, hi)
    ring = bare_ring(x, t, rows, 100, 4, 1)
    ring.prefetch_until(2)
    for step in range(3):
        ring.acquire(step, 1)
        ring.release(step, 1)
    time.sleep(0.2)                         # unbounded, the ring would hand out steps 3..6 now
    assert sorted(set(gathered)) == [0, 1, 2]
    ring.acquire(3, 2)                      # past the horizon: a launch that needs steps gets them
    ring.release(3, 2)
    time.sleep(0.2)
    assert sorted(set(gathered)) == [0, 1, 2, 3, 4]
    ring.prefetch_until(None)               # no limit: the ring runs pool steps ahead again
    ring.acquire(5, 1)
    time.sleep(0.2)
    assert sorted(set(gathered)) == list(range(9))
    ring.close()
