"""Where branches meet: the residual `Add` layer, and the sum of several gradients of one output.

Add (He et al. 2016, the identity shortcut y = F(x) + x) takes two outputs of
one shape. Its backward computes nothing: the gradient of a sum reaches both
addends unchanged, so both input gradients are the output gradient's buffer.
`GradientSum` is the other half: an output read by several nodes gets the sum
of their gradients, one element-wise pass over all of them (accumulated in
float32, stored in the compute dtype).
"""
from __future__ import annotations


from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, packed_launch
from .base import BuildContext, Layer

_SOURCE = r"""
// VEC values a thread, one vector load of each addend and one store.
extern "C" __global__ void add2(const ELEM_T* a, const ELEM_T* b, ELEM_T* out, long long packs) {
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < packs;
         n += (long long)gridDim.x * blockDim.x) {
        const Pack<ELEM_T, VEC> x = load_pack<ELEM_T, VEC>(a, n * VEC), y = load_pack<ELEM_T, VEC>(b, n * VEC);
        Pack<ELEM_T, VEC> s;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(s.v, k, load_f(x.v, k) + load_f(y.v, k));
        store_pack(out, n * VEC, s);
    }
}
"""


def add_into(backend, a, b, out):
    """out = a + b element-wise (out may be a or b)."""
    if not backend.is_gpu:
        out[...] = (widen(a) + widen(b)).astype(out.dtype)
        return
    width, grid, block, packs = packed_launch(out.size, a, b, out, widest=16 // out.itemsize)
    get_kernel(_SOURCE, "add2", ELEM_T=ctype(out.dtype), VEC=width)(grid, block, (a, b, out, packs))


class Add(Layer):
    """y = a + b for two inputs of one shape."""

    arity = 2
    summed_by_reader = False   # set by a program whose LayerNorm above computes this sum in its forward
    wiring = ("summed_by_reader",)

    def __init__(self, name: str = ""):
        self.name = name

    def output_shape(self, a_shape, b_shape):
        if tuple(a_shape) != tuple(b_shape):
            raise ValueError(f"Add needs inputs of one shape, got {tuple(a_shape)} and {tuple(b_shape)}")
        return tuple(a_shape)

    def build_forward(self, ctx: BuildContext, a, b):
        self.backend, self.a, self.b = ctx.backend, a, b
        self.out = ctx.allocator.zeros(a.shape, a.dtype, "activations")
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad):
        return tuple(dy if need else None for need in needs_input_grad)

    def forward(self):
        if not self.summed_by_reader:
            add_into(self.backend, self.a, self.b, self.out)

    def backward(self):
        """Nothing to compute: both input gradients are the output gradient."""


class GradientSum:
    """`out` = the sum of the gradient buffers `parts` (two or more, one shape)."""

    def __init__(self, ctx: BuildContext, parts: list):
        if len(parts) < 2 or len({tuple(p.shape) for p in parts}) != 1:
            raise ValueError(f"GradientSum adds two or more gradients of one shape, got {[p.shape for p in parts]}")
        self.backend, self.parts = ctx.backend, list(parts)
        self.out = ctx.allocator.zeros(parts[0].shape, parts[0].dtype, "activations")
        self.summed_by_reader = False   # set by a layer whose backward adds the parts as it loads them

    def run(self):
        if self.summed_by_reader:
            return
        add_into(self.backend, self.parts[0], self.parts[1], self.out)
        for part in self.parts[2:]:
            add_into(self.backend, self.out, part, self.out)
