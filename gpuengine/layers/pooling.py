"""Max pooling on NHWC activations, forward and backward.

Forward (one thread per output pixel's few channels) keeps the max of each
window and where it was (the window offset kh_index * kw + kw_index, first max
on ties, like torch and NumPy's argmax); padding never wins. Backward gathers
rather than scatters: one thread per input pixel's few channels adds the
gradients of the (at most ceil(k/s)^2) windows that chose them, so overlapping
windows (ResNet's 3x3/2 stem pool, seed note 002) need no atomics and no
zero-fill, and the result is the same every run. Index arithmetic dominated
these memory-bound kernels, so it is 32-bit (a batch of 2^31 values or more is
refused), the layer's geometry is compiled into them (divisions by constants
become multiplies), and a thread shares it over up to 4 channels moved by one
vector access.
"""
from __future__ import annotations

import numpy as np

from ..ops.direct_wgrad import PooledGradient
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape, vector_width
from .base import BuildContext, Layer
from .geometry import add_windows, pad, pair, resolve_window, windows

_SOURCE = r"""
// The geometry is compiled in (IN_H, IN_W, CHANNELS, OUT_H, OUT_W, WIN_H, WIN_W, STRIDE_H, STRIDE_W,
// PAD_TOP, PAD_LEFT): index arithmetic then divides by constants, which compiles to multiplies. A thread takes
// VEC neighbouring channels (CHANNELS % VEC == 0), moved by one vector load or store, so its index arithmetic is
// shared by VEC values.
extern "C" __global__ void maxpool_forward(const ELEM_T* x, ELEM_T* y, int* argmax, int packs) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < packs; n += gridDim.x * blockDim.x) {
        const int i = n * VEC, ch = i % CHANNELS, pixel = i / CHANNELS;
        const int ow = pixel % OUT_W, oh = pixel / OUT_W % OUT_H, b = pixel / (OUT_W * OUT_H);
        float best[VEC];
        Pack<int, VEC> arg;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) { best[k] = 0.f; arg.v[k] = -1; }
        #pragma unroll
        for (int a = 0; a < WIN_H; ++a) {
            const int row = oh * STRIDE_H - PAD_TOP + a;
            #pragma unroll
            for (int d = 0; d < WIN_W; ++d) {
                const int col = ow * STRIDE_W - PAD_LEFT + d;
                if (row < 0 || row >= IN_H || col < 0 || col >= IN_W) continue;
                const Pack<ELEM_T, VEC> v = load_pack<ELEM_T, VEC>(x, ((b * IN_H + row) * IN_W + col) * CHANNELS + ch);
                #pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float f = load_f(v.v, k);
                    if (arg.v[k] < 0 || f > best[k]) { best[k] = f; arg.v[k] = a * WIN_W + d; }
                }
            }
        }
        Pack<ELEM_T, VEC> out;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(out.v, k, best[k]);
        store_pack(y, i, out);
        store_pack(argmax, i, arg);
    }
}
extern "C" __global__ void maxpool_backward(const ELEM_T* dy, const int* argmax, ELEM_T* dx, int packs) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < packs; n += gridDim.x * blockDim.x) {
        const int i = n * VEC, ch = i % CHANNELS, pixel = i / CHANNELS;
        const int col = pixel % IN_W, row = pixel / IN_W % IN_H, b = pixel / (IN_W * IN_H);
        // Windows containing (row, col): oh * STRIDE_H - PAD_TOP <= row <= oh * STRIDE_H - PAD_TOP + WIN_H - 1.
        const int r = row + PAD_TOP, q = col + PAD_LEFT;
        const int oh_first = r - WIN_H + 1 <= 0 ? 0 : (r - WIN_H + STRIDE_H) / STRIDE_H;
        const int ow_first = q - WIN_W + 1 <= 0 ? 0 : (q - WIN_W + STRIDE_W) / STRIDE_W;
        const int oh_last = min(OUT_H - 1, r / STRIDE_H), ow_last = min(OUT_W - 1, q / STRIDE_W);
        float g[VEC];
        #pragma unroll
        for (int k = 0; k < VEC; ++k) g[k] = 0.f;
        for (int oh = oh_first; oh <= oh_last; ++oh) {
            for (int ow = ow_first; ow <= ow_last; ++ow) {
                const int o = ((b * OUT_H + oh) * OUT_W + ow) * CHANNELS + ch;
                const int here = (r - oh * STRIDE_H) * WIN_W + (q - ow * STRIDE_W);
                const Pack<int, VEC> arg = load_pack<int, VEC>(argmax, o);
                const Pack<ELEM_T, VEC> d = load_pack<ELEM_T, VEC>(dy, o);
                #pragma unroll
                for (int k = 0; k < VEC; ++k)
                    if (arg.v[k] == here) g[k] += load_f(d.v, k);
            }
        }
        Pack<ELEM_T, VEC> out;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(out.v, k, g[k]);
        store_pack(dx, i, out);
    }
}
"""


