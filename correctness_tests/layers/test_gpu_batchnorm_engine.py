"""On a GPU: the engine's own batch-norm kernels (`batchnorm=engine`, ops/batchnorm.py) against the NumPy backend.

The NumPy BatchNorm is checked against finite differences and PyTorch on the
CPU (test_resnet_gradients.py, test_resnet_torch_parity.py); these tests
carry that trust to the engine's kernels: every fused variant in every
precision, one row chunk and many (the last-ticket ending and, on sm_90, the
cluster's), channel counts with and without a bit mask, a mean far from zero,
the same bits on every run, whole reduced ResNet steps, captured replay and
steady-state memory.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import BatchNorm2D
from gpuengine.layers.merge import GradientSum
from gpuengine.ops import autotune, batchnorm as ops_batchnorm
from gpuengine.runtime.backend import gpu_visible
from gpuengine.runtime.kernels import compute_capability, max_active_clusters, multiprocessor_count
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet, zoo

from ..gpu_checks import assert_close, assert_steady_state_allocates_nothing, losses_by_graph_group
from ..layer_harness import make_context, run_layer, run_network
from ..workloads.test_gpu_zoo import reduced_batch
from ..workloads.test_gpu_resnet import (BN_CASES, BN_TOLERANCE, PRECISIONS, assert_step_close, bn_weights, numeric,
                                         smoke_batch, smoke_weights)
from .test_gpu_conv import normal, representable

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

# (batch, sample shape): one row chunk (32 rows, 64 column tiles), tens and a hundred chunks (the tiles'
# barriers; on sm_90 the plan takes clusters where their rows fit the registers), 12 channels (no mask: the
# gradient from y), 8 channels in 360 values (the mask's last word one byte), 24 channels (three packs of 8 in a
# tile of four: an idle column) in 5 chunks
SHAPES = {"1x1x2048": (32, (1, 1, 2048)), "8x8x64": (32, (8, 8, 64)), "16x16x64": (32, (16, 16, 64)),
          "4x4x256": (32, (4, 4, 256)), "5x4x12": (5, (4, 4, 12)), "3x5x8": (3, (3, 5, 8)),
          "7x7x24": (8, (7, 7, 24))}


@pytest.fixture
def default_plan(monkeypatch):
    """The plan of TILE_CHOICES' first bounds alone, for the tests of what that plan takes (clusters, trips): the
    plan a layer's timing keeps may be another."""
    monkeypatch.setattr(ops_batchnorm, "FORCED_TILES", ops_batchnorm.TILE_CHOICES[0])


def _engine_and_numpy(case: str, precision: str, batch: int, shape: tuple, offset: float = 0.5):
    x = representable(normal(1, (batch,) + shape, precision) * 2.0 + offset, precision)   # both start equal
    inputs = (x, normal(2, (batch,) + shape, precision)) if BN_CASES[case].get("residual") else x
    dy = normal(4, (batch,) + shape, precision)
    # ReLU6 clipped at 6 (gamma 3) where rounding cannot move a value across 6; bf16 keeps clear of 6 (gamma 0.5)
    clips = "relu6" in case and precision != "bf16"
    weights = bn_weights(shape[2], precision, gain=3.0 if clips else 0.5 if "relu6" in case else 1.0)
    cpu = run_layer(BatchNorm2D(name="bn", **BN_CASES[case]), inputs, dy, precision="fp32", weights=weights)
    layer = BatchNorm2D(name="bn", **BN_CASES[case])
    gpu = run_layer(layer, inputs, dy, device="cuda", precision=precision, weights=weights, batchnorm="engine")
    return gpu, cpu, layer, clips


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", BN_CASES, ids=list(BN_CASES))
@pytest.mark.parametrize("size", SHAPES)
def test_engine_batchnorm_matches_numpy(case, precision, size):
    """y, dx (and the residual's gradient), dgamma, dbeta and the updated running statistics."""
    batch, shape = SHAPES[size]
    gpu, cpu, layer, clips = _engine_and_numpy(case, precision, batch, shape)
    assert layer._fwd_graph.__class__.__name__ == "BatchNormForward" and layer._tail is None
    assert (layer.mask is not None) == (layer.activation is not None and shape[2] % 8 == 0)
    # bf16 + residual: the sum near 0 of two bf16 values may take the other sign than the float reference's
    tolerance = 5e-2 if case == "add-relu6" and precision == "bf16" else BN_TOLERANCE[precision]
    assert_close(gpu, cpu, tolerance)
    assert not clips or batch * np.prod(shape) < 2048 or (cpu["y"] == 6.0).mean() > 0.01   # few values: few clip


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_batchnorm_keeps_the_variance_of_a_far_mean(precision):
    """x = 100 + 2 N(0, 1): sums of x - x[0] keep the variance that sums of x and x^2 in float32 would lose."""
    gpu, cpu, _, _ = _engine_and_numpy("relu", precision, 32, (16, 16, 64), offset=100.0)
    assert_close(gpu, cpu, BN_TOLERANCE[precision] if precision == "fp32" else 5e-2)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_batchnorm_gives_the_same_bits_every_run(precision, monkeypatch):
    """A hundred row chunks finished by whichever block draws the last ticket: the sums' order is fixed."""
    monkeypatch.setattr(ops_batchnorm, "ON_CHIP_CHUNKS", ())   # the ticket's ending, whatever the GPU
    runs = [_engine_and_numpy("add-relu", precision, 64, (16, 16, 64))[0] for _ in range(3)]
    for other in runs[1:]:
        for key, value in runs[0].items():
            np.testing.assert_array_equal(other[key], value, err_msg=key)


