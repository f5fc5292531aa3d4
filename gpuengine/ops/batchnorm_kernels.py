"""The CUDA source of the engine's own batch-norm kernels (training, NHWC); ops/batchnorm.py plans and launches them.

Forward, one launch (`bn_forward`): each block sums x - x[0, c] and its square
over its rows of its column tile (reductions.py's column tiles and one-launch
ending: partial sums per row chunk, the block drawing the tile's last ticket
adds them in a fixed order, so the result is the same bits every run). That
block writes the batch mean and inverse standard deviation and moves the
running statistics; the tile's other blocks wait for it (`tile_barrier`),
then every block computes y = act((x - mean) gamma / std + beta [+ residual])
over its own rows, last first (the likeliest still in L2), and, where the
activation's gradient is needed later, its bit mask (8 channels a byte, as
cuDNN's fused backward reads it). Where |mean| is large against the std,
shifting by one sample of the channel keeps the variance's digits, and the
centred form keeps y's. A thread moves a pack of VEC = 8 channels in one
vector access (16 bytes of bf16; one byte of the mask), or one channel where
the channels or a buffer's alignment do not allow 8 (`pack_width`; its
lanes' mask bits then meet by ballot).

Backward, one launch (`bn_backward`): dz = dy where the activation passed the
gradient (the mask, or y without one; written where a residual's gradient
needs it), dbeta = sum dz and dgamma = sum dz x^ the same way, then after the
tile's barrier dx = gamma / std (dz - (dbeta + x^ dgamma) / M).

Clusters (CLUSTER > 1, sm_90): the CLUSTER row chunks of a column tile run as
one thread-block cluster. Each block leaves its totals in its shared memory,
and after the cluster's barrier every block adds all of them in rank order
(the same bits in each) and takes its statistics from there. That replaces
the partial sums in global memory, their fences, the ticket, the tile's
barrier and the statistics' round trip. An H200's Nsight Compute run of
ResNet-50 CIFAR bf16 put those at about 5 us of each 13.6 us launch with 4x4
maps: the single-chunk launches of 2x2 maps took 8.9 us.

Launched early (EARLY 1, ops/batchnorm.py LAUNCH_EARLY; sm_90): each
kernel is launched with programmatic stream serialization, so its blocks may
start while the kernel before it on the stream ends. Until
griddepcontrol.wait they only ask L2 for the inputs older launches wrote
(the residual forward; x, the mask or y and the saved statistics backward):
a step's backward finds those a forward pass old, in device memory (an
H200's ResNet-50 bf16 backward: 557 us with each layer's inputs cold, 463
warm). Prefetches only, so no value is read before the wait: a line the
kernel before still writes is written in L2, where the loads after the wait
read it.

Why: cuDNN's batch norm is a runtime-compiled graph per shape (about a second
to build each candidate on a fresh machine) and a memset beside each launch
(an H200 profile of ResNet-50 bf16: 792 us of the step in 106 launches and 89
us in 107 memsets). The first version, two launches each way, made the H100's
step 3.6-6.4% slower than cuDNN's.
"""
from __future__ import annotations

from .reductions import COLUMN_TILE_SOURCE

# The activations batch norm fuses and the bit mask of their gradient; the layer's element-wise kernels share it.
ACTIVATION_SOURCE = r"""
__device__ __forceinline__ float activate(float v) {
    return ACT == 0 ? v : ACT == 1 ? fmaxf(v, 0.f) : fminf(fmaxf(v, 0.f), 6.f);
}
// Where the activation passes the gradient on: y > 0 (ReLU), 0 < y < 6 (ReLU6).
__device__ __forceinline__ bool passes_gradient(float y) { return y > 0.f && (ACT != 2 || y < 6.f); }
// Element i's bit of the mask, 8 channels a byte: a warp's ballot over 32 consecutive elements is 4 mask bytes
// (little-endian: bit j of byte k is element 8k+j). Every lane of the warp calls it, i < n or not.
__device__ __forceinline__ void write_mask_bit(unsigned char* mask, long long i, long long n, bool passes) {
    const unsigned int bits = __ballot_sync(0xffffffffu, passes);
    if ((threadIdx.x & 31) == 0 && i < n) {   // i is a multiple of 32 here: a whole word, or the last bytes
        if (i + 32 <= n) *(unsigned int*)(mask + i / 8) = bits;
        else for (int k = 0; i + 8 * k < n; ++k) mask[i / 8 + k] = (unsigned char)(bits >> (8 * k));
    }
}
"""

