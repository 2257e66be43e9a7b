// Neighbour sampling: the sampled in-edges of each destination row of a block, written at
// the row's offset of the block's CSR as their source nodes and (optionally) their edge ids,
// read from the graph's in-edge CSR at the picked positions.
//
// block_degrees: each row's entry count in the block, min(in-degree, fanout) (all for
// fanout < 0), whose prefix sum the caller makes the block's row pointers.
//
// Both take n rows of dst, of which the first *real_rows are nodes where the caller passes
// that count (made on the device by the hop before, so that a batch's hops need no read
// back to the host); the rest is room, of degree 0.
//
// sample_edges: one thread per row. A row of in-degree <= fanout (or fanout < 0: all
// neighbours) takes its in-edges in order; a larger row keeps a uniform random
// fanout-subset by Floyd's algorithm over its fanout draws u_j in [0, 1): step j picks
// t = floor(u_j * (top + 1)), top = degree - fanout + j, and keeps top instead when t was
// picked before. The same arithmetic as dgl_maxk.backends.reference.sample_neighbors, so
// both give the same block.
//
// Compile-time constants (-D): MAX_FANOUT, the largest fanout the per-thread pick list
// holds; SRC_BYTES 4 or 8, the graph's source ids (int32 or int64); EID_BYTES 0 (no edge
// ids), 4 or 8, the graph's edge ids (written as int64).

#ifndef MAX_FANOUT
#define MAX_FANOUT 64
#endif
#ifndef SRC_BYTES
#define SRC_BYTES 4
#endif
#ifndef EID_BYTES
#define EID_BYTES 0
#endif

#include "cbsr_types.cuh"

#if EID_BYTES == 8
typedef long long eid_t;
#else
typedef int eid_t;
#endif

extern "C" __global__ void block_degrees(
    const long long* __restrict__ graph_indptr, const long long* __restrict__ dst,
    const long long* __restrict__ real_rows, long long* __restrict__ out, long long n,
    int fanout)
{
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= n) return;
    if (r >= rows_of(real_rows, n)) { out[r] = 0; return; }
    long long node = dst[r];
    long long degree = graph_indptr[node + 1] - graph_indptr[node];
    out[r] = fanout < 0 || degree <= fanout ? degree : fanout;
}

// The in-edge at graph position `pos` as the block's entry `slot`.
__device__ __forceinline__ void emit(const src_t* __restrict__ graph_indices,
                                     const eid_t* __restrict__ graph_eids,
                                     src_t* __restrict__ out_src,
                                     long long* __restrict__ out_eid, long long slot,
                                     long long pos) {
    out_src[slot] = graph_indices[pos];
#if EID_BYTES
    out_eid[slot] = (long long)graph_eids[pos];
#endif
}

extern "C" __global__ void sample_edges(
    const long long* __restrict__ graph_indptr, const src_t* __restrict__ graph_indices,
    const eid_t* __restrict__ graph_eids, const long long* __restrict__ dst,
    const long long* __restrict__ real_rows, const long long* __restrict__ block_indptr,
    const double* __restrict__ draws, src_t* __restrict__ out_src,
    long long* __restrict__ out_eid, long long n, int fanout)
{
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows_of(real_rows, n)) return;
    long long node = dst[r];
    long long start = graph_indptr[node];
    long long degree = graph_indptr[node + 1] - start;
    long long row_start = block_indptr[r];
    if (fanout < 0 || degree <= fanout) {
        for (long long i = 0; i < degree; ++i)
            emit(graph_indices, graph_eids, out_src, out_eid, row_start + i, start + i);
        return;
    }
    long long picked[MAX_FANOUT];
    const double* u = draws + r * fanout;
    for (int j = 0; j < fanout; ++j) {
        long long top = degree - fanout + j;
        long long t = (long long)(u[j] * (double)(top + 1));
        if (t > top) t = top;
        for (int i = 0; i < j; ++i) {
            if (picked[i] == t) { t = top; break; }
        }
        picked[j] = t;
        emit(graph_indices, graph_eids, out_src, out_eid, row_start + j, start + t);
    }
}
