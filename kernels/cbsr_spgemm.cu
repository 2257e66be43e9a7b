// Forward aggregation Y = A . X with X in CBSR (values N x k, indices N x k), Y dense fp32.
//
// A (num_dst x num_src, CSR over destination rows) is cut into edge groups (edge_groups.cuh).
// Every row has at least one group (an empty row has one empty group), so every row of Y is
// written.
//
// Lane j of a sub-group reads entries (j, j + L, ...) * QV .. + QV - 1 of the neighbour's
// CBSR row (coalesced), and accumulates a * value into its sub-group's own d-wide fp32 buffer
// in shared memory (within one edge the columns are distinct, so no two lanes of a sub-group
// touch one address in the same step, and a __syncwarp orders consecutive steps). U edges per
// sub-group have their loads in flight at once, and the next 32 (column, value) pairs are
// loaded while a batch is gathered. At the end the S buffers are summed (fixed order) and the
// row is stored (single-group rows: deterministic, and no zeroing of Y needed) or added with
// global atomics (multi-group rows: Y must be zero there first; the order of the atomic adds,
// hence the rounding, varies from run to run).
//
// Bank windows (P_BANKED): sub-group s's buffer lives in banks [s * L,
// s * L + L) (buf_slot), so sub-groups never collide, and the lanes of one step collide only
// on columns equal mod L, which the top-k kernel's bank order (maxk_cbsr.cu) makes rare.
// Measured (H200, Reddit-sized, k = 32): shared-memory wavefronts 918M -> 638M, 4.9 -> 4.5 ms.
//
// X's entries come as values xv and indices xi, or (P_PACKED) each value with its index
// at xv: one 32-bit word for half-precision values, an int32 pair for fp32 (load_entries).
//
// Run-time: k (CBSR entries per row), d (width). Compile-time constants (-D): those of
//   edge_groups.cuh (P_T = ceil(k / (P_L * P_QV))), P_BANKED (bank windows), and P_PAD:
//   each sub-group's buffer holds d + P_PAD floats (launch.py's spgemm_buffer_stride, the one
//   place it is chosen; checked here).

#ifndef P_BANKED
#define P_BANKED 0
#endif
#ifndef P_PAD
#define P_PAD 0
#endif

#include "edge_groups.cuh"

// Private buffers lie d + P_PAD floats apart: the least stride >= d that is L more than a
// multiple of 32, so that sub-groups adding into the same column hit different banks (columns
// that many rows keep, as trained layers' are, collided 4 ways at d apart: H200,
// Reddit-sized, k = 8, 2.6 against 2.1 ms for uniform columns). Bank windows give each
// sub-group d + P_PAD = ceil(d / L) * L floats of ceil(d / L) rows of 32 banks. The padding
// is checked here as far as it is known at compile time; the bank windows' fit to d, which
// their memory safety rests on, at run time (the private buffers' bank spacing is a matter
// of speed only: tests/test_ops.py checks the launch's).
static_assert(P_PAD >= 0 && P_PAD < (P_BANKED ? P_L : 32), "P_PAD: less than a step");
static_assert(!P_D4 || P_PAD % 4 == 0, "P_PAD: float4 rows stay 16-byte aligned");
static_assert(P_S > 1 || P_PAD == 0, "P_PAD: none for one buffer");

__device__ __forceinline__ int buf_stride(int d) { return d + P_PAD; }

// Where column c of sub-group sub's buffer lives: banked, at (c / L) * 32 + sub * L + c % L.
__device__ __forceinline__ int buf_slot(int c, int sub, int d) {
#if P_BANKED
    return (c / P_L) * 32 + sub * P_L + (c % P_L);
#else
    return sub * buf_stride(d) + c;
#endif
}

__device__ __forceinline__ int buf_floats(int d) { return P_S * buf_stride(d); }

