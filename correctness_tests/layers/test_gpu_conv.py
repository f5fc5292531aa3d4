"""On a GPU: the CNN ops and whole CNN runs agree with the NumPy backend.

The NumPy CNN ops are checked against finite differences and PyTorch on the
CPU (test_conv_gradients.py, test_cnn_torch_parity.py); these tests carry that
trust to the cuDNN graphs (conv forward with fused bias/ReLU, data and weight
gradients), the ColumnSum bias gradient and its fusion with an activation's
gradient, the pooling and softmax cross-entropy kernels, and to captured
training steps. bf16 cases feed both sides
bf16-representable inputs, so a max pool sees the same ties on both.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.layers import Conv2D, MaxPool2D, ReLU
from gpuengine.losses import SoftmaxCrossEntropy
from gpuengine.ops.conv_pool import ConvPoolForward
from gpuengine.ops.reductions import ColumnSum
from gpuengine.runtime.backend import Backend, bfloat16_dtype, gpu_visible
from gpuengine.runtime.memory import Allocator
from gpuengine.trainer import Trainer
from gpuengine.workloads.cnn import CNNShape, build_cnn, cnn_data

from ..gpu_checks import (TOLERANCE, assert_close, assert_steady_state_allocates_nothing, losses_by_graph_group,
    rel_err)
from ..gradient_check import random_weights
from ..layer_harness import make_context, run_layer, run_loss

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

PRECISIONS = ["fp32", "tf32", "bf16"]


def representable(a: np.ndarray, precision: str) -> np.ndarray:
    """`a` rounded to bf16 under bf16, so both backends start from the same values."""
    return a.astype(bfloat16_dtype()).astype(np.float64) if precision == "bf16" else a


def normal(seed: int, shape, precision: str, scale: float = 1.0) -> np.ndarray:
    return representable(np.random.default_rng(seed).standard_normal(shape) * scale, precision)


def conv_on_both(case: tuple, precision: str, seed: int = 1, needs_input_grad: bool = True):
    """(GPU layer, GPU results, NumPy fp32 results) of Conv2D(**kwargs) for case (batch, (H, W, C), kwargs) on the
    same random input, output gradient and weights (rounded to bf16 under bf16, so both start equal)."""
    batch, shape, kwargs = case
    layer = Conv2D(name="conv", **kwargs)
    x = normal(seed, (batch,) + shape, precision)
    dy = normal(seed + 1, (batch,) + layer.output_shape(shape), precision)
    weights = {k: representable(v, precision) for k, v in
               random_weights(layer.param_specs(shape), np.random.default_rng(seed + 2), 0.2).items()}
    cpu = run_layer(Conv2D(name="conv", **kwargs), x, dy, precision="fp32", weights=weights,
                    needs_input_grad=needs_input_grad)
    gpu = run_layer(layer, x, dy, device="cuda", precision=precision, weights=weights,
                    needs_input_grad=needs_input_grad)
    return layer, gpu, cpu


# (batch, input (H, W, C), Conv2D arguments). The fused ReLU is compared in fp32 only: under TF32 or
# bf16 a few pre-activations near 0 change sign, and each moves a whole dy term in or out of the sums.
CONV_CASES = {
    "mnist": (128, (28, 28, 1), dict(filters=16)),
    "same-stride2-asymmetric": (16, (16, 16, 8), dict(filters=24, stride=2)),
    "explicit-stride2": (16, (15, 15, 8), dict(filters=16, padding=1, stride=2)),
    "valid-no-bias": (8, (9, 9, 16), dict(filters=32, padding="valid", use_bias=False)),
    "1x1-stride2": (16, (8, 8, 32), dict(filters=64, kernel_size=1, stride=2, padding=0)),
    "3x3-on-2x2": (32, (2, 2, 64), dict(filters=64, padding="same")),
    "mnist-fused-relu": (128, (28, 28, 1), dict(filters=16, activation="relu")),
}
CONV_RUNS = [(case, p) for case, (_, _, kwargs) in CONV_CASES.items()
             for p in (["fp32"] if kwargs.get("activation") else PRECISIONS)]


@pytest.mark.parametrize("case,precision", CONV_RUNS, ids=[f"{c}-{p}" for c, p in CONV_RUNS])
def test_conv_matches_numpy(case, precision):
    """Forward (fused bias/ReLU), dgrad, wgrad and the ColumnSum bias gradient, against im2col."""
    _, gpu, cpu = conv_on_both(CONV_CASES[case], precision)
    assert_close(gpu, cpu, TOLERANCE[precision])


# First layers (no input gradient) with few taps take the fused direct weight-gradient kernel.
FIRST_LAYER_CASES = {
    "mnist": CONV_CASES["mnist"],
    "mnist-fused-relu": CONV_CASES["mnist-fused-relu"],
    "rgb-stride2-no-bias": (64, (32, 32, 3), dict(filters=32, stride=2, use_bias=False)),
    "5x5-valid": (32, (28, 28, 1), dict(filters=8, kernel_size=5, padding="valid")),
    "one-chunk": (2, (4, 4, 1), dict(filters=8)),   # 32 pixels, one chunk: 31 lanes of each summing warp idle
}
FIRST_LAYER_RUNS = [("mnist", p) for p in PRECISIONS] + [(c, "fp32") for c in list(FIRST_LAYER_CASES)[1:]]


@pytest.mark.parametrize("case,precision", FIRST_LAYER_RUNS, ids=[f"{c}-{p}" for c, p in FIRST_LAYER_RUNS])
def test_first_layer_weight_gradients_match_numpy(case, precision):
    layer, gpu, cpu = conv_on_both(FIRST_LAYER_CASES[case], precision, seed=11, needs_input_grad=False)
    assert layer._direct is not None
    assert_close(gpu, cpu, TOLERANCE[precision])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fused_conv_bias_relu_equals_conv_then_relu_layer(precision):
    shape, batch = (28, 28, 1), 64
    x = normal(4, (batch,) + shape, precision)
    weights = {k: representable(v, precision) for k, v in
               random_weights(Conv2D(16, name="conv").param_specs(shape), np.random.default_rng(5), 0.5).items()}
    fused = run_layer(Conv2D(16, activation="relu", name="conv"), x, np.zeros((batch, 28, 28, 16)),
                      device="cuda", precision=precision, weights=weights)
    conv = run_layer(Conv2D(16, name="conv"), x, np.zeros((batch, 28, 28, 16)), device="cuda",
                     precision=precision, weights=weights)
    relu = run_layer(ReLU("relu"), conv["y"], np.zeros((batch, 28, 28, 16)), device="cuda", precision=precision)
    assert rel_err(fused["y"], relu["y"]) < TOLERANCE[precision]


POOL_CASES = {
    "2x2": (dict(), (28, 28, 16)),
    "3x3-stride2-pad1": (dict(pool_size=3, stride=2, padding=1), (16, 16, 8)),
    "2x2-odd-map": (dict(pool_size=2), (7, 9, 3)),
    "3x3-stride2-same": (dict(pool_size=3, stride=2, padding="same"), (8, 8, 64)),
    "2x2-six-channels": (dict(), (10, 10, 6)),   # two channels a thread
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", POOL_CASES, ids=list(POOL_CASES))
def test_maxpool_matches_numpy(case, precision):
    kwargs, shape = POOL_CASES[case]
    layer = MaxPool2D(name="pool", **kwargs)
    x = normal(6, (32,) + shape, precision)
    dy = normal(7, (32,) + layer.output_shape(shape), precision)
    cpu = run_layer(MaxPool2D(name="pool", **kwargs), x, dy, precision="fp32")
    gpu = run_layer(MaxPool2D(name="pool", **kwargs), x, dy, device="cuda", precision=precision)
    assert_close(gpu, cpu, TOLERANCE[precision] if precision == "bf16" else 1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("rows,classes", [(128, 10), (1024, 10), (33, 1000), (5000, 3), (16, 1000), (3, 300)])
def test_softmax_cross_entropy_matches_numpy(rows, classes, precision):
    z = normal(8, (rows, classes), precision, scale=4.0)
    t = np.eye(classes)[np.random.default_rng(9).integers(0, classes, rows)]
    cpu = run_loss(SoftmaxCrossEntropy(), z, t, precision="fp32")
    gpu = run_loss(SoftmaxCrossEntropy(), z, t, device="cuda", precision=precision)
    assert_close(gpu, cpu, TOLERANCE[precision] if precision == "bf16" else 1e-5)


@pytest.mark.parametrize("rows,cols", [(128 * 784, 16), (1024 * 784, 16), (777, 10), (64, 2048), (3, 300)])
def test_column_sum_of_tall_and_wide_gradients(rows, cols):
    import cupy
    dy = np.random.default_rng(10).standard_normal((rows, cols)).astype(np.float32)
    backend = Backend("cuda")
    with backend.activate():
        db = cupy.zeros((cols,), np.float32)
        ColumnSum(backend, Allocator(backend), cupy.asarray(dy), db).run()
    assert rel_err(backend.to_host(db), dy.astype(np.float64).sum(axis=0)) < 1e-4


# (rows, cols, rows_per_chunk): the Transformer's and the CNN's bias gradients, partial tiles and chunks, and tiny
# sums (one chunk: no ticket) forced into several chunks, one row each or fewer rows than row lanes.
COLUMN_SUM_CASES = [(2048, 512, None), (2048, 2048, None), (100352, 16, None), (999, 300, None), (5, 3, None),
                    (37, 1, None), (5, 3, 1), (37, 1, 4), (999, 300, 100)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("rows,cols,rows_per_chunk", COLUMN_SUM_CASES)
def test_column_sum_is_deterministic_and_resets_its_tickets(rows, cols, rows_per_chunk, precision):
    """Two eager runs, then a CUDA graph of two runs replayed twice: every one within fp32 rounding of the float64
    sum and bit-identical to the first (a fixed order whichever block ends last), the tile counters back at zero."""
    from gpuengine.runtime.capture import GraphCapturedStep
    dy = normal(20, (rows, cols), precision)
    backend = Backend("cuda")
    allocator = Allocator(backend)
    src = allocator.zeros((rows, cols), np.float32 if precision == "fp32" else bfloat16_dtype(), "activations")
    db = allocator.zeros((cols,), np.float32, "gradients")
    backend.upload(src, dy)
    op = ColumnSum(backend, allocator, src, db, rows_per_chunk)
    if rows_per_chunk is not None:
        assert op.plan.chunks > 1, op.plan

    def sums(run) -> np.ndarray:
        with backend.activate():
            db.fill(np.nan)   # each run must write every column
        run()
        backend.synchronize()
        assert not backend.to_host(op.counters).any(), "a tile counter was left non-zero"
        return backend.to_host(db)

    with backend.activate():
        results = [sums(op.run), sums(op.run)]
    graph = GraphCapturedStep(backend, op.run, 2, {"src": src, "db": db})
    graph.capture()
    results += [sums(graph.launch), sums(graph.launch)]
    assert rel_err(results[0], dy.astype(np.float64).sum(axis=0)) < 1e-5, op.plan
    for again in results[1:]:
        np.testing.assert_array_equal(again, results[0])


# (rows, cols): a VGG-like conv gradient, the CNN's 16 channels, partial tiles, one chunk (column tiles); the
# Transformer's feed-forward at seq 384, rows not filling the last block, a block alone (whole rows).
BACKWARD_SUM_CASES = [(16 * 56 * 56, 64), (100352, 16), (999, 300), (5, 3), (6144, 1024), (777, 512), (3, 256)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["relu", "relu6", "tanh"])
@pytest.mark.parametrize("rows,cols", BACKWARD_SUM_CASES)
def test_backward_column_sum_writes_the_activation_gradient_and_sums_it(rows, cols, kind, precision):
    """dz bit-identical to activation_backward's; the bias gradient within fp32 rounding of the float64 sum of dz as
    stored; an eager run and two replays of a captured one bit-identical, the tile counters back at zero."""
    from gpuengine.layers.activations import BackwardColumnSum, activation_backward
    from gpuengine.runtime.capture import GraphCapturedStep
    backend = Backend("cuda")
    allocator = Allocator(backend)
    dtype = np.float32 if precision == "fp32" else bfloat16_dtype()
    y, dy, dz, expected_dz = (allocator.zeros((rows, cols), dtype, "activations") for _ in range(4))
    db = allocator.zeros((cols,), np.float32, "gradients")
    bound = 1 if kind == "tanh" else 8   # tanh's outputs lie in (-1, 1); ReLU6's reach past both clip points
    backend.upload(y, normal(21, (rows, cols), precision, scale=4.0).clip(-bound, bound))
    backend.upload(dy, normal(22, (rows, cols), precision))
    op = BackwardColumnSum(backend, allocator, kind, y, dy, dz, db)
    with backend.activate():
        activation_backward(backend, kind, y, dy, expected_dz)

    def run_once(run):
        backend.upload(dz, np.full((rows, cols), np.nan))   # each run must write every value and column
        with backend.activate():
            db.fill(np.nan)
        run()
        backend.synchronize()
        assert not backend.to_host(op.counters).any(), "a tile counter was left non-zero"
        return backend.to_host(dz), backend.to_host(db)

    with backend.activate():
        results = [run_once(op.run)]
    graph = GraphCapturedStep(backend, op.run, 1, {"y": y, "dy": dy})
    graph.capture()
    results += [run_once(graph.launch), run_once(graph.launch)]
    stored = backend.to_host(expected_dz)
    np.testing.assert_array_equal(results[0][0], stored)
    assert rel_err(results[0][1], stored.astype(np.float64).sum(axis=0)) < 1e-5, op.plan
    for again_dz, again_db in results[1:]:
        np.testing.assert_array_equal(again_dz, stored)
        np.testing.assert_array_equal(again_db, results[0][1])


def test_a_cudnn_graph_first_met_in_capture_is_an_error_not_an_untimed_plan():
    import cupy
    from gpuengine.layers.geometry import Window
    from gpuengine.ops.cudnn import conv_forward, runtime_for
    from gpuengine.runtime.capture import GraphCapturedStep
    backend = Backend("cuda")
    window = Window((9, 11), (3, 3), (1, 1), (1, 1, 1, 1))   # a shape no other test builds: a fresh graph
    with backend.activate():
        x, w, y = cupy.ones((2, 9, 11, 5), np.float32), cupy.ones((7, 3, 3, 5), np.float32), \
            cupy.zeros((2, 9, 11, 7), np.float32)
    bound = conv_forward(runtime_for(backend), "fp32", window, x, w, y)
    with pytest.raises(RuntimeError, match="first ran inside CUDA-graph capture"):
        GraphCapturedStep(backend, bound.run, 1, {}).capture()
    with backend.activate():
        bound.run()   # the eager run times the plans; capture then records the fastest
    step = GraphCapturedStep(backend, bound.run, 1, {})
    step.capture()
    step.launch()
    assert float(backend.to_host(y)[0, 4, 5, 0]) == 45.0   # 3x3x5 ones


# -- whole runs ------------------------------------------------------------------------

SHAPE = CNNShape()


def test_training_matches_numpy():
    net = build_cnn(SHAPE)
    x, t = cnn_data(2048, SHAPE)
    cpu = Trainer(net, x, t, 128, EngineConfig(device="cpu", precision="fp32", cuda_graph=0))
    gpu = Trainer(net, x, t, 128, EngineConfig(device="cuda", precision="fp32", cuda_graph=0))
    np.testing.assert_allclose(gpu.train(2), cpu.train(2), rtol=1e-4)
    a, b = cpu.params.state_dict(), gpu.params.state_dict()
    for name in a:
        assert rel_err(b[name], a[name]) < 1e-4, name


@pytest.mark.parametrize("precision", PRECISIONS)
def test_first_convolution_fused_with_its_pool_trains_like_the_unfused_step(precision):
    """model/passes.py: the convolution and the max pool run forward as one kernel and the pool hands its output
    gradient to the direct weight gradient, writing none of its own; the step trains as the unfused one."""
    net = build_cnn(SHAPE)
    x, t = cnn_data(512, SHAPE)
    fused = Trainer(net, x, t, 128, EngineConfig(precision=precision, cuda_graph=0))
    plain = Trainer(net, x, t, 128, EngineConfig(precision=precision, cuda_graph=0), fuse=False)
    assert fused.program.layers["pool"].dx is None and plain.program.layers["pool"].dx is not None
    tolerance = max(TOLERANCE[precision], 1e-4)
    np.testing.assert_allclose(fused.train(2), plain.train(2), rtol=tolerance)
    a, b = fused.params.state_dict(), plain.params.state_dict()
    for name in a:
        assert rel_err(a[name], b[name]) < tolerance, name


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_conv_pool_forward_matches_the_convolution_then_the_pool(precision, relu):
    """ops/conv_pool.py against cuDNN's convolution and maxpool_forward on the same input: the pooled values, and
    the argmax wherever a window's two largest differ by more than rounding. 29 rows: the last in no window."""
    batch, shape = 16, (29, 28, 1)
    conv, pool = Conv2D(8, activation="relu" if relu else None, name="conv"), MaxPool2D(2, name="pool")
    weights = {k: representable(v, precision) for k, v in
               random_weights(conv.param_specs(shape), np.random.default_rng(3), 0.5).items()}
    ctx = make_context("cuda", precision, batch, conv.param_specs(shape), weights)
    be = ctx.backend
    with be.activate():
        x = ctx.allocator.zeros((batch,) + shape, ctx.policy.compute_dtype, "batch")
        x[...] = be.xp.asarray(normal(5, (batch,) + shape, precision).astype(x.dtype))
        pool.build_forward(ctx, conv.build_forward(ctx, x))
        conv.forward()
        pool.forward()
        be.synchronize()
        conv_out, want, want_arg = (be.to_host(a).astype(np.float64) for a in (conv.out, pool.out, pool.argmax))
        pool.out[...], pool.argmax[...] = 0, -7
        ConvPoolForward(conv, pool).run()
        be.synchronize()
        got, got_arg = be.to_host(pool.out).astype(np.float64), be.to_host(pool.argmax)
    tolerance = TOLERANCE[precision]
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    windows = conv_out[:, :28].reshape(batch, 14, 2, 14, 2, 8).transpose(0, 1, 3, 5, 2, 4).reshape(-1, 4)
    top = np.sort(windows, axis=1)
    clear = (top[:, 3] - top[:, 2]) > 4 * tolerance * np.maximum(1.0, np.abs(top[:, 3]))
    assert clear.mean() > 0.5   # most windows decide their argmax beyond rounding
    np.testing.assert_array_equal(got_arg.reshape(-1)[clear], want_arg.reshape(-1)[clear])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_captured_replay_equals_eager(precision):
    net = build_cnn(SHAPE)
    x, t = cnn_data(4096, SHAPE)
    runs = losses_by_graph_group(net, x, t, 128, precision, (0, 1, 8), epochs=3)
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)
    np.testing.assert_allclose(runs[8], runs[0], rtol=1e-6)
    assert runs[0][-1] < runs[0][0] < np.log(10)


