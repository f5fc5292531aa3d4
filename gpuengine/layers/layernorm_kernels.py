"""The CUDA source of LayerNorm's kernels; layers/layernorm.py plans and launches them.

FORWARD_SOURCE: the forward, with the residual sum of post-LN where a program
gives it; SOURCE: the two-launch backward (dx) and the column sums of wide
rows; FUSED_SOURCE: dx, dgamma and dbeta in one launch where a lane holds its
part of a row in registers. In each, a lane takes VEC neighbouring features at a
time (dim % VEC == 0), one vector load or store each.
"""
from __future__ import annotations

from ..ops.reductions import BLOCK_ROWS_SOURCE, COLUMN_TILE_SOURCE

# The forward, compiled with PACKS: a lane's packs of its row kept in registers (dim <= 32 VEC PACKS), read from
# x once; PACKS 0 (wider rows) reads the row again for the variance and the output.
FORWARD_SOURCE = r"""
typedef Pack<ELEM_T, VEC> P;
// f(p, c) for each pack p of the lane's part of a row, c its first feature, in order of c.
template <typename F> __device__ __forceinline__ void each_pack(int dim, F f) {
    const int lane = threadIdx.x & 31;
    if (PACKS > 0) {
        #pragma unroll
        for (int p = 0; p < (PACKS > 0 ? PACKS : 1); ++p) {
            const int c = (p * 32 + lane) * VEC;
            if (c < dim) f(p, c);
        }
    } else {
        for (int c = lane * VEC, p = 0; c < dim; c += 32 * VEC, ++p) f(p, c);
    }
}
// The row's variance and output once the first pass has its sum s (x's packs in held, or x read again).
__device__ __forceinline__ void normalize_row(const ELEM_T* x, const P* held, const ELEM_T* gamma,
                                              const ELEM_T* beta, ELEM_T* y, float* mean, float* rstd,
                                              long long row, int dim, float eps, float s) {
    const long long base = row * dim;
    const float m = warp_sum(s) / dim;
    float q = 0.f;
    each_pack(dim, [&](int p, int c) {
        const P a = PACKS > 0 ? held[p] : load_pack<ELEM_T, VEC>(x, base + c);
        #pragma unroll
        for (int k = 0; k < VEC; ++k) { const float d = load_f(a.v, k) - m; q += d * d; }
    });
    const float r = rsqrtf(warp_sum(q) / dim + eps);
    each_pack(dim, [&](int p, int c) {
        const P a = PACKS > 0 ? held[p] : load_pack<ELEM_T, VEC>(x, base + c), g = load_pack<ELEM_T, VEC>(gamma, c),
                b = load_pack<ELEM_T, VEC>(beta, c);
        P out;
        #pragma unroll
        for (int k = 0; k < VEC; ++k)
            store_f(out.v, k, (load_f(a.v, k) - m) * r * load_f(g.v, k) + load_f(b.v, k));
        store_pack(y, base + c, out);
    });
    if ((threadIdx.x & 31) == 0) { mean[row] = m; rstd[row] = r; }
}
extern "C" __global__ void layernorm_fwd(const ELEM_T* x, const ELEM_T* gamma, const ELEM_T* beta, ELEM_T* y,
                                         float* mean, float* rstd, int rows, int dim, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    P held[PACKS > 0 ? PACKS : 1];
    float s = 0.f;
    each_pack(dim, [&](int p, int c) {
        const P a = load_pack<ELEM_T, VEC>(x, row * dim + c);
        if (PACKS > 0) held[p] = a;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) s += load_f(a.v, k);
    });
    normalize_row(x, held, gamma, beta, y, mean, rstd, row, dim, eps, s);
}
// A residual sum and the LayerNorm of it: x = r1 + r2 is written (backward reads it), rounded to ELEM_T as the
// Add layer rounds it, and the statistics are taken of the rounded values, so the output is the unfused one's.
extern "C" __global__ void layernorm_add_fwd(const ELEM_T* r1, const ELEM_T* r2, ELEM_T* x, const ELEM_T* gamma,
                                             const ELEM_T* beta, ELEM_T* y, float* mean, float* rstd, int rows,
                                             int dim, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    P held[PACKS > 0 ? PACKS : 1];
    float s = 0.f;
    each_pack(dim, [&](int p, int c) {
        const P a = load_pack<ELEM_T, VEC>(r1, row * dim + c), b = load_pack<ELEM_T, VEC>(r2, row * dim + c);
        P sum;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            store_f(sum.v, k, load_f(a.v, k) + load_f(b.v, k));
            s += load_f(sum.v, k);
        }
        if (PACKS > 0) held[p] = sum;
        store_pack(x, row * dim + c, sum);
    });
    normalize_row(x, held, gamma, beta, y, mean, rstd, row, dim, eps, s);
}
"""
# The unfused backward (dx) and the column sums of wide rows.
SOURCE = COLUMN_TILE_SOURCE + r"""
extern "C" __global__ void layernorm_bwd(const ELEM_T* x, const ELEM_T* gamma, const ELEM_T* dy, const float* mean,
                                         const float* rstd, ELEM_T* dx, int rows, int dim) {
    typedef Pack<ELEM_T, VEC> P;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long base = row * dim;
    const float m = mean[row], r = rstd[row];
    float sg = 0.f, sgx = 0.f;
    for (int c = lane * VEC; c < dim; c += 32 * VEC) {
        const P a = load_pack<ELEM_T, VEC>(x, base + c), d = load_pack<ELEM_T, VEC>(dy, base + c),
                w = load_pack<ELEM_T, VEC>(gamma, c);
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float xhat = (load_f(a.v, k) - m) * r, g = load_f(d.v, k) * load_f(w.v, k);
            sg += g;
            sgx += g * xhat;
        }
    }
    const float mg = warp_sum(sg) / dim, mgx = warp_sum(sgx) / dim;
    for (int c = lane * VEC; c < dim; c += 32 * VEC) {
        const P a = load_pack<ELEM_T, VEC>(x, base + c), d = load_pack<ELEM_T, VEC>(dy, base + c),
                w = load_pack<ELEM_T, VEC>(gamma, c);
        P out;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float xhat = (load_f(a.v, k) - m) * r;
            store_f(out.v, k, r * (load_f(d.v, k) * load_f(w.v, k) - mg - xhat * mgx));
        }
        store_pack(dx, base + c, out);
    }
}
// dgamma (sums of dy * xhat) and dbeta (sums of dy), per reductions.py's finish_column_sums<2>.
extern "C" __global__ void layernorm_param_grads(const ELEM_T* x, const ELEM_T* dy, const float* mean,
                                                 const float* rstd, float* dgamma, float* dbeta, float* partials,
                                                 unsigned int* counters, int rows, int dim, int rows_per_chunk,
                                                 int tile_cols) {
    extern __shared__ float lane_sums[];   // dy * xhat sums, then dy sums: blockDim.x each
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    float s[2] = {0.f, 0.f};   // dy * xhat, dy
    if (t.col < dim) {
        #pragma unroll 4
        for (long long r = t.first; r < t.stop; r += t.step) {
            const float d = load_f(dy, r * dim + t.col);
            s[0] += d * ((load_f(x, r * dim + t.col) - mean[r]) * rstd[r]);
            s[1] += d;
        }
    }
    float* const out[2] = {dgamma, dbeta};
    finish_column_sums<2>(t, dim, tile_cols, s, lane_sums, partials, counters, out);
}
"""
# The one-launch backward, compiled with PACKS (a lane's packs of its row) beside ELEM_T and VEC.
FUSED_SOURCE = BLOCK_ROWS_SOURCE + r"""
// dx, dgamma and dbeta in one launch, where a lane keeps its PACKS packs of the row in registers: a warp takes a
// row at a time as layernorm_bwd does (the same dx, bit for bit) and adds dy * xhat and dy into its lanes' column
// sums; the block's warps meet in shared memory in order and the block writes its rows' sums to partials (rows of
// `stride` floats: SUMS dim rounded up to 4); the block drawing the last ticket adds the blocks' sums in a fixed
// order (the same bits every run, no float atomics) and resets the counter for the next launch or graph replay.
// warp_sums holds warps x stride floats. With DY_PARTS 2,
// dy is the sum of dy and dy2 (the gradients of the output's two readers), rounded to ELEM_T as add2 rounds it.
// With BIAS_SUM 1 (SUMS 3) a third column sum adds dx as written into dbias: the gradient of the last bias of the
// layer below, whose output gradient dx is. With DEFER 1 the block ends at its row of partials: a training program
// adds every kernel's rows in one launch after the backward pass (ops/partial_sums.py).
#define SUMS (2 + BIAS_SUM)
extern "C" __global__ void layernorm_bwd_grads(const ELEM_T* x, const ELEM_T* gamma, const ELEM_T* dy,
                                               const ELEM_T* dy2, const float* mean, const float* rstd, ELEM_T* dx,
                                               float* dgamma, float* dbeta, float* dbias, float* partials,
                                               unsigned int* counter, int rows, int dim, int rows_per_block,
                                               int stride) {
    typedef Pack<ELEM_T, VEC> P;
    // [warp][stride]: the warp's dy * xhat sums, its dy sums[, its dx sums]; then the ticket's flag in word 0
    extern __shared__ float warp_sums[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5, sums = SUMS * dim;
    float col_gx[PACKS][VEC], col_g[PACKS][VEC], col_dx[PACKS][BIAS_SUM ? VEC : 1];
    #pragma unroll
    for (int p = 0; p < PACKS; ++p)
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            col_gx[p][k] = col_g[p][k] = 0.f;
            if (BIAS_SUM) col_dx[p][BIAS_SUM ? k : 0] = 0.f;
        }
    const long long stop = min((long long)rows, (long long)(blockIdx.x + 1) * rows_per_block);
    for (long long row = (long long)blockIdx.x * rows_per_block + warp; row < stop; row += warps) {   // warp-uniform
        const long long base = row * dim;
        const float m = mean[row], r = rstd[row];
        P a[PACKS], d[PACKS], w[PACKS];
        float sg = 0.f, sgx = 0.f;
        #pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int c = (p * 32 + lane) * VEC;
            if (c >= dim) continue;
            a[p] = load_pack<ELEM_T, VEC>(x, base + c);
            d[p] = load_pack<ELEM_T, VEC>(dy, base + c);
            if (DY_PARTS == 2) {
                const P e = load_pack<ELEM_T, VEC>(dy2, base + c);
                #pragma unroll
                for (int k = 0; k < VEC; ++k) store_f(d[p].v, k, load_f(d[p].v, k) + load_f(e.v, k));
            }
            w[p] = load_pack<ELEM_T, VEC>(gamma, c);
            #pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float xhat = (load_f(a[p].v, k) - m) * r, dyk = load_f(d[p].v, k), g = dyk * load_f(w[p].v, k);
                sg += g;
                sgx += g * xhat;
                col_gx[p][k] += dyk * xhat;
                col_g[p][k] += dyk;
            }
        }
        const float mg = warp_sum(sg) / dim, mgx = warp_sum(sgx) / dim;
        #pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int c = (p * 32 + lane) * VEC;
            if (c >= dim) continue;
            P out;
            #pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float xhat = (load_f(a[p].v, k) - m) * r;
                store_f(out.v, k, r * (load_f(d[p].v, k) * load_f(w[p].v, k) - mg - xhat * mgx));
                if (BIAS_SUM) col_dx[p][BIAS_SUM ? k : 0] += load_f(out.v, k);   // dx as written: rounded
            }
            store_pack(dx, base + c, out);
        }
    }
    #pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int c = (p * 32 + lane) * VEC;
        if (c >= dim) continue;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            warp_sums[warp * sums + c + k] = col_gx[p][k];
            warp_sums[warp * sums + dim + c + k] = col_g[p][k];
            if (BIAS_SUM) warp_sums[warp * sums + 2 * dim + c + k] = col_dx[p][BIAS_SUM ? k : 0];
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < sums; j += blockDim.x) {
        float s = 0.f;
        for (int v = 0; v < warps; ++v) s += warp_sums[v * sums + j];   // the warps in order
        if (gridDim.x == 1)   // one block: its sums are the gradients
            (j < dim ? dgamma[j] : j < 2 * dim ? dbeta[j - dim] : dbias[j - 2 * dim]) = s;
        else partials[(long long)blockIdx.x * stride + j] = s;
    }
    if (gridDim.x == 1 || DEFER) return;
    __threadfence();   // the partials reach every SM before this block's ticket is taken
    __syncthreads();   // also: every read of warp_sums is done, so word 0 may take the flag
    int* last = (int*)warp_sums;
    if (threadIdx.x == 0) {
        *last = atomicAdd(counter, 1u) == gridDim.x - 1;
        if (*last) *counter = 0u;   // all tickets drawn: zero for the next launch or graph replay
    }
    __syncthreads();
    const bool is_last = *last;
    __syncthreads();   // every thread has the flag before warp_sums takes the runs' sums below
    if (!is_last) return;
    __threadfence();   // pairs with the writers' fences before the partials are read
    const int split = max(1, min(warps, (int)blockDim.x / (stride >> 2)));
    float4* runs = (float4*)warp_sums;   // [split][stride / 4]: split <= warps, so within the warps' stride floats
    add_block_rows(partials, stride, split, runs);
    for (int j = threadIdx.x; j < sums; j += blockDim.x)
        (j < dim ? dgamma[j] : j < 2 * dim ? dbeta[j - dim] : dbias[j - 2 * dim]) = run_total(runs, split, stride, j);
}
"""
