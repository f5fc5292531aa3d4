"""The fused conv + BN pieces the probe times: cuDNN runtime-fusion graphs and the small CUDA kernels around them.

Graphs (cuDNN frontend Python API, built, cached and autotuned by the engine's gpuengine/ops/cudnn.py):
  fprop_genstats  [relu(s*x + b) prologue ->] conv_fprop -> y, genstats(y) -> per-channel sum, sum of squares
                  (the frontend's test_conv_genstats.py / C++ sample "SBRCS")
  dgrad_drelu     conv_dgrad(dy, w) -> relu_backward against the recomputed s*x + b -> dz [-> reduction(dz),
                  reduction(dz * x)]: the previous BN's weight-gradient sums. The frontend's dbn_weight node
                  (C++ sample "Dgrad Drelu DBNweight") is not bound in Python 1.22.1, so the sums are
                  `reduction` nodes here; where cuDNN refuses them, `dbn_partials` below sums dz instead
  wgrad_prologue  conv_wgrad whose image is relu(s*x + b), recomputed on load
Kernels (CUDA C through the engine's get_kernel; one thread per element or channel):
  bn_finalize     (sum, sqsum, gamma, beta) -> s, b, mean, inv_std, running statistics (conv_bn_sites.bn_finalize_ref)
  bn_apply        [relu](s*y + b [+ r | + s2*y2 + b2]) where a BN output must be written (stem, block end)
  dbn_partials    per-channel partial sums of dz = [relu'(s*y + b)] da and dz*y, dz written on request
  dbn_finalize    dgamma, dbeta and dy = A dz + B y + C's coefficients (conv_bn_sites.dbn_coefficients_ref)
  dbn_apply       dy = A dz + B y + C, dz recomputed from da when the ReLU is undone here
"""
from __future__ import annotations

import numpy as np

from gpuengine.ops.cudnn import BoundGraph, TensorSpec, _conv_args, _cudnn, graph_key
from gpuengine.runtime.kernels import ctype, get_kernel, launch_shape, multiprocessor_count

# -- graphs -------------------------------------------------------------------------------------------------


def _prologue(g, x, scale, bias):
    """relu(x * s + b), never written: the BN + ReLU of the previous site applied on load."""
    out = g.scale(name="bn_scale", input=x, scale=scale)
    out = g.bias(name="bn_bias", input=out, bias=bias)
    return g.relu(name="bn_relu", input=out)


def _bind(runtime, op: str, precision: str, window, io_dtype, inputs: dict, outputs: dict, define):
    graph = runtime.graph(graph_key(op, precision, window, **inputs, **outputs), io_dtype, precision, define)
    return BoundGraph(runtime, graph, inputs | outputs)


def fprop_genstats(runtime, precision: str, window, x, w, y, ysum, ysqsum, scale=None, bias=None) -> BoundGraph:
    """y = conv([relu(s*x + b)], w); ysum, ysqsum (float32 (K,)) = per-channel sums of y and y^2."""
    inputs = {"x": x, "w": w} | ({"scale": scale, "bias": bias} if scale is not None else {})
    outputs = {"y": y, "sum": ysum, "sqsum": ysqsum}

    def define(g):
        t = {name: TensorSpec.of(a).make(g, name) for name, a in inputs.items()}
        image = _prologue(g, t["x"], t["scale"], t["bias"]) if scale is not None else t["x"]
        out = g.conv_fprop(image=image, weight=t["w"], name="conv", **_conv_args(window))
        TensorSpec.of(y).mark_output(out)
        total, squares = g.genstats(name="genstats", input=out, compute_data_type=_cudnn().data_type.FLOAT)
        TensorSpec.of(ysum).mark_output(total)
        TensorSpec.of(ysqsum).mark_output(squares)
        return t | {"y": out, "sum": total, "sqsum": squares}

    return _bind(runtime, "fprop_genstats", precision, window, x.dtype, inputs, outputs, define)


