"""The engine's memory report: categories that add up, buffers that are really there, and the footprint cuts.

`Trainer.memory_report()` and `ResidentPredictor.memory_report()` are booked
at construction, before any step runs. On the CPU, NumPy reports its
allocations to tracemalloc, so the bytes a construction really allocated are
measured and compared with the report. On a GPU, the CuPy pool after a step
is compared with it (within 5%: the pool rounds and caches allocations).
"""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.memory import CATEGORIES, RESERVE_BYTES, Allocator
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import SEED_SHAPE, SMOKE_SHAPE, build_mlp, mlp_data

from ..layer_harness import run_network

SHAPE = SMOKE_SHAPE   # 32 -> 48 tanh -> 1
F32 = 4


def cpu_config(**changes) -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0).replace(**changes)


def allocated_while(build):
    """(object, bytes NumPy allocated and still holds) for build()."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        return built, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_report_has_every_category_and_they_add_up():
    x, t = mlp_data(512, SHAPE)
    report = Trainer(build_mlp(SHAPE), x, t, 128, cpu_config()).memory_report()
    assert set(report) == set(CATEGORIES) | {"total"}
    assert report["total"] == sum(report[c] for c in CATEGORIES)
    params = -(-SHAPE.inputs * SHAPE.hidden // 64) * 64 + 64 + 64 + 64   # each view padded to 64 elements
    assert report["parameters"] == report["gradients"] == params * F32
    assert report["optimizer"] == 2 * params * F32


@pytest.mark.parametrize("resident,pool,batch", [(True, 2, 8192), (True, 2, 1024), (False, 1, 2048),
                                                 (False, 2, 2048)])
def test_training_report_matches_what_construction_allocated(resident, pool, batch):
    x, t = mlp_data(8192, SHAPE)
    config = cpu_config(resident_data=resident, batch_pool=pool)
    trainer, allocated = allocated_while(lambda: Trainer(build_mlp(SHAPE), x, t, batch, config))
    planned = trainer.memory_report()["total"]
    assert allocated == pytest.approx(planned, rel=0.05), (allocated, trainer.memory_report())


def test_inference_report_matches_what_construction_allocated():
    def build():
        return ResidentPredictor(Predictor(build_mlp(SHAPE), cpu_config()), 8192)
    workspace, allocated = allocated_while(build)
    report = workspace.memory_report()
    assert report["gradients"] == report["optimizer"] == 0          # inference holds no training state
    assert allocated == pytest.approx(report["total"], rel=0.05)


def test_a_steady_step_keeps_nothing_beyond_the_report():
    x, t = mlp_data(4096, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, 4096, cpu_config())
    tracemalloc.start()
    try:
        trainer.warm_up()
        before = tracemalloc.get_traced_memory()[0]
        trainer.run_epochs(3)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 0.01 * trainer.memory_report()["total"]


# -- the footprint cuts ----------------------------------------------------------------

def test_a_full_batch_data_set_is_held_once():
    batch = 1000
    x, t = mlp_data(batch, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, batch, cpu_config())
    assert trainer.data.batch_x is trainer.data.x
    assert trainer.memory_report()["batch"] == batch * (SHAPE.inputs + 1) * F32


def test_a_full_batch_step_equals_the_batch_computed_directly():
    """Skipping the gather of a full batch reorders nothing that matters: same loss and gradients."""
    batch = 96
    net = build_mlp(SHAPE)
    x, t = mlp_data(batch, SHAPE, seed=4)
    trainer = Trainer(net, x, t, batch, cpu_config())
    weights = trainer.params.state_dict()
    with trainer.backend.activate():
        trainer.data.before_launch(0, 1)
        trainer.step()
    direct = run_network(net, x, t, precision="fp32", weights=weights)
    engine_loss = float(trainer.backend.to_host(trainer.state.history)[0])
    assert engine_loss == pytest.approx(direct["loss"], rel=1e-6)
    for name, grad in trainer.params.grads_dict().items():
        np.testing.assert_allclose(grad, direct[f"grad:{name}"], rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("pool,copies", [(1, 1), (2, 2)])
def test_streamed_batch_copies_on_the_device_are_the_pool(pool, copies):
    batch = 256
    x, t = mlp_data(4 * batch, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, batch, cpu_config(resident_data=False, batch_pool=pool))
    assert trainer.memory_report()["batch"] == copies * batch * (SHAPE.inputs + 1) * F32


def test_the_fused_head_writes_its_gradient_over_the_hidden_activations():
    batch = 512
    x, t = mlp_data(batch, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, batch, cpu_config())
    assert trainer.program.fused
    assert trainer.memory_report()["activations"] == batch * SHAPE.hidden * F32    # z, with dz written over it


def test_in_tf32_the_fused_head_takes_z_batch_innermost_and_a_full_batch_is_copied_so_once():
    batch = 512
    x, t = mlp_data(batch, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, batch, cpu_config(precision="tf32"))
    assert trainer.program.loss.batch_innermost
    assert trainer.memory_report()["activations"] == batch * SHAPE.hidden * F32   # z (H, B) with dz written over it
    assert trainer.data._batch_innermost.shape == (SHAPE.inputs, batch)   # x's copy: the data's, made once


def test_in_tf32_the_gather_writes_the_batch_innermost_copy_the_dense_reads():
    batch = 512
    x, t = mlp_data(4 * batch, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, batch, cpu_config(precision="tf32"))
    report = trainer.memory_report()
    assert report["activations"] == batch * SHAPE.hidden * F32   # z with dz over it; x's copy is the data's
    assert trainer.data._gather.out_xt.shape == (SHAPE.inputs, batch)
    trainer.train(1)
    first = trainer.program.layers[trainer.program.nodes[0].name]
    assert first._x_copy is None


@pytest.mark.parametrize("samples,resident", [(512, True), (2048, True), (2048, False)],
                         ids=["full-batch", "gathered", "streamed"])
def test_in_tf32_no_second_x_where_the_device_has_no_room_for_it(samples, resident, monkeypatch):
    batch = 512
    x, t = mlp_data(samples, SHAPE)
    config = cpu_config(precision="tf32", resident_data=resident)
    roomy = Trainer(build_mlp(SHAPE), x, t, batch, config)
    monkeypatch.setattr(Backend, "memory_room", lambda self: 0)
    tight = Trainer(build_mlp(SHAPE), x, t, batch, config)
    first = tight.program.layers[tight.program.nodes[0].name]
    assert tight.program.loss.batch_innermost and first._x_copy is None and tight.data.batch_innermost_input() is None
    assert roomy.memory_report()["total"] - tight.memory_report()["total"] == batch * SHAPE.inputs * F32
    np.testing.assert_allclose(tight.train(2), roomy.train(2), rtol=1e-6)   # dW reads x as it is: the same step


def test_an_optional_buffer_fits_where_it_leaves_room_for_what_is_booked_and_the_reserve(monkeypatch):
    allocator = Allocator(Backend("cpu"))
    assert allocator.fits(1 << 50)   # the NumPy backend knows no limit
    monkeypatch.setattr(Backend, "memory_room", lambda self: RESERVE_BYTES + 1000)
    assert allocator.fits(1000) and not allocator.fits(1001)
    allocator.book(10, "workspace")   # a library's, allocated at its first run
    assert allocator.fits(990) and not allocator.fits(991)


# -- on a GPU: the CuPy pool after a step against the report ---------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device): GPU-only test")
@pytest.mark.parametrize("mode,resident,pool", [("train", True, 2), ("train", False, 1), ("train", False, 2),
                                                ("infer", True, 2)])
def test_pool_after_a_step_matches_the_report_within_5_percent(mode, resident, pool):
    import cupy
    batch = 65536
    config = EngineConfig(precision="tf32", cuda_graph=1, resident_data=resident, batch_pool=pool, device="cuda")
    memory_pool = cupy.get_default_memory_pool()
    gc.collect()   # an earlier case's engine objects, once collected, would hand their blocks to this one
    memory_pool.free_all_blocks()
    before = memory_pool.total_bytes()
    x, t = mlp_data(batch, SEED_SHAPE)
    if mode == "train":
        runner = Trainer(build_mlp(SEED_SHAPE), x, t, batch, config)
        report = runner.memory_report()
        runner.warm_up()
    else:
        runner = ResidentPredictor(Predictor(build_mlp(SEED_SHAPE), config), batch)
        report = runner.memory_report()
        runner.load(x)
        runner.run()
    runner.synchronize()
    measured = memory_pool.total_bytes() - before
    assert measured == pytest.approx(report["total"], rel=0.05), (measured, report)
