"""The CUDA source of the engine's batch-norm backward (`bn_backward`); batchnorm_kernels.py has what it shares.

One launch: dz = dy where the activation passed the gradient (the mask, or y
without one; written where a residual's gradient needs it), dbeta = sum dz and
dgamma = sum dz x^ the same way, then after the tile's barrier dx = gamma /
std (dz - (dbeta + x^ dgamma) / M).
"""
from __future__ import annotations

from .batchnorm_kernels import TILE_SOURCE

BACKWARD_SOURCE = TILE_SOURCE + r"""
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
