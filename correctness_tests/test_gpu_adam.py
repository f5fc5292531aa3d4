"""On a GPU: the fused Adam kernel makes the NumPy backend's update, by its 16-byte path and by its scalar one,
and reading bf16 gradients from their scratches makes the update of widening them first.

Flat parameter buffers start aligned and have a length that is a multiple of 64 (params.py), so the kernel
updates a large one four elements a thread; a small buffer, one that starts off a 16-byte boundary, and
the tail of a length that is not a multiple of four go through the scalar loop. Each case runs three steps
(the bias correction changes with the step) under fp32 and under bf16, whose pass also refreshes the bf16
compute copy.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine import optim
from gpuengine.optim import Adam
from gpuengine.runtime.backend import get_backend, gpu_visible
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.precision import policy_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

STEPS = 3
LARGE = optim._VECTOR_MIN   # the smallest buffer updated four elements a thread


def flat_buffers(backend, allocator, size: int, offset: int, precision: str, rng):
    """Master, gradient, moments and compute copy of `size` elements, each starting `offset` elements into its
    allocation (an offset of 1 puts every start off a 16-byte boundary); seeded values, moments non-negative."""
    policy = policy_for(precision)

    def buffer(values, dtype):
        whole = allocator.zeros((size + offset,), dtype, "optimizer")
        view = whole[offset:]
        backend.upload(view, values.astype(dtype))
        return view
    values = [rng.standard_normal(size).astype(np.float32) for _ in range(3)]
    master, grad = buffer(values[0], np.float32), buffer(values[1], np.float32)
    moment1 = buffer(0.1 * values[2], np.float32)
    moment2 = buffer(np.abs(values[2]) * 0.01, np.float32)
    compute = buffer(values[0], policy.compute_dtype) if policy.needs_compute_copy else master
    return SimpleNamespace(master=master, grad=grad, moment1=moment1, moment2=moment2, compute=compute, size=size)


def run_adam(device: str, size: int, offset: int, precision: str):
    backend = get_backend(EngineConfig(device=device, precision=precision, cuda_graph=0))
    allocator = Allocator(backend)
    params = flat_buffers(backend, allocator, size, offset, precision, np.random.default_rng(7))
    state = SimpleNamespace(step=allocator.zeros((1,), np.int64, "workspace"))
    adam = Adam(backend, allocator, params, state, lr=3e-3)
    for step in range(STEPS):
        backend.upload(state.step, np.array([step], np.int64))
        with backend.activate():
            adam.step()
    backend.synchronize()
    host = {name: backend.to_host(getattr(params, name)).astype(np.float32)
            for name in ("master", "moment1", "moment2", "compute")}
    return host, adam


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("size,offset,path", [(LARGE, 0, "vector"), (LARGE + 3, 0, "vector and tail"),
                                              (LARGE, 1, "scalar"), (4096, 0, "scalar")])
def test_adam_on_the_gpu_makes_the_numpy_update(precision, size, offset, path):
    gpu, adam = run_adam("cuda", size, offset, precision)
    cpu, _ = run_adam("cpu", size, offset, precision)
    assert adam.vector == (path != "scalar")
    for name in ("master", "moment1", "moment2"):   # float32 either side, contracted differently: 1e-5 apart
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=5e-5, atol=1e-6, err_msg=f"{name} ({path})")
    if precision == "bf16":   # the compute copy is the GPU's own master rounded to the nearest bf16
        rounded = gpu["master"].astype(policy_for(precision).compute_dtype).astype(np.float32)
        np.testing.assert_array_equal(gpu["compute"], rounded, err_msg=f"compute ({path})")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_vector_and_scalar_paths_agree_bit_for_bit(precision):
    vector, _ = run_adam("cuda", LARGE, 0, precision)
    scalar, _ = run_adam("cuda", LARGE, 1, precision)   # the same values, every start off a 16-byte boundary
    for name, values in vector.items():
        np.testing.assert_array_equal(values, scalar[name], err_msg=name)


# (offset, count) of the bf16 gradients: a long one cut into rows, one whose end leaves the next row unaligned, a
# short one; offsets are multiples of 64, as the flat layout makes them.
SPANS = [(0, 2 * optim.ROW + 5), (64 * 300, 1728), (LARGE - 128, 27)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_reading_bf16_gradients_from_their_scratches_makes_the_widened_update_bit_for_bit(precision):
    """Adam given (scratch, master) pairs reads those gradients from the bf16 scratches, never from the master
    gradients (NaN there), and makes the bits of widening them first and updating."""
    results = []
    for narrow in (False, True):
        backend = get_backend(EngineConfig(device="cuda", precision=precision, cuda_graph=0))
        allocator = Allocator(backend)
        rng = np.random.default_rng(7)
        params = flat_buffers(backend, allocator, LARGE + 3, 0, precision, rng)
        state = SimpleNamespace(step=allocator.zeros((1,), np.int64, "workspace"))
        pairs = []
        for first, count in SPANS:
            values = rng.standard_normal(count).astype(policy_for("bf16").compute_dtype)
            scratch = allocator.zeros((count,), values.dtype, "workspace")
            backend.upload(scratch, values)
            master = params.grad[first:first + count]
            backend.upload(master, np.full(count, np.nan, np.float32) if narrow else values.astype(np.float32))
            pairs.append((scratch, master))
        adam = Adam(backend, allocator, params, state, lr=3e-3, narrow=pairs if narrow else ())
        assert adam.reads_narrow == narrow
        for step in range(STEPS):
            backend.upload(state.step, np.array([step], np.int64))
            with backend.activate():
                adam.step()
        backend.synchronize()
        results.append({name: backend.to_host(getattr(params, name)) for name in ("master", "moment1", "moment2",
                                                                               "compute")})
    for name, values in results[0].items():
        np.testing.assert_array_equal(values, results[1][name], err_msg=name)


def test_a_trainer_whose_adam_reads_the_scratches_trains_the_same_bits(monkeypatch):
    """The reduced ResNet in bf16, eager then captured: Adam reading the convolutions' bf16 weight gradients from
    their scratches (its size floor lowered to reach them) gives the weights, and grads_dict the gradients, of the
    trainer that widens them first."""
    from gpuengine import trainer as trainer_module
    from gpuengine.trainer import Trainer
    from gpuengine.workloads import resnet
    from gpuengine.workloads.registry import ENTRIES
    monkeypatch.setattr(optim, "_VECTOR_MIN", 64)
    shape = ENTRIES["resnet"].shape("smoke")
    x, t = resnet.resnet_data(64, shape)
    results = []
    for narrow in (False, True):
        monkeypatch.setattr(trainer_module, "READ_NARROW_GRADIENTS", narrow)
        trainer = Trainer(resnet.build_resnet(shape), x, t, 16, EngineConfig(device="cuda", precision="bf16",
                                                                            cuda_graph=2), seed=3)
        assert trainer.optimizer.reads_narrow == narrow and len(trainer.program.widening) > 0
        trainer.train(2)
        results.append((trainer.params.state_dict(), trainer.params.grads_dict()))
    for before, after in zip(*results):
        for name, values in before.items():
            np.testing.assert_array_equal(values, after[name], err_msg=name)
