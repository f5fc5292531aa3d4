"""2-D convolution on NHWC activations: cuDNN frontend graphs on a GPU, im2col on NumPy.

Weights are KRSC, (filters, kh, kw, in_channels / groups): cuDNN's filter layout
for NHWC data, so the graphs read the flat parameter buffer in place; torch's
(out, in / groups, kh, kw) is `w.transpose(0, 3, 1, 2)`. Grouped convolution
(Krizhevsky et al. 2012; depthwise when groups = in_channels = filters, as in
MobileNetV2, Sandler et al. 2018) splits the input channels and the filters
into `groups` blocks, block g of the filters reading block g of the input
only. The cuDNN graph API has no group count: it infers the groups from the
image's channels over the filter's (in_channels / groups), the convention of
PyTorch's cuDNN v8 path too, so the same graphs serve every group count.
Glorot/Xavier uniform init with fan_in = kh kw in / groups and fan_out = kh kw
out (torch's xavier_uniform_, Keras' glorot_uniform), or `init="he_fan_out"`
(torchvision's kaiming_normal_ in fan-out mode, for deep stacks without batch
norm such as VGG), zero bias.

Forward is one cuDNN graph: conv, + bias, + ReLU when the layer asks for the
activation (seed note 001: conv + bias + ReLU fused into a single forward
graph). Backward: ReLU's gradient from the saved output and the bias gradient
as its column sum over (N*H*W, C) in one pass (activations.BackwardColumnSum;
a ColumnSum alone without the ReLU; deterministic: cuDNN 9.19's reduction
graph has no fp32 engine), the weight-gradient graph, and the
data-gradient graph only where the layer below needs it; the weight gradient
(and a bias gradient without ReLU) is `backward_params()`, run after it. Under bf16 the weight
gradient lands in a bf16 scratch that is widened into the fp32 master
gradient, as torch's autocast does (in a training program, every
convolution's at once: ops/widen.py): cuDNN's bf16-in/fp32-out wgrad engines
exist but are runtime-compiled kernels that took 0.93 ms of ResNet-50's
3.2 ms bf16 step on an H100, against ~0.3 ms for the bf16-out ones. A first
layer with few filter taps (no input gradient; MNIST's 3x3x1) replaces all of
that with direct_wgrad.py's single fused pass. A depthwise layer (groups =
channels = filters, MobileNetV2) also builds depthwise.py's kernels and keeps,
op by op, whichever of them and cuDNN's graphs measures faster (cuDNN's grouped
engines are not always fast at this memory-bound shape).
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops import autotune, depthwise, direct_wgrad
from ..ops.cudnn import CudnnUnsupported, conv_data_grad, conv_forward, conv_weight_grad, graph_key, runtime_for
from ..ops.reductions import ColumnSum
from ..runtime.backend import widen
from ..runtime.params import ParamSpec
from .activations import BackwardColumnSum, activation_backward, activation_forward
from .base import BuildContext, Layer
from .geometry import add_windows, pad, resolve_window, windows

ACTIVATIONS = (None, "relu")   # what a cuDNN forward graph fuses after the bias
INITS = ("glorot", "he_fan_out")


class Conv2D(Layer):
    def __init__(self, filters: int, kernel_size=3, stride=1, padding="same", activation: str | None = None,
                 use_bias: bool = True, groups: int = 1, init: str = "glorot", name: str = ""):
        filters, groups = checks.whole("Conv2D filters", filters), checks.whole("Conv2D groups", groups)
        use_bias = checks.flag("Conv2D use_bias", use_bias)
        if filters % groups:
            raise ValueError(f"Conv2D filters={filters} is not a multiple of groups={groups}")
        checks.choice("Conv2D activation", activation, ACTIVATIONS, "what a cuDNN forward graph fuses")
        checks.choice("Conv2D init", init, INITS)
        self.init = init
        self.filters, self.kernel_size, self.stride, self.padding = int(filters), kernel_size, stride, padding
        self.activation, self.use_bias, self.groups, self.name = activation, use_bias, int(groups), name
        resolve_window("Conv2D", (1 << 20, 1 << 20), kernel_size, stride, padding)   # bad arguments fail here

    def _window(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: Conv2D takes (height, width, channels) samples, got {input_shape}")
        if input_shape[2] % self.groups:
            raise ValueError(f"{self.name}: {input_shape[2]} input channels do not split into {self.groups} groups")
        return resolve_window(self.name or "Conv2D", input_shape[:2], self.kernel_size, self.stride, self.padding)

    def param_specs(self, input_shape):
        window = self._window(input_shape)
        kh, kw = window.kernel
        channels = input_shape[2] // self.groups   # each filter reads its group's channels
        specs = [ParamSpec(f"{self.name}.weight", (self.filters, kh, kw, channels), self.init,
                           kh * kw * channels, kh * kw * self.filters)]
        if self.use_bias:
            specs.append(ParamSpec(f"{self.name}.bias", (self.filters,), "zeros"))
        return specs

    def output_shape(self, input_shape):
        return self._window(input_shape).output_hw + (self.filters,)

    def forward_flops(self, input_shape):
        window = self._window(input_shape)
        out_h, out_w = window.output_hw
        return 2 * out_h * out_w * self.filters * window.kernel[0] * window.kernel[1] * input_shape[2] // self.groups

    def _direct_wgrad_fits(self, window, channels: int) -> bool:
        return self.groups == 1 and direct_wgrad.fits(window, channels, self.filters)

    def takes_direct_wgrad(self) -> bool:
        """Built: whether its weight gradient fits the direct kernels (taken on a GPU where no input gradient
        is needed)."""
        return self._direct_wgrad_fits(self.window, self.x.shape[3])

    def direct_wgrad_defines(self, input_shape, dtype, pool=None) -> dict | None:
        """The direct weight-gradient kernels' defines (a first layer on a GPU; `pool`: the window of a max pool
        whose gradient they read, and the forward kernel fused with that pool compiles with the same); None where
        that path is not taken."""
        window = self._window(tuple(input_shape))
        if not self._direct_wgrad_fits(window, input_shape[2]):
            return None
        return direct_wgrad.kernel_defines(window, input_shape, self.filters, dtype, self.activation == "relu",
                                           self.use_bias, pool)

    def depthwise_defines(self, input_shape, dtype) -> dict | None:
        """The depthwise kernels' defines (a depthwise layer on a GPU); None where the layer is not depthwise."""
        window = self._window(tuple(input_shape))
        if not depthwise.fits(self.groups, input_shape[2], self.filters, window):
            return None
        return depthwise.kernel_defines(window, input_shape, dtype, self.use_bias, self.activation == "relu")

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.policy = ctx.backend, ctx.policy
        self.window = self._window(tuple(x.shape[1:]))
        self.x = x
        self.weight = ctx.params.compute_view(f"{self.name}.weight")
        self.bias = ctx.params.compute_view(f"{self.name}.bias") if self.use_bias else None
        self.out = ctx.allocator.zeros((x.shape[0],) + self.window.output_hw + (self.filters,),
                                       ctx.policy.compute_dtype, "activations")
        self._forward = self._depthwise = None
        if ctx.backend.is_gpu:
            relu = self.activation == "relu"
            if depthwise.fits(self.groups, x.shape[3], self.filters, self.window):
                self._depthwise = depthwise.DepthwiseKernels(ctx.allocator, self.window, x, self.weight, self.out,
                                                             self.bias, relu)   # defines: depthwise_defines
            runtime = runtime_for(ctx.backend, ctx.deterministic)
            graph = self._cudnn(lambda: conv_forward(runtime, ctx.policy.name, self.window, x, self.weight, self.out,
                                                     self.bias, relu, ctx.allocator))
            self._forward = self._faster_of(ctx, "forward", graph and graph.run,
                                            self._depthwise and self._depthwise.forward, bias=self.use_bias, relu=relu)
        return self.out

    def _cudnn(self, build):
        """The cuDNN graph `build()` makes; None where cuDNN has no engine and the depthwise kernels serve."""
        try:
            return build()
        except CudnnUnsupported:
            if self._depthwise is None:
                raise
            return None

    def _faster_of(self, ctx, op: str, cudnn, direct, **extra):
        key = graph_key(f"conv_{op}_choice", ctx.policy.name, self.window, x=self.x, w=self.weight)
        if not ctx.deterministic:   # cuDNN's side may run other engines: a choice of its own
            extra["deterministic"] = False
        return autotune.FasterOf(ctx.backend, key + tuple(sorted(extra.items())), {"cudnn": cudnn, "direct": direct})

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        self.grad_w = ctx.params.grad_view(f"{self.name}.weight")
        grad_b = ctx.params.grad_view(f"{self.name}.bias") if self.use_bias else None
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations") if needs_input_grad else None
        self._direct = self._grad_b = self._grad_w = self._grad_x = self._grad_z = None
        self._widened_by_program = False
        direct = self.takes_direct_wgrad()
        if isinstance(dy, direct_wgrad.PooledGradient) and not (ctx.backend.is_gpu and not needs_input_grad and direct):
            raise ValueError(f"{self.name}: a max pool's gradient is read directly only by the direct weight "
                             "gradient (a GPU, no input gradient, few taps)")
        if ctx.backend.is_gpu and not needs_input_grad and direct:
            self._direct = direct_wgrad.DirectWeightGrad(ctx, self.window, self.x, self.out, dy, self.grad_w, grad_b,
                                                         self.activation == "relu")
            return None
        # The gradient at the convolution's output, before the fused activation.
        self.dz = ctx.allocator.zeros(dy.shape, dy.dtype, "activations") if self.activation else dy
        if self.activation and self.use_bias:
            self._grad_z = BackwardColumnSum(ctx.backend, ctx.allocator, self.activation, self.out, dy, self.dz,
                                             grad_b, sums=ctx.sums)
        elif self.use_bias:
            self._grad_b = ColumnSum(ctx.backend, ctx.allocator, self.dz.reshape(-1, self.filters), grad_b,
                                     sums=ctx.sums)
        if ctx.backend.is_gpu:
            runtime, precision, dw = runtime_for(ctx.backend, ctx.deterministic), ctx.policy.name, self._depthwise
            self.grad_w_compute = self.grad_w
            if self.dz.dtype != self.grad_w.dtype:   # bf16: a bf16 weight gradient, widened after
                self.grad_w_compute = ctx.allocator.zeros(self.grad_w.shape, self.dz.dtype, "workspace")
            self._cudnn_grad_w = self._cudnn(lambda: conv_weight_grad(runtime, precision, self.window, self.x, self.dz,
                                                                      self.grad_w_compute, ctx.allocator))
            # bf16 without a depthwise way to time against: the program widens every such gradient in one launch
            self._widened_by_program = (self._cudnn_grad_w is not None and not dw and ctx.widening is not None
                                        and self.grad_w_compute is not self.grad_w
                                        and ctx.widening.add(self.grad_w_compute, self.grad_w))
            self._grad_w = self._faster_of(ctx, "wgrad", self._cudnn_grad_w and self._cudnn_weight_grad,
                                           dw and (lambda: dw.wgrad(self.dz, self.grad_w)))
            if self.dx is not None:
                graph = self._cudnn(lambda: conv_data_grad(runtime, precision, self.window, self.dz, self.weight,
                                                           self.dx, ctx.allocator))
                self._grad_x = self._faster_of(ctx, "dgrad", graph and graph.run,
                                               dw and (lambda: dw.dgrad(self.dz, self.dx)))
        return self.dx

    def _cudnn_weight_grad(self):
        self._cudnn_grad_w.run()
        if self.grad_w_compute is not self.grad_w and not self._widened_by_program:
            self.backend.xp.copyto(self.grad_w, self.grad_w_compute)

    def forward(self):
        if self._forward is not None:
            self._forward.run()
            return
        n, out_h, out_w = self.out.shape[:3]
        z = np.matmul(self._columns(), self._grouped_weight().transpose(0, 2, 1))   # (G, N*Ho*Wo, K/G)
        z = z.transpose(1, 0, 2).reshape(n, out_h, out_w, self.filters)   # filters are group-major
        if self.bias is not None:
            z += widen(self.bias)
        if self.activation:
            activation_forward(self.backend, self.activation, z, z)
        self.out[...] = z.astype(self.out.dtype)

    def backward(self):
        """The activation's gradient and the data gradient: the chain the layers below wait for."""
        if self._direct is not None:
            return
        if self._grad_z is not None:
            self._grad_z.run()   # the bias gradient too
        elif self.activation:
            activation_backward(self.backend, self.activation, self.out, self.dy, self.dz)
        if self.dx is None:
            return
        if self.backend.is_gpu:
            self._grad_x.run()
            return
        n, out_h, out_w = self.out.shape[:3]
        kh, kw = self.window.kernel
        grad_cols = np.matmul(self._grouped_dz(), self._grouped_weight())   # (G, N*Ho*Wo, kh*kw*C/G)
        grad_cols = grad_cols.reshape(self.groups, n, out_h, out_w, kh, kw, -1)
        grad_cols = grad_cols.transpose(1, 2, 3, 4, 5, 0, 6).reshape(n, out_h, out_w, kh, kw, -1)   # g-major channels
        self.dx[...] = add_windows(grad_cols, self.window).astype(self.dx.dtype)

    def backward_params(self):
        """The weight gradient from the saved input and dz; the bias gradient unless backward() took it."""
        if self._direct is not None:
            self._direct.run()
            return
        if self._grad_b is not None:
            self._grad_b.run()
        if self.backend.is_gpu:
            self._grad_w.run()
            return
        grad = np.matmul(self._grouped_dz().transpose(0, 2, 1), self._columns())   # (G, K/G, kh*kw*C/G)
        self.grad_w[...] = grad.reshape(self.grad_w.shape)

    # NumPy im2col, one matrix per group (one group is the plain convolution); rows are output pixels.
    def _columns(self):
        """(G, N*Ho*Wo, kh*kw*C/G): each output pixel's window over its group's channels."""
        cols = windows(pad(widen(self.x), self.window), self.window)   # (N, Ho, Wo, kh, kw, C)
        n, out_h, out_w, kh, kw, _ = cols.shape
        cols = cols.reshape(n, out_h, out_w, kh, kw, self.groups, -1).transpose(5, 0, 1, 2, 3, 4, 6)
        return cols.reshape(self.groups, n * out_h * out_w, -1)

    def _grouped_weight(self):
        """(G, K/G, kh*kw*C/G)."""
        return widen(self.weight).reshape(self.groups, self.filters // self.groups, -1)

    def _grouped_dz(self):
        """(G, N*Ho*Wo, K/G)."""
        return widen(self.dz).reshape(-1, self.groups, self.filters // self.groups).transpose(1, 0, 2)
