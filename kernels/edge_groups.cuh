// What the three edge-group kernels (cbsr_spgemm.cu, cbsr_sspmm.cu, cbsr_sddmm.cu) share:
// their compile-time constants, the CBSR value and index types, how a warp walks its edge
// groups and the edges in them, how CBSR entries are loaded, how a dY row is staged in shared
// memory, and the vector reduction into global memory. Each kernel says only what it does
// with a batch of edges. dgl_maxk.backends.cuda.runtime pastes this file in place of the
// kernels' #include line; dgl_maxk.backends.cuda.launch picks the constants.
//
// Edge groups: group g covers CSR entries [group_start[g], group_start[g+1]) of destination
// row group_row[g] & 0x7fffffff; the top bit of group_row[g] is set when the row spans several
// groups. (The SSpMM takes each group's end as well: its walk by source slices lists groups
// out of CSR order.) Persistent warps take groups g, g + (all warps), ... (uniform per warp;
// no block-wide barrier anywhere). A warp is split into P_S = 32 / P_L sub-groups of P_L lanes;
// sub-group s takes edges s, s + P_S, ... of each batch of 32 edges, P_U of them in flight.
//
// Edge values: one per CSR entry (P_EDGE_VALUES), or none: each edge of a group then has
// the same value, its destination row's scale (row_scale, nullable: 1), which the forward
// and the backward pass to the batch walk as its `unit`. A mean's 1 / in-degree or a GCN's
// in-degree^-1/2 repeated per entry cost the loads and shuffles of E values: 6% of the
// forward at k = 8, 5% of the backward at k = 8 and 3% at k = 32 (H200, Reddit-sized).
// (The forward scaling its sums as it flushes a row instead was 7-18% slower at k = 32 and
// 64: the compiler laid out its inner loop worse.)
//
// Constants (-D): P_L lanes per edge (a power of 2), P_T entries per lane (a power of 2),
// P_U edges in flight per sub-group, P_QV entries per lane per load (1, 2 or 4: launch.py's
// spgemm_lanes, sspmm_config and sddmm_config say when), P_D4 (d % 4 == 0: float4 row
// access), P_MINB (min blocks per SM), WARPS per block, VAL_KIND (0 fp32, 1 fp16, 2 bf16),
// IDX_BYTES (1 uint8, 2 uint16), P_PREFETCH (staged rows copied one group ahead; P_D4
// only), P_EDGE_VALUES (1: the edges' values are read; 0: each edge counts the batch walk's
// `unit`), P_PACKED (how X's entries come, launch.py's spgemm_entries: 0 values and
// indices apart; 1 half-precision values, each entry one 32-bit word, the value's bits low
// and the index high; 2 fp32 values, each entry an int32 pair, value bits then index; so
// that one load brings both; see load_entries).

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
#ifndef P_QV
#define P_QV 1
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
#ifndef P_PREFETCH
#define P_PREFETCH 0
#endif
#ifndef P_EDGE_VALUES
#define P_EDGE_VALUES 1
#endif
#ifndef P_PACKED
#define P_PACKED 0
#endif

#define P_S (32 / P_L)

#include "cbsr_types.cuh"

#if VAL_KIND == 0
typedef float val_t;
__device__ __forceinline__ float to_f32(float v) { return v; }
#else
typedef unsigned short val_t;
__device__ __forceinline__ float to_f32(unsigned short v) {
#if VAL_KIND == 1
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#else
    return __uint_as_float(((unsigned int)v) << 16);
#endif
}
#endif

// Four fp32 adds into global memory at addr (16-byte aligned), one vector reduction on sm_90.
__device__ __forceinline__ void red_add_v4(float* addr, float4 v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
#else
    atomicAdd(addr, v.x); atomicAdd(addr + 1, v.y); atomicAdd(addr + 2, v.z);
    atomicAdd(addr + 3, v.w);
#endif
}

