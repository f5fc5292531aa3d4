"""Parameters, gradients and Adam moments as flat device buffers.

One contiguous buffer each (Chainer/llm.c style) means the fused Adam kernel
updates every parameter in one launch, and layers see named views into it.
Initial values are drawn on the host with a seeded NumPy generator, so the CPU
and GPU backends start from identical weights (Glorot/Xavier uniform init,
Glorot & Bengio 2010: limit = sqrt(6 / (fan_in + fan_out)); or He normal with
std sqrt(2 / fan_out), He et al. 2015, for deep ReLU stacks; biases zero).
Each view starts on a 256-byte boundary (fp32; 128 bytes for bf16 copies):
cuDNN frontend tensors and vectorised kernels assume aligned pointers, and
the padding between views stays zero (zero gradients leave Adam at zero).
Layer state that is not trained (BatchNorm's running mean and variance) lives
in one more flat float32 buffer beside them, `buffers`, which Adam never sees.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGN_ELEMENTS = 64   # every view's offset is a multiple of this: 256 B in fp32, 128 B in bf16


@dataclass(frozen=True)
class ParamSpec:
    name: str            # "dense1.weight"
    shape: tuple
    init: str            # "glorot" | "he_fan_out" | "zeros" | "ones"
    fan_in: int = 0
    fan_out: int = 0

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def initial_value(spec: ParamSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.init == "zeros":
        return np.zeros(spec.shape, np.float32)
    if spec.init == "ones":
        return np.ones(spec.shape, np.float32)
    if spec.init == "glorot":
        limit = np.sqrt(6.0 / (spec.fan_in + spec.fan_out))
        return rng.uniform(-limit, limit, size=spec.shape).astype(np.float32)
    if spec.init == "he_fan_out":   # He et al. 2015 for ReLU, fan-out mode: torchvision's convolution init
        return (rng.standard_normal(spec.shape) * np.sqrt(2.0 / spec.fan_out)).astype(np.float32)
    raise ValueError(f"unknown initialiser {spec.init!r} for {spec.name}")


class FlatParameters:
    """Named views into flat master, gradient, moment and compute-copy buffers."""

    def __init__(self, specs: list[ParamSpec], allocator, policy, seed: int = 0, training: bool = True,
                 buffer_specs: list[ParamSpec] = ()):
        names = [s.name for s in list(specs) + list(buffer_specs)]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {names}")
        self.specs = list(specs)
        self.policy = policy
        self.offsets, self.size = self.layout(specs)
        self.count = sum(s.size for s in specs)   # the parameters proper, padding excluded
        self.master = allocator.zeros((self.size,), policy.master_dtype, "parameters")
        self.training = training   # inference-only parameters carry no gradients or moments
        self.grad = self.moment1 = self.moment2 = None
        if training:
            self.grad = allocator.zeros((self.size,), policy.master_dtype, "gradients")
            self.moment1 = allocator.zeros((self.size,), policy.master_dtype, "optimizer")
            self.moment2 = allocator.zeros((self.size,), policy.master_dtype, "optimizer")
        self.compute = (allocator.zeros((self.size,), policy.compute_dtype, "parameters")
                        if policy.needs_compute_copy else self.master)
        self.buffer_specs = list(buffer_specs)
        self.buffer_offsets, buffer_size = self.layout(self.buffer_specs)
        self.buffers = allocator.zeros((buffer_size,), np.float32, "parameters")
        self._backend = allocator.backend
        # set by a trainer whose steps leave some master gradients unwritten (optim.py): writes them before a read
        self.complete_gradients = None
        rng = np.random.default_rng(seed)
        self.load({s.name: initial_value(s, rng) for s in specs})
        if self.buffer_specs:
            self.load_buffers({s.name: initial_value(s, rng) for s in self.buffer_specs})

    @staticmethod
    def layout(specs: list[ParamSpec]) -> tuple[dict, int]:
        """{name: (offset, size, shape)} with aligned offsets, and the padded length of the flat buffers."""
        offsets, offset = {}, 0
        for s in specs:
            offsets[s.name] = (offset, s.size, s.shape)
            offset += -(-s.size // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
        return offsets, offset

    @classmethod
    def planned_bytes(cls, specs: list[ParamSpec], policy, training: bool = True,
                      buffer_specs: list[ParamSpec] = ()) -> int:
        """What the constructor allocates: master, (gradient, two moments,) compute copy, buffers, padding included."""
        size = cls.layout(specs)[1]
        copy = policy.compute_dtype.itemsize if policy.needs_compute_copy else 0
        return size * ((4 if training else 1) * policy.master_dtype.itemsize + copy) + 4 * cls.layout(buffer_specs)[1]

    def _view(self, flat, name, offsets=None):
        offset, size, shape = (self.offsets if offsets is None else offsets)[name]
        return flat[offset:offset + size].reshape(shape)

    def buffer_view(self, name):
        """A non-trained float32 state tensor (BatchNorm running statistics)."""
        return self._view(self.buffers, name, self.buffer_offsets)

    def master_view(self, name):
        return self._view(self.master, name)

    def grad_view(self, name):
        """Where the layer of `name` writes its master gradient; read a trainer's gradients with grads_dict, which
        first writes those its steps left elsewhere (complete_gradients)."""
        if self.grad is None:
            raise ValueError(f"{name}: these parameters were built for inference (training=False) and carry no "
                             "gradients; build them with training=True to train")
        return self._view(self.grad, name)

    def compute_view(self, name):
        """What GEMMs read: the bf16 copy under bf16, the master otherwise."""
        return self._view(self.compute, name)

    @staticmethod
    def _packed(values: dict, offsets: dict, size: int, dtype, what: str) -> np.ndarray:
        """One host array in the flat layout of `offsets`; every name present, every shape exact."""
        missing, unknown = set(offsets) - set(values), set(values) - set(offsets)
        if missing or unknown:
            raise ValueError(f"{what} names differ: missing {sorted(missing)}, unknown {sorted(unknown)}")
        host = np.zeros(size, dtype)
        for name, (offset, count, shape) in offsets.items():
            value = np.asarray(values[name], dtype=dtype)
            if value.shape != tuple(shape):
                raise ValueError(f"{name}: shape {value.shape} given, {tuple(shape)} expected")
            host[offset:offset + count] = value.ravel()
        return host

    def load(self, values: dict[str, np.ndarray]):
        """Set parameters from host arrays (shapes checked) and refresh the compute copy."""
        host = self._packed(values, self.offsets, self.size, self.master.dtype, "parameter")
        with self._backend.activate():
            self._backend.upload(self.master, host)   # straight into the buffer: no pooled temporary
            if self.compute is not self.master:
                self._backend.xp.copyto(self.compute, self.master, casting="unsafe")

    def load_buffers(self, values: dict[str, np.ndarray]):
        """Set the non-trained state (running statistics) from host arrays."""
        host = self._packed(values, self.buffer_offsets, self.buffers.size, np.float32, "buffer")
        with self._backend.activate():
            self._backend.upload(self.buffers, host)

    @staticmethod
    def _unpacked(host: np.ndarray, offsets: dict) -> dict[str, np.ndarray]:
        return {name: host[o:o + s].reshape(shape) for name, (o, s, shape) in offsets.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        return self._unpacked(self._backend.to_host(self.master), self.offsets)

    def grads_dict(self) -> dict[str, np.ndarray]:
        # A fresh host copy: views into it are the caller's own.
        if self.complete_gradients is not None:
            self.complete_gradients()
        return self._unpacked(self._backend.to_host(self.grad), self.offsets)

    def buffers_dict(self) -> dict[str, np.ndarray]:
        return self._unpacked(self._backend.to_host(self.buffers), self.buffer_offsets)
