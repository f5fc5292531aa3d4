"""Batch normalization over NHWC maps (Ioffe & Szegedy 2015), with an activation and a residual add fused in.

Training: per channel c over the N*H*W values of the batch, mean m and biased
variance v, x^ = (x - m) / sqrt(v + eps), z = gamma x^ + beta [+ residual],
y = [act](z), act ReLU or ReLU6. The running statistics follow torch's
convention: running = (1 - momentum) running + momentum batch, the variance
unbiased (M / (M - 1)). Backward from dz = [act'](dy): dbeta = sum dz,
dgamma = sum dz x^, dx = gamma / (M sqrt(v + eps)) (M dz - dbeta - x^ dgamma);
the residual's gradient is dz itself. Inference (an inference program,
`ctx.training` False) normalizes with the running statistics instead.

On a GPU training runs as cuDNN frontend graphs, or as the engine's own
kernels (ops/batchnorm.py) under the toggle batchnorm=engine, and under
batchnorm=auto on small maps (AUTO_ENGINE); each layer trains
on one of them both ways. cuDNN's graphs (cudnn_batchnorm.py: BN + add
+ ReLU forward and dReLU + dBN backward, seed note 002's fusions, the
activation's gradient carried from forward to backward as a bit mask). Where
cuDNN fuses no tail (ReLU6, or an add without ReLU) the plain BN graph runs
and this module's kernel adds and activates in place, writing the same bit
mask, so the backward is still one cuDNN graph (dy times the mask, then dBN);
inference is one element-wise kernel. gamma and beta are read in float32 from
the master weights under every precision. The NumPy backend computes the
formulas above (the gradient checks' reference).
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops.batchnorm import BatchNormBackward, BatchNormForward
from ..ops.batchnorm_kernels import ACTIVATION_SOURCE
from ..ops.cudnn import CudnnUnsupported, runtime_for
from ..ops.cudnn_batchnorm import batchnorm_backward, batchnorm_forward, mask_shape
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape
from ..runtime.params import ParamSpec
from .activations import activation_backward, activation_forward
from .base import BuildContext, Layer

_SOURCE = ACTIVATION_SOURCE + r"""
// The tail of a BN forward cuDNN did not fuse, in place: y = act(y [+ residual]). With MASK it also writes the
// bits of passes_gradient(y) for the backward graph's mask multiply (cudnn_batchnorm.py).
extern "C" __global__ void bn_tail(ELEM_T* y, const ELEM_T* residual, unsigned char* mask, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long start = (long long)blockIdx.x * blockDim.x; start < n; start += stride) {   // uniform per block
        const long long i = start + threadIdx.x;
        bool passes = false;
        if (i < n) {
            const float v = activate(load_f(y, i) + (HAS_RESIDUAL ? load_f(residual, i) : 0.f));
            store_f(y, i, v);
            passes = passes_gradient(v);
        }
        if (MASK) write_mask_bit(mask, i, n, passes);
    }
}
// Inference: y = act(gamma (x - mean) / sqrt(var + eps) + beta [+ residual]) with the running statistics.
extern "C" __global__ void bn_inference(const ELEM_T* x, const float* gamma, const float* beta, const float* mean,
                                        const float* var, const ELEM_T* residual, ELEM_T* y, float eps, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const int c = (int)(i % CHANNELS);
        float v = (load_f(x, i) - mean[c]) * rsqrtf(var[c] + eps) * gamma[c] + beta[c];
        if (HAS_RESIDUAL) v += load_f(residual, i);
        store_f(y, i, activate(v));
    }
}
"""
# batchnorm=auto: the most rows (N*H*W) and values (rows x channels) a map may have to train on the engine's
# kernels, by precision; cuDNN's graphs train the larger. Each ResNet-50 CIFAR b128 map timed alone on an H200
# (log nvidia-h200/logs/20261130_1310_3a825ed_*): in bf16 the engine's are faster up to 2,048 rows and 2^19
# values (4x4x256: 0.95 of cuDNN's time), slower from 4x4x512 (1.04) and on every 8x8 map (8x8x64, 2^19 values:
# 1.08); at 224 b16 the 14x14 maps (3,136 rows) took 336 us more on the engine's (log ..._0757_a011bab_*).
# In TF32 only the 1x1 maps (128 rows) gain. fp32 untimed.
AUTO_ENGINE = {"bf16": (2048, 1 << 19), "tf32": (128, 1 << 18), "fp32": (0, 0)}
ACTIVATIONS = (None, "relu", "relu6")
_ACT_CODES = {None: 0, "relu": 1, "relu6": 2}


def engine_trains(batchnorm: str, precision: str, rows: int, channels: int) -> bool:
    """Whether a map of `rows` rows (N*H*W) of `channels` trains on the engine's kernels under the toggle
    `batchnorm`."""
    most_rows, most_values = AUTO_ENGINE.get(precision, (0, 0))
    return batchnorm == "engine" or (batchnorm == "auto" and rows <= most_rows and rows * channels <= most_values)


class BatchNorm2D(Layer):
    """BN over (H, W, C) samples; `residual=True` makes it a two-input node: relu(BN(x) + residual)."""

    gradient_sum = None   # set by a training program: the GradientSum of dy, which the engine's kernel may do
    wiring = ("gradient_sum",)

    def __init__(self, activation: str | None = None, residual: bool = False, momentum: float = 0.1,
                 epsilon: float = 1e-5, name: str = ""):
        checks.choice("BatchNorm2D activation", activation, ACTIVATIONS, "the activations it fuses")
        residual = checks.flag("BatchNorm2D residual", residual)
        momentum = checks.number("BatchNorm2D momentum", momentum, at_least=0.0, at_most=1.0)
        epsilon = checks.number("BatchNorm2D epsilon", epsilon, above=0.0)
        self.activation, self.residual, self.momentum, self.epsilon = activation, residual, momentum, epsilon
        self.arity = 2 if residual else 1
        self.name = name

    def _channels(self, x_shape, residual_shape=None) -> int:
        if len(x_shape) != 3:
            raise ValueError(f"{self.name}: BatchNorm2D takes (height, width, channels) samples, got {x_shape}")
        if self.residual and tuple(residual_shape) != tuple(x_shape):
            raise ValueError(f"{self.name}: the residual {tuple(residual_shape)} must have the shape of the "
                             f"normalized input {tuple(x_shape)}")
        return x_shape[2]

    def output_shape(self, *shapes):
        self._channels(*shapes)
        return tuple(shapes[0])

    def param_specs(self, *shapes):
        c = self._channels(*shapes)
        return [ParamSpec(f"{self.name}.weight", (c,), "ones"), ParamSpec(f"{self.name}.bias", (c,), "zeros")]

    def buffer_specs(self, *shapes):
        c = self._channels(*shapes)
        return [ParamSpec(f"{self.name}.running_mean", (c,), "zeros"),
                ParamSpec(f"{self.name}.running_var", (c,), "ones")]

    def kernel_defines(self, input_shape, dtype) -> dict:
        """The element-wise kernels' compile-time defines (inference, and the tail of an unfused graph)."""
        return dict(ELEM_T=ctype(dtype), HAS_RESIDUAL=int(self.residual), ACT=_ACT_CODES[self.activation],
                    MASK=int(self._masks(input_shape[2])), CHANNELS=input_shape[2])

    def _masks(self, channels: int) -> bool:
        """Whether the forward keeps the activation's gradient as a bit mask (8 channels a byte) for cuDNN's
        backward."""
        return self.activation is not None and channels % 8 == 0

    def build_forward(self, ctx: BuildContext, x, residual=None):
        self.backend, self.training, self.x, self.res = ctx.backend, ctx.training, x, residual
        p = ctx.params
        self.gamma, self.beta = p.master_view(f"{self.name}.weight"), p.master_view(f"{self.name}.bias")
        self.running_mean = p.buffer_view(f"{self.name}.running_mean")
        self.running_var = p.buffer_view(f"{self.name}.running_var")
        self.out = ctx.allocator.zeros(x.shape, x.dtype, "activations")
        channels = x.shape[3]
        # float32 for cuDNN; float64 under the NumPy gradient checks' precision
        self.saved_mean = ctx.allocator.zeros((channels,), ctx.policy.master_dtype, "activations")
        self.saved_inv_std = ctx.allocator.zeros((channels,), ctx.policy.master_dtype, "activations")
        self._fwd_graph = self._tail = self._infer = self.mask = None
        self._engine = False
        if not ctx.backend.is_gpu:
            return self.out
        defines = self.kernel_defines(x.shape[1:], x.dtype)
        if not self.training:
            self._infer = get_kernel(_SOURCE, "bn_inference", **defines)
            return self.out
        self._engine = engine_trains(ctx.batchnorm, ctx.policy.name, x.size // channels, channels)
        if self._engine:   # the engine's own kernels; the mask wherever the activation's gradient is needed later
            if defines["MASK"]:
                self.mask = ctx.allocator.zeros(mask_shape(x.shape), np.uint8, "activations")
            self._fwd_graph = BatchNormForward(ctx.backend, ctx.allocator, defines, x, self.gamma, self.beta,
                                               self.running_mean, self.running_var, self.out, self.saved_mean,
                                               self.saved_inv_std, self.epsilon, self.momentum, residual=residual,
                                               mask=self.mask)
            return self.out
        args = (runtime_for(ctx.backend, ctx.deterministic), ctx.policy.name, x, self.gamma, self.beta,
                self.running_mean, self.running_var, self.out, self.saved_mean, self.saved_inv_std, self.epsilon,
                self.momentum)
        relu, masks = self.activation == "relu", self._masks(channels)
        if relu and masks:   # the ReLU's bit mask lets cuDNN fuse its gradient into BN's backward
            mask = ctx.allocator.zeros(mask_shape(x.shape), np.uint8, "activations")
            try:
                self._fwd_graph = batchnorm_forward(*args, residual=residual, relu=True, mask=mask,
                                                    allocator=ctx.allocator)
                self.mask = mask
                return self.out
            except CudnnUnsupported:
                pass
        if relu or (residual is not None and self.activation is None):   # cuDNN fuses an add and a ReLU only
            try:
                self._fwd_graph = batchnorm_forward(*args, residual=residual, relu=relu, allocator=ctx.allocator)
                return self.out
            except CudnnUnsupported:
                pass
        self._fwd_graph = self._plain_graph(batchnorm_forward, *args, allocator=ctx.allocator)
        if residual is not None or self.activation:   # our kernel does the rest, and writes the mask cuDNN would
            self._tail = get_kernel(_SOURCE, "bn_tail", **defines)
            if masks:
                self.mask = ctx.allocator.zeros(mask_shape(x.shape), np.uint8, "activations")
        return self.out

    def _plain_graph(self, build, *args, **kwargs):
        """The unfused graph; where cuDNN has none either, an error naming the layer and the shape."""
        try:
            return build(*args, **kwargs)
        except CudnnUnsupported as exc:
            raise CudnnUnsupported(f"{self.name}: cuDNN has no batch-norm engine for {self.x.shape[3]} channels of "
                                   f"{self.x.dtype} on this GPU (bf16 reads 8 channels at a time: use a multiple "
                                   f"of 8)") from exc

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad):
        needs_x, needs_res = (needs_input_grad, False) if self.arity == 1 else needs_input_grad
        if ctx.backend.is_gpu and not self.training:
            raise NotImplementedError(f"{self.name}: BatchNorm2D builds no GPU backward in inference mode")
        self.dy = dy
        self.dgamma = ctx.params.grad_view(f"{self.name}.weight")
        self.dbeta = ctx.params.grad_view(f"{self.name}.bias")
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations")   # cuDNN writes it regardless
        # The gradient after the activation: a buffer of its own where the residual reads it or it is undone here.
        self.dz = dy
        self._bwd_graph = None
        if self.activation and (needs_res or not ctx.backend.is_gpu):
            self.dz = ctx.allocator.zeros(dy.shape, dy.dtype, "activations")
        if ctx.backend.is_gpu and self._engine:
            self._activation_here = False
            # dy's two parts added as the kernel loads them, unless the residual reads dy itself (no activation)
            parts = self.gradient_sum.parts if self.gradient_sum is not None else ()
            reads_parts = len(parts) == 2 and (self.activation is not None or not needs_res)
            if reads_parts:
                self.gradient_sum.summed_by_reader = True
            self._bwd_graph = BatchNormBackward(ctx.backend, ctx.allocator, self.kernel_defines(self.x.shape[1:],
                                                self.x.dtype), parts[0] if reads_parts else dy, self.x, self.out,
                                                self.gamma, self.saved_mean, self.saved_inv_std,
                                                self.dx if needs_x else None, self.dgamma, self.dbeta, mask=self.mask,
                                                dz=self.dz if self.activation and needs_res else None,
                                                dy2=parts[1] if reads_parts else None)
        elif ctx.backend.is_gpu:
            self._build_gpu_backward(ctx, needs_res)
        grads = (self.dx if needs_x else None, self.dz if needs_res else None)
        return grads if self.arity == 2 else grads[0]

    def _build_gpu_backward(self, ctx, needs_res: bool):
        args = (runtime_for(ctx.backend, ctx.deterministic), ctx.policy.name)
        stats = (self.gamma, self.saved_mean, self.saved_inv_std, self.dx, self.dgamma, self.dbeta)
        relu = self.activation == "relu"
        self._activation_here = False
        dz = self.dz if self.activation and needs_res else None
        if self.mask is not None:
            try:
                self._bwd_graph = batchnorm_backward(*args, self.dy, self.x, *stats, mask=self.mask, dz=dz,
                                                     allocator=ctx.allocator)
                return
            except CudnnUnsupported:
                pass
        if self.activation in (None, "relu"):   # cuDNN's ReLU gradient from y; ReLU6's is ours
            try:
                self._bwd_graph = batchnorm_backward(*args, self.dy, self.x, *stats, y=self.out if relu else None,
                                                     dz=dz, allocator=ctx.allocator)
                return
            except CudnnUnsupported:
                pass
        if self.activation and self.dz is self.dy:
            self.dz = ctx.allocator.zeros(self.dy.shape, self.dy.dtype, "activations")
        self._activation_here = self.activation is not None
        self._bwd_graph = self._plain_graph(batchnorm_backward, *args, self.dz, self.x, *stats,
                                            allocator=ctx.allocator)

    def forward(self):
        if not self.backend.is_gpu:
            self._forward_numpy()
        elif self._infer is not None:
            grid, block = launch_shape(self.out.size)
            self._infer(grid, block, (self.x, self.gamma, self.beta, self.running_mean, self.running_var,
                                      self.x if self.res is None else self.res, self.out, np.float32(self.epsilon),
                                      np.int64(self.out.size)))
        else:
            self._fwd_graph.run()
            if self._tail is not None:
                grid, block = launch_shape(self.out.size)
                self._tail(grid, block, (self.out, self.out if self.res is None else self.res,
                                         self.out if self.mask is None else self.mask, np.int64(self.out.size)))

    def backward(self):
        if not self.backend.is_gpu:
            self._backward_numpy()
            return
        if self._activation_here:
            activation_backward(self.backend, self.activation, self.out, self.dy, self.dz)
        self._bwd_graph.run()

    def _statistics(self, x):
        """(mean, inverse std) of this step: the batch's in training, the running ones in inference."""
        if not self.training:
            return widen(self.running_mean).astype(x.dtype), 1.0 / np.sqrt(self.running_var + self.epsilon)
        # float64 sums: NumPy adds the rows of an outer-axis reduction one by one, and in float32 a channel whose
        # |mean| is large against its std loses the mean's last digits (100 + 2 N(0, 1): ~1e-4 off over 8192 rows)
        mean = x.mean(axis=(0, 1, 2), dtype=np.float64).astype(x.dtype)
        var = x.var(axis=(0, 1, 2), dtype=np.float64).astype(x.dtype)
        count = x.size // x.shape[3]
        m = self.momentum
        self.running_mean[...] = (1 - m) * self.running_mean + m * mean
        self.running_var[...] = (1 - m) * self.running_var + m * var * count / max(count - 1, 1)
        return mean, 1.0 / np.sqrt(var + self.epsilon)

    def _forward_numpy(self):
        x = widen(self.x)
        mean, inv_std = self._statistics(x)
        self.saved_mean[...], self.saved_inv_std[...] = mean, inv_std
        z = (x - mean) * inv_std * widen(self.gamma) + widen(self.beta)
        if self.res is not None:
            z = z + widen(self.res)
        self.out[...] = z.astype(self.out.dtype)
        if self.activation:
            activation_forward(self.backend, self.activation, self.out, self.out)

    def _backward_numpy(self):
        if self.activation:
            activation_backward(self.backend, self.activation, self.out, self.dy, self.dz)
        x, dz = widen(self.x), widen(self.dz)
        mean, inv_std = widen(self.saved_mean).astype(x.dtype), widen(self.saved_inv_std).astype(x.dtype)
        x_hat = (x - mean) * inv_std
        dbeta, dgamma = dz.sum(axis=(0, 1, 2)), (dz * x_hat).sum(axis=(0, 1, 2))
        self.dbeta[...], self.dgamma[...] = dbeta, dgamma
        scale = widen(self.gamma) * inv_std
        if self.training:
            count = x.size // x.shape[3]
            dx = scale * (dz - dbeta / count - x_hat * dgamma / count)
        else:
            dx = scale * dz   # frozen statistics: the mean and variance are constants
        self.dx[...] = dx.astype(self.dx.dtype)
