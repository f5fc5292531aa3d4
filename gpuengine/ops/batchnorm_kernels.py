"""What the engine's own batch-norm kernels (training, NHWC) share: the activations, the tile's sums and barrier,
clusters and the early launch. batchnorm_forward.py and batchnorm_backward.py hold the two kernels;
ops/batchnorm.py plans and launches them.

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

# Row trips, the early launch's prefetch and wait, the tile's barrier and its sums (ticket or cluster), for both.
TILE_SOURCE = COLUMN_TILE_SOURCE + ACTIVATION_SOURCE + r"""
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
"""
