// Neighbour sampling: the sampled in-edges of each destination row of a block, as positions
// in the graph's in-edge CSR, written at the row's offset of the block's CSR (the caller
// gathers the source nodes, and the edge ids, at those positions).
//
// One thread per row. A row of in-degree <= fanout (or fanout < 0: all neighbours) takes its
// in-edges in order; a larger row keeps a uniform random fanout-subset by Floyd's algorithm
// over its fanout draws u_j in [0, 1): step j picks t = floor(u_j * (top + 1)),
// top = degree - fanout + j, and keeps top instead when t was picked before. The same
// arithmetic as dgl_maxk.backends.reference.sample_neighbors, so both give the same block.
//
// Compile-time constant (-D): MAX_FANOUT, the largest fanout the per-thread pick list holds.

#ifndef MAX_FANOUT
#define MAX_FANOUT 64
#endif

extern "C" __global__ void sample_neighbors(
    const long long* __restrict__ graph_indptr, const long long* __restrict__ dst,
    const long long* __restrict__ block_indptr, const double* __restrict__ draws,
    long long* __restrict__ out, long long n, int fanout)
{
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= n) return;
    long long node = dst[r];
    long long start = graph_indptr[node];
    long long degree = graph_indptr[node + 1] - start;
    long long* row_out = out + block_indptr[r];
    if (fanout < 0 || degree <= fanout) {
        for (long long i = 0; i < degree; ++i) row_out[i] = start + i;
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
        row_out[j] = start + t;
    }
}
