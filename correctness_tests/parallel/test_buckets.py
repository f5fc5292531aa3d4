"""The bucket plan: buckets tile the flat gradient buffer, and each is complete when its all-reduce launches."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.parallel.buckets import Bucket, backward_ready_steps, launches_by_step, plan_buckets
from gpuengine.runtime.params import FlatParameters, ParamSpec
from gpuengine.trainer import Trainer
from gpuengine.workloads.cnn import SMOKE_SHAPE as CNN_SMOKE, build_cnn, cnn_data
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)


def layout(*sizes):
    return FlatParameters.layout([ParamSpec(f"p{i}", (s,), "zeros") for i, s in enumerate(sizes)])


def test_buckets_tile_the_buffer_from_the_top_and_close_at_the_cap():
    offsets, size = layout(100, 30, 200, 10)      # padded to 128, 64, 256, 64 elements
    ready = {"p0": 3, "p1": 2, "p2": 1, "p3": 0}   # backward writes the last parameters first
    buckets = plan_buckets(offsets, size, ready, itemsize=4, cap_bytes=4 * 256)
    assert buckets == [Bucket(192, 512, 1), Bucket(0, 192, 3)]
    assert plan_buckets(offsets, size, ready, 4, cap_bytes=1) == [
        Bucket(448, 512, 0), Bucket(192, 448, 1), Bucket(128, 192, 2), Bucket(0, 128, 3)]
    assert plan_buckets(offsets, size, ready, 4) == [Bucket(0, 512, 3)]   # 25 MiB holds all of it


def test_a_bucket_waits_for_the_latest_of_its_gradients():
    offsets, size = layout(64, 64, 64)
    ready = {"p0": 0, "p1": 2, "p2": 1}      # out of order: the bucket of p1 and p2 is ready after step 2
    assert plan_buckets(offsets, size, ready, 4, cap_bytes=4 * 128) == [Bucket(64, 192, 2), Bucket(0, 64, 0)]
    assert launches_by_step([Bucket(64, 192, 2), Bucket(0, 64, 0)], 3) == [[Bucket(0, 64, 0)], [],
                                                                            [Bucket(64, 192, 2)]]


def test_bad_plans_are_refused():
    offsets, size = layout(64, 64)
    with pytest.raises(ValueError, match=r"no backward step writes the gradients of \['p1'\]"):
        plan_buckets(offsets, size, {"p0": 0}, 4)
    with pytest.raises(ValueError, match="bucket cap must be >= 1 byte"):
        plan_buckets(offsets, size, {"p0": 0, "p1": 0}, 4, cap_bytes=0)


def mlp_trainer(fuse):
    shape = MLPShape(inputs=12, hidden=40)
    return Trainer(build_mlp(shape), *mlp_data(64, shape), 16, CPU, fuse=fuse)


def cnn_trainer(fuse):
    return Trainer(build_cnn(CNN_SMOKE), *cnn_data(32, CNN_SMOKE), 8, CPU, fuse=fuse)


@pytest.mark.parametrize("make,fuse", [(mlp_trainer, True), (mlp_trainer, False), (cnn_trainer, True)])
@pytest.mark.parametrize("cap_bytes", [1, 700, 1 << 25])
def test_every_bucket_is_final_when_its_launch_comes(make, fuse, cap_bytes):
    trainer = make(fuse)
    program, grad = trainer.program, trainer.params.grad
    buckets = plan_buckets(trainer.params.offsets, trainer.params.size, backward_ready_steps(trainer.net, program),
                           grad.dtype.itemsize, cap_bytes)
    launches = launches_by_step(buckets, len(program.backward_nodes))
    covered = np.zeros(grad.size, int)
    for b in buckets:
        covered[b.start:b.stop] += 1
    assert (covered == 1).all(), "the buckets must tile the gradient buffer exactly once"
    seen = {}
    trainer.data.load_batch()
    program.forward()
    grad[...] = np.nan   # a gradient not yet written reads NaN at its launch
    program.loss_and_backward(lambda i: seen.update({b: grad[b.start:b.stop].copy() for b in launches[i]}))
    assert set(seen) == set(buckets)
    for b, at_launch in seen.items():
        np.testing.assert_array_equal(at_launch, grad[b.start:b.stop], err_msg=f"{b} launched before it was final")
    for spec in trainer.params.specs:   # backward overwrote every gradient: the NaNs were not read as-is
        assert np.isfinite(trainer.params.grad_view(spec.name)).all(), spec.name
