"""The streamed data set on the NumPy backend: staging, seeks, memory, training, errors.

The device path (mapped pinned memory, the side stream) is test_gpu_loader.py's;
here the same staging protocol runs with NumPy arrays: the stage holds the
next step's batch after every step, a launch that starts elsewhere stages its
own first batch, and training equals resident training bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import ConfigError, EngineConfig
from gpuengine.data.pinned import refusal
from gpuengine.data.shuffle import batch_rows
from gpuengine.data.streamed import StreamedDataset
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


def streamed(x, t, batch, seed=3, pool=2) -> StreamedDataset:
    backend = Backend("cpu")
    allocator = Allocator(backend)
    state = StepState(backend, allocator, steps_per_epoch=len(x) // batch)
    return StreamedDataset(backend, allocator, policy_for("fp32"), state, x, t, batch, seed, pool=pool)


@pytest.mark.parametrize("pool,per_launch", [(1, 1), (1, 4), (2, 1), (2, 3), (2, 5)])
def test_each_step_gets_its_rows_in_order(pool, per_launch):
    x, t = row_numbered(1031)
    batch, seed, steps = 200, 3, 13          # 5 steps an epoch: crosses two epoch boundaries
    data = streamed(x, t, batch, seed, pool)
    for step, (bx, bt) in enumerate(delivered_batches(data, steps, per_launch)):
        rows = batch_rows(len(x), seed, step, batch, len(x) // batch)
        np.testing.assert_array_equal(bt[:, 0], rows, err_msg=f"step {step}")
        np.testing.assert_array_equal(bx, x[rows], err_msg=f"step {step}")


def test_every_sample_once_per_epoch_and_a_new_order_each_epoch():
    x, t = row_numbered(1000)
    batch = 200                                # 5 steps an epoch, no remainder: every row every epoch
    batches = delivered_batches(streamed(x, t, batch), 15, 1)
    epochs = [np.concatenate([bt[:, 0] for _, bt in batches[e * 5:(e + 1) * 5]]) for e in range(3)]
    for epoch, seen in enumerate(epochs):
        np.testing.assert_array_equal(np.sort(seen), np.arange(1000), err_msg=f"epoch {epoch}")
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])


def test_the_stage_holds_the_next_steps_batch_after_each_step():
    x, t = row_numbered(1031)
    data = streamed(x, t, 200, seed=4)
    data.before_launch(0, 1)
    np.testing.assert_array_equal(data.stage_t[:, 0], batch_rows(1031, 4, 0, 200, 5))   # staged before the launch
    for step in range(7):
        data.state.step[0] = step
        data.load_batch()
        data.end_step()
        np.testing.assert_array_equal(data.stage_t[:, 0], batch_rows(1031, 4, step + 1, 200, 5), err_msg=f"{step}")
    data.after_launch(0, 7)


def test_a_launch_out_of_sequence_stages_its_own_first_batch():
    x, t = row_numbered(1031)
    data = streamed(x, t, 200, seed=5)
    for first in (7, 2, 4):                   # a seek ahead, one back, then 4 follows the launch 2..3 on
        data.state.step[0] = first
        data.before_launch(first, 2)
        for step in (first, first + 1):
            data.state.step[0] = step
            data.load_batch()
            np.testing.assert_array_equal(data.batch_t[:, 0], batch_rows(1031, 5, step, 200, 5), err_msg=f"{step}")
            data.end_step()
        data.after_launch(first, 2)


@pytest.mark.parametrize("pool", [1, 2])
def test_the_device_holds_pool_batches_and_no_copy_of_the_data_set(pool):
    x, t = row_numbered(1000, features=8)
    data = streamed(x, t, 100, pool=pool)
    assert data.bytes_per_step == 100 * (8 * 4 + 4)
    allocator = Allocator(Backend("cpu"))
    state = StepState(allocator.backend, allocator, 10)
    StreamedDataset(allocator.backend, allocator, policy_for("fp32"), state, x, t, 100, pool=pool)
    assert allocator.bytes_by_category["batch"] == pool * data.bytes_per_step


@pytest.mark.parametrize("graph,pool", [(0, 1), (0, 2), (2, 2), (3, 1)])
def test_streamed_training_is_resident_training_bit_for_bit(graph, pool):
    x, t = mlp_data(1024, SMOKE_SHAPE)
    base = EngineConfig(device="cpu", precision="fp32", cuda_graph=graph)
    resident = Trainer(build_mlp(SMOKE_SHAPE), x, t, 256, base).train(3)
    trainer = Trainer(build_mlp(SMOKE_SHAPE), x, t, 256, base.replace(resident_data=False, batch_pool=pool))
    assert trainer.train(3) == resident


@pytest.mark.parametrize("pool", [0, 3, True, 1.5, "2"])
def test_a_bad_pool_is_refused_before_anything_is_built(pool):
    x, t = row_numbered(600)
    allocator = Allocator(Backend("cpu"))
    state = StepState(allocator.backend, allocator, 6)
    with pytest.raises(ConfigError, match=rf"batch_pool={pool!r} is not accepted: 1 .* or 2 "):
        StreamedDataset(allocator.backend, allocator, policy_for("fp32"), state, x, t, 100, pool=pool)
    assert allocator.bytes_by_category["batch"] == 0


def test_the_config_refuses_a_pool_above_two():
    with pytest.raises(ConfigError, match="batch_pool=3 is not accepted; use a whole number from 1 to 2"):
        EngineConfig(batch_pool=3)


def test_a_refused_pin_names_the_bytes_and_the_hosts_memory():
    message = str(refusal("the inputs", 3 * 2**30, "cudaErrorMemoryAllocation: out of memory"))
    assert "the inputs must be pinned in host memory" in message
    assert "3221225472 bytes (3 GiB) were refused (cudaErrorMemoryAllocation: out of memory)" in message
    assert "this host has" in message or "the host's memory could not be read" in message
    assert "resident_data=1" in message
