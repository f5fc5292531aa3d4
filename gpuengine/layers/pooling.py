"""Max pooling on NHWC activations, forward and backward.

Forward (one thread per output value) keeps the max of each window and where
it was (the window offset kh_index * kw + kw_index, first max on ties, like
torch and NumPy's argmax); padding never wins. Backward gathers rather than
scatters: one thread per input value adds the gradients of the (at most
ceil(k/s)^2) windows that chose it, so overlapping windows (ResNet's 3x3/2 stem
pool, seed note 002) need no atomics and no zero-fill, and the result is the
same every run. Indices are 32-bit (64-bit division costs several times more on
a GPU and made the kernels compute-bound); a batch of 2^31 values or more is refused.
"""
from __future__ import annotations

import numpy as np

from ..backend import widen
from ..kernels import ctype, get_kernel
from .activations import launch_shape
from .base import BuildContext, Layer
from .geometry import add_windows, pad, pair, resolve_window, windows

_SOURCE = r"""
extern "C" __global__ void maxpool_forward(const ELEM_T* x, ELEM_T* y, int* argmax, int n, int h, int w,
                                           int c, int out_h, int out_w, int kh, int kw, int sh, int sw, int top,
                                           int left) {
    const int total = n * out_h * out_w * c;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % c;
        int rest = i / c;
        const int ow = rest % out_w; rest /= out_w;
        const int oh = rest % out_h;
        const int b = rest / out_h;
        float best = 0.f;
        int arg = -1;
        for (int a = 0; a < kh; ++a) {
            const int row = oh * sh - top + a;
            if (row < 0 || row >= h) continue;
            for (int d = 0; d < kw; ++d) {
                const int col = ow * sw - left + d;
                if (col < 0 || col >= w) continue;
                const float v = load_f(x, ((b * h + row) * w + col) * c + ch);
                if (arg < 0 || v > best) { best = v; arg = a * kw + d; }
            }
        }
        store_f(y, i, best);
        argmax[i] = arg;
    }
}
extern "C" __global__ void maxpool_backward(const ELEM_T* dy, const int* argmax, ELEM_T* dx, int n, int h,
                                            int w, int c, int out_h, int out_w, int kh, int kw, int sh, int sw,
                                            int top, int left) {
    const int total = n * h * w * c;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % c;
        int rest = i / c;
        const int col = rest % w; rest /= w;
        const int row = rest % h;
        const int b = rest / h;
        // Windows containing (row, col): oh * sh - top <= row <= oh * sh - top + kh - 1.
        const int r = row + top, q = col + left;
        const int oh_first = r - kh + 1 <= 0 ? 0 : (r - kh + sh) / sh, oh_last = min(out_h - 1, r / sh);
        const int ow_first = q - kw + 1 <= 0 ? 0 : (q - kw + sw) / sw, ow_last = min(out_w - 1, q / sw);
        float g = 0.f;
        for (int oh = oh_first; oh <= oh_last; ++oh) {
            for (int ow = ow_first; ow <= ow_last; ++ow) {
                const int o = ((b * out_h + oh) * out_w + ow) * c + ch;
                if (argmax[o] == (r - oh * sh) * kw + (q - ow * sw)) g += load_f(dy, o);
            }
        }
        store_f(dx, i, g);
    }
}
"""


class MaxPool2D(Layer):
    def __init__(self, pool_size=2, stride=None, padding="valid", name: str = ""):
        self.pool_size = pair("MaxPool2D pool size", pool_size)
        self.stride = self.pool_size if stride is None else pair("MaxPool2D stride", stride)
        self.padding, self.name = padding, name

    def _window(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: MaxPool2D takes (height, width, channels) samples, got {input_shape}")
        window = resolve_window(self.name or "MaxPool2D", input_shape[:2], self.pool_size, self.stride, self.padding)
        top, bottom, left, right = window.pads
        if max(top, bottom) >= window.kernel[0] or max(left, right) >= window.kernel[1]:
            raise ValueError(f"{self.name}: padding {self.padding!r} is as wide as the {window.kernel} pool: "
                             "a window could hold padding only")
        return window

    def output_shape(self, input_shape):
        return self._window(input_shape).output_hw + (input_shape[2],)

    def _dims(self):
        n, h, w, c = self.x.shape
        (out_h, out_w), (kh, kw), (sh, sw) = self.window.output_hw, self.window.kernel, self.window.stride
        top, _, left, _ = self.window.pads
        return tuple(np.int32(v) for v in (n, h, w, c, out_h, out_w, kh, kw, sh, sw, top, left))

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        self.window = self._window(tuple(x.shape[1:]))
        shape = (x.shape[0],) + self.window.output_hw + (x.shape[3],)
        if max(x.size, int(np.prod(shape))) >= 2 ** 31:
            raise ValueError(f"{self.name}: {x.shape} is too large for 32-bit indices; use a smaller batch")
        self.out = ctx.allocator.zeros(shape, x.dtype, "activations")
        self.argmax = ctx.allocator.zeros(shape, np.int32, "activations")
        if ctx.backend.is_gpu:
            self._forward = get_kernel(_SOURCE, "maxpool_forward", ELEM_T=ctype(x.dtype))
            self._backward = get_kernel(_SOURCE, "maxpool_backward", ELEM_T=ctype(x.dtype))
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations") if needs_input_grad else None
        return self.dx

    def forward(self):
        if self.backend.is_gpu:
            grid, block = launch_shape(self.out.size)
            self._forward(grid, block, (self.x, self.out, self.argmax) + self._dims())
            return
        n, out_h, out_w, c = self.out.shape
        cols = windows(pad(widen(self.x), self.window, -np.inf), self.window).reshape(n, out_h, out_w, -1, c)
        self.argmax[...] = cols.argmax(axis=3)
        self.out[...] = np.take_along_axis(cols, self.argmax[:, :, :, None, :], axis=3)[:, :, :, 0, :]

    def backward(self):
        if self.dx is None:
            return
        if self.backend.is_gpu:
            grid, block = launch_shape(self.dx.size)
            self._backward(grid, block, (self.dy, self.argmax, self.dx) + self._dims())
            return
        n, out_h, out_w, c = self.out.shape
        (kh, kw) = self.window.kernel
        grad = np.zeros((n, out_h, out_w, kh * kw, c), widen(self.dy).dtype)
        np.put_along_axis(grad, self.argmax[:, :, :, None, :], widen(self.dy)[:, :, :, None, :], axis=3)
        self.dx[...] = add_windows(grad.reshape(n, out_h, out_w, kh, kw, c), self.window).astype(self.dx.dtype)

