"""The CUDA source of the engine's batch-norm forward (`bn_forward`); batchnorm_kernels.py has what it shares.

One launch: each block sums x - x[0, c] and its square over its rows of its
column tile (reductions.py's column tiles and one-launch ending: partial sums
per row chunk, the block drawing the tile's last ticket adds them in a fixed
order, so the result is the same bits every run). That block writes the batch
mean and inverse standard deviation and moves the running statistics; the
tile's other blocks wait for it (`tile_barrier`), then every block computes y
= act((x - mean) gamma / std + beta [+ residual]) over its own rows, last
first (the likeliest still in L2), and, where the activation's gradient is
needed later, its bit mask (8 channels a byte, as cuDNN's fused backward reads
it). Where |mean| is large against the std, shifting by one sample of the
channel keeps the variance's digits, and the centred form keeps y's. A thread
moves a pack of VEC = 8 channels in one vector access (16 bytes of bf16; one
byte of the mask), or one channel where the channels or a buffer's alignment
do not allow 8 (`pack_width`; its lanes' mask bits then meet by ballot).
"""
from __future__ import annotations

from .batchnorm_kernels import TILE_SOURCE

FORWARD_SOURCE = TILE_SOURCE + r"""
// One byte of the mask for every 8 elements: the lanes of a warp hold consecutive elements, 8 to a byte (CHANNELS
// is a multiple of 8 where there is a mask), and the byte's first lane writes it where its element is in range.
__device__ __forceinline__ void write_mask_byte(unsigned char* mask, long long i, bool valid, bool passes) {
    const int lane = threadIdx.x & 31, warp_start = threadIdx.x - lane;
    const int lanes = min(32, (int)blockDim.x - warp_start);
    const unsigned int bits = __ballot_sync(lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u, passes && valid);
    if ((lane & 7) == 0 && valid) mask[i >> 3] = (unsigned char)(bits >> lane);
}
// The mask's bits of one pack: with VEC 8 the pack is one byte; one channel a lane takes the warp's ballot.
__device__ __forceinline__ void write_mask(unsigned char* mask, long long i, bool valid, unsigned int bits) {
    if (VEC == 8) {
        if (valid) mask[i >> 3] = (unsigned char)bits;
    } else {
        write_mask_byte(mask, i, valid, bits != 0u);
    }
}
// The statistics' sums of one pack: x - shift and its square.
__device__ __forceinline__ void add_shifted_sums(const Elems& e, const float (&shift)[VEC], float (&s)[2 * VEC]) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const float d = load_f(e.v, v) - shift[v];
        s[2 * v] += d;
        s[2 * v + 1] += d * d;
    }
}
// y = act((x - mean) scale + beta [+ residual]) of one pack into y[i...] (res unread without HAS_RESIDUAL); its
// activation's mask bits.
__device__ __forceinline__ unsigned int normalize_pack(const Elems& e, const Elems& res, ELEM_T* y, long long i,
                                                       const float (&mean)[VEC], const float (&scale)[VEC],
                                                       const float (&b)[VEC]) {
    Elems o;
    unsigned int bits = 0u;
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        float value = (load_f(e.v, v) - mean[v]) * scale[v] + b[v];
        if (HAS_RESIDUAL) value += load_f(res.v, v);
        value = activate(value);
        store_f(o.v, v, value);
        bits |= (unsigned int)passes_gradient(value) << v;
    }
    store_pack<ELEM_T, VEC>(y, i, o);
    return bits;
}
// BN training forward in one launch: per channel of x (rows x CHANNELS) the shifted sums, the batch mean and
// inverse std (running statistics moved toward them, the variance unbiased as torch's), then over the block's
// own rows y = act((x - mean) scale + beta [+ residual]) and, with MASK, where act passes the gradient.
extern "C" TILE_CLUSTER __global__ void __launch_bounds__(256, 2)
bn_forward(const ELEM_T* x, const float* gamma, const float* beta, float* running_mean, float* running_var,
           float* saved_mean, float* saved_inv_std, float* sums, const ELEM_T* residual, ELEM_T* y,
           unsigned char* mask, float* partials, unsigned int* counters, unsigned int* generations, int rows,
           int rows_per_chunk, int tile_cols, float eps, float momentum) {
    extern __shared__ float lane_sums[];   // 2 VEC sums a thread: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    const bool own = t.col < PACKS;
    const long long c0 = (long long)t.col * VEC;   // the pack's first channel
    if (EARLY && HAS_RESIDUAL && own) {   // the residual, read after the statistics: into L2 meanwhile
        for (int k = 0; k < EARLY_TRIPS && t.first + k * t.step < t.stop; ++k)
            prefetch_l2(residual + (t.first + k * t.step) * cols + c0);
    }
    wait_for_previous();   // before any load or store
    const unsigned int seen = tile_generation(generations);
    float shift[VEC], s[2 * VEC];
    #pragma unroll
    for (int v = 0; v < 2 * VEC; ++v) s[v] = 0.f;
    Elems kept[CACHE];   // the packs of the first CACHE trips, kept for the output's pass
    if (own) {
        const Elems first = load_pack<ELEM_T, VEC>(x, c0);
        #pragma unroll
        for (int v = 0; v < VEC; ++v) shift[v] = load_f(first.v, v);
        #pragma unroll
        for (int k = 0; k < CACHE; ++k)   // every load in flight before the first add
            if (t.first + k * t.step < t.stop) kept[k] = load_pack<ELEM_T, VEC>(x, (t.first + k * t.step) * cols + c0);
        #pragma unroll
        for (int k = 0; k < CACHE; ++k)
            if (t.first + k * t.step < t.stop) add_shifted_sums(kept[k], shift, s);
        #pragma unroll 4
        for (long long r = t.first + CACHE * t.step; r < t.stop; r += t.step)   // the rows beyond the cache
            add_shifted_sums(load_pack<ELEM_T, VEC>(x, r * cols + c0), shift, s);
    }
    float total[2 * VEC];
    const bool last = tile_sums<2 * VEC>(t, tile_cols, s, lane_sums, partials, counters, sums, total);
    float g[VEC], b[VEC], batch_mean[VEC], batch_var[VEC];   // gamma and beta loaded while the tile waits
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        g[v] = own ? gamma[c0 + v] : 0.f;
        b[v] = own ? beta[c0 + v] : 0.f;
    }
    const bool owner = last && threadIdx.x < tile_cols && own;   // the owners: each holds its pack's sums
    const bool writer = owner && (CLUSTER == 1 || blockIdx.y == 0);   // one block writes the statistics
    __shared__ float tile_stats[2 * VEC * 32];   // clusters: a block's owners hand its threads mean and 1 / std
    const float n = (float)rows;
    if (owner) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const float d_mean = total[2 * v] / n;
            batch_var[v] = fmaxf(total[2 * v + 1] / n - d_mean * d_mean, 0.f);
            batch_mean[v] = shift[v] + d_mean;
            const float inv_std = 1.f / sqrtf(batch_var[v] + eps);
            if (writer) {
                saved_mean[c0 + v] = batch_mean[v];
                saved_inv_std[c0 + v] = inv_std;
            }
            if (CLUSTER > 1) {
                tile_stats[2 * v * tile_cols + t.tc] = batch_mean[v];
                tile_stats[(2 * v + 1) * tile_cols + t.tc] = inv_std;
            }
        }
    }
    if (CLUSTER == 1 && gridDim.y > 1) tile_barrier(generations, seen, last);
    else __syncthreads();
    if (writer) {   // after the barrier: no block waits for the running statistics
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const long long c = c0 + v;
            running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * batch_mean[v];
            running_var[c] = (1.f - momentum) * running_var[c] + momentum * batch_var[v] * n / fmaxf(n - 1.f, 1.f);
        }
    }
    float scale[VEC], mean[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const float inv_std = CLUSTER > 1 ? tile_stats[(2 * v + 1) * tile_cols + t.tc]
                                          : *(volatile const float*)(saved_inv_std + c0 + v);
        scale[v] = own ? g[v] * inv_std : 0.f;
        mean[v] = own ? (CLUSTER > 1 ? tile_stats[2 * v * tile_cols + t.tc]
                                     : *(volatile const float*)(saved_mean + c0 + v)) : 0.f;
    }
    // trips from the chunk's first row, not the thread's: the same trips in every thread (MASK's ballot)
    const long long steps = trips(t.first - threadIdx.x / tile_cols, t);
    // The rows beyond the cache read again, backwards: the first pass's last rows are the likeliest still in L2
    // (a map larger than L2, read forwards twice, would miss every time).
    #pragma unroll 2
    for (long long k = steps - 1; k >= CACHE; --k) {
        const long long r = t.first + k * t.step, i = r * cols + c0;
        const bool valid = own && r < t.stop;
        unsigned int bits = 0u;
        if (valid) {
            Elems res;
            if (HAS_RESIDUAL) res = load_pack<ELEM_T, VEC>(residual, i);
            bits = normalize_pack(load_pack<ELEM_T, VEC>(x, i), res, y, i, mean, scale, b);
        }
        if (MASK) write_mask(mask, i, valid, bits);
    }
    Elems kept_res[HAS_RESIDUAL ? CACHE : 1];   // the kept rows' residual: every load in flight before a store
    if (HAS_RESIDUAL && own) {
        #pragma unroll
        for (int k = 0; k < CACHE; ++k)
            if (t.first + k * t.step < t.stop)
                kept_res[k] = load_pack<ELEM_T, VEC>(residual, (t.first + k * t.step) * cols + c0);
    }
    #pragma unroll
    for (int k = 0; k < CACHE; ++k) {   // the kept rows: no load of x
        if (k >= steps) continue;
        const long long r = t.first + k * t.step, i = r * cols + c0;
        const bool valid = own && r < t.stop;
        unsigned int bits = 0u;
        if (valid) bits = normalize_pack(kept[k], kept_res[HAS_RESIDUAL ? k : 0], y, i, mean, scale, b);
        if (MASK) write_mask(mask, i, valid, bits);
    }
}
"""