@pytest.mark.usefixtures("default_plan")
@pytest.mark.parametrize("case", ["add-relu", "relu"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_trips_kept_in_registers_change_no_bit(precision, case, monkeypatch):
    """Kept trips (CACHE: up to 8 forward, 4 backward) against one kept trip: the same sums in the same order and
    the same output and gradient of every value, bit for bit; 8 trips a thread at 16x16x64 and batch 32."""
    monkeypatch.setattr(ops_batchnorm, "ON_CHIP_CHUNKS", ())   # an on-chip plan keeps every trip whatever CACHE
    kept = _engine_and_numpy(case, precision, 32, (16, 16, 64))
    layer = kept[2]
    assert layer._fwd_graph.sums.defines["CACHE"] > 1 and layer._bwd_graph.sums.defines["CACHE"] > 1
    monkeypatch.setattr(ops_batchnorm, "FORWARD_CACHE_BYTES", 1)
    monkeypatch.setattr(ops_batchnorm, "BACKWARD_CACHE_BYTES", 1)
    one = _engine_and_numpy(case, precision, 32, (16, 16, 64))
    assert one[2]._fwd_graph.sums.defines["CACHE"] == one[2]._bwd_graph.sums.defines["CACHE"] == 1
    for key, value in kept[0].items():
        np.testing.assert_array_equal(one[0][key], value, err_msg=key)


# (batch, sample shape) whose batch norms take a cluster both ways in every precision on an sm_90 GPU (1 or 2 trips
# a thread, 2 being the fewest a backward keeps): 8 packs, 32 packs (clusters of 4 where 32 of 8 exceed an H200's
# 30 at once), 12 channels a lane each (no mask), 3 packs in a tile of one
CLUSTER_SHAPES = {"8x8x64": (32, (8, 8, 64)), "4x4x256": (128, (4, 4, 256)), "4x4x12": (128, (4, 4, 12)),
                  "7x7x24": (64, (7, 7, 24))}
needs_clusters = pytest.mark.skipif(gpu_visible() and compute_capability() < 90,
                                    reason="thread-block clusters need sm_90 (Hopper) or newer")


def _clusters(layer) -> tuple[int, int]:
    return layer._fwd_graph.sums.defines["CLUSTER"], layer._bwd_graph.sums.defines["CLUSTER"]


@needs_clusters
@pytest.mark.usefixtures("default_plan")
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", ["add-relu", "relu6", "plain"])
@pytest.mark.parametrize("size", CLUSTER_SHAPES)
def test_cluster_and_ticket_endings_both_match_numpy(size, case, precision, monkeypatch):
    """The cluster's sums (every block adds all blocks' totals in rank order) and, for the same map, the ticket's
    ending (no ON_CHIP_CHUNKS), whose sums run in another order, each against NumPy."""
    batch, shape = CLUSTER_SHAPES[size]
    gpu, cpu, layer, _ = _engine_and_numpy(case, precision, batch, shape)
    assert min(_clusters(layer)) > 1, _clusters(layer)
    assert_close(gpu, cpu, BN_TOLERANCE[precision])
    monkeypatch.setattr(ops_batchnorm, "ON_CHIP_CHUNKS", ())
    ticket, cpu, ticket_layer, _ = _engine_and_numpy(case, precision, batch, shape)
    assert _clusters(ticket_layer) == (1, 1) and ticket_layer._fwd_graph.sums.plan.chunks > 1
    assert_close(ticket, cpu, BN_TOLERANCE[precision])


@needs_clusters
@pytest.mark.usefixtures("default_plan")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("size,batch,shape", [(2, 32, (4, 4, 256)), (4, 16, (7, 7, 256))], ids=["two", "four"])
def test_clusters_of_two_and_four_match_numpy(size, batch, shape, precision):
    """Maps whose fewest trips come with clusters smaller than 8 on 132 SMs (an H100 SXM's, an H200's)."""
    if multiprocessor_count() != 132:
        pytest.skip(f"the plan's clusters of {size} are worked out for 132 SMs, not {multiprocessor_count()}")
    gpu, cpu, layer, _ = _engine_and_numpy("add-relu", precision, batch, shape)
    assert _clusters(layer) == (size, size)
    assert_close(gpu, cpu, BN_TOLERANCE[precision])


@needs_clusters
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("bounds", ops_batchnorm.TILE_CHOICES, ids=str)
@pytest.mark.parametrize("size", ["4x4x256", "1x1x2048", "8x8x64"])
def test_every_plan_a_layer_may_keep_matches_numpy(size, bounds, precision, monkeypatch):
    """Each of the plans the first run times (TILE_CHOICES' tile bounds), built alone, against NumPy."""
    monkeypatch.setattr(ops_batchnorm, "FORCED_TILES", bounds)
    batch, shape = SHAPES[size]
    gpu, cpu, layer, _ = _engine_and_numpy("add-relu", precision, batch, shape)
    assert len(layer._fwd_graph._timed.plans) == len(layer._bwd_graph._timed.plans) == 1
    assert_close(gpu, cpu, BN_TOLERANCE[precision])


@needs_clusters
def test_a_layer_times_its_plans_keeps_one_and_updates_its_statistics_once(monkeypatch):
    """The timing launches the forward many times; the running statistics are put back before the step's own run
    (run_layer compares them with NumPy's after one step)."""
    choices = autotune.PlanChoices()   # nothing chosen yet: this layer times its plans
    monkeypatch.setattr(autotune, "PLAN_CHOICES", choices)
    gpu, cpu, layer, _ = _engine_and_numpy("add-relu", "bf16", 128, (4, 4, 256))
    for graph, direction in ((layer._fwd_graph, "forward"), (layer._bwd_graph, "backward")):
        assert len(graph._timed.plans) > 1 and graph._timed.ways.chosen in graph._timed.plans
        assert any(key.startswith(f"('bn_{direction}_choice'") for key in choices.tuned), choices.tuned
    assert_close(gpu, cpu, BN_TOLERANCE["bf16"])


@needs_clusters
@pytest.mark.parametrize("shape", [(8, 8, 256), (4, 4, 512), (4, 4, 256), (2, 2, 1024)], ids=str)
def test_no_cluster_grid_outnumbers_the_clusters_the_device_runs_at_once(shape):
    """ResNet-50 CIFAR's widest maps at batch 128 in bf16, whose fewest trips come with 256 blocks: their clusters
    within the kernel's ceiling (32 clusters of 8 ran in two waves on an H200, twice the time), matching NumPy."""
    gpu, cpu, layer, _ = _engine_and_numpy("add-relu", "bf16", 128, shape)
    for graph in (layer._fwd_graph, layer._bwd_graph):
        sums, plan = graph.sums, graph.sums.plan
        if sums.defines["CLUSTER"] > 1:
            most = max_active_clusters(sums.kernel, (plan.tiles, plan.chunks), plan.threads,
                                       plan.shared_bytes(sums.sums))
            assert plan.tiles <= most, (shape, sums.defines["CLUSTER"], plan.tiles, most)
    assert_close(gpu, cpu, BN_TOLERANCE["bf16"])


@needs_clusters
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cluster_ending_gives_the_same_bits_every_run(precision):
    runs = [_engine_and_numpy("add-relu", precision, 32, (8, 8, 64)) for _ in range(3)]
    assert all(min(_clusters(layer)) == 8 for _, _, layer, _ in runs)
    for other in runs[1:]:
        for key, value in runs[0][0].items():
            np.testing.assert_array_equal(other[0][key], value, err_msg=key)


@needs_clusters
def test_cluster_kernels_replay_exactly_like_eager():
    """The reduced ResNet at batch 256 in bf16: its 4x4 and 2x2 maps take clusters of 8 both ways."""
    x, t = smoke_batch(batch=2048)
    trainer = Trainer(resnet.build_resnet(resnet.SMOKE_SHAPE), x[:256], t[:256], 256,
                      EngineConfig(precision="bf16", batchnorm="engine"))
    bns = [layer for layer in trainer.program.layers.values() if isinstance(layer, BatchNorm2D)]
    assert sum(min(_clusters(bn)) > 1 for bn in bns) >= 8, [_clusters(bn) for bn in bns]
    losses = losses_by_graph_group(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 256, "bf16", (0, 8), 3,
                                   batchnorm="engine")
    assert losses[0] == losses[8]
    assert losses[0][-1] < losses[0][0]


@needs_clusters
@pytest.mark.usefixtures("default_plan")
@pytest.mark.parametrize("ending", ["cluster", "ticket"])
@pytest.mark.parametrize("case", ["add-relu", "relu6", "plain"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_plan_launched_early_gives_the_bits_of_its_plain_launch(precision, case, ending, monkeypatch):
    """LAUNCH_EARLY: the kernels start while the one before them ends, and ask L2 for their old inputs before
    they wait; they read nothing before the wait, so every output and gradient is the plain launch's, bit for bit.
    ReLU6 at 12 channels: no mask (the gradient from y); the tiles' chunks meet in clusters or by ticket."""
    if ending == "ticket":
        monkeypatch.setattr(ops_batchnorm, "ON_CHIP_CHUNKS", ())
    batch, shape = CLUSTER_SHAPES["4x4x12" if case == "relu6" else "8x8x64"]
    monkeypatch.setattr(ops_batchnorm, "LAUNCH_EARLY", False)
    plain = _engine_and_numpy(case, precision, batch, shape)
    monkeypatch.setattr(ops_batchnorm, "LAUNCH_EARLY", True)
    early = _engine_and_numpy(case, precision, batch, shape)
    for graph in (early[2]._fwd_graph, early[2]._bwd_graph):
        assert graph.sums.early and graph.sums.defines["EARLY"] == 1
    for graph in (plain[2]._fwd_graph, plain[2]._bwd_graph):
        assert not graph.sums.early and graph.sums.defines["EARLY"] == 0
    assert _clusters(early[2]) == _clusters(plain[2])
    if ending == "cluster":
        assert min(_clusters(plain[2])) > 1, _clusters(plain[2])
    else:
        assert _clusters(plain[2]) == (1, 1) and plain[2]._fwd_graph.sums.plan.chunks > 1
    for key, value in plain[0].items():
        np.testing.assert_array_equal(early[0][key], value, err_msg=key)


@needs_clusters
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_kernels_launched_early_replay_exactly_like_eager(precision, monkeypatch):
    """The reduced ResNet with every batch norm launched early: in a captured graph the launches become
    programmatic edges, and replay trains with the eager run's bits."""
    monkeypatch.setattr(ops_batchnorm, "LAUNCH_EARLY", True)
    x, t = smoke_batch(batch=256)
    losses = losses_by_graph_group(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, precision, (0, 8), 3,
                                   batchnorm="engine")
    assert losses[0] == losses[8]
    assert losses[0][-1] < losses[0][0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_batchnorm_adds_its_output_gradients_as_their_sum_would(precision):
    """A block end's output is read by the next block's branch and shortcut: its kernel adds dy's two parts as it
    loads them, rounded as add2 rounds them, so dx, the residual's gradient, dgamma and dbeta are the bits of
    GradientSum's add2 followed by the kernel on the sum."""
    batch, shape = 32, (16, 16, 64)
    x, res, dy1, dy2 = (representable(normal(seed, (batch,) + shape, precision), precision) for seed in (5, 6, 7, 8))
    results = []
    for reads_parts in (True, False):
        layer = BatchNorm2D(name="bn", activation="relu", residual=True)
        ctx = make_context("cuda", precision, batch, layer.param_specs(shape, shape), bn_weights(shape[2], precision),
                           layer.buffer_specs(shape, shape), batchnorm="engine")
        xp, dtype = ctx.backend.xp, ctx.policy.compute_dtype
        with ctx.backend.activate():
            layer.build_forward(ctx, xp.asarray(x.astype(dtype)), xp.asarray(res.astype(dtype)))
            summed = GradientSum(ctx, [xp.asarray(dy1.astype(dtype)), xp.asarray(dy2.astype(dtype))])
            layer.gradient_sum = summed if reads_parts else None
            dx, d_res = layer.build_backward(ctx, summed.out, (True, True))
            assert summed.summed_by_reader == reads_parts
            layer.forward()
            summed.run()
            layer.backward()
            ctx.backend.synchronize()
            results.append([a.get() for a in (dx, d_res, layer.dgamma, layer.dbeta)])
    for name, fused, unfused in zip(("dx", "residual", "dgamma", "dbeta"), *results):
        np.testing.assert_array_equal(fused, unfused, err_msg=name)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-block-end", "unfused-block-end"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_reduced_resnet_step_with_engine_batchnorm_matches_numpy(precision, fused):
    """Loss, every parameter gradient and every running statistic of one step of the reduced ResNet."""
    x, t = smoke_batch()
    weights = smoke_weights(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=fused), precision)
    cpu = run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=fused), x, t, precision="fp32", weights=weights)
    gpu = run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=fused), x, t, device="cuda",
                      precision=precision, weights=weights, batchnorm="engine")
    assert_step_close(numeric(gpu), numeric(cpu), precision, 1e-3)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_engine_batchnorm_replay_trains_exactly_like_eager(precision):
    x, t = smoke_batch(batch=256)
    losses = losses_by_graph_group(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, precision, (0, 1, 8), 3,
                                   batchnorm="engine")
    assert losses[0] == losses[1] == losses[8]
    assert losses[0][-1] < losses[0][0]


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_mobilenet_v2_with_engine_batchnorm_replays_exactly_like_eager(precision):
    """ReLU6 after batch norm 35 times (8-channel multiples: each keeps a mask), dropout on, no cuDNN graph."""
    net = zoo.zoo_net("mobilenet_v2")
    trainer = Trainer(net.network(reduced=True), *reduced_batch("mobilenet_v2", batch=64), 16,
                      EngineConfig(precision=precision, batchnorm="engine"))
    bns = [layer for layer in trainer.program.layers.values() if isinstance(layer, BatchNorm2D)]
    assert bns and all(bn._engine and bn._tail is None and (bn.mask is not None) == bool(bn.activation) for bn in bns)
    x, t = reduced_batch("mobilenet_v2", batch=128)
    losses = losses_by_graph_group(net.network(reduced=True), x, t, 16, precision, (0, 8), 6, batchnorm="engine")
    assert losses[0] == losses[8]
    assert losses[0][-1] < losses[0][0]


