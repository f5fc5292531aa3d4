"""Batch normalization over NHWC maps (Ioffe & Szegedy 2015), with ReLU and a residual add fused in.

Training: per channel c over the N*H*W values of the batch, mean m and biased
variance v, x^ = (x - m) / sqrt(v + eps), z = gamma x^ + beta [+ residual],
y = [relu](z). The running statistics follow torch's convention: running =
(1 - momentum) running + momentum batch, the variance unbiased (M / (M - 1)).
Backward from dz = [relu'](dy): dbeta = sum dz, dgamma = sum dz x^,
dx = gamma / (M sqrt(v + eps)) (M dz - dbeta - x^ dgamma); the residual's
gradient is dz itself. Inference (an inference program, `ctx.training` False)
normalizes with the running statistics instead.

On a GPU training runs as cuDNN frontend graphs (cudnn_batchnorm.py: BN + add
+ ReLU forward and dReLU + dBN backward, seed note 002's fusions, the ReLU's
gradient carried from forward to backward as a bit mask), falling back
to the plain BN graphs plus this module's element-wise kernels for a variant
cuDNN cannot fuse; inference is one element-wise kernel. gamma and beta are
read in float32 from the master weights under every precision. The NumPy
backend computes the formulas above (the gradient checks' reference).
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops.cudnn import CudnnUnsupported, runtime_for
from ..ops.cudnn_batchnorm import batchnorm_backward, batchnorm_forward, mask_shape
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape
from ..runtime.params import ParamSpec
from .activations import activation_backward
from .base import BuildContext, Layer

_SOURCE = r"""
// y = [relu](y + residual), in place: the tail of an unfused BN + add + ReLU.
extern "C" __global__ void add_relu(ELEM_T* y, const ELEM_T* residual, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float v = load_f(y, i) + (HAS_RESIDUAL ? load_f(residual, i) : 0.f);
        store_f(y, i, RELU ? fmaxf(v, 0.f) : v);
    }
}
// Inference: y = [relu](gamma (x - mean) / sqrt(var + eps) + beta [+ residual]) with the running statistics.
extern "C" __global__ void bn_inference(const ELEM_T* x, const float* gamma, const float* beta, const float* mean,
                                        const float* var, const ELEM_T* residual, ELEM_T* y, float eps, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % CHANNELS);
        float v = (load_f(x, i) - mean[c]) * rsqrtf(var[c] + eps) * gamma[c] + beta[c];
        if (HAS_RESIDUAL) v += load_f(residual, i);
        store_f(y, i, RELU ? fmaxf(v, 0.f) : v);
    }
}
"""
ACTIVATIONS = (None, "relu")


class BatchNorm2D(Layer):
    """BN over (H, W, C) samples; `residual=True` makes it a two-input node: relu(BN(x) + residual)."""

    def __init__(self, activation: str | None = None, residual: bool = False, momentum: float = 0.1,
                 epsilon: float = 1e-5, name: str = ""):
        checks.choice("BatchNorm2D activation", activation, ACTIVATIONS, "what the cuDNN graphs fuse")
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
        return dict(ELEM_T=ctype(dtype), HAS_RESIDUAL=int(self.residual), RELU=int(self.activation == "relu"),
                    CHANNELS=input_shape[2])

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
        if not ctx.backend.is_gpu:
            return self.out
        defines = self.kernel_defines(x.shape[1:], x.dtype)
        if not self.training:
            self._infer = get_kernel(_SOURCE, "bn_inference", **defines)
            return self.out
        args = (runtime_for(ctx.backend), ctx.policy.name, x, self.gamma, self.beta, self.running_mean,
                self.running_var, self.out, self.saved_mean, self.saved_inv_std, self.epsilon, self.momentum)
        relu = self.activation == "relu"
        if relu and channels % 8 == 0:   # the ReLU's bit mask lets cuDNN fuse its gradient into BN's backward
            mask = ctx.allocator.zeros(mask_shape(x.shape), np.uint8, "activations")
            try:
                self._fwd_graph = batchnorm_forward(*args, residual=residual, relu=True, mask=mask,
                                                    allocator=ctx.allocator)
                self.mask = mask
                return self.out
            except CudnnUnsupported:
                pass
        try:
            self._fwd_graph = batchnorm_forward(*args, residual=residual, relu=relu, allocator=ctx.allocator)
        except CudnnUnsupported:
            self._fwd_graph = self._plain_graph(batchnorm_forward, *args, allocator=ctx.allocator)
            if residual is not None or self.activation:
                self._tail = get_kernel(_SOURCE, "add_relu", **defines)
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
        # The gradient after the ReLU: a buffer of its own where the residual reads it or the ReLU is undone here.
        self.dz = dy
        self._bwd_graph = None
        if self.activation and (needs_res or not ctx.backend.is_gpu):
            self.dz = ctx.allocator.zeros(dy.shape, dy.dtype, "activations")
        if ctx.backend.is_gpu:
            self._build_gpu_backward(ctx, needs_res)
        grads = (self.dx if needs_x else None, self.dz if needs_res else None)
        return grads if self.arity == 2 else grads[0]

    def _build_gpu_backward(self, ctx, needs_res: bool):
        args = (runtime_for(ctx.backend), ctx.policy.name)
        stats = (self.gamma, self.saved_mean, self.saved_inv_std, self.dx, self.dgamma, self.dbeta)
        relu = self.activation == "relu"
        self._drelu_here = False
        dz = self.dz if relu and needs_res else None
        if self.mask is not None:
            try:
                self._bwd_graph = batchnorm_backward(*args, self.dy, self.x, *stats, mask=self.mask, dz=dz,
                                                     allocator=ctx.allocator)
                return
            except CudnnUnsupported:
                pass
        try:
            self._bwd_graph = batchnorm_backward(*args, self.dy, self.x, *stats, y=self.out if relu else None,
                                                 dz=dz, allocator=ctx.allocator)
        except CudnnUnsupported:
            if relu and self.dz is self.dy:
                self.dz = ctx.allocator.zeros(self.dy.shape, self.dy.dtype, "activations")
            self._drelu_here = relu
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
                                         np.int64(self.out.size)))

    def backward(self):
        if not self.backend.is_gpu:
            self._backward_numpy()
            return
        if self._drelu_here:
            activation_backward(self.backend, "relu", self.out, self.dy, self.dz)
        self._bwd_graph.run()

    def _statistics(self, x):
        """(mean, inverse std) of this step: the batch's in training, the running ones in inference."""
        if not self.training:
            return widen(self.running_mean).astype(x.dtype), 1.0 / np.sqrt(self.running_var + self.epsilon)
        mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
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
        if self.activation:
            z = np.maximum(z, 0.0)
        self.out[...] = z.astype(self.out.dtype)

    def _backward_numpy(self):
        if self.activation:
            activation_backward(self.backend, "relu", self.out, self.dy, self.dz)
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