// P_QV consecutive CBSR indices of a row, from entry pointer pi (P_QV-aligned).
__device__ __forceinline__ void load_indices(const idx_t* pi, int (&ix)[P_QV]) {
#if P_QV == 4 && IDX_BYTES == 1
    const unsigned int q = *reinterpret_cast<const unsigned int*>(pi);
    ix[0] = q & 0xff; ix[1] = (q >> 8) & 0xff; ix[2] = (q >> 16) & 0xff; ix[3] = q >> 24;
#elif P_QV == 4
    const uint2 q = *reinterpret_cast<const uint2*>(pi);
    ix[0] = q.x & 0xffff; ix[1] = q.x >> 16; ix[2] = q.y & 0xffff; ix[3] = q.y >> 16;
#elif P_QV == 2 && IDX_BYTES == 1
    const unsigned int q = *reinterpret_cast<const unsigned short*>(pi);
    ix[0] = q & 0xff; ix[1] = q >> 8;
#elif P_QV == 2
    const unsigned int q = *reinterpret_cast<const unsigned int*>(pi);
    ix[0] = q & 0xffff; ix[1] = q >> 16;
#else
    ix[0] = IDX_TO_INT(*pi);
#endif
}

// P_QV consecutive CBSR values of a row as fp32, from entry pointer pv (P_QV-aligned).
__device__ __forceinline__ void load_values(const val_t* pv, float (&v)[P_QV]) {
#if P_QV == 4 && VAL_KIND == 0
    const float4 w = *reinterpret_cast<const float4*>(pv);
    v[0] = w.x; v[1] = w.y; v[2] = w.z; v[3] = w.w;
#elif P_QV == 4
    const uint2 w = *reinterpret_cast<const uint2*>(pv);
    v[0] = to_f32((unsigned short)(w.x & 0xffff)); v[1] = to_f32((unsigned short)(w.x >> 16));
    v[2] = to_f32((unsigned short)(w.y & 0xffff)); v[3] = to_f32((unsigned short)(w.y >> 16));
#elif P_QV == 2 && VAL_KIND == 0
    const float2 w = *reinterpret_cast<const float2*>(pv);
    v[0] = w.x; v[1] = w.y;
#elif P_QV == 2
    const unsigned int w = *reinterpret_cast<const unsigned int*>(pv);
    v[0] = to_f32((unsigned short)(w & 0xffff)); v[1] = to_f32((unsigned short)(w >> 16));
#else
    v[0] = to_f32(*pv);
#endif
}

// n consecutive 32-bit words from p (n * 4-byte aligned, n = 1, 2 or a multiple of 4) in
// the widest vector loads.
template <int n>
__device__ __forceinline__ void load_words(const unsigned int* p, unsigned int (&w)[n]) {
    if constexpr (n % 4 == 0) {
#pragma unroll
        for (int i = 0; i < n; i += 4) {
            const uint4 q = *reinterpret_cast<const uint4*>(p + i);
            w[i] = q.x; w[i + 1] = q.y; w[i + 2] = q.z; w[i + 3] = q.w;
        }
    } else if constexpr (n == 2) {
        const uint2 q = *reinterpret_cast<const uint2*>(p);
        w[0] = q.x; w[1] = q.y;
    } else {
        static_assert(n == 1, "1, 2 or a multiple of 4 words");
        w[0] = *p;
    }
}

// P_QV consecutive CBSR entries of a row (values as fp32, indices), from entry offset off
// (P_QV-aligned) of the values xv and indices xi, or with P_PACKED of the words or pairs at
// xv (xi unused). Packed or paired, a gathered row is one run: one L1 wavefront an edge
// where values and indices took two (H200: bf16 values, k = 32, Reddit-sized 4.73 -> 4.22
// ms; fp32 pairs, k = 8, products-sized 5.67 -> 4.35; docs/performance.md).
__device__ __forceinline__ void load_entries(const val_t* xv, const idx_t* xi, long long off,
                                             float (&v)[P_QV], int (&ix)[P_QV]) {
#if P_PACKED
    // a packed entry is one 32-bit word, a paired one two (value bits, then index)
    constexpr int W = P_PACKED == 2 ? 2 : 1;
    static_assert((P_PACKED == 2) == (VAL_KIND == 0), "pairs hold fp32, words half values");
    unsigned int w[P_QV * W];
    load_words(reinterpret_cast<const unsigned int*>(xv) + off * W, w);
#pragma unroll
    for (int q = 0; q < P_QV; ++q) {
#if P_PACKED == 2
        v[q] = __uint_as_float(w[2 * q]);
        ix[q] = (int)w[2 * q + 1];
#else
        v[q] = to_f32((unsigned short)(w[q] & 0xffff));
        ix[q] = (int)(w[q] >> 16);
#endif
    }
#else
    load_values(xv + off, v);
    load_indices(xi + off, ix);
#endif
}

