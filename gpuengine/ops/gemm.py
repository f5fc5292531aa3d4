"""GEMMs into preallocated outputs: cuBLASLt through nvmath-python on a GPU.

`Gemm(out, a, b, bias)` is planned once and computes `out = a @ b (+ bias)`
on every `run()`, where a and b may be transposed views of row-major arrays.
With `a_sums` it also writes a's row sums there (cuBLASLt's BGRADB epilogue):
a weight gradient dW = dy^T x then yields the bias gradient in the same kernel.
With `relu` the epilogue applies ReLU to the result (a layer's fused activation).
cuBLASLt is column-major and its bias epilogue runs along the result's first
(M) dimension, so we ask it for out^T = b^T a^T written in place into the
transposed view of `out`: the bias then runs along `out`'s columns, which is
what a dense layer needs (docs/architecture.md, "Facts measured on the GPU
machines"). nvmath's execute() is capture-safe, unlike CuPy's cuBLAS calls,
and allocates nothing when in place.
On the NumPy backend the same object computes with np.matmul in float32.

The first eager run chooses among the algorithms cuBLASLt's heuristic returns
for the GEMM (up to CANDIDATES), timing their kernels in captured replays
(ops/autotune.py): the heuristic's first is kept unless another is clearly
faster, and the choice is recorded in autotune.PLAN_CHOICES like a cuDNN plan.

Each plan's cuBLASLt workspace comes from CuPy's pool at the first execute;
it is capped (nvmath would allow 80% of the device and size the workspace for
the hungriest candidate algorithm) and booked with the allocator, so the
engine's memory report covers it before anything runs.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import widen
from . import autotune
from .reductions import ColumnSum

WORKSPACE_LIMIT = 32 << 20   # bytes per GEMM: PyTorch's default cuBLAS/cuBLASLt workspace on Hopper
CANDIDATES = 16              # algorithms asked of the heuristic (nvmath's default asks for 8)
_TUNING = autotune.Progress("cuBLASLt GEMMs autotuned")


def algorithm_name(algorithm) -> str:
    """A cuBLASLt algorithm's configuration as stable text: the same on every process of one stack."""
    parts = []
    for field in ("algorithm_id", "tile", "stages", "split_k", "reduction_scheme", "cta_swizzling",
                  "custom_option", "inner_shape", "cluster_shape"):
        try:
            parts.append(f"{field}={getattr(algorithm, field)}")
        except Exception:   # a field this cuBLASLt does not report: the others still name the algorithm
            continue
    return ",".join(parts)


def workspace_bytes(mm) -> int:
    """The workspace nvmath sized at plan() (a Workspace object since nvmath 1.0, an int before)."""
    workspace = getattr(mm, "workspace", None)
    if workspace is not None and hasattr(workspace, "size"):
        return int(workspace.size)
    return int(getattr(mm, "workspace_size", 0) or 0)