def dgrad_drelu(runtime, precision: str, window, dy, w, x, scale, bias, dz, dsum=None, dxsum=None) -> BoundGraph:
    """dz = relu'(s*x + b) * dgrad(dy, w); with dsum, dxsum (float32 (C,)): the sums of dz and dz*x."""
    sums = dsum is not None
    inputs = {"dy": dy, "w": w, "x": x, "scale": scale, "bias": bias}
    outputs = {"dz": dz} | ({"dsum": dsum, "dxsum": dxsum} if sums else {})
    cudnn = _cudnn()

    def define(g):
        t = {name: TensorSpec.of(a).make(g, name) for name, a in inputs.items()}
        grad = g.conv_dgrad(loss=t["dy"], filter=t["w"], name="dgrad", **_conv_args(window))
        spec = TensorSpec.of(dz)
        grad.set_dim(list(spec.dims)).set_stride(list(spec.strides))   # a strided dgrad cannot infer its input size
        preact = g.bias(name="bn_bias", input=g.scale(name="bn_scale", input=t["x"], scale=t["scale"]), bias=t["bias"])
        out = g.relu_backward(name="drelu", loss=grad, input=preact)
        spec.mark_output(out)
        tensors = t | {"dz": out}
        if sums:
            total = g.reduction(name="dsum", input=out, mode=cudnn.reduction_mode.ADD,
                                compute_data_type=cudnn.data_type.FLOAT)
            product = g.reduction(name="dxsum", input=g.mul(name="dz_x", a=out, b=t["x"]),
                                  mode=cudnn.reduction_mode.ADD, compute_data_type=cudnn.data_type.FLOAT)
            TensorSpec.of(dsum).mark_output(total)
            TensorSpec.of(dxsum).mark_output(product)
            tensors |= {"dsum": total, "dxsum": product}
        return tensors

    op = "dgrad_drelu_sums" if sums else "dgrad_drelu"
    return _bind(runtime, op, precision, window, dy.dtype, inputs, outputs, define)


def wgrad_prologue(runtime, precision: str, window, x, scale, bias, dy, dw) -> BoundGraph:
    """dw = the filter gradient of conv(relu(s*x + b), w) given dy; dw has dy's dtype (as the engine's wgrad)."""
    inputs = {"x": x, "scale": scale, "bias": bias, "dy": dy}
    outputs = {"dw": dw}

    def define(g):
        t = {name: TensorSpec.of(a).make(g, name) for name, a in inputs.items()}
        image = _prologue(g, t["x"], t["scale"], t["bias"])
        out = g.conv_wgrad(image=image, loss=t["dy"], name="wgrad", **_conv_args(window))
        TensorSpec.of(dw).mark_output(out)
        return t | {"dw": out}

    return _bind(runtime, "wgrad_prologue", precision, window, dy.dtype, inputs, outputs, define)


# -- kernels ------------------------------------------------------------------------------------------------

