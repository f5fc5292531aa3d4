"""Element-wise activations: tanh (the MLP's) and ReLU, forward and backward.

tanh' = 1 - tanh^2, so backward needs only the forward output, not the input.
ReLU' = [y > 0], likewise. Each is one CUDA kernel over the buffer.
"""
from __future__ import annotations

import numpy as np

from ..backend import widen
from ..kernels import ctype, get_kernel
from .base import BuildContext, Layer

_SOURCE = r"""
__device__ __forceinline__ float act(float x) { return @FORWARD@; }
__device__ __forceinline__ float act_grad(float y, float dy) { return @BACKWARD@; }
extern "C" __global__ void forward(const ELEM_T* x, ELEM_T* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store_f(y, i, act(load_f(x, i)));
}
extern "C" __global__ void backward(const ELEM_T* y, const ELEM_T* dy, ELEM_T* dx, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store_f(dx, i, act_grad(load_f(y, i), load_f(dy, i)));
}
"""

_ACTIVATIONS = {
    "tanh": ("tanhf(x)", "dy * (1.f - y * y)",
             lambda x: np.tanh(x), lambda y, dy: dy * (1.0 - y * y)),
    "relu": ("fmaxf(x, 0.f)", "y > 0.f ? dy : 0.f",
             lambda x: np.maximum(x, 0.0), lambda y, dy: np.where(y > 0, dy, 0.0)),
}


def launch_shape(n: int, threads: int = 256) -> tuple:
    return (min(-(-n // threads), 65535 * 4),), (threads,)


class Activation(Layer):
    def __init__(self, kind: str, name: str = ""):
        if kind not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {kind!r}; use one of {', '.join(_ACTIVATIONS)}")
        self.kind, self.name = kind, name

    def _kernel(self, which, dtype):
        forward, backward, _, _ = _ACTIVATIONS[self.kind]
        source = _SOURCE.replace("@FORWARD@", forward).replace("@BACKWARD@", backward)
        return get_kernel(source, which, ELEM_T=ctype(dtype))

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        self.out = ctx.allocator.zeros(x.shape, x.dtype, "activations")
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        if not needs_input_grad:
            self.dx = None
            return None
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations")
        return self.dx

    def forward(self):
        if not self.backend.is_gpu:
            np_forward = _ACTIVATIONS[self.kind][2]
            self.out[...] = np_forward(widen(self.x)).astype(self.out.dtype)
            return
        n = self.x.size
        grid, block = launch_shape(n)
        self._kernel("forward", self.x.dtype)(grid, block, (self.x, self.out, np.int64(n)))

    def backward(self):
        if self.dx is None:
            return
        if not self.backend.is_gpu:
            np_backward = _ACTIVATIONS[self.kind][3]
            grad = np_backward(widen(self.out), widen(self.dy))
            self.dx[...] = grad.astype(self.dx.dtype)
            return
        n = self.out.size
        grid, block = launch_shape(n)
        self._kernel("backward", self.out.dtype)(grid, block, (self.out, self.dy, self.dx, np.int64(n)))


def Tanh(name: str = "") -> Activation:
    return Activation("tanh", name)


def ReLU(name: str = "") -> Activation:
    return Activation("relu", name)