def test_resident_and_streamed_train_identically():
    net = build_cnn(SHAPE)
    x, t = cnn_data(4096, SHAPE)
    resident = Trainer(net, x, t, 1024, EngineConfig(resident_data=True, cuda_graph=2)).train(3)
    streamed = Trainer(net, x, t, 1024, EngineConfig(resident_data=False, cuda_graph=2, batch_pool=2)).train(3)
    np.testing.assert_allclose(streamed, resident, rtol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_inference_captured_and_one_shot_match_numpy(precision):
    net = build_cnn(SHAPE)
    x, _ = cnn_data(256, SHAPE, seed=1)
    cpu = Predictor(net, EngineConfig(device="cpu", precision="fp32"), seed=3).predict(x)
    gpu = Predictor(net, EngineConfig(precision=precision, cuda_graph=1), seed=3)   # same seed, same weights
    resident = ResidentPredictor(gpu, len(x))
    resident.load(x)
    assert rel_err(gpu.backend.to_host(resident.run()), cpu) < TOLERANCE[precision]
    assert rel_err(gpu.predict(x), cpu) < TOLERANCE[precision]


def test_steady_state_allocates_nothing():
    net = build_cnn(SHAPE)
    x, t = cnn_data(4096, SHAPE)
    configs = (EngineConfig(cuda_graph=0), EngineConfig(cuda_graph=8), EngineConfig(resident_data=False))
    assert_steady_state_allocates_nothing(net, x, t, 512, configs)
