// Gradient of the CBSR aggregation with respect to the edge values (SDDMM):
//     dA[e] = sum_j dY[r_e, idx[c_e, j]] * X[c_e, j]      for each CSR entry e = (r_e, c_e)
// Persistent warps take the edge groups (destination row r): dY[r] is staged in shared
// memory; a sub-group of L lanes takes one edge, each lane a partial dot product over its
// entries (QV consecutive ones per load, as the forward reads them), then a fixed butterfly
// reduction inside the sub-group. No atomics: bit-deterministic.
//
// Run-time: k, d. Compile-time constants (-D): those of edge_groups.cuh (P_QV 4 when
//   k % 4 == 0 and the rows allow 4-entry loads, else 1; P_T = ceil(k / (P_QV * P_L))).

#include "edge_groups.cuh"

EDGE_GROUP_KERNEL
cbsr_sddmm(EDGE_GROUP_ARGS, const float* __restrict__ dy, const val_t* __restrict__ xv,
           const idx_t* __restrict__ xi, float* __restrict__ out, long long num_groups, int k,
           int d) {
    for_each_staged_group(num_groups, dy, group_row, d, [&](const LanePlace& p, long long g,
                                                            const float* buf) {
        const long long e0 = group_start[g], e1 = group_start[g + 1];
        for_each_edge_batch<false>(col_idx, nullptr, 0.f, e0, e1, p,
                                   [&](const int (&cc)[P_U], const float (&)[P_U],
                                       const bool (&ok)[P_U], const int (&le)[P_U],
                                       long long eb) {
            float v[P_U][P_T][P_QV];
            int ix[P_U][P_T][P_QV];
            load_batch_entries(xv, xi, cc, ok, k, p.sl, v, ix);
            float acc[P_U];
#pragma unroll
            for (int u = 0; u < P_U; ++u) {
                acc[u] = 0.f;
#pragma unroll
                for (int t = 0; t < P_T; ++t)
#pragma unroll
                    for (int q = 0; q < P_QV; ++q)
                        if (ix[u][t][q] >= 0) acc[u] += buf[ix[u][t][q]] * v[u][t][q];
            }
#pragma unroll
            for (int u = 0; u < P_U; ++u) {
#pragma unroll
                for (int o = P_L / 2; o > 0; o >>= 1)
                    acc[u] += __shfl_xor_sync(FULL_MASK, acc[u], o);
                if (p.sl == 0 && ok[u]) out[eb + le[u]] = acc[u];
            }
        });
    });
}
