"""GEMMs into preallocated outputs: cuBLASLt through nvmath-python on a GPU.

`Gemm(out, a, b, bias)` is planned once and computes `out = a @ b (+ bias)`
on every `run()`, where a and b may be transposed views of row-major arrays.
cuBLASLt is column-major and its bias epilogue runs along the result's first
(M) dimension, so we ask it for out^T = b^T a^T written in place into the
transposed view of `out`: the bias then runs along `out`'s columns, which is
what a dense layer needs (docs/architecture.md, "Facts measured on the GPU
machines"). nvmath's execute() is capture-safe, unlike CuPy's cuBLAS calls,
and allocates nothing when in place.
On the NumPy backend the same object computes with np.matmul in float32.

Each plan's cuBLASLt workspace comes from CuPy's pool at the first execute;
it is capped (nvmath would allow 80% of the device and size the workspace for
the hungriest candidate algorithm) and booked with the allocator, so the
engine's memory report covers it before anything runs.
"""
from __future__ import annotations

from ..runtime.backend import widen

WORKSPACE_LIMIT = 32 << 20   # bytes per GEMM: PyTorch's default cuBLAS/cuBLASLt workspace on Hopper


def workspace_bytes(mm) -> int:
    """The workspace nvmath sized at plan() (a Workspace object since nvmath 1.0, an int before)."""
    workspace = getattr(mm, "workspace", None)
    if workspace is not None and hasattr(workspace, "size"):
        return int(workspace.size)
    return int(getattr(mm, "workspace_size", 0) or 0)


class Gemm:
    """out = a @ b (+ bias broadcast over rows), planned once, run many times."""

    def __init__(self, backend, policy, out, a, b, bias=None, allocator=None):
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise ValueError("Gemm takes 2-D operands")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or out.shape != (m, n):
            raise ValueError(f"Gemm shapes do not chain: {a.shape} @ {b.shape} -> {out.shape}")
        if bias is not None and bias.shape != (n,):
            raise ValueError(f"Gemm bias shape {bias.shape}, expected ({n},)")
        self.backend, self.policy = backend, policy
        self.out, self.a, self.b, self.bias = out, a, b, bias
        self.flops = 2 * m * n * k
        self._mm = self._plan() if backend.is_gpu else None
        self._allocator, self._booked = allocator, 0
        self._book_workspace()

    def _book_workspace(self):
        """Keep the allocator's "workspace" entry equal to the current plan's workspace."""
        planned = 0 if self._mm is None else workspace_bytes(self._mm)
        if self._allocator is not None:
            self._allocator.book(planned - self._booked, "workspace")
        self._booked = planned

    def _plan(self):
        from nvmath.linalg.advanced import Matmul, MatmulEpilog
        options = {"inplace": True, "compute_type": self.policy.gemm_compute_type(), "memory_limit": WORKSPACE_LIMIT}
        stream = self.backend.stream
        mm = Matmul(self.b.T, self.a.T, c=self.out.T, beta=0.0, options=options, stream=stream)
        if self.bias is not None:
            mm.plan(epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": self.bias}, stream=stream)
        else:
            mm.plan(stream=stream)
        return mm

    def run(self):
        if self._mm is not None:
            self._mm.execute(stream=self.backend.stream)
            return self.out
        if self.backend.is_gpu:
            raise RuntimeError("Gemm.run() after free(): its cuBLASLt plan was released")
        result = widen(self.a) @ widen(self.b)
        if self.bias is not None:
            result += widen(self.bias)
        self.out[...] = result.astype(self.out.dtype, copy=False)
        return self.out

    def free(self):
        """Release the cuBLASLt plan and its workspace now rather than at garbage collection."""
        if self._mm is not None:
            self._mm.free()
            self._mm = None
