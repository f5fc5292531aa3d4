"""Layer normalization over the last axis (Ba, Kiros & Hinton 2016), forward and backward.

y = (x - mean) * rstd * gamma + beta per row of d features, rstd = 1/sqrt(var + eps)
(biased variance, as torch). Backward, with xhat = (x - mean) * rstd and g = dy * gamma:
dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dgamma = sum over rows of dy * xhat,
dbeta = sum of dy. On a GPU one warp owns a row in the forward and in dx, each lane
moving up to 4 features in one access (mean and rstd saved for backward). Where a
lane can keep its part of a row in registers (up to 512 features), the forward
reads x once for its mean, variance and output, and dx, dgamma and dbeta take one
launch (`layernorm_bwd_grads`): the warps add dy * xhat and dy into
their lanes' column sums as they go, the blocks' sums meet in the last block, in a
fixed order (no float atomics), or, in a training program, in its one launch
after the backward pass (ops/partial_sums.py: nothing reads them before the
optimizer, so the launch need not wait for a last block). Wider rows, and a
first LayerNorm (no dx), take dgamma and dbeta from a second kernel in
reductions.py's one-launch column-sum scheme, which recomputes xhat from x and
sums dy * xhat and dy side by side.
Where a program gives it the residual Add below (post-LN: LayerNorm(x +
sublayer(x))), the forward also computes that sum, in the same pass that starts
the statistics. Where a Linear layer or an attention below that Add feeds
nothing else, the gradient of its last bias is the column sum of this layer's
dx (the Add hands dx to both its inputs): the one-launch backward adds it as a
third column sum (BIAS_SUM), and that weight gradient runs without a bias
epilogue or column sum. On the NumPy backend all of it is array arithmetic.
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops.reductions import ColumnSum, deferred, plan_chunks
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, multiprocessor_count, vector_width
from ..runtime.params import ParamSpec
from .base import BuildContext, Layer
from .layernorm_kernels import FORWARD_SOURCE, FUSED_SOURCE, SOURCE
from .merge import add_into

_ROWS_PER_BLOCK = 8
EPSILON = 1e-5   # torch.nn.LayerNorm's default
_HELD_MAX_DIM = 512   # a lane keeps at most 16 features of its row in registers (forward; one-launch backward)
_SHARED_BYTES = 48 * 1024   # a block's shared memory without the opt-in attribute


def held_packs(dim: int, width: int) -> int:
    """A lane's packs of `width` features where it keeps its part of a row in registers; 0 above _HELD_MAX_DIM
    (the forward reads x again, the backward takes two launches)."""
    return -(-dim // (32 * width)) if dim <= _HELD_MAX_DIM else 0


def partial_stride(dim: int, sums: int) -> int:
    """The floats of a block's row of partials in layernorm_bwd_grads: its sums * dim column sums rounded up to 4,
    so the last block reads them as float4."""
    return -(-sums * dim // 4) * 4


def fused_grid(rows: int, dim: int, sums: int, blocks: int) -> tuple[int, int, int]:
    """(warps a block, rows a block, blocks) of layernorm_bwd_grads with `sums` column sums a feature, at most
    `blocks` blocks (one an SM: the fp32 kernel's 71-80 registers a thread let one 512-thread block on an SM).
    Of 16, 8 and 4 warps, each taking a row at a time, whose column sums fit 48 KB of shared memory (dynamic: the
    kernel declares nothing static), the one whose blocks take the fewest rows each, the most warps of those (the
    fewest blocks' partials to add): rows too few for a block of 16 warps on every SM (1,024 at seq 64) go to
    smaller blocks on more SMs."""
    best = None
    for warps in (16, 8, 4):
        if warps * partial_stride(dim, sums) * 4 > _SHARED_BYTES:
            continue
        rows_per_block = warps * max(1, -(-rows // (warps * blocks)))
        if best is None or rows_per_block < best[1]:
            best = warps, rows_per_block, -(-rows // rows_per_block)
    return best


class LayerNorm(Layer):
    """Normalizes each sample's last axis; weight (gamma) starts at one, bias (beta) at zero, torch's names."""

    residual = None   # set by a program: the Add below, whose sum this layer's forward computes
    gradient_sum = None   # set by a training program: the GradientSum of dy, which backward may do itself
    bias_of = None   # set by a program: a bias below that Add (its parameter's name) whose gradient is dx's sum
    wiring = ("residual", "gradient_sum", "bias_of")

    def __init__(self, epsilon: float = EPSILON, name: str = ""):
        epsilon = checks.number("LayerNorm epsilon", epsilon, above=0.0)
        self.epsilon, self.name = epsilon, name

    def param_specs(self, input_shape):
        d = input_shape[-1]
        return [ParamSpec(f"{self.name}.weight", (d,), "ones"), ParamSpec(f"{self.name}.bias", (d,), "zeros")]

    def forward_flops(self, input_shape):
        return 0   # element-wise, no multiply-add GEMM work

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.dim = ctx.backend, x.shape[-1]
        self.x = x.reshape(-1, self.dim)
        self.rows = self.x.shape[0]
        self.gamma = ctx.params.compute_view(f"{self.name}.weight")
        self.beta = ctx.params.compute_view(f"{self.name}.bias")
        self.out = ctx.allocator.zeros(x.shape, x.dtype, "activations")
        self.mean = ctx.allocator.zeros((self.rows,), np.float32, "activations")
        self.rstd = ctx.allocator.zeros((self.rows,), np.float32, "activations")
        self._blocks = (-(-self.rows // _ROWS_PER_BLOCK),)
        self._addends = () if self.residual is None else (self.residual.a, self.residual.b)
        if ctx.backend.is_gpu:
            width = vector_width(self.dim, self.x, self.gamma, self.beta, self.out, *self._addends)
            defines = dict(ELEM_T=ctype(x.dtype), VEC=width, PACKS=held_packs(self.dim, width))
            if self._addends:
                self._fwd = get_kernel(FORWARD_SOURCE, "layernorm_add_fwd", **defines)
            else:
                self._fwd = get_kernel(FORWARD_SOURCE, "layernorm_fwd", **defines)
            # the launch's arguments, fixed with the buffers: a step only launches
            self._fwd_args = (*self._addends, self.x, self.gamma, self.beta, self.out, self.mean, self.rstd,
                              np.int32(self.rows), np.int32(self.dim), np.float32(self.epsilon))
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy.reshape(-1, self.dim)
        self.dx = ctx.allocator.zeros(dy.shape, dy.dtype, "activations") if needs_input_grad else None
        self.dgamma = ctx.params.grad_view(f"{self.name}.weight")
        self.dbeta = ctx.params.grad_view(f"{self.name}.bias")
        self.fused = None   # (warps, rows a block, blocks) where dx and the parameter gradients take one launch
        self.dbias = self._bias_sum = None   # bias_of's gradient, and its own column sum where one launch cannot
        if self.bias_of is not None:
            if self.dx is None:
                raise ValueError(f"{self.name}: the gradient of {self.bias_of!r} is dx's column sum, but this "
                                 "LayerNorm computes no dx")
            self.dbias = ctx.params.grad_view(self.bias_of)
        if ctx.backend.is_gpu:
            arrays = (self.x, self.gamma, self.dy) + ((self.dx,) if self.dx is not None else ())
            parts = self.gradient_sum.parts if self.gradient_sum is not None else ()
            width = vector_width(self.dim, *arrays, *parts)
            defines = dict(ELEM_T=ctype(dy.dtype), VEC=width)
            packs = held_packs(self.dim, width)
            if self.dx is not None and packs:
                sums = 2 if self.dbias is None else 3
                self.fused = warps, rows_per_block, blocks = fused_grid(self.rows, self.dim, sums,
                                                                        multiprocessor_count())
                dy_parts = (self.dy, self.dy)   # the launch's dy and dy2; the same buffer twice: dy alone
                if len(parts) == 2:   # dy's two parts are added here, as they are loaded: no add2 launch
                    dy_parts = tuple(part.reshape(-1, self.dim) for part in parts)
                    self.gradient_sum.summed_by_reader = True
                # each block's dy * xhat sums in columns [0, dim) of its row, its dy sums in [dim, 2 dim)[, its
                # dx sums in [2 dim, 3 dim)]
                stride = partial_stride(self.dim, sums)
                self.partials = ctx.allocator.zeros((blocks, stride), np.float32, "workspace")
                self.counters = ctx.allocator.zeros((1,), np.uint32, "workspace")
                dbias = self.dbeta if self.dbias is None else self.dbias   # unread without BIAS_SUM
                # several blocks' sums are finished by the program's one launch where it takes them
                segments = [(0, self.dgamma), (self.dim, self.dbeta)] + [(2 * self.dim, dbias)] * (sums - 2)
                defer = deferred(ctx.sums, blocks, self.partials, segments)
                self._bwd = get_kernel(FUSED_SOURCE, "layernorm_bwd_grads", PACKS=packs,
                                       DY_PARTS=2 if len(parts) == 2 else 1, BIAS_SUM=sums - 2, DEFER=int(defer),
                                       **defines)
                # the launch's grid, block and arguments, fixed with the buffers: a step only launches
                self._fused_launch = ((blocks,), (32 * warps,), (
                    self.x, self.gamma, *dy_parts, self.mean, self.rstd, self.dx, self.dgamma, self.dbeta, dbias,
                    self.partials, self.counters, np.int32(self.rows), np.int32(self.dim), np.int32(rows_per_block),
                    np.int32(stride)))
                self._fused_shared = 4 * warps * stride
                return self.dx
            if self.dbias is not None:   # rows too wide for one launch: the Linear's column sum, run here
                self._bias_sum = ColumnSum(ctx.backend, ctx.allocator, self.dx.reshape(-1, self.dim), self.dbias,
                                           sums=ctx.sums)
            self._bwd = get_kernel(SOURCE, "layernorm_bwd", **defines)
            self.plan = plan_chunks(ctx.backend, self.rows, self.dim)
            # dy * xhat partials in columns [0, dim) of each chunk's row, dy partials in [dim, 2 dim).
            self.partials, self.counters = self.plan.workspace(ctx.allocator, self.dim, sums=2)
            defer = self.plan.defer(ctx.sums, self.partials, [(0, self.dgamma), (self.dim, self.dbeta)])
            self._param_grads = get_kernel(SOURCE, "layernorm_param_grads", DEFER=int(defer), **defines)
            self._dx_args = (self.x, self.gamma, self.dy, self.mean, self.rstd, self.dx, np.int32(self.rows),
                             np.int32(self.dim))
            self._param_args = (self.x, self.dy, self.mean, self.rstd, self.dgamma, self.dbeta, self.partials,
                                self.counters, np.int32(self.rows), np.int32(self.dim), *self.plan.grid_args())
        return self.dx

    def forward(self):
        if not self.backend.is_gpu:
            if self._addends:
                add_into(self.backend, *self._addends, self.residual.out)
            x = widen(self.x)
            mean = x.mean(axis=1, keepdims=True)
            rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + self.epsilon)
            y = (x - mean) * rstd * widen(self.gamma) + widen(self.beta)
            self.out.reshape(-1, self.dim)[...] = y.astype(self.out.dtype)
            self.mean[...], self.rstd[...] = mean[:, 0], rstd[:, 0]
            self._rstd_exact = rstd   # float64 under the gradient checks
            return
        self._fwd(self._blocks, (32 * _ROWS_PER_BLOCK,), self._fwd_args)

    def backward(self):
        if not self.backend.is_gpu:
            x, dy = widen(self.x), widen(self.dy)
            rstd = self._rstd_exact
            xhat = (x - x.mean(axis=1, keepdims=True)) * rstd
            g = dy * widen(self.gamma)
            self.dgamma[...] = (dy * xhat).sum(axis=0)
            self.dbeta[...] = dy.sum(axis=0)
            if self.dx is not None:
                dx = rstd * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
                self.dx.reshape(-1, self.dim)[...] = dx.astype(self.dx.dtype)
            if self.dbias is not None:   # dx as written, as the Linear's own column sum would read it
                self.dbias[...] = widen(self.dx.reshape(-1, self.dim)).sum(axis=0)
            return
        if self.fused is not None:
            self._bwd(*self._fused_launch, shared_mem=self._fused_shared)
            return
        if self.dx is not None:
            self._bwd(self._blocks, (32 * _ROWS_PER_BLOCK,), self._dx_args)
        self.plan.launch(self._param_grads, self._param_args, sums=2)
        if self._bias_sum is not None:
            self._bias_sum.run()