// Sum the warp's S buffers into row yrow of Y: stored (single-group row) or added (multi).
__device__ __forceinline__ void flush_row(const float* buf, float* yrow, int d, int lane,
                                          bool multi) {
#if P_D4
    for (int c = lane * 4; c < d; c += 128) {
        float4 s = *reinterpret_cast<const float4*>(buf + buf_slot(c, 0, d));
#pragma unroll
        for (int q = 1; q < P_S; ++q) {
            const float4 w = *reinterpret_cast<const float4*>(buf + buf_slot(c, q, d));
            s.x += w.x; s.y += w.y; s.z += w.z; s.w += w.w;
        }
        if (multi) red_add_v4(yrow + c, s);
        else *reinterpret_cast<float4*>(yrow + c) = s;
    }
#else
    for (int c = lane; c < d; c += 32) {
        float s = buf[buf_slot(c, 0, d)];
#pragma unroll
        for (int q = 1; q < P_S; ++q) s += buf[buf_slot(c, q, d)];
        if (multi) atomicAdd(yrow + c, s);
        else yrow[c] = s;
    }
#endif
}

// Add a * v into columns ix of the sub-group's buffer, for this lane's entries of one edge
// (index -1: none). They lie in one row of X, so their columns differ, and every load goes
// before any store: written as `buf[slot] += ...`, each entry's load waited on the previous
// entry's store (the compiler cannot tell the slots apart), one shared-memory round trip
// after another (H200, Reddit-sized, fp32: k = 32 4.31 -> 3.81 ms). A lane with one entry
// keeps the plain form, which was faster there (products-sized k = 8: 4.31 against 4.89).
__device__ __forceinline__ void add_edge_entries(float* buf, int sub, int d, float a,
                                                 const float (&v)[P_T][P_QV],
                                                 const int (&ix)[P_T][P_QV]) {
    if constexpr (P_T * P_QV == 1) {
        if (ix[0][0] >= 0) buf[buf_slot(ix[0][0], sub, d)] += a * v[0][0];
    } else {
        float sum[P_T][P_QV];
#pragma unroll
        for (int t = 0; t < P_T; ++t)
#pragma unroll
            for (int q = 0; q < P_QV; ++q)
                sum[t][q] = ix[t][q] >= 0 ? buf[buf_slot(ix[t][q], sub, d)] : 0.f;
#pragma unroll
        for (int t = 0; t < P_T; ++t)
#pragma unroll
            for (int q = 0; q < P_QV; ++q)
                if (ix[t][q] >= 0) buf[buf_slot(ix[t][q], sub, d)] = sum[t][q] + a * v[t][q];
    }
}

EDGE_GROUP_KERNEL
cbsr_spgemm(EDGE_GROUP_ARGS, const float* __restrict__ edge_val,
            const float* __restrict__ row_scale, const val_t* __restrict__ xv,
            const idx_t* __restrict__ xi, float* __restrict__ y, long long num_groups, int k,
            int d) {
    if (P_BANKED && buf_stride(d) % P_L) __trap();  // windows cut short: a launch bug
    const LanePlace p;
    float* buf = warp_smem(p.warp, buf_floats(d));

    for_each_group(num_groups, p.warp, [&](long long g) {
        for (int i = p.lane; i < buf_floats(d); i += 32) buf[i] = 0.f;
        __syncwarp();
        const int rowf = group_row[g];
        const long long row = rowf & 0x7fffffff;
        // without edge values each edge's value is the row's scale
        for_each_edge_batch<true>(col_idx, edge_val, row_scale_of(row_scale, row),
                                  group_start[g], group_start[g + 1], p,
                                  [&](const int (&cc)[P_U], const float (&aa)[P_U],
                                      const bool (&ok)[P_U], const int (&)[P_U], long long) {
            float v[P_U][P_T][P_QV];
            int ix[P_U][P_T][P_QV];
            load_batch_entries(xv, xi, cc, ok, k, p.sl, v, ix);
#pragma unroll
            for (int u = 0; u < P_U; ++u) {
                add_edge_entries(buf, p.sub, d, aa[u], v[u], ix[u]);
                __syncwarp();  // the next edge's entries may hit the same columns
            }
        });
        __syncwarp();
        flush_row(buf, y + row * d, d, p.lane, rowf < 0);
        __syncwarp();  // the flush reads what the next group's zeroing overwrites
    });
}
