"""CUDA kernels compiled once and cached, plus the helpers their sources share.

Kernels are CuPy RawModules: they launch inside CUDA-graph capture (unlike
CuPy's cuBLAS calls) and a launch costs a few microseconds of Python. bf16
values travel as raw `unsigned short` with explicit conversions, so no CUDA
header is needed at run-time compile.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

# Shared device helpers prepended to every kernel source.
PRELUDE = r"""
typedef unsigned short bf16_t;
__device__ __forceinline__ float bf16_to_float(bf16_t v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ bf16_t float_to_bf16(float f) {
    unsigned int bits = __float_as_uint(f);
    if ((bits & 0x7f800000u) == 0x7f800000u) return (bf16_t)(bits >> 16 | ((bits & 0xffffu) ? 0x40u : 0u));
    bits += 0x7fffu + ((bits >> 16) & 1u);   // round to nearest even
    return (bf16_t)(bits >> 16);
}
__device__ __forceinline__ float load_f(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load_f(const bf16_t* p, long long i) { return bf16_to_float(p[i]); }
__device__ __forceinline__ void store_f(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(bf16_t* p, long long i, float v) { p[i] = float_to_bf16(v); }
// N neighbouring values moved by one vector access (the address aligned to the whole pack).
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };
template <typename T, int N> __device__ __forceinline__ Pack<T, N> load_pack(const T* p, long long i) {
    return *reinterpret_cast<const Pack<T, N>*>(p + i);
}
template <typename T, int N> __device__ __forceinline__ void store_pack(T* p, long long i, const Pack<T, N>& v) {
    *reinterpret_cast<Pack<T, N>*>(p + i) = v;
}
// Butterfly reductions over one warp: every lane ends with the result.
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The block's total of its warps' totals (lane 0 of each hands one in), added in warp order: thread 0 holds it.
__device__ __forceinline__ float block_sum(float warp_total) {
    __shared__ float warp_totals[32];
    if ((threadIdx.x & 31) == 0) warp_totals[threadIdx.x >> 5] = warp_total;
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (blockDim.x >> 5); ++w) s += warp_totals[w];
    return s;
}
// A step's loss into its epoch's slot of the history; the first step whose loss is inf or nan is kept.
__device__ __forceinline__ void book_loss_value(const long long* step, long long steps_per_epoch, float* history,
                                                long long capacity, long long* diverged, float v) {
    history[(step[0] / steps_per_epoch) % capacity] += v;
    if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u && diverged[0] < 0) diverged[0] = step[0];
}
// One warp's row z[base, base + classes) of logits: its max m and log(sum(exp(z - m))), in every lane.
template <typename T>
__device__ __forceinline__ void row_log_softmax(const T* z, long long base, int classes, int lane, float& m,
                                                float& log_sum) {
    m = __int_as_float(0xff800000);   // -inf without math.h under NVRTC
    for (int k = lane; k < classes; k += 32) m = fmaxf(m, load_f(z, base + k));
    m = warp_max(m);
    float s = 0.f;
    for (int k = lane; k < classes; k += 32) s += expf(load_f(z, base + k) - m);
    log_sum = logf(warp_sum(s));
}
"""


def ctype(dtype) -> str:
    """The C element type a kernel uses for arrays of this dtype."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "float"
    if dtype.name == "bfloat16":
        return "bf16_t"
    raise TypeError(f"no kernel element type for dtype {dtype}")


def define_items(defines: dict) -> tuple[tuple[str, str], ...]:
    """The -D defines of a get_kernel call as a sorted, hashable tuple (the module cache key)."""
    return tuple(sorted((k, str(v)) for k, v in defines.items()))


def compile_options(defines: tuple[tuple[str, str], ...] = ()) -> tuple[str, ...]:
    """NVRTC options of a kernel module; kernel_check.py compiles with these too, so the two cannot drift."""
    return ("--std=c++17",) + tuple(f"-D{k}={v}" for k, v in defines)


@functools.lru_cache(maxsize=None)
def compile_module(source: str, defines: tuple[tuple[str, str], ...] = ()):
    """A cached cupy.RawModule of PRELUDE + source with -D defines (CuPy adds the device's architecture)."""
    import cupy
    return cupy.RawModule(code=PRELUDE + source, options=compile_options(defines))


def get_kernel(source: str, name: str, **defines):
    return compile_module(source, define_items(defines)).get_function(name)


