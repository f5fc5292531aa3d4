"""Sharding and the launcher variables: N ranks at global batch B see exactly the rows one process at B sees."""
from __future__ import annotations

import numpy as np
import pytest

from correctness_tests.data.test_data import delivered_batches, sample_data
from gpuengine.config import ConfigError
from gpuengine.data.resident import ResidentDataset
from gpuengine.data.shuffle import batch_rows
from gpuengine.data.streamed import StreamedDataset
from gpuengine.parallel import ProcessGroup
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.precision import policy_for
from gpuengine.runtime.step_state import StepState

ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_group_reads_the_launcher_variables():
    group = ProcessGroup.from_env(ENV)
    assert (group.rank, group.world_size, group.local_rank, group.master_addr, group.master_port) == \
        (1, 2, 1, "127.0.0.1", 29500)
    assert not group.is_root and group.local_batch(64) == 32


def test_missing_variables_are_named():
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "MASTER_PORT")}
    with pytest.raises(ConfigError, match="missing: RANK, MASTER_PORT"):
        ProcessGroup.from_env(env)


@pytest.mark.parametrize("name,value,message", [
    ("RANK", "one", "RANK must be a whole number, got 'one'"),
    ("RANK", "2", r"RANK must be in 0..1 \(WORLD_SIZE=2\), got 2"),
    ("WORLD_SIZE", "0", "WORLD_SIZE must be >= 1"),
    ("LOCAL_RANK", "-1", "LOCAL_RANK must be >= 0"),
    ("MASTER_PORT", "70000", "MASTER_PORT must be in 1..65535"),
    ("MASTER_ADDR", " ", "MASTER_ADDR is empty"),
])
def test_bad_variables_are_named(name, value, message):
    with pytest.raises(ConfigError, match=message):
        ProcessGroup.from_env(dict(ENV, **{name: value}))


def test_a_global_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(ConfigError, match="global batch 33 is not divisible by WORLD_SIZE=2"):
        ProcessGroup.from_env(ENV).local_batch(33)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_ranks_slices_make_up_the_single_process_batch(world):
    n, seed, batch = 103, 5, 12           # 8 steps an epoch: crosses epoch boundaries
    steps_per_epoch = n // batch
    for step in range(20):
        whole = batch_rows(n, seed, step, batch, steps_per_epoch)
        parts = [batch_rows(n, seed, step, batch // world, steps_per_epoch, rank, world) for rank in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts), whole, err_msg=f"step {step}")


def sharded_dataset(kind, x, t, batch, seed, rank, world):
    backend = Backend("cpu")
    allocator = Allocator(backend)
    state = StepState(backend, allocator, steps_per_epoch=len(x) // (batch * world))
    policy = policy_for("fp32")
    if kind == "resident":
        return ResidentDataset(backend, allocator, policy, state, x, t, batch, seed, rank=rank, world=world)
    return StreamedDataset(backend, allocator, policy, state, x, t, batch, seed, pool=2, rank=rank, world=world)


@pytest.mark.parametrize("kind", ["resident", "streamed"])
def test_sharded_data_sets_deliver_their_slice_of_the_global_batch(kind):
    x, t = sample_data()
    global_batch, seed, world, steps = 12, 7, 3, 20
    per_rank = [delivered_batches(sharded_dataset(kind, x, t, global_batch // world, seed, r, world), steps, 2)
                for r in range(world)]
    assert per_rank[0][0][0].shape == (global_batch // world, x.shape[1])
    for step in range(steps):
        rows = batch_rows(len(x), seed, step, global_batch, len(x) // global_batch)
        delivered = np.concatenate([per_rank[r][step][1][:, 0] for r in range(world)])
        np.testing.assert_array_equal(delivered, rows, err_msg=f"{kind} step {step}")
        np.testing.assert_array_equal(np.concatenate([per_rank[r][step][0] for r in range(world)]), x[rows])
