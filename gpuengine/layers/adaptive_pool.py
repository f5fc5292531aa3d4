"""Adaptive average pooling on NHWC maps: any (H, W) to a fixed (out_h, out_w), torch's bins.

Output cell (i, j) averages rows floor(i H / out_h) .. ceil((i + 1) H / out_h) - 1
and the columns alike (torch's AdaptiveAvgPool2d), so bins may overlap by a
pixel when out_h does not divide H. AlexNet and VGG put one before their
classifier ((6, 6) and (7, 7)); at 224x224 the maps already have that size, so
the layer is then a view of its input in both directions (no kernel), as
`GlobalAveragePool2D` (the pool to 1x1, flattened) is on a 1x1 map.
Otherwise forward is one thread per output value; backward gathers, one
thread per input value adding the gradients of the (at most a few) bins that
hold it: no atomics, no zero-fill, the same result every run. The geometry is
compiled into the kernels.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape
from .base import BuildContext, Layer
from .geometry import pair

_SOURCE = r"""
// Compiled in: IN_H, IN_W, CHANNELS, OUT_H, OUT_W. Bin i of n over size s spans [i s / n, ceil((i + 1) s / n)).
__device__ __forceinline__ int bin_start(int i, int size, int bins) { return i * size / bins; }
__device__ __forceinline__ int bin_end(int i, int size, int bins) { return ((i + 1) * size + bins - 1) / bins; }
extern "C" __global__ void adaptive_average_forward(const ELEM_T* x, ELEM_T* y, int total) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % CHANNELS, pixel = i / CHANNELS;
        const int ow = pixel % OUT_W, oh = pixel / OUT_W % OUT_H, b = pixel / (OUT_W * OUT_H);
        const int r0 = bin_start(oh, IN_H, OUT_H), r1 = bin_end(oh, IN_H, OUT_H);
        const int c0 = bin_start(ow, IN_W, OUT_W), c1 = bin_end(ow, IN_W, OUT_W);
        float s = 0.f;
        for (int r = r0; r < r1; ++r)
            for (int c = c0; c < c1; ++c) s += load_f(x, ((b * IN_H + r) * IN_W + c) * CHANNELS + ch);
        store_f(y, i, s / (float)((r1 - r0) * (c1 - c0)));
    }
}
extern "C" __global__ void adaptive_average_backward(const ELEM_T* dy, ELEM_T* dx, int total) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % CHANNELS, pixel = i / CHANNELS;
        const int col = pixel % IN_W, row = pixel / IN_W % IN_H, b = pixel / (IN_W * IN_H);
        float g = 0.f;
        for (int oh = 0; oh < OUT_H; ++oh) {
            const int r0 = bin_start(oh, IN_H, OUT_H), r1 = bin_end(oh, IN_H, OUT_H);
            if (row < r0 || row >= r1) continue;
            for (int ow = 0; ow < OUT_W; ++ow) {
                const int c0 = bin_start(ow, IN_W, OUT_W), c1 = bin_end(ow, IN_W, OUT_W);
                if (col < c0 || col >= c1) continue;
                g += load_f(dy, ((b * OUT_H + oh) * OUT_W + ow) * CHANNELS + ch) / (float)((r1 - r0) * (c1 - c0));
            }
        }
        store_f(dx, i, g);
    }
}
"""


def bins(size: int, count: int) -> list[tuple[int, int]]:
    """torch's adaptive bins: [floor(i size / count), ceil((i + 1) size / count)) for each i."""
    return [(i * size // count, -(-(i + 1) * size // count)) for i in range(count)]


class AdaptiveAveragePool2D(Layer):
    """(H, W, C) samples -> (out_h, out_w, C): the mean over each adaptive bin."""

    def __init__(self, output_size=(1, 1), name: str = ""):
        self.output_size = pair("AdaptiveAveragePool2D output size", output_size)
        self.name = name

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: AdaptiveAveragePool2D takes (height, width, channels) samples, "
                             f"got {input_shape}")
        return self.output_size + (input_shape[2],)

    def kernel_defines(self, input_shape, dtype) -> dict | None:
        """The kernels' compile-time defines for (H, W, C) samples of `dtype`; None where the pool is a view."""
        h, w, c = input_shape
        if (h, w) == self.output_size:
            return None
        out_h, out_w = self.output_size
        return dict(ELEM_T=ctype(dtype), IN_H=h, IN_W=w, CHANNELS=c, OUT_H=out_h, OUT_W=out_w)

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        n, h, w, c = x.shape
        self.identity = (h, w) == self.output_size
        if self.identity:
            self.out = x
            return x
        if x.size >= 2 ** 31:
            raise ValueError(f"{self.name}: {x.shape} is too large for 32-bit indices; use a smaller batch")
        self.out = ctx.allocator.zeros((n,) + self.output_size + (c,), x.dtype, "activations")
        if ctx.backend.is_gpu:
            defines = self.kernel_defines(x.shape[1:], x.dtype)
            self._forward = get_kernel(_SOURCE, "adaptive_average_forward", **defines)
            self._backward = get_kernel(_SOURCE, "adaptive_average_backward", **defines)
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        if not needs_input_grad:
            self.dx = None
        elif self.identity:
            self.dx = dy
        else:
            self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations")
        return self.dx

    def _bins(self):
        _, h, w, _ = self.x.shape
        return [(i, j, rows, cols) for i, rows in enumerate(bins(h, self.output_size[0]))
                for j, cols in enumerate(bins(w, self.output_size[1]))]

    def forward(self):
        if self.identity:
            return
        if self.backend.is_gpu:
            grid, block = launch_shape(self.out.size)
            self._forward(grid, block, (self.x, self.out, np.int32(self.out.size)))
            return
        x = widen(self.x)
        for i, j, (r0, r1), (c0, c1) in self._bins():
            self.out[:, i, j, :] = x[:, r0:r1, c0:c1, :].mean(axis=(1, 2)).astype(self.out.dtype)

    def backward(self):
        if self.dx is None or self.identity:
            return
        if self.backend.is_gpu:
            grid, block = launch_shape(self.dx.size)
            self._backward(grid, block, (self.dy, self.dx, np.int32(self.dx.size)))
            return
        dy, dx = widen(self.dy), np.zeros(self.x.shape, widen(self.dy).dtype)
        for i, j, (r0, r1), (c0, c1) in self._bins():
            dx[:, r0:r1, c0:c1, :] += (dy[:, i, j, :] / ((r1 - r0) * (c1 - c0)))[:, None, None, :]
        self.dx[...] = dx.astype(self.dx.dtype)


class GlobalAveragePool2D(AdaptiveAveragePool2D):
    """(H, W, C) samples -> (C,): the mean over the map (ResNet's avgpool before the classifier).

    The adaptive pool to 1x1, its output seen as (N, C). On a 1x1 map (ResNet-50 on 32x32 inputs) the mean is
    the map itself: output and input gradient are views, no kernel runs (seed note 002 omitted the pool).
    """

    def __init__(self, name: str = ""):
        super().__init__((1, 1), name)

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: GlobalAveragePool2D takes (height, width, channels) samples, "
                             f"got {input_shape}")
        return (input_shape[2],)

    def build_forward(self, ctx: BuildContext, x):
        return super().build_forward(ctx, x).reshape(x.shape[0], x.shape[3])

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        return super().build_backward(ctx, dy.reshape(dy.shape[0], 1, 1, dy.shape[1]), needs_input_grad)