// This lane's CBSR entries of a batch's edges (for_each_edge_batch: edge slot u's source row
// cc[u]), all loads in flight before any is used: slot u, step t holds entries
// (sl + t * P_L) * P_QV .. + P_QV - 1 of the row, or index -1 (value 0) past the row's k
// entries or where ok[u] is false.
__device__ __forceinline__ void load_batch_entries(const val_t* xv, const idx_t* xi,
                                                   const int (&cc)[P_U], const bool (&ok)[P_U],
                                                   int k, int sl, float (&v)[P_U][P_T][P_QV],
                                                   int (&ix)[P_U][P_T][P_QV]) {
#pragma unroll
    for (int u = 0; u < P_U; ++u) {
        const long long rb = (long long)cc[u] * k;
#pragma unroll
        for (int t = 0; t < P_T; ++t) {
            const int j = (sl + t * P_L) * P_QV;
            if (ok[u] && j < k) {
                load_entries(xv, xi, rb + j, v[u][t], ix[u][t]);
            } else {
#pragma unroll
                for (int q = 0; q < P_QV; ++q) { v[u][t][q] = 0.f; ix[u][t][q] = -1; }
            }
        }
    }
}

// Copy row (d floats) into the warp's shared-memory buffer.
__device__ __forceinline__ void stage_row(float* buf, const float* row, int d, int lane) {
#if P_D4
    for (int c = lane * 4; c < d; c += 128)
        *reinterpret_cast<float4*>(buf + c) = *reinterpret_cast<const float4*>(row + c);
#else
    for (int c = lane; c < d; c += 32) buf[c] = row[c];
#endif
}

// The scale of destination row `row`: row_scale[row], or 1 without row scales.
__device__ __forceinline__ float row_scale_of(const float* __restrict__ row_scale, long long row) {
    return row_scale != nullptr ? row_scale[row] : 1.f;
}

// Copy row (d floats, 16-byte aligned, d % 4 == 0) into buf asynchronously (cp.async, sm_80+):
// the copies land by the lane's next cp.async.wait_group.
__device__ __forceinline__ void stage_row_async(float* buf, const float* row, int d, int lane) {
#if __CUDA_ARCH__ >= 800
    for (int c = lane * 4; c < d; c += 128) {
        const unsigned int to = (unsigned int)__cvta_generic_to_shared(buf + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(to), "l"(row + c)
                     : "memory");
    }
#else
    stage_row(buf, row, d, lane);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
#endif
}

// Every edge-group kernel's entry: WARPS warps a block, at least P_MINB blocks an SM; its
// arguments start with the groups' rows (bit 31: a row of several groups), their first CSR
// entries (one more than there are groups, the last one closing the last group; the SSpMM
// also takes each group's end) and the CSR's source columns.
#define EDGE_GROUP_KERNEL extern "C" __global__ void __launch_bounds__(WARPS * 32, P_MINB)
#define EDGE_GROUP_ARGS const int* __restrict__ group_row, \
    const long long* __restrict__ group_start, const int* __restrict__ col_idx

// This warp's part of the block's dynamic shared memory: floats_per_warp floats.
__device__ __forceinline__ float* warp_smem(int warp, int floats_per_warp) {
    extern __shared__ float4 smem4[];
    return reinterpret_cast<float*>(smem4) + warp * floats_per_warp;
}

// Where a lane sits: its warp in the block, its sub-group and its place in the sub-group.
struct LanePlace {
    int lane, warp, sub, sl;
    __device__ __forceinline__ LanePlace()
        : lane(threadIdx.x & 31), warp(threadIdx.x >> 5), sub((threadIdx.x & 31) / P_L),
          sl((threadIdx.x & 31) % P_L) {}
};

// on_group(g) for each edge group of this warp (persistent warps).
template <class OnGroup>
__device__ __forceinline__ void for_each_group(long long num_groups, int warp, OnGroup on_group) {
    for (long long g = (long long)blockIdx.x * WARPS + warp; g < num_groups;
         g += (long long)gridDim.x * WARPS)
        on_group(g);
}