def test_engine_batchnorm_steady_state_allocates_nothing():
    x, t = smoke_batch(batch=128)
    configs = [EngineConfig(precision=p, cuda_graph=g, batchnorm="engine") for p in ("tf32", "bf16") for g in (0, 8)]
    assert_steady_state_allocates_nothing(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, configs)


@pytest.mark.parametrize("precision, most_rows", [("bf16", 512), ("tf32", 128)])
def test_auto_trains_small_maps_on_the_engine_and_replays_exactly_like_eager(precision, most_rows, monkeypatch):
    """batchnorm=auto on the reduced ResNet at batch 32 (maps of 2,048, 512 and 128 rows): the layers of at most
    `most_rows` rows train on the engine's kernels and the rest on cuDNN's graphs, in one network; its captured
    replay trains exactly like eager, and the loss goes down."""
    from gpuengine.layers import batchnorm as layers_batchnorm
    monkeypatch.setitem(layers_batchnorm.AUTO_ENGINE, precision, (most_rows, 1 << 30))
    x, t = smoke_batch(batch=256)
    trainer = Trainer(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32,
                      EngineConfig(precision=precision, batchnorm="auto"))
    bns = [layer for layer in trainer.program.layers.values() if isinstance(layer, BatchNorm2D)]
    engine = {bn.name for bn in bns if bn._engine}
    assert engine == {bn.name for bn in bns if bn.x.size // bn.x.shape[3] <= most_rows}
    assert 0 < len(engine) < len(bns)
    losses = losses_by_graph_group(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, precision, (0, 8), 3,
                                   batchnorm="auto")
    assert losses[0] == losses[8]
    assert losses[0][-1] < losses[0][0]
