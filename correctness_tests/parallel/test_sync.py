"""The trainer with a gradient sync, ranks as threads: one rank trains bit for bit like no sync; bad runs refused."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the rendezvous uses torch's TCPStore; torch is not installed")

from correctness_tests.parallel.test_rendezvous import run_ranks  # noqa: E402
from gpuengine.config import ConfigError, EngineConfig  # noqa: E402
from gpuengine.parallel import GradientSync, StoreAllReduce  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data  # noqa: E402

CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)
SHAPE = MLPShape(inputs=10, hidden=24)


def trainer(sync=None, batch=16, seed=0):
    return Trainer(build_mlp(SHAPE), *mlp_data(96, SHAPE), batch, CPU, seed=seed, sync=sync)


def test_one_rank_with_a_sync_trains_exactly_like_no_sync():
    plain = trainer()
    expected = plain.train(3)

    def body(rank, rdv):
        synced = trainer(GradientSync(rdv.group, rdv, StoreAllReduce(rdv), bucket_bytes=256))
        return synced.train(3), synced.params.state_dict(), len(synced.sync.buckets)

    (result,), errors = run_ranks(1, body)
    assert errors == [None]
    losses, weights, buckets = result
    assert losses == expected and buckets > 1
    for name, value in plain.params.state_dict().items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


@pytest.mark.parametrize("field,differ", [("seed", {"seed": 3}), ("batch", {"batch": 32})])
def test_ranks_configured_differently_are_refused_at_start(field, differ):
    def body(rank, rdv):
        trainer(GradientSync(rdv.group, rdv, StoreAllReduce(rdv)), **(differ if rank == 1 else {}))

    _, errors = run_ranks(2, body)
    for error in errors:
        assert isinstance(error, ConfigError) and f"rank 1's configuration differs from rank 0's in {field!r}" \
            in str(error)


def test_a_global_batch_the_ranks_cannot_split_is_refused():
    def body(rank, rdv):
        trainer(GradientSync(rdv.group, rdv, StoreAllReduce(rdv)), batch=15)

    _, errors = run_ranks(2, body)
    assert all(isinstance(e, ConfigError) and "global batch 15 is not divisible by WORLD_SIZE=2" in str(e)
               for e in errors)


def test_attaching_hands_every_rank_rank_0s_weights():
    def body(rank, rdv):
        local = trainer(seed=rank)          # different initial weights on each rank
        sync = GradientSync(rdv.group, rdv, StoreAllReduce(rdv))
        sync.attach(local.net, local.program, local.params, local.backend, {"batch": 16})
        return local.params.state_dict()

    results, errors = run_ranks(2, body)
    assert errors == [None, None]
    rank0_weights, rank1_own = trainer(seed=0).params.state_dict(), trainer(seed=1).params.state_dict()
    assert not np.array_equal(rank1_own["dense1.weight"], rank0_weights["dense1.weight"])   # the test means it
    for name, value in rank0_weights.items():
        for weights in results:
            np.testing.assert_array_equal(weights[name], value, err_msg=name)
