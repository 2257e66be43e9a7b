// Backward of the CBSR aggregation with respect to X's values (SSpMM, outer product):
//     dX[c, j] = sum_r A[r, c] * dY[r, idx[c, j]]      (A^T dY sampled at X's pattern)
// walking the same edge groups as the forward (no transposed matrix). Persistent warps take
// the groups (destination row r): a warp stages dY[r] (d floats) in shared memory, then for
// every edge (r, c, a) pushes a * dY[r][idx[c][j]] into dX[c][j] with global atomic adds
// (vector red.global.add.v4.f32 on sm_90 when k % 4 == 0). dX must be zero first. The order of the
// atomic adds varies from run to run, so the rounding of dX does too (not bit-deterministic).
//
// Run-time: k, d. Compile-time constants (-D): P_QV entries per lane per step (4 when
//   k % 4 == 0, else 1), P_L lanes per edge (a power of 2), P_T = ceil(k / (P_QV * P_L)),
//   P_U edges in flight per sub-group, P_D4 (d % 4 == 0), WARPS, IDX_BYTES (1 uint8, 2 int16).

#ifndef P_D4
#define P_D4 1
#endif
#ifndef P_QV
#define P_QV 4
#endif
#ifndef P_L
#define P_L 8
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
#ifndef IDX_BYTES
#define IDX_BYTES 1
#endif

#define P_S (32 / P_L)
#define FULL_MASK 0xffffffffu

#if IDX_BYTES == 1
typedef unsigned char idx_t;
#else
typedef short idx_t;
#endif

__device__ __forceinline__ void red_add_v4(float* addr, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
    atomicAdd(addr, a); atomicAdd(addr + 1, b); atomicAdd(addr + 2, c); atomicAdd(addr + 3, d);
#endif
}

// QV consecutive indices of row c starting at entry j (aligned: K % 4 == 0 when QV == 4).
__device__ __forceinline__ void load_idx(const idx_t* p, int (&o)[P_QV]) {
#if P_QV == 4
#if IDX_BYTES == 1
    const unsigned int w = *reinterpret_cast<const unsigned int*>(p);
    o[0] = w & 0xff; o[1] = (w >> 8) & 0xff; o[2] = (w >> 16) & 0xff; o[3] = w >> 24;
#else
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    o[0] = w.x & 0xffff; o[1] = w.x >> 16; o[2] = w.y & 0xffff; o[3] = w.y >> 16;
#endif
#else
#if IDX_BYTES == 1
    o[0] = (int)*p;
#else
    o[0] = (int)(unsigned short)*p;
#endif
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, P_MINB)
cbsr_sspmm(const int* __restrict__ group_row, const long long* __restrict__ group_start,
           const int* __restrict__ col_idx, const float* __restrict__ edge_val,
           const float* __restrict__ dy, const idx_t* __restrict__ xi,
           float* __restrict__ dx, long long num_groups, int k, int d, int c_lo, int c_hi) {
    // Only edges whose source c lies in [c_lo, c_hi) are pushed: the launcher may split the
    // sources into passes so that the slice of dX being updated stays in L2.
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
        if (e0 == e1) continue;  // uniform: an empty row contributes nothing
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

        // The next 32 (column, value) pairs are loaded while this batch is gathered.
        int col_next = 0;
        float a_next = 0.f;
        if (e0 + lane < e1) { col_next = col_idx[e0 + lane]; a_next = edge_val[e0 + lane]; }
        for (long long eb = e0; eb < e1; eb += 32) {
            const int n = (int)min(32LL, e1 - eb);
            const int col = col_next;
            const float a = a_next;
            if (eb + 32 + lane < e1) {
                col_next = col_idx[eb + 32 + lane];
                a_next = edge_val[eb + 32 + lane];
            }
            for (int t0 = 0; t0 < n; t0 += P_S * P_U) {  // uniform trip count over the warp
                int cc[P_U];
                float aa[P_U];
                bool ok[P_U];
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
                    const int le = t0 + u * P_S + sub;
                    cc[u] = __shfl_sync(FULL_MASK, col, le & 31);
                    aa[u] = __shfl_sync(FULL_MASK, a, le & 31);
                    ok[u] = le < n && cc[u] >= c_lo && cc[u] < c_hi;
                }
                int ix[P_U][P_T][P_QV];
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
#pragma unroll
                    for (int t = 0; t < P_T; ++t) {
                        const int j = (sl + t * P_L) * P_QV;
                        if (ok[u] && j < k) {
                            load_idx(xi + (long long)cc[u] * k + j, ix[u][t]);
                        } else {
#pragma unroll
                            for (int q = 0; q < P_QV; ++q) ix[u][t][q] = 0;
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
#pragma unroll
                    for (int t = 0; t < P_T; ++t) {
                        const int j = (sl + t * P_L) * P_QV;
                        if (ok[u] && j < k) {
                            float* dst = dx + (long long)cc[u] * k + j;
#if P_QV == 4
                            red_add_v4(dst, aa[u] * buf[ix[u][t][0]], aa[u] * buf[ix[u][t][1]],
                                       aa[u] * buf[ix[u][t][2]], aa[u] * buf[ix[u][t][3]]);
#else
                            atomicAdd(dst, aa[u] * buf[ix[u][t][0]]);
#endif
                        }
                    }
                }
            }
        }
    }
}
