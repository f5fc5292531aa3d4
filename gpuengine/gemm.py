"""GEMMs into preallocated outputs: cuBLASLt through nvmath-python on a GPU.

`Gemm(out, a, b, bias)` is planned once and computes `out = a @ b (+ bias)`
on every `run()`, where a and b may be transposed views of row-major arrays.
cuBLASLt is column-major and its bias epilogue runs along the result's first
(M) dimension, so we ask it for out^T = b^T a^T written in place into the
transposed view of `out`: the bias then runs along `out`'s columns, which is
what a dense layer needs (DESIGN.md, "Facts measured"). nvmath's execute() is
capture-safe, unlike CuPy's cuBLAS calls, and allocates nothing when in place.
On the NumPy backend the same object computes with np.matmul in float32.
"""
from __future__ import annotations

from .backend import widen


class Gemm:
    """out = a @ b (+ bias broadcast over rows), planned once, run many times."""

    def __init__(self, backend, policy, out, a, b, bias=None):
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
        self._mm = self._plan(transposed=True) if backend.is_gpu else None

    def _plan(self, transposed: bool):
        """Plan out^T = b^T a^T (needed for the bias epilogue) or, without bias, out = a b."""
        from nvmath.linalg.advanced import Matmul, MatmulEpilog
        options = {"inplace": True, "compute_type": self.policy.gemm_compute_type()}
        stream = self.backend.stream
        if transposed:
            mm = Matmul(self.b.T, self.a.T, c=self.out.T, beta=0.0, options=options, stream=stream)
        else:
            mm = Matmul(self.a, self.b, c=self.out, beta=0.0, options=options, stream=stream)
        if self.bias is not None:
            mm.plan(epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": self.bias}, stream=stream)
        else:
            mm.plan(preferences={"limit": 16}, stream=stream)
        return mm

    def _device_ms(self, mm, repeats: int = 10) -> float:
        xp, stream = self.backend.xp, self.backend.stream
        start, stop = xp.cuda.Event(), xp.cuda.Event()
        mm.execute(stream=stream)
        start.record(stream)
        for _ in range(repeats):
            mm.execute(stream=stream)
        stop.record(stream)
        stop.synchronize()
        return xp.cuda.get_elapsed_time(start, stop) / repeats

    def autotune(self):
        """Time each candidate algorithm (and operand orientation) on the live buffers; keep the fastest."""
        if self._mm is None:
            return
        stream = self.backend.stream
        candidates = [self._mm] + ([] if self.bias is not None else [self._plan(transposed=False)])
        for mm in candidates:
            mm.autotune(iterations=5, stream=stream)
        times = [self._device_ms(mm) for mm in candidates]
        best = candidates[times.index(min(times))]
        for mm in candidates:
            if mm is not best:
                mm.free()
        self._mm = best

    def run(self):
        if self._mm is not None:
            self._mm.execute(stream=self.backend.stream)
            return self.out
        result = widen(self.a) @ widen(self.b)
        if self.bias is not None:
            result += widen(self.bias)
        self.out[...] = result.astype(self.out.dtype, copy=False)
        return self.out

    def free(self):
        if self._mm is not None:
            self._mm.free()
            self._mm = None