SOURCE = COLUMN_TILE_SOURCE + ACTIVATION_SOURCE + r"""
// Row steps from row `from` of the block's chunk to its end (t.stop), t.step rows a step.
__device__ __forceinline__ long long trips(long long from, const ColumnTile& t) {
    return from < t.stop ? (t.stop - from + t.step - 1) / t.step : 0;
}
// EARLY: the rows a thread asks L2 for before the wait, from its first (on-chip plans keep at most 8 trips).
#define EARLY_TRIPS 8
// A hint that brings the line of p into L2; it reads nothing into a register, so it may run before the wait.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
// EARLY: wait for the kernel before this one on the stream (all its writes visible); without EARLY there is nothing
// to wait for (the launch came after it ended).
__device__ __forceinline__ void wait_for_previous() {
#if EARLY && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Blocks of one column tile meet here after its sums: the block that drew the last ticket (`last`, it wrote the
// tile's statistics) publishes them by moving the tile's generation on; the others wait for that. The grid is
// at most two blocks an SM (plan_chunks) and __launch_bounds__ keeps two resident, so no block waits on one that
// cannot start. `seen` is the generation read before the block's ticket, so no memset and no reset is needed.
__device__ __forceinline__ void tile_barrier(unsigned int* generations, unsigned int seen, bool last) {
    __syncthreads();   // the last block's owners wrote the statistics
    if (threadIdx.x == 0) {
        if (last) {
            __threadfence();
            atomicAdd(generations + blockIdx.x, 1u);
        } else {
            while (*(volatile unsigned int*)(generations + blockIdx.x) == seen) __nanosleep(64);
            __threadfence();
        }
    }
    __syncthreads();
}
// The generation of this block's tile, read by thread 0 before any ticket is drawn (the fence orders them).
__device__ __forceinline__ unsigned int tile_generation(const unsigned int* generations) {
    unsigned int seen = 0u;
    if (CLUSTER == 1 && threadIdx.x == 0 && gridDim.y > 1) {
        seen = *(volatile const unsigned int*)(generations + blockIdx.x);
        __threadfence();
    }
    return seen;
}
// One byte of the mask for every 8 elements: the lanes of a warp hold consecutive elements, 8 to a byte (CHANNELS
// is a multiple of 8 where there is a mask), and the byte's first lane writes it where its element is in range.
__device__ __forceinline__ void write_mask_byte(unsigned char* mask, long long i, bool valid, bool passes) {
    const int lane = threadIdx.x & 31, warp_start = threadIdx.x - lane;
    const int lanes = min(32, (int)blockDim.x - warp_start);
    const unsigned int bits = __ballot_sync(lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u, passes && valid);
    if ((lane & 7) == 0 && valid) mask[i >> 3] = (unsigned char)(bits >> lane);
}
// Channel c's sums sit at sums[j * PACKS + c / VEC] for its j = 2 (c % VEC) and 2 (c % VEC) + 1: a column-sum
// "column" is a pack of VEC channels, so each thread adds 2 VEC sums (finish_column_sums<2 VEC>).
#define PACKS (CHANNELS / VEC)
typedef Pack<ELEM_T, VEC> Elems;
#if CLUSTER > 1
// A column tile's row chunks are one cluster: gridDim.y == CLUSTER, so a block's rank is blockIdx.y.
#define TILE_CLUSTER __cluster_dims__(1, CLUSTER, 1)
// Every thread of every block of the cluster (arrive releases, wait acquires): shared-memory writes before it are
// seen by every block after it.
__device__ __forceinline__ void cluster_sync() {
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
}
// The float at `local` in this block's shared memory, read from the same place in the cluster's block `rank`.
__device__ __forceinline__ float cluster_load(float* local, unsigned int rank) {
    return *(const float*)__cluster_map_shared_rank((void*)local, rank);
}
#else
#define TILE_CLUSTER
#endif
// The N sums of column t.col over its whole tile, in `total` of the column's owner (row lane 0). CLUSTER 1: the
// ticket's ending (finish_column_sums) through `sums`; the owners of the block that wrote them read them back,
// and true is returned there. Clusters: each block's totals in its shared `slots`, then every block's owners add
// all blocks' slots in rank order, the same bits in each, and every block returns true. Every thread calls it.
template <int N>
__device__ __forceinline__ bool tile_sums(const ColumnTile& t, int tile_cols, const float (&s)[N], float* lane_sums,
                                          float* partials, unsigned int* counters, float* sums, float (&total)[N]) {
    const bool owner = threadIdx.x < tile_cols;
#if CLUSTER > 1
    __shared__ float slots[N * 32];   // tile_cols <= 32
    float own_total[N];
    lane_totals<N>(s, lane_sums, t, tile_cols, own_total);
    if (owner) {
        #pragma unroll
        for (int j = 0; j < N; ++j) slots[j * tile_cols + t.tc] = own_total[j];
    }
    cluster_sync();   // every block's slots written
    if (owner) {
        #pragma unroll
        for (int j = 0; j < N; ++j) total[j] = 0.f;
        for (unsigned int r = 0; r < CLUSTER; ++r) {
            #pragma unroll
            for (int j = 0; j < N; ++j) total[j] += cluster_load(slots + j * tile_cols + t.tc, r);
        }
    }
    cluster_sync();   // no block leaves while another still reads its slots
    return true;
#else
    float* out[N];
    #pragma unroll
    for (int j = 0; j < N; ++j) out[j] = sums + j * PACKS;
    const bool last = finish_column_sums<N>(t, PACKS, tile_cols, s, lane_sums, partials, counters, out);
    if (last && owner && t.col < PACKS) {
        #pragma unroll
        for (int j = 0; j < N; ++j) total[j] = sums[j * PACKS + t.col];
    }
    return last;
#endif
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
// The gradient after the activation of one pack: dy where it passed (the mask's bits, or y without a mask). With
// DY_PARTS 2, dy is the sum of dy and dy2 (the gradients of the output's two readers), rounded as add2 rounds it.
__device__ __forceinline__ Elems through_activation(const ELEM_T* dy, const ELEM_T* dy2, const ELEM_T* y,
                                                    const unsigned char* mask, long long i) {
    Elems g = load_pack<ELEM_T, VEC>(dy, i);
    if (DY_PARTS == 2) {
        const Elems h = load_pack<ELEM_T, VEC>(dy2, i);
        #pragma unroll
        for (int v = 0; v < VEC; ++v) store_f(g.v, v, load_f(g.v, v) + load_f(h.v, v));
    }
    unsigned int bits = 0xffu;
    Elems out, z;
    if (ACT != 0 && MASK) bits = VEC == 8 ? mask[i >> 3] : (mask[i >> 3] >> (i & 7)) & 1u;
    if (ACT != 0 && !MASK) out = load_pack<ELEM_T, VEC>(y, i);
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const bool passes = ACT == 0 || (MASK ? (bits >> v) & 1u : passes_gradient(load_f(out.v, v)));
        store_f(z.v, v, passes ? load_f(g.v, v) : 0.f);   // dy or 0: exact in ELEM_T
    }
    return z;
}
// dgamma's and dbeta's sums of one pack: dz x^ and dz.
__device__ __forceinline__ void add_gradient_sums(const Elems& z, const Elems& e, const float (&m)[VEC],
                                                  const float (&r_std)[VEC], float (&s)[2 * VEC]) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        s[2 * v] += load_f(z.v, v) * ((load_f(e.v, v) - m[v]) * r_std[v]);
        s[2 * v + 1] += load_f(z.v, v);
    }
}
// dx = gamma / std (dz - (dbeta + x^ dgamma) / M) of one pack, k = gamma / std.
__device__ __forceinline__ Elems input_gradient(const Elems& e, const Elems& z, const float (&m)[VEC],
                                                const float (&r_std)[VEC], const float (&k)[VEC],
                                                const float (&g)[VEC], const float (&bsum)[VEC], float inv_count) {
    Elems o;
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const float x_hat = (load_f(e.v, v) - m[v]) * r_std[v];
        store_f(o.v, v, k[v] * (load_f(z.v, v) - (bsum[v] + x_hat * g[v]) * inv_count));
    }
    return o;
}
// BN backward in one launch: dgamma = sum dz x^ and dbeta = sum dz per channel (dz = act'(dy), written to dz
// where write_dz: a residual reads it), then, where dx is wanted, over the block's own rows
// dx = gamma / std (dz - (dbeta + x^ dgamma) / M), M = rows (the batch statistics' count).
extern "C" TILE_CLUSTER __global__ void __launch_bounds__(256, 2)
bn_backward(const ELEM_T* dy, const ELEM_T* dy2, const ELEM_T* x, const ELEM_T* y, const unsigned char* mask,
            const float* gamma, const float* mean, const float* inv_std, float* dgamma, float* dbeta, float* sums,
            ELEM_T* dz, int write_dz, ELEM_T* dx, int write_dx, float* partials, unsigned int* counters,
            unsigned int* generations, int rows, int rows_per_chunk, int tile_cols) {
    extern __shared__ float lane_sums[];   // 2 VEC sums a thread: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    const bool own = t.col < PACKS;
    const long long c0 = (long long)t.col * VEC;
    if (EARLY && own) {   // what the forward pass wrote: the statistics, x, and the mask or y
        prefetch_l2(mean + c0);
        prefetch_l2(inv_std + c0);
        for (int k = 0; k < EARLY_TRIPS && t.first + k * t.step < t.stop; ++k) {
            const long long i = (t.first + k * t.step) * cols + c0;
            prefetch_l2(x + i);
            if (ACT != 0 && MASK) prefetch_l2(mask + (i >> 3));
            if (ACT != 0 && !MASK) prefetch_l2(y + i);
        }
    }
    wait_for_previous();   // before any load or store
    const unsigned int seen = tile_generation(generations);
    float m[VEC], r_std[VEC], s[2 * VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        m[v] = own ? mean[c0 + v] : 0.f;
        r_std[v] = own ? inv_std[c0 + v] : 0.f;
        s[2 * v] = s[2 * v + 1] = 0.f;
    }
    Elems kept_x[CACHE], kept_z[CACHE];   // the first CACHE trips' x and dz, kept for dx's pass
    if (own) {
        #pragma unroll
        for (int k = 0; k < CACHE; ++k) {   // every load in flight before the first add
            const long long i = (t.first + k * t.step) * cols + c0;
            if (t.first + k * t.step >= t.stop) continue;
            kept_z[k] = through_activation(dy, dy2, y, mask, i);
            kept_x[k] = load_pack<ELEM_T, VEC>(x, i);
        }
        #pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            if (t.first + k * t.step >= t.stop) continue;
            add_gradient_sums(kept_z[k], kept_x[k], m, r_std, s);
            if (write_dz) store_pack<ELEM_T, VEC>(dz, (t.first + k * t.step) * cols + c0, kept_z[k]);
        }
        #pragma unroll 4
        for (long long r = t.first + CACHE * t.step; r < t.stop; r += t.step) {   // the rows beyond the cache
            const long long i = r * cols + c0;
            const Elems z = through_activation(dy, dy2, y, mask, i);
            add_gradient_sums(z, load_pack<ELEM_T, VEC>(x, i), m, r_std, s);
            if (write_dz) store_pack<ELEM_T, VEC>(dz, i, z);
        }
    }
    float total[2 * VEC];
    const bool last = tile_sums<2 * VEC>(t, tile_cols, s, lane_sums, partials, counters, sums, total);
    const bool owner = last && threadIdx.x < tile_cols && own;   // the owners: each holds its pack's sums
    __shared__ float tile_grads[2 * VEC * 32];   // clusters: a block's owners hand its threads dgamma and dbeta
    if (owner) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            if (CLUSTER == 1 || blockIdx.y == 0) {   // one block writes the parameters' gradients
                dgamma[c0 + v] = total[2 * v];
                dbeta[c0 + v] = total[2 * v + 1];
            }
            if (CLUSTER > 1) {
                tile_grads[2 * v * tile_cols + t.tc] = total[2 * v];
                tile_grads[(2 * v + 1) * tile_cols + t.tc] = total[2 * v + 1];
            }
        }
    }
    if (!write_dx) return;   // no block waits: the sums are all this launch owes
    float k[VEC];   // loaded while the tile waits
    #pragma unroll
    for (int v = 0; v < VEC; ++v) k[v] = own ? gamma[c0 + v] * r_std[v] : 0.f;
    if (CLUSTER == 1 && gridDim.y > 1) tile_barrier(generations, seen, last);
    else __syncthreads();
    if (!own) return;
    float g[VEC], bsum[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        g[v] = CLUSTER > 1 ? tile_grads[2 * v * tile_cols + t.tc] : *(volatile const float*)(dgamma + c0 + v);
        bsum[v] = CLUSTER > 1 ? tile_grads[(2 * v + 1) * tile_cols + t.tc] : *(volatile const float*)(dbeta + c0 + v);
    }
    const float inv_count = 1.f / (float)rows;
    // The rows beyond the cache read again, backwards (the likeliest still in L2), then the kept ones.
    #pragma unroll 2
    for (long long r = t.first + (trips(t.first, t) - 1) * t.step; r >= t.first + CACHE * t.step; r -= t.step) {
        const long long i = r * cols + c0;
        store_pack<ELEM_T, VEC>(dx, i, input_gradient(load_pack<ELEM_T, VEC>(x, i),
                                                      through_activation(dy, dy2, y, mask, i), m, r_std, k, g, bsum,
                                                      inv_count));
    }
    #pragma unroll
    for (int j = 0; j < CACHE; ++j) {
        const long long r = t.first + j * t.step;
        if (r < t.stop)
            store_pack<ELEM_T, VEC>(dx, r * cols + c0, input_gradient(kept_x[j], kept_z[j], m, r_std, k, g, bsum,
                                                                      inv_count));
    }
}
"""