class MaxPool2D(Layer):
    def __init__(self, pool_size=2, stride=None, padding="valid", name: str = ""):
        self.pool_size = pair("MaxPool2D pool size", pool_size)
        self.stride = self.pool_size if stride is None else pair("MaxPool2D stride", stride)
        self.padding, self.name = padding, name
        resolve_window("MaxPool2D", (1 << 20, 1 << 20), self.pool_size, self.stride, padding)   # bad padding fails here

    def _window(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: MaxPool2D takes (height, width, channels) samples, got {input_shape}")
        window = resolve_window(self.name or "MaxPool2D", input_shape[:2], self.pool_size, self.stride, self.padding)
        top, bottom, left, right = window.pads
        if max(top, bottom) >= window.kernel[0] or max(left, right) >= window.kernel[1]:
            raise ValueError(f"{self.name}: padding {self.padding!r} is as wide as the {window.kernel} pool: "
                             "a window could hold padding only")
        return window

    def window_of(self, input_shape):
        """The pool's resolved window over (H, W, C) samples."""
        return self._window(tuple(input_shape))

    def output_shape(self, input_shape):
        return self._window(input_shape).output_hw + (input_shape[2],)

    def kernel_defines(self, input_shape, dtype, *arrays) -> dict:
        """The kernels' compile-time defines for (H, W, C) samples of `dtype`, the channels a thread takes chosen
        for the GPU `arrays` it will read and write (their addresses must suit its vector accesses)."""
        h, w, c = input_shape
        window = self._window(tuple(input_shape))
        (out_h, out_w), (kh, kw), (sh, sw) = window.output_hw, window.kernel, window.stride
        top, _, left, _ = window.pads
        return dict(ELEM_T=ctype(dtype), IN_H=h, IN_W=w, CHANNELS=c, OUT_H=out_h, OUT_W=out_w, WIN_H=kh,
                    WIN_W=kw, STRIDE_H=sh, STRIDE_W=sw, PAD_TOP=top, PAD_LEFT=left, VEC=vector_width(c, *arrays))

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        self.window = self._window(tuple(x.shape[1:]))
        shape = (x.shape[0],) + self.window.output_hw + (x.shape[3],)
        if max(x.size, int(np.prod(shape))) >= 2 ** 31:
            raise ValueError(f"{self.name}: {x.shape} is too large for 32-bit indices; use a smaller batch")
        self.out = ctx.allocator.zeros(shape, x.dtype, "activations")
        self.argmax = ctx.allocator.zeros(shape, np.int32, "activations")
        if ctx.backend.is_gpu:
            self._forward_defines = self.kernel_defines(x.shape[1:], x.dtype, x, self.out, self.argmax)
            self._forward = get_kernel(_SOURCE, "maxpool_forward", **self._forward_defines)
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations") if needs_input_grad else None
        if ctx.backend.is_gpu and self.dx is not None:
            self._backward_defines = self.kernel_defines(self.x.shape[1:], self.x.dtype, dy, self.argmax, self.dx)
            self._backward = get_kernel(_SOURCE, "maxpool_backward", **self._backward_defines)
        return self.dx

    def build_backward_pooled(self, ctx: BuildContext, dy) -> PooledGradient:
        """Backward fused into the direct weight gradient of the convolution below (model/passes.py): this layer
        writes nothing; the convolution's kernel reads dy, the output and argmax itself."""
        self.dy, self.dx = dy, None
        return PooledGradient(dy, self.out, self.argmax, self.window)

    def forward(self):
        if self.backend.is_gpu:
            packs = self.out.size // self._forward_defines["VEC"]
            grid, block = launch_shape(packs)
            self._forward(grid, block, (self.x, self.out, self.argmax, np.int32(packs)))
            return
        n, out_h, out_w, c = self.out.shape
        cols = windows(pad(widen(self.x), self.window, -np.inf), self.window).reshape(n, out_h, out_w, -1, c)
        self.argmax[...] = cols.argmax(axis=3)
        self.out[...] = np.take_along_axis(cols, self.argmax[:, :, :, None, :], axis=3)[:, :, :, 0, :]

    def backward(self):
        if self.dx is None:
            return
        if self.backend.is_gpu:
            packs = self.dx.size // self._backward_defines["VEC"]
            grid, block = launch_shape(packs)
            self._backward(grid, block, (self.dy, self.argmax, self.dx, np.int32(packs)))
            return
        n, out_h, out_w, c = self.out.shape
        (kh, kw) = self.window.kernel
        grad = np.zeros((n, out_h, out_w, kh * kw, c), widen(self.dy).dtype)
        np.put_along_axis(grad, self.argmax[:, :, :, None, :], widen(self.dy)[:, :, :, None, :], axis=3)
        self.dx[...] = add_windows(grad.reshape(n, out_h, out_w, kh, kw, c), self.window).astype(self.dx.dtype)