// on_group(g, row) for each edge group of this warp, with row = the group's destination row of
// `rows` (d floats) staged in the warp's shared memory (buf: 2 d floats with P_PREFETCH, else
// d). P_PREFETCH (P_D4 rows only): the next group's row is copied in (cp.async) while this
// group's edges are walked, hiding the row's load where groups are short. (Rows are staged
// unscaled: the backward scaling each landed copy in place, rather than its products, took
// products-sized k = 8 6.16 against 5.66 ms, its source-sliced groups being short.)
template <class OnGroup>
__device__ __forceinline__ void for_each_group_staged(long long num_groups, const LanePlace& p,
                                                      float* buf, const float* rows,
                                                      const int* __restrict__ group_row,
                                                      int d, OnGroup on_group) {
#if P_PREFETCH
    const long long stride = (long long)gridDim.x * WARPS;
    long long g = (long long)blockIdx.x * WARPS + p.warp;
    if (g < num_groups)
        stage_row_async(buf, rows + (long long)(group_row[g] & 0x7fffffff) * d, d, p.lane);
    cp_async_commit();
    for (int half = 0; g < num_groups; g += stride, half ^= 1) {
        if (g + stride < num_groups)
            stage_row_async(buf + (half ^ 1) * d,
                            rows + (long long)(group_row[g + stride] & 0x7fffffff) * d, d,
                            p.lane);
        cp_async_commit();
        cp_async_wait<1>();  // this group's row has landed (the next one may still fly)
        __syncwarp();
        on_group(g, buf + half * d);
        __syncwarp();  // this row is read before the next group's copy overwrites it
    }
    cp_async_wait<0>();
#else
    for_each_group(num_groups, p.warp, [&](long long g) {
        __syncwarp();  // the previous group's reads of buf are done
        stage_row(buf, rows + (long long)(group_row[g] & 0x7fffffff) * d, d, p.lane);
        __syncwarp();
        on_group(g, buf);
    });
#endif
}

// on_group(p, g, row): for_each_group_staged with this lane's place p and the warp's share of
// the block's dynamic shared memory ((1 + P_PREFETCH) d floats), the entry of the kernels
// that walk the groups with their destination row of `rows` staged.
template <class OnGroup>
__device__ __forceinline__ void for_each_staged_group(long long num_groups, const float* rows,
                                                      const int* __restrict__ group_row,
                                                      int d, OnGroup on_group) {
    const LanePlace p;
    float* smem = warp_smem(p.warp, (1 + P_PREFETCH) * d);
    for_each_group_staged(num_groups, p, smem, rows, group_row, d,
                          [&](long long g, const float* row) { on_group(p, g, row); });
}

// One batch of edges for a sub-group: P_U edges (slot u: column col[u], edge value val[u],
// position le[u] in the current block of 32 edges starting at CSR entry eb; ok[u] false past
// the group's end). kValues: whether the kernel uses edge values: read where P_EDGE_VALUES,
// else `unit` each (val[] is 0 without kValues).
template <bool kValues, class OnBatch>
__device__ __forceinline__ void for_each_edge_batch(const int* __restrict__ col_idx,
                                                    const float* __restrict__ edge_val,
                                                    float unit, long long e0, long long e1,
                                                    const LanePlace& p, OnBatch on_batch) {
    // The next 32 (column, value) pairs are loaded while this batch is gathered.
    int col_next = 0;
    float a_next = 0.f;
    if (e0 + p.lane < e1) {
        col_next = col_idx[e0 + p.lane];
        if (kValues && P_EDGE_VALUES) a_next = edge_val[e0 + p.lane];
    }
    for (long long eb = e0; eb < e1; eb += 32) {
        const int n = (int)min(32LL, e1 - eb);
        const int col = col_next;
        const float a = a_next;
        if (eb + 32 + p.lane < e1) {
            col_next = col_idx[eb + 32 + p.lane];
            if (kValues && P_EDGE_VALUES) a_next = edge_val[eb + 32 + p.lane];
        }
        for (int t0 = 0; t0 < n; t0 += P_S * P_U) {  // uniform trip count over the warp
            int cc[P_U], le[P_U];
            float aa[P_U];
            bool ok[P_U];
#pragma unroll
            for (int u = 0; u < P_U; ++u) {
                le[u] = t0 + u * P_S + p.sub;
                cc[u] = __shfl_sync(FULL_MASK, col, le[u] & 31);
                aa[u] = !kValues ? 0.f
                        : P_EDGE_VALUES ? __shfl_sync(FULL_MASK, a, le[u] & 31) : unit;
                ok[u] = le[u] < n;
            }
            on_batch(cc, aa, ok, le, eb);
        }
    }
}
