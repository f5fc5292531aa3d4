"""On a GPU: BatchNorm, the residual pieces and whole ResNets agree with the NumPy backend.

The NumPy BatchNorm, Add, GradientSum and average pool are checked against
finite differences and PyTorch on the CPU (test_resnet_gradients.py,
test_resnet_torch_parity.py); these tests carry that trust to the cuDNN
batch-norm graphs (BN + ReLU, BN + add + ReLU, dReLU + dBN), the inference and
element-wise kernels, whole training steps of a reduced ResNet, their captured
replay, and the fused block end against the unfused one.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor
from gpuengine.layers import BatchNorm2D, GlobalAveragePool2D
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet, zoo

from ..gpu_checks import TOLERANCE, assert_close, assert_steady_state_allocates_nothing, losses_by_graph_group
from ..layer_harness import run_layer, run_network
from ..layers.test_gpu_conv import normal, representable

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

PRECISIONS = ["fp32", "tf32", "bf16"]
BN_CASES = {"plain": dict(), "relu": dict(activation="relu"), "add-relu": dict(activation="relu", residual=True),
            "add": dict(residual=True), "relu6": dict(activation="relu6"),
            "add-relu6": dict(activation="relu6", residual=True)}
# Batch statistics over N*H*W values: bf16 inputs and outputs round at 8 bits, the sums stay float32.
BN_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-4, "bf16": 3e-2}


def bn_weights(channels: int, precision: str, gain: float = 1.0) -> dict:
    rng = np.random.default_rng(3)
    return {"bn.weight": representable(gain * (1.0 + 0.2 * rng.standard_normal(channels)), precision),
            "bn.bias": representable(0.2 * rng.standard_normal(channels), precision)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", BN_CASES, ids=list(BN_CASES))
@pytest.mark.parametrize("shape", [(8, 8, 64), (1, 1, 2048), (4, 4, 256)], ids=["8x8x64", "1x1x2048", "4x4x256"])
def test_batchnorm_training_matches_numpy(case, precision, shape):
    """y, dx (and the residual's gradient), dgamma, dbeta and the updated running statistics."""
    batch = 32
    x = normal(1, (batch,) + shape, precision) * 2.0 + 0.5
    inputs = (x, normal(2, (batch,) + shape, precision)) if BN_CASES[case].get("residual") else x
    dy = normal(4, (batch,) + shape, precision)
    # ReLU6 clipped at 6 too: gamma 3 where rounding cannot move a value across 6; under bf16 a value rounded
    # onto 6 drops its gradient, so its case keeps clear of 6 (gamma 0.5)
    clips = "relu6" in case and precision != "bf16"
    weights = bn_weights(shape[2], precision, gain=3.0 if clips else 0.5 if "relu6" in case else 1.0)
    cpu = run_layer(BatchNorm2D(name="bn", **BN_CASES[case]), inputs, dy, precision="fp32", weights=weights)
    gpu = run_layer(BatchNorm2D(name="bn", **BN_CASES[case]), inputs, dy, device="cuda", precision=precision,
                    weights=weights)
    # bf16 add + ReLU6 runs unfused: the residual is added to BN's output already rounded to bf16, so a sum near 0
    # can take the other sign and mask its gradient differently from the float reference (3.1-3.5% on the H100)
    tolerance = 5e-2 if case == "add-relu6" and precision == "bf16" else BN_TOLERANCE[precision]
    assert_close(gpu, cpu, tolerance)
    assert not clips or (cpu["y"] == 6.0).mean() > 0.01


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch, shape", [(3, (3, 5, 8)), (5, (4, 4, 12))], ids=["mask-part-word", "no-mask"])
def test_batchnorm_relu6_odd_sizes_match_numpy(precision, batch, shape):
    """360 values: the mask's last word is one byte; 12 channels pack no mask bytes (ReLU6's gradient ours)."""
    if precision == "bf16" and shape[2] % 8:
        pytest.skip("cuDNN's bf16 batch norm reads 8 channels at a time: 12 channels are refused by design")
    x, dy = normal(1, (batch,) + shape, precision) * 2.0 + 0.5, normal(4, (batch,) + shape, precision)
    weights = bn_weights(shape[2], precision, gain=0.5 if precision == "bf16" else 3.0)
    cpu = run_layer(BatchNorm2D(name="bn", activation="relu6"), x, dy, precision="fp32", weights=weights)
    gpu = run_layer(BatchNorm2D(name="bn", activation="relu6"), x, dy, device="cuda", precision=precision,
                    weights=weights)
    assert_close(gpu, cpu, BN_TOLERANCE[precision])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_our_tail_writes_cudnns_relu_mask_bit_for_bit(precision):
    """The mask bn_tail writes for ReLU6 is read by the backward graph cuDNN's own BN + ReLU forward feeds:
    for ReLU both can write it, and the bits (order within a byte, bytes per pixel) must agree."""
    import cupy
    from gpuengine.layers import batchnorm
    from gpuengine.runtime.kernels import get_kernel, launch_shape
    layer = BatchNorm2D(name="bn", activation="relu")
    x = normal(1, (32, 8, 8, 64), precision) * 2.0 + 0.5
    run_layer(layer, x, normal(4, x.shape, precision), device="cuda", precision=precision,
              weights=bn_weights(64, precision))
    if layer._tail is not None:
        pytest.skip("cuDNN fused no BN + ReLU forward with a mask here: there is no mask of its to compare with")
    ours, y = cupy.zeros_like(layer.mask), layer.out.copy()
    tail = get_kernel(batchnorm._SOURCE, "bn_tail", **layer.kernel_defines(x.shape[1:], y.dtype))
    grid, block = launch_shape(y.size)
    tail(grid, block, (y, y, ours, np.int64(y.size)))
    assert 0.3 < float((y > 0).mean()) < 0.7
    assert (cupy.asnumpy(ours) == cupy.asnumpy(layer.mask)).all()


@pytest.mark.parametrize("shape", [(2, 2, 64), (1, 1, 512), (7, 5, 3)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_global_average_pool_matches_numpy(shape, precision):
    x, dy = normal(5, (16,) + shape, precision), normal(6, (16, shape[2]), precision)
    cpu = run_layer(GlobalAveragePool2D(name="gap"), x, dy, precision="fp32")
    gpu = run_layer(GlobalAveragePool2D(name="gap"), x, dy, device="cuda", precision=precision)
    assert_close(gpu, cpu, TOLERANCE[precision] if precision == "bf16" else 1e-6)


@pytest.mark.parametrize("size,offset", [(4096, 0), (4098, 0), (4099, 0), (4096, 1)],
                         ids=["packs-of-16-bytes", "pairs", "odd-size", "unaligned-view"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gradient_sum_at_every_vector_width(size, offset, precision):
    """add_into moves up to 16 bytes a thread where the size and every address allow, fewer where not."""
    import cupy
    from gpuengine.layers.merge import add_into
    from gpuengine.runtime.backend import Backend, bfloat16_dtype
    from gpuengine.runtime.kernels import vector_width
    dtype = np.dtype(np.float32) if precision == "fp32" else bfloat16_dtype()
    a, b = (normal(seed, (size + offset,), precision).astype(dtype) for seed in (1, 2))
    ga, gb = (cupy.asarray(v)[offset:] for v in (a, b))
    out = cupy.zeros_like(ga)
    widest = 16 // dtype.itemsize
    assert vector_width(size, ga, gb, out, widest=widest) == {
        (4096, 0): widest, (4098, 0): 2, (4099, 0): 1, (4096, 1): 1}[(size, offset)]
    add_into(Backend("cuda"), ga, gb, out)
    exact = a[offset:].astype(np.float64) + b[offset:].astype(np.float64)
    expected = exact.astype(dtype).astype(np.float64)   # one rounding of the exact sum, as the kernel's
    assert (cupy.asnumpy(out).astype(np.float64) == expected).all()


def smoke_batch(shape=resnet.SMOKE_SHAPE, batch: int = 32, seed: int = 7):
    rng = np.random.default_rng(seed)
    x = rng.random((batch,) + shape.image_shape)
    return x, np.eye(shape.classes)[rng.integers(0, shape.classes, batch)]


def smoke_weights(net, precision: str) -> dict:
    x, t = smoke_batch()
    state = Trainer(net, x, t, 32, EngineConfig(device="cpu")).params.state_dict()
    return {k: representable(v, precision) for k, v in state.items()}


def numeric(result: dict) -> dict:
    return {k: np.asarray(v, dtype=np.float64) for k, v in result.items() if k != "fused"}


# Loss and running statistics come from the forward pass; the stem's weight gradient has been through 17
# layers of TF32 / bf16 products and BN normalizations by the time it is summed (measured against float32:
# 4.8% (tf32) and 25% (bf16) relative error on conv1.weight, far less elsewhere). So under TF32 and bf16 the
# gradient is compared as one vector: its direction (cosine) and its norm. bf16 rounds every stored
# activation to 8 bits and BN on 4x4 maps of 32 samples magnifies it: measured on an H100 (2026-11-23), the
# whole gradient's cosine to float32 is 0.970-0.972, and rounding the BN output before the residual add
# (unfused) instead of after (fused) alone moves it to 0.992; the per-layer bf16 tests above are the tight ones.
# TF32 (10-bit products): the cosine depends on the convolution plans autotuning keeps: 0.99889 fused and unfused
# alike (H100, 2026-11-23), 0.99707 with cuDNN's batch norm and 0.99654 with the engine's (H200, f275f75, log
# baselines_store/nvidia-h200/logs/20261128_1855_*: the worst gradients alike, about 10% off on a few BN biases),
# while fp32 agrees to 1e-6 there; so the bar is 0.995, not the 0.998 one H100 run gave.
FORWARD_TOLERANCE = {"fp32": 1e-3, "tf32": 2e-3, "bf16": 3e-2}
GRADIENT_COSINE = {"tf32": 0.995, "bf16": 0.95}


def assert_step_close(gpu: dict, reference: dict, precision: str, fp32_tolerance: float):
    if precision == "fp32":
        assert_close(gpu, reference, fp32_tolerance)
        return
    forward = [k for k in reference if not k.startswith("grad:")]
    assert_close({k: gpu[k] for k in forward}, {k: reference[k] for k in forward}, FORWARD_TOLERANCE[precision])
    grads = sorted(k for k in reference if k.startswith("grad:"))
    ours = np.concatenate([gpu[k].ravel() for k in grads])
    theirs = np.concatenate([reference[k].ravel() for k in grads])
    assert np.isfinite(ours).all()
    cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
    assert cosine > GRADIENT_COSINE[precision], cosine
    assert abs(np.linalg.norm(ours) / np.linalg.norm(theirs) - 1) < 2 * (1 - GRADIENT_COSINE[precision]) + 0.01


@pytest.mark.parametrize("fused", [True, False], ids=["fused-block-end", "unfused-block-end"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_reduced_resnet_step_matches_numpy(precision, fused):
    """Loss, every parameter gradient and every running statistic of one step of the reduced ResNet."""
    net = resnet.build_resnet(resnet.SMOKE_SHAPE, fused=fused)
    x, t = smoke_batch()
    weights = smoke_weights(net, precision)
    cpu = run_network(net, x, t, precision="fp32", weights=weights)
    gpu = run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=fused), x, t, device="cuda",
                      precision=precision, weights=weights)
    assert_step_close(numeric(gpu), numeric(cpu), precision, 1e-3)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fused_block_end_equals_the_unfused_sequence(precision):
    """relu(BN(x) + shortcut) as one cuDNN graph against BN, Add and ReLU as three nodes, on the GPU."""
    x, t = smoke_batch()
    weights = smoke_weights(resnet.build_resnet(resnet.SMOKE_SHAPE), precision)
    fused, unfused = (numeric(run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=f), x, t, device="cuda",
                                          precision=precision, weights=weights)) for f in (True, False))
    assert_step_close(fused, unfused, precision, 1e-4)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_relu_batchnorm_fuses_its_gradient(precision):
    """ResNet's BN + ReLU layers carry the ReLU's bit mask to a fused dReLU + dBN graph: no separate kernels."""
    x, t = smoke_batch(batch=64)
    trainer = Trainer(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, EngineConfig(precision=precision))
    bns = [layer for layer in trainer.program.layers.values() if isinstance(layer, BatchNorm2D)]
    relu = [bn for bn in bns if bn.activation == "relu"]
    assert relu and len(relu) < len(bns)   # the projection shortcuts' BN has no ReLU
    unfused = [bn.name for bn in bns if bn._tail is not None or bn._activation_here or
               (bn.activation == "relu") != (bn.mask is not None)]
    assert unfused == []


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_relu6_batchnorm_backward_is_one_graph(precision):
    """MobileNetV2's BN + ReLU6 layers: our tail writes the mask, the backward is cuDNN's dy * mask + dBN graph."""
    net = zoo.zoo_net("mobilenet_v2")
    x, t = zoo.zoo_data(64, net.reduced.size, net.reduced.classes)
    trainer = Trainer(net.network(reduced=True), x, t, 32, EngineConfig(precision=precision))
    relu6 = [layer for layer in trainer.program.layers.values()
             if isinstance(layer, BatchNorm2D) and layer.activation == "relu6"]
    assert len(relu6) == 35
    assert [bn.name for bn in relu6 if bn.mask is None or bn._activation_here] == []


@pytest.mark.parametrize("precision", PRECISIONS)
def test_captured_replay_trains_exactly_like_eager(precision):
    x, t = smoke_batch(batch=256)
    losses = losses_by_graph_group(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, precision, (0, 1, 8), 3)
    assert losses[0] == losses[1] == losses[8]
    assert losses[0][-1] < losses[0][0]


def test_inference_with_running_statistics_matches_numpy():
    """After training, the inference program normalizes with the running statistics (bn_inference kernel)."""
    net = resnet.build_resnet(resnet.SMOKE_SHAPE)
    x, t = smoke_batch(batch=128)
    gpu_trainer = Trainer(net, x, t, 32, EngineConfig(precision="fp32", cuda_graph=1))
    gpu_trainer.train(2)
    cpu = Predictor(resnet.build_resnet(resnet.SMOKE_SHAPE), EngineConfig(device="cpu", precision="fp32"))
    cpu.params.load(gpu_trainer.params.state_dict())
    cpu.params.load_buffers(gpu_trainer.params.buffers_dict())
    running = gpu_trainer.params.buffers_dict()
    assert not np.allclose(running["bn1.running_mean"], 0.0), "training must have moved the running mean"
    gpu_out = Predictor.from_trainer(gpu_trainer).predict(x[:64].astype(np.float32))
    assert_close({"logits": gpu_out}, {"logits": cpu.predict(x[:64].astype(np.float32))}, 1e-4)


def test_resnet_steady_state_allocates_nothing():
    x, t = smoke_batch(batch=128)
    configs = [EngineConfig(precision=p, cuda_graph=g) for p in ("tf32", "bf16") for g in (0, 8)]
    assert_steady_state_allocates_nothing(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, 32, configs)