class Gemm:
    """out = a @ b (+ bias broadcast over rows, then ReLU if relu; or a's row sums into a_sums), planned once,
    run many times."""

    def __init__(self, backend, policy, out, a, b, bias=None, allocator=None, a_sums=None, relu: bool = False):
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise ValueError("Gemm takes 2-D operands")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or out.shape != (m, n):
            raise ValueError(f"Gemm shapes do not chain: {a.shape} @ {b.shape} -> {out.shape}")
        if bias is not None and bias.shape != (n,):
            raise ValueError(f"Gemm bias shape {bias.shape}, expected ({n},)")
        if relu and a_sums is not None:
            raise ValueError("Gemm takes relu or a_sums, not both (one epilogue)")
        if a_sums is not None:
            if bias is not None:
                raise ValueError("Gemm takes a bias or a_sums, not both (cuBLASLt has one bias pointer)")
            aligned = not backend.is_gpu or a_sums.data.ptr % 16 == 0
            if a_sums.shape != (m,) or a_sums.dtype != out.dtype or a_sums.strides != (a_sums.itemsize,) \
                    or not aligned:
                raise ValueError(f"Gemm a_sums {a_sums.shape} {a_sums.dtype} strides {a_sums.strides}: expected a "
                                 f"contiguous ({m},) vector of the output's dtype {out.dtype}, 16-byte aligned")
        self.backend, self.policy = backend, policy
        self.out, self.a, self.b, self.bias, self.a_sums, self.relu = out, a, b, bias, a_sums, bool(relu)
        self.flops = 2 * m * n * k
        epilogues = (("a_sums",) if a_sums is not None else ()) + (("relu",) if relu else ())   # a plain key as before
        self.key = ("gemm", policy.name, a.shape, a.strides, b.shape, b.strides, out.strides, a.dtype.name,
                    out.dtype.name, bias is not None) + epilogues
        self._mm, self._algorithms = self._plan() if backend.is_gpu else (None, [])
        self._algorithm = None   # chosen at the first eager run; None with one candidate: the heuristic's first
        self._chosen = len(self._algorithms) <= 1
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
        preferences = {"limit": CANDIDATES}
        if self.bias is not None:
            algorithms = mm.plan(preferences=preferences, epilog=MatmulEpilog.RELU_BIAS if self.relu else
                                 MatmulEpilog.BIAS, epilog_inputs={"bias": self.bias}, stream=stream)
        elif self.a_sums is not None:   # BGRADB sums nvmath's b (= a^T here) over k: a's row sums
            algorithms = mm.plan(preferences=preferences, epilog=MatmulEpilog.BGRADB, stream=stream)
        elif self.relu:
            algorithms = mm.plan(preferences=preferences, epilog=MatmulEpilog.RELU, stream=stream)
        else:
            algorithms = mm.plan(preferences=preferences, stream=stream)
        return mm, list(algorithms)

    def _execute(self, algorithm=None):
        if self.a_sums is None:
            self._mm.execute(algorithm=algorithm, stream=self.backend.stream)
            return
        # nvmath allocates the epilogue's output at every execute(), before anything else there: a_sums is handed
        # to that allocation, so the sums land in place (in a captured graph too) and nothing new is allocated
        cupy, fallback, handed = self.backend.xp, self.backend.xp.cuda.get_allocator(), []

        def hand_out(size):
            if not handed and size == self.a_sums.nbytes:
                handed.append(size)
                return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(self.a_sums.data.ptr, size, self.a_sums), 0)
            return fallback(size)

        with cupy.cuda.using_allocator(hand_out):
            _, outputs = self._mm.execute(algorithm=algorithm, stream=self.backend.stream)
        if outputs["bgradb"].data.ptr != self.a_sums.data.ptr:
            raise RuntimeError("Gemm: cuBLASLt's row sums went to memory nvmath allocated, not to a_sums: this nvmath "
                               "allocates differently in execute(); use bias_grad=sum")

    def _choose(self):
        """Time the heuristic's algorithms on the live operands (the output is overwritten) and keep one."""
        names = {algorithm_name(algorithm): algorithm for algorithm in self._algorithms}
        preset = autotune.PLAN_CHOICES.chosen_for(self.key)
        if preset in names:
            chosen = preset
        else:
            autotune.refuse_capture(self.backend.stream, f"GEMM {self.key[2]} @ {self.key[4]}")
            ways = {name: (lambda algorithm=algorithm: self._execute(algorithm)) for name, algorithm in names.items()}
            for run in ways.values():
                run()   # first runs: the workspace is allocated, kernels load
            chosen, _ = autotune.tune(self.backend.xp, self.backend.stream, self.key, ways)
            _TUNING.step()
        first = next(iter(names))
        self._algorithm = None if chosen == first else names[chosen]   # the first is execute()'s own default
        self._chosen = True

    def run(self):
        if self._mm is not None:
            if not self._chosen:
                self._choose()
            self._execute(self._algorithm)
            return self.out
        if self.backend.is_gpu:
            raise RuntimeError("Gemm.run() after free(): its cuBLASLt plan was released")
        result = widen(self.a) @ widen(self.b)
        if self.bias is not None:
            result += widen(self.bias)
        if self.relu:
            result = np.maximum(result, 0.0)
        if self.a_sums is not None:
            self.a_sums[...] = widen(self.a).sum(axis=1).astype(self.a_sums.dtype, copy=False)
        self.out[...] = result.astype(self.out.dtype, copy=False)
        return self.out

    def free(self):
        """Release the cuBLASLt plan and its workspace now rather than at garbage collection."""
        if self._mm is not None:
            # nvmath waits on the event of the last execute(), which for a captured step was recorded inside
            # the capture and cannot be waited on (CUDA_ERROR_INVALID_VALUE): wait for the stream instead
            self.backend.synchronize()
            self._mm.last_compute_event = None
            self._mm.free()
            self._mm, self._algorithms, self._algorithm = None, [], None


def weight_gradients(backend, policy, allocator, grad_w, grad_b, dy, x, epilogue: bool, sums=None):
    """A dense layer's dW = dy^T x and, unless grad_b is None, db = dy's column sums: in the GEMM's epilogue
    (epilogue=True), else by a ColumnSum after it (finished by `sums` where it takes them). (gemm, column_sum or
    None): run both, in that order."""
    if grad_b is None or not epilogue:
        gemm = Gemm(backend, policy, grad_w, dy.T, x, allocator=allocator)
        return gemm, (None if grad_b is None else ColumnSum(backend, allocator, dy, grad_b, sums=sums))
    return Gemm(backend, policy, grad_w, dy.T, x, allocator=allocator, a_sums=grad_b), None
