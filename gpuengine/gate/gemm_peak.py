"""The GPU's measured GEMM peak for a precision: the denominator of each workload's fraction of peak.

An 8192^3 matmul through PyTorch's cuBLAS, on random data, median of timed
runs after warm-up, as the H200 figures in docs/architecture.md ("Facts
measured on the GPU machines") were taken (bf16 ~800 TFLOP/s, TF32 ~407, IEEE
fp32 ~51). PyTorch is an independent measure: the engine's own GEMM path is
what is being judged, so it cannot also set the yardstick.
"""
from __future__ import annotations

import statistics


def measure_gemm_peak_tflops(precision: str, size: int = 8192, warmup: int = 3, repeats: int = 10) -> float | None:
    """TFLOP/s of one size^3 GEMM in `precision` (fp32 IEEE, tf32, bf16); None without torch on CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    previous = torch.get_float32_matmul_precision()
    # "high" lets float32 matmuls use TF32 tensor cores; "highest" keeps them IEEE.
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        generator = torch.Generator(device="cuda").manual_seed(0)
        a, b = (torch.randn(size, size, device="cuda", dtype=dtype, generator=generator) for _ in range(2))
        out = torch.empty(size, size, device="cuda", dtype=dtype)
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        times_ms = []
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=out)
            stop.record()
            stop.synchronize()
            times_ms.append(start.elapsed_time(stop))
        del a, b, out
        return 2 * size ** 3 / (statistics.median(times_ms) / 1e3) / 1e12
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.cuda.empty_cache()
