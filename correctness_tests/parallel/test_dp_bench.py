"""The data-parallel benchmark's machinery on the CPU tier: worker ranks driven from this process, torch_ddp on gloo.

torch_ddp's shards are the engine's (shuffle.batch_rows); DDP over 2 ranks at
per-rank batch b trains like 1 rank at b x 2 (same rows, gradients averaged);
a rank that raises or dies fails the call naming it.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="torch_ddp and the rendezvous need torch.distributed")

from gpuengine.bench.dp_group import WorkerError, WorkerGroup  # noqa: E402
from gpuengine.data.shuffle import batch_rows  # noqa: E402
from gpuengine.reference.torch_ddp import shard_order  # noqa: E402

CPU = {"GPUENGINE_DEVICE": "cpu"}


def spec(per_gpu_batch, runners=("gpuengine", "torch_ddp"), workload="mlp"):
    return dict(workload=workload, shape="smoke", per_gpu_batch=per_gpu_batch, steps_per_epoch=4, epochs_per_round=1,
                precision="fp32", cuda_graph=0, device="cpu", runners=list(runners), torch_graph=False)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_torch_ddp_shards_are_the_engines_rows(world):
    n, seed, batch, steps = 100, 3, 8, 4
    for epoch in range(3):
        parts = [shard_order(n, seed, epoch, batch, world, rank, steps).reshape(steps, batch) for rank in range(world)]
        for k in range(steps):
            for rank in range(world):
                np.testing.assert_array_equal(parts[rank][k], batch_rows(n, seed, epoch * steps + k, batch, steps,
                                                                         rank, world))


def losses(world, per_gpu_batch, rounds=3):
    with WorkerGroup(world, CPU) as group:
        runners = group.build(spec(per_gpu_batch))
        for runner in runners.values():
            runner.prepare()
        assert runners["torch_ddp"].notes == {"mode": "eager"}
        return {name: [r.epoch_loss() for _ in range(rounds)] for name, r in runners.items()}


def test_two_ranks_train_like_one_rank_at_the_global_batch():
    two, one = losses(2, 8), losses(1, 16)
    for name in ("gpuengine", "torch_ddp"):
        np.testing.assert_allclose(two[name], one[name], rtol=2e-5, err_msg=name)
        assert two[name][-1] < two[name][0], f"{name} did not train: {two[name]}"


def test_ranks_start_from_the_kept_choices_and_hand_back_only_what_they_timed():
    # As many choices as a kept file holds and more: the spec's line is far longer than a pipe's buffer.
    kept = {f"('conv_fprop', 'tf32', {i}, {'x' * 150})": f"eng{i % 7}" for i in range(4000)}
    with WorkerGroup(2, CPU) as group:
        group.build({**spec(8), "plans": kept})
        replies = group.call(range(2), {"op": "plans"})
        assert [replies[r]["preset"] for r in range(2)] == [4000, 4000]
        assert group.tuned_plans() == {}   # the NumPy backend times nothing


def test_a_rank_that_raises_is_named():
    with WorkerGroup(2, CPU) as group:
        # Both ranks raise the same error; the group names whichever reply it reads first (a race under load).
        with pytest.raises(WorkerError, match=r"(?s)rank [01] raised during build.*unknown workload "
                                              r"'nope'"):
            group.build(spec(8, workload="nope"))


def test_a_rank_that_dies_is_named_and_the_others_stopped():
    with WorkerGroup(2, CPU) as group:
        runners = group.build(spec(8, runners=("gpuengine",)))
        group._procs[1].kill()
        with pytest.raises(WorkerError, match=r"rank 1 (died during prepare \(killed by signal 9\)|is gone)"):
            runners["gpuengine"].prepare()
        assert all(p.poll() is not None for p in group._procs.values())


def test_runners_and_commands_are_checked():
    with WorkerGroup(1, CPU) as group:
        with pytest.raises(WorkerError, match="runners must include 'gpuengine'"):
            group.build(spec(8, runners=("torch_ddp",)))