def launch_shape(n: int, threads: int = 256) -> tuple:
    """(grid, block) of a grid-stride loop over n elements; the grid is capped, the loop covers the rest."""
    return (min(-(-n // threads), 65535 * 4),), (threads,)


def vector_width(count: int, *arrays, widest: int = 4) -> int:
    """How many neighbouring values a thread moves in one vector access (widest, ..., 2 or 1): a divisor of
    `count` (values in a row) to which every GPU array's address is aligned."""
    width = widest
    while width > 1 and (count % width or any(a.data.ptr % (a.itemsize * width) for a in arrays)):
        width //= 2
    return width


def packed_launch(count: int, *arrays, widest: int = 4) -> tuple[int, tuple, tuple, np.int64]:
    """(width, grid, block, packs) of a grid-stride loop over `count` values moved `width` a thread (vector_width
    of the arrays): the kernel compiles with VEC=width and takes `packs` as its count."""
    width = vector_width(count, *arrays, widest=widest)
    grid, block = launch_shape(count // width)
    return width, grid, block, np.int64(count // width)


@functools.lru_cache(maxsize=None)
def multiprocessor_count() -> int:
    import cupy
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


@functools.lru_cache(maxsize=None)
def compute_capability() -> int:
    """The device's compute capability as major * 10 + minor (90: Hopper)."""
    import cupy
    return int(cupy.cuda.Device().compute_capability)


def _driver(what: str):
    """cuda.bindings.driver, or an error that says `what` needed it."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise RuntimeError(f"{what} needs the driver's API from cuda-bindings (nvmath-python installs it), which "
                           f"does not import: {exc}") from None
    return driver


def _launch_config(driver, grid: tuple, block: tuple, shared_bytes: int):
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (*grid, 1, 1)[:3]
    config.blockDimX, config.blockDimY, config.blockDimZ = (*block, 1, 1)[:3]
    config.sharedMemBytes = shared_bytes
    return config


def max_active_clusters(kernel, grid: tuple, threads: int, shared_bytes: int) -> int:
    """How many of `kernel`'s thread-block clusters (its compiled __cluster_dims__) the device runs at once at this
    launch shape: a grid of more runs in waves, and its GPCs' spare SMs hold none (30 clusters of 8 blocks on an
    H200's 132 SMs at two blocks an SM, not 33)."""
    driver = _driver(f"the cluster ceiling of {kernel.name} (cuOccupancyMaxActiveClusters)")
    config = _launch_config(driver, grid, (threads,), shared_bytes)
    config.numAttrs = 0
    error, clusters = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(kernel.kernel.ptr), config)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters of {kernel.name}: {error.name}")
    return int(clusters)


# A NumPy scalar argument's C type, as the kernels declare it.
_SCALAR_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
                 np.dtype(np.int64): ctypes.c_int64, np.dtype(np.float32): ctypes.c_float}


def kernel_params(driver, kernel_name: str, args: tuple) -> tuple:
    """(values, types) of a launch's arguments as cuda.bindings takes them: device arrays as CUdeviceptr (type
    None), NumPy scalars by their C type; anything else is refused by position."""
    values, types = [], []
    for index, arg in enumerate(args):
        if hasattr(getattr(arg, "data", None), "ptr"):   # a CuPy array
            values.append(driver.CUdeviceptr(arg.data.ptr))
            types.append(None)
        elif isinstance(arg, np.generic) and arg.dtype in _SCALAR_TYPES:
            values.append(arg.item())
            types.append(_SCALAR_TYPES[arg.dtype])
        else:
            raise TypeError(f"{kernel_name}: argument {index} is a {type(arg).__name__}; a launch takes device arrays "
                            "and NumPy int32, uint32, int64 or float32 scalars")
    return tuple(values), tuple(types)


def launch_early(kernel, grid: tuple, block: tuple, args: tuple, shared_bytes: int = 0):
    """`kernel` on the current stream with programmatic stream serialization (sm_90): its blocks may start while
    the kernel before it on the stream ends, so before griddepcontrol.wait the kernel must read nothing that kernel
    writes. Captured into a CUDA graph, the launch becomes a programmatic edge."""
    driver = _driver(f"launching {kernel.name} early")
    import cupy
    config = _launch_config(driver, grid, block, shared_bytes)
    config.hStream = driver.CUstream(cupy.cuda.get_current_stream().ptr)
    early = driver.CUlaunchAttribute()
    early.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    early.value.programmaticStreamSerializationAllowed = 1
    config.attrs = [early]
    config.numAttrs = 1
    error, = driver.cuLaunchKernelEx(config, driver.CUfunction(kernel.kernel.ptr),
                                     kernel_params(driver, kernel.name, args), 0)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx of {kernel.name} (launched early): {error.name}")
