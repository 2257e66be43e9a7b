// Gradient of the CBSR aggregation with respect to the edge values (SDDMM):
//     dA[e] = sum_j dY[r_e, idx[c_e, j]] * X[c_e, j]      for each CSR entry e = (r_e, c_e)
// Persistent warps take the edge groups (destination row r): dY[r] is staged in shared
// memory; a sub-group of L lanes takes one edge, each lane a partial dot product over entries
// j, j + L, ..., then a fixed butterfly reduction inside the sub-group. No atomics:
// bit-deterministic.
//
// Run-time: k, d. Compile-time constants (-D): P_L lanes per edge (a power of 2),
//   P_T = ceil(k / P_L), P_U, P_D4 (d % 4 == 0), WARPS, VAL_KIND (0 fp32, 1 fp16, 2 bf16),
//   IDX_BYTES (1 uint8, 2 int16).

#ifndef P_D4
#define P_D4 1
#endif
#ifndef P_L
#define P_L 32
#endif
#ifndef P_T
#define P_T 1
#endif
#ifndef P_U
#define P_U 4
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef P_MINB
#define P_MINB 1
#endif
#ifndef VAL_KIND
#define VAL_KIND 0
#endif
#ifndef IDX_BYTES
#define IDX_BYTES 1
#endif

#include "cbsr_types.cuh"

extern "C" __global__ void __launch_bounds__(WARPS * 32, P_MINB)
cbsr_sddmm(const int* __restrict__ group_row, const long long* __restrict__ group_start,
           const int* __restrict__ col_idx, const float* __restrict__ dy,
           const val_t* __restrict__ xv, const idx_t* __restrict__ xi,
           float* __restrict__ out, long long num_groups, int k, int d) {
    extern __shared__ float4 smem4[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int sub = lane / P_L;
    const int sl = lane % P_L;
    float* buf = reinterpret_cast<float*>(smem4) + warp * d;

    // Persistent warps: each warp takes groups g, g + (all warps), ... (uniform per warp;
    // no block-wide barrier anywhere).
    for (long long g = (long long)blockIdx.x * WARPS + warp; g < num_groups;
         g += (long long)gridDim.x * WARPS) {
        const long long e0 = group_start[g], e1 = group_start[g + 1];
        if (e0 == e1) continue;  // uniform
        const long long row = group_row[g] & 0x7fffffff;
        const float* dyr = dy + row * d;
        __syncwarp();  // the previous group's reads of buf are done
#if P_D4
        for (int c = lane * 4; c < d; c += 128)
            *reinterpret_cast<float4*>(buf + c) = *reinterpret_cast<const float4*>(dyr + c);
#else
        for (int c = lane; c < d; c += 32) buf[c] = dyr[c];
#endif
        __syncwarp();

        // The next 32 columns are loaded while this batch is gathered.
        int col_next = 0;
        if (e0 + lane < e1) col_next = col_idx[e0 + lane];
        for (long long eb = e0; eb < e1; eb += 32) {
            const int n = (int)min(32LL, e1 - eb);
            const int col = col_next;
            if (eb + 32 + lane < e1) col_next = col_idx[eb + 32 + lane];
            for (int t0 = 0; t0 < n; t0 += P_S * P_U) {  // uniform trip count over the warp
                int cc[P_U];
                bool ok[P_U];
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
                    const int le = t0 + u * P_S + sub;
                    cc[u] = __shfl_sync(FULL_MASK, col, le & 31);
                    ok[u] = le < n;
                }
                float acc[P_U];
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
                    acc[u] = 0.f;
                    const long long rb = (long long)cc[u] * k;
#pragma unroll
                    for (int t = 0; t < P_T; ++t) {
                        const int j = sl + t * P_L;
                        if (ok[u] && j < k)
                            acc[u] += buf[IDX_TO_INT(xi[rb + j])] * to_f32(xv[rb + j]);
                    }
                }
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
#pragma unroll
                    for (int o = P_L / 2; o > 0; o >>= 1)
                        acc[u] += __shfl_xor_sync(FULL_MASK, acc[u], o);
                    const int le = t0 + u * P_S + sub;
                    if (sl == 0 && le < n) out[eb + le] = acc[u];
                }
            }
        }
    }
}
