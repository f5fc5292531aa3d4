"""Probe a GPU machine's stack: the facts the engine's design rests on.

Checks, each printed as one line: library versions; CuPy bfloat16 arrays;
nvmath (cuBLASLt) in-place matmul into a transposed view with a bias epilogue,
eager and inside CUDA-graph capture, in TF32, IEEE fp32 and bf16->fp32; the
Python overhead of one execute(); pool allocations per execute; cuDNN frontend.
"""
import json
import sys
import time
import traceback


def step(name, fn, report):
    try:
        report[name] = fn()
    except Exception as exc:  # a probe records failures, it does not stop
        report[name] = f"FAILED: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    print(f"{name}: {report[name]}", flush=True)


def main():
    import cupy as cp
    import numpy as np

    report = {}
    step("versions", lambda: {
        "cupy": cp.__version__, "numpy": np.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "driver": cp.cuda.runtime.driverGetVersion(),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
    }, report)

    def bf16():
        import ml_dtypes
        a = cp.asarray(np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16))
        return {"dtype": str(a.dtype), "sum": float(a.astype(cp.float32).sum())}
    step("cupy_bf16", bf16, report)

    import nvmath
    from nvmath.linalg.advanced import Matmul, MatmulEpilog
    from nvmath.bindings import cublas
    step("nvmath", lambda: nvmath.__version__, report)

    B, K, N = 8000, 1000, 1000
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((B, K), dtype=cp.float32)
    w = rng.standard_normal((N, K), dtype=cp.float32) * 0.03
    bias = rng.standard_normal((N,), dtype=cp.float32)
    z = cp.empty((B, N), dtype=cp.float32)
    ref = x.astype(cp.float64) @ w.T.astype(cp.float64) + bias

    stream = cp.cuda.Stream(non_blocking=True)

    def make(ct, a=None, b=None):
        opts = {"inplace": True, "compute_type": ct}
        mm = Matmul(w if a is None else a, (x if b is None else b).T, c=z.T, beta=0.0, options=opts, stream=stream)
        mm.plan(epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": bias}, stream=stream)
        return mm

    def rel(a):
        return float(cp.linalg.norm(a.astype(cp.float64) - ref) / cp.linalg.norm(ref))

    def time_graph(mm, reps=50):
        with stream:
            mm.execute(stream=stream)
            stream.synchronize()
            z.fill(cp.nan)
            stream.begin_capture()
            mm.execute(stream=stream)
            g = stream.end_capture()
            g.launch(stream)
            stream.synchronize()
            err = rel(z)
            s, e = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(5):
                g.launch(stream)
            s.record(stream)
            for _ in range(reps):
                g.launch(stream)
            e.record(stream)
            e.synchronize()
            ms = cp.cuda.get_elapsed_time(s, e) / reps
        return {"rel_err": err, "ms": round(ms, 4), "tflops": round(2 * B * K * N / ms / 1e9, 1)}

    step("tf32_graph", lambda: time_graph(make(cublas.ComputeType.COMPUTE_32F_FAST_TF32)), report)
    step("fp32_graph", lambda: time_graph(make(cublas.ComputeType.COMPUTE_32F)), report)

    def bf16_mm():
        import ml_dtypes
        xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
        return time_graph(make(cublas.ComputeType.COMPUTE_32F, a=wb, b=xb))
    step("bf16_in_fp32_out_graph", bf16_mm, report)

    def overhead():
        mm = make(cublas.ComputeType.COMPUTE_32F_FAST_TF32)
        pool = cp.get_default_memory_pool()
        with stream:
            mm.execute(stream=stream)
            stream.synchronize()
            used0 = pool.used_bytes()
            t0 = time.perf_counter()
            for _ in range(200):
                mm.execute(stream=stream)
            t1 = time.perf_counter()
            stream.synchronize()
            used1 = pool.used_bytes()
        return {"host_us_per_execute": round((t1 - t0) / 200 * 1e6, 1), "pool_growth": used1 - used0}
    step("execute_overhead", overhead, report)

    def rawkernel_capture():
        k = cp.RawKernel(r'''extern "C" __global__ void inc(float* a, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += 1.f; }''', "inc")
        a = cp.zeros(1000, dtype=cp.float32)
        with stream:
            stream.begin_capture()
            k((4,), (256,), (a, np.int32(1000)))
            g = stream.end_capture()
            for _ in range(3):
                g.launch(stream)
            stream.synchronize()
        return float(a.sum())
    step("rawkernel_capture", rawkernel_capture, report)

    def cudnn_probe():
        import cudnn
        return {"frontend": cudnn.__version__, "backend": cudnn.backend_version()}
    step("cudnn_frontend", cudnn_probe, report)

    def torch_probe():
        import torch
        return {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}
    step("torch", torch_probe, report)
    json.dump(report, open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main()
