// Backward of the CBSR aggregation with respect to X's values (SSpMM, outer product):
//     dX[c, j] = sum_r A[r, c] * dY[r, idx[c, j]]      (A^T dY sampled at X's pattern)
// walking edge groups (no transposed matrix): group g covers CSR entries [group_start[g],
// group_end[g]). They are the forward's groups, or, when dX is larger than L2, a walk of the
// CSR source slice by source slice (GraphPlan.source_slices), so that the atomics of each
// stretch of the walk hit one slice of dX, which then stays in L2. Persistent warps take
// the groups (destination row r): a warp stages dY[r] (d floats) in shared memory, then for
// every edge (r, c, a) (a: the edge's value, or r's scale) pushes a * dY[r][idx[c][j]] into
// dX[c][j] with global atomic adds (vector red.global.add.v4.f32 on sm_90 when k % 4 == 0).
// dX must be zero first. The order of the atomic adds varies from run to run, so the
// rounding of dX does too (not bit-deterministic).
//
// Run-time: k, d. Compile-time constants (-D): those of edge_groups.cuh (P_QV 4 when
//   k % 4 == 0, else 1; P_T = ceil(k / (P_QV * P_L))).

#include "edge_groups.cuh"

EDGE_GROUP_KERNEL
cbsr_sspmm(EDGE_GROUP_ARGS, const long long* __restrict__ group_end,
           const float* __restrict__ edge_val, const float* __restrict__ row_scale,
           const float* __restrict__ dy, const idx_t* __restrict__ xi, float* __restrict__ dx,
           long long num_groups, int k, int d) {
    for_each_staged_group(num_groups, dy, group_row, d, [&](const LanePlace& p, long long g,
                                                            const float* buf) {
        const long long e0 = group_start[g], e1 = group_end[g];
        // without edge values each edge's value is the row's scale
        for_each_edge_batch<true>(col_idx, edge_val,
                                  row_scale_of(row_scale, group_row[g] & 0x7fffffff), e0, e1, p,
                                  [&](const int (&cc)[P_U], const float (&aa)[P_U],
                                      const bool (&ok)[P_U], const int (&)[P_U], long long) {
            // each (edge slot u, step t) with an entry: its first column j of X's row
            auto each_entry = [&](auto on_entry) {
#pragma unroll
                for (int u = 0; u < P_U; ++u) {
#pragma unroll
                    for (int t = 0; t < P_T; ++t) {
                        const int j = (p.sl + t * P_L) * P_QV;
                        on_entry(u, t, j, ok[u] && j < k);
                    }
                }
            };
            int ix[P_U][P_T][P_QV];
            each_entry([&](int u, int t, int j, bool valid) {  // all indices, then the adds
                if (valid) {
                    load_indices(xi + (long long)cc[u] * k + j, ix[u][t]);
                } else {
#pragma unroll
                    for (int q = 0; q < P_QV; ++q) ix[u][t][q] = 0;
                }
            });
            each_entry([&](int u, int t, int j, bool valid) {
                if (!valid) return;
                float* dst = dx + (long long)cc[u] * k + j;
#if P_QV == 4
                red_add_v4(dst, make_float4(aa[u] * buf[ix[u][t][0]], aa[u] * buf[ix[u][t][1]],
                                            aa[u] * buf[ix[u][t][2]], aa[u] * buf[ix[u][t][3]]));
#else
                atomicAdd(dst, aa[u] * buf[ix[u][t][0]]);
#endif
            });
        });
    });
}