_SOURCE = r"""
// Forward finalize, one thread per channel: partials (2, chunks, C) of sum y and sum y^2.
extern "C" __global__ void bn_finalize(const float* partials, int chunks, const float* gamma, const float* beta,
                                       float* running_mean, float* running_var, SCALE_T* scale, SCALE_T* bias,
                                       float* mean_out, float* inv_std_out, float count, float eps, float momentum) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= CHANNELS) return;
    float total = 0.f, squares = 0.f;
    for (int k = 0; k < chunks; ++k) { total += partials[k * CHANNELS + c]; squares += partials[(chunks + k) * CHANNELS + c]; }
    const float mean = total / count, var = fmaxf(squares / count - mean * mean, 0.f), inv_std = rsqrtf(var + eps);
    const float s = gamma[c] * inv_std;
    store_f(scale, c, s);
    store_f(bias, c, beta[c] - mean * s);
    mean_out[c] = mean;
    inv_std_out[c] = inv_std;
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * count / fmaxf(count - 1.f, 1.f);
}
// out = [relu](s*y + b [+ r (RESIDUAL 1) | + s2*r + b2 (RESIDUAL 2)]): a BN output that must be written.
extern "C" __global__ void bn_apply(const ELEM_T* y, const SCALE_T* s, const SCALE_T* b, const ELEM_T* r,
                                    const SCALE_T* s2, const SCALE_T* b2, ELEM_T* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % CHANNELS);
        float v = load_f(y, i) * load_f(s, c) + load_f(b, c);
        if (RESIDUAL == 1) v += load_f(r, i);
        if (RESIDUAL == 2) v += load_f(r, i) * load_f(s2, c) + load_f(b2, c);
        store_f(out, i, RELU ? fmaxf(v, 0.f) : v);
    }
}
// Per-channel partial sums over a chunk of rows of dz = [relu'(s*y + b)] da and of dz*y; dz written if WRITE_DZ.
// Block: TILE channels x (blockDim.x / TILE) row lanes; blockIdx.x: channel tile, blockIdx.y: chunk.
extern "C" __global__ void dbn_partials(const ELEM_T* da, const ELEM_T* y, const SCALE_T* s, const SCALE_T* b,
                                        ELEM_T* dz, float* partials, long long rows, int rows_per_chunk) {
    extern __shared__ float lane_sums[];
    const int lanes = blockDim.x / TILE, lane = threadIdx.x / TILE, c = blockIdx.x * TILE + threadIdx.x % TILE;
    const long long start = (long long)blockIdx.y * rows_per_chunk;
    const long long stop = min(rows, start + rows_per_chunk);
    float s1 = 0.f, s2 = 0.f;
    if (c < CHANNELS) {
        for (long long r = start + lane; r < stop; r += lanes) {
            const long long i = r * CHANNELS + c;
            const float yv = load_f(y, i);
            float g = load_f(da, i);
            if (RELU && !(yv * load_f(s, c) + load_f(b, c) > 0.f)) g = 0.f;
            if (WRITE_DZ) store_f(dz, i, g);
            s1 += g;
            s2 += g * yv;
        }
    }
    lane_sums[threadIdx.x] = s1;
    lane_sums[blockDim.x + threadIdx.x] = s2;
    __syncthreads();
    if (lane == 0 && c < CHANNELS) {
        float t1 = 0.f, t2 = 0.f;
        for (int l = 0; l < lanes; ++l) { t1 += lane_sums[l * TILE + threadIdx.x]; t2 += lane_sums[blockDim.x + l * TILE + threadIdx.x]; }
        partials[(long long)blockIdx.y * CHANNELS + c] = t1;
        partials[(long long)(gridDim.y + blockIdx.y) * CHANNELS + c] = t2;
    }
}
// Backward finalize, one thread per channel: coef = (A, B, C) rows of dy = A dz + B y + C.
extern "C" __global__ void dbn_finalize(const float* partials, int chunks, const float* mean, const float* inv_std,
                                        const float* gamma, float* dgamma, float* dbeta, float* coef, float count) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= CHANNELS) return;
    float dsum = 0.f, dysum = 0.f;
    for (int k = 0; k < chunks; ++k) { dsum += partials[k * CHANNELS + c]; dysum += partials[(chunks + k) * CHANNELS + c]; }
    const float dg = inv_std[c] * (dysum - mean[c] * dsum), a = gamma[c] * inv_std[c];
    const float bcoef = -a * inv_std[c] * dg / count;
    dgamma[c] = dg;
    dbeta[c] = dsum;
    coef[c] = a;
    coef[CHANNELS + c] = bcoef;
    coef[2 * CHANNELS + c] = -a * dsum / count - bcoef * mean[c];
}
// dy = A dz + B y + C, dz = [relu'(s*y + b)] da.
extern "C" __global__ void dbn_apply(const ELEM_T* da, const ELEM_T* y, const SCALE_T* s, const SCALE_T* b,
                                     const float* coef, ELEM_T* dy, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % CHANNELS);
        const float yv = load_f(y, i);
        float g = load_f(da, i);
        if (RELU && !(yv * load_f(s, c) + load_f(b, c) > 0.f)) g = 0.f;
        store_f(dy, i, coef[c] * g + coef[CHANNELS + c] * yv + coef[2 * CHANNELS + c]);
    }
}
"""
_THREADS = 256
# Placeholders for the defines a kernel does not read (NVRTC still needs them: one source, one module).
_UNREAD = dict(RELU=0, RESIDUAL=0, TILE=_THREADS, WRITE_DZ=0)


def _channel_grid(channels: int) -> tuple:
    return (-(-channels // _THREADS),), (_THREADS,)


class Kernels:
    """The probe's kernels for one (element dtype, scale dtype) pair; each call launches on the current stream."""

    def __init__(self, elem_dtype, scale_dtype):
        self.types = dict(ELEM_T=ctype(elem_dtype), SCALE_T=ctype(scale_dtype))

    def _defines(self, **defines) -> dict:
        """Every name the source reads: its kernels compile as one module, so each call defines them all."""
        return {**_UNREAD, **self.types, **defines}

    def bn_finalize(self, partials, gamma, beta, running_mean, running_var, scale, bias, mean, inv_std, count: int,
                    eps: float, momentum: float):
        channels = gamma.shape[0]
        grid, block = _channel_grid(channels)
        get_kernel(_SOURCE, "bn_finalize", **self._defines(CHANNELS=channels))(grid, block, (
            partials, np.int32(partials.shape[1]), gamma, beta, running_mean, running_var, scale, bias, mean, inv_std,
            np.float32(count), np.float32(eps), np.float32(momentum)))

    def bn_apply(self, y, scale, bias, out, relu: bool, residual=None, scale2=None, bias2=None):
        """residual alone: + residual; with scale2/bias2: + scale2*residual + bias2 (a projection BN)."""
        mode = 0 if residual is None else (2 if scale2 is not None else 1)
        grid, block = launch_shape(y.size)
        defines = self._defines(CHANNELS=y.shape[-1], RELU=int(relu), RESIDUAL=mode)
        get_kernel(_SOURCE, "bn_apply", **defines)(grid, block, (
            y, scale, bias, y if residual is None else residual, scale if scale2 is None else scale2,
            bias if bias2 is None else bias2, out, np.int64(y.size)))

    def dbn_partials(self, da, y, scale, bias, partials, relu: bool, dz=None):
        """partials (2, chunks, C) from `partial_layout(y.shape)`."""
        channels = y.shape[-1]
        rows = y.size // channels
        tile, threads, tiles, chunks, rows_per_chunk = partial_layout(y.shape)
        if partials.shape != (2, chunks, channels):
            raise ValueError(f"dbn_partials: partials {partials.shape}, the layout is {(2, chunks, channels)}")
        defines = self._defines(CHANNELS=channels, TILE=tile, RELU=int(relu), WRITE_DZ=int(dz is not None))
        get_kernel(_SOURCE, "dbn_partials", **defines)(
            (tiles, chunks), (threads,), (da, y, scale, bias, da if dz is None else dz, partials, np.int64(rows),
                                          np.int32(rows_per_chunk)), shared_mem=8 * threads)

    def dbn_finalize(self, partials, mean, inv_std, gamma, dgamma, dbeta, coef, count: int):
        channels = gamma.shape[0]
        grid, block = _channel_grid(channels)
        get_kernel(_SOURCE, "dbn_finalize", **self._defines(CHANNELS=channels))(grid, block, (
            partials, np.int32(partials.shape[1]), mean, inv_std, gamma, dgamma, dbeta, coef, np.float32(count)))

    def dbn_apply(self, da, y, scale, bias, coef, dy, relu: bool):
        grid, block = launch_shape(y.size)
        get_kernel(_SOURCE, "dbn_apply", **self._defines(CHANNELS=y.shape[-1], RELU=int(relu)))(grid, block, (
            da, y, scale, bias, coef, dy, np.int64(y.size)))


def partial_layout(shape) -> tuple:
    """(tile channels, threads, channel tiles, chunks, rows per chunk) of dbn_partials over an NHWC map."""
    channels = shape[-1]
    rows = int(np.prod(shape[:-1]))
    tile = min(channels, _THREADS)
    threads = tile * (_THREADS // tile)
    tiles = -(-channels // tile)
    target_chunks = max(1, 4 * multiprocessor_count() // tiles)   # ~4 blocks per SM in flight
    rows_per_chunk = max(8 * (threads // tile), -(-rows // target_chunks))
    return tile, threads, tiles, -(-rows // rows_per_chunk), rows_per_chunk
