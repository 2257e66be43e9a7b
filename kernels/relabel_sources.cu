// Relabelling a sampled block's sources: its source nodes are its destination nodes, in
// their order, then the other sampled neighbours in the order of their first edge (as DGL's
// to_block numbers them); each edge's source becomes its position among them. Positions p
// in [0, n + capacity) name the destination rows (p < n) and the edges (edge p - n). Rows
// at or past rows_of(real_rows, n) and edges at or past the block's edge count,
// block_indptr[n], are room the caller left for the most the fan-outs allow, and are
// skipped, so nothing is read back to the host before.
//
// One open-addressing table (2^log2_slots slots of {node id, first position}, every word
// all ones when empty) takes three passes:
//   relabel_insert: each node at each position, keeping its smallest position (atomicMin);
//   relabel_flags:  1 for an edge that is its source's first position past the destinations;
//   (the caller's running sum of the flags numbers the new sources, 1 up)
//   relabel_assign: each edge's local id, each source node at its id, and the two counts
//                   [edges, source nodes] the caller reads back.
// Every pass depends only on the set of (node, position) pairs, so the result is the same
// for any interleaving of the threads.
//
// Compile-time constant (-D): SRC_BYTES 4 or 8, the width of the edges' source ids.

#ifndef SRC_BYTES
#define SRC_BYTES 4
#endif

#include "cbsr_types.cuh"

typedef unsigned long long table_t;
#define EMPTY_SLOT (~0ULL)

// Fibonacci hashing: the top bits of the id times 2^64 / phi spread consecutive ids.
__device__ __forceinline__ long long first_slot(table_t node, int log2_slots) {
    return (long long)((node * 0x9E3779B97F4A7C15ULL) >> (64 - log2_slots));
}

// The slot of `node`, claimed if it is not in the table yet (the table has room: the caller
// sizes it to at least twice the distinct nodes the positions can hold).
__device__ __forceinline__ long long claim(table_t* table, table_t node, int log2_slots) {
    long long mask = (1LL << log2_slots) - 1;
    for (long long s = first_slot(node, log2_slots);; s = (s + 1) & mask) {
        table_t held = atomicCAS(&table[2 * s], EMPTY_SLOT, node);
        if (held == EMPTY_SLOT || held == node) return s;
    }
}

// The slot of `node`, which an earlier pass inserted.
__device__ __forceinline__ long long find(const table_t* table, table_t node, int log2_slots) {
    long long mask = (1LL << log2_slots) - 1;
    long long s = first_slot(node, log2_slots);
    while (table[2 * s] != node) s = (s + 1) & mask;
    return s;
}

// The node at position p, or false for room past the block's rows or edges.
__device__ __forceinline__ bool node_at(long long p, long long n, long long rows,
                                        long long num_edges, const long long* dst,
                                        const src_t* sources, table_t* node) {
    if (p < n) {
        if (p >= rows) return false;
        *node = (table_t)dst[p];
        return true;
    }
    if (p - n >= num_edges) return false;
    *node = (table_t)sources[p - n];
    return true;
}

extern "C" __global__ void relabel_insert(
    const long long* __restrict__ dst, const long long* __restrict__ real_rows,
    const src_t* __restrict__ sources, const long long* __restrict__ block_indptr,
    table_t* __restrict__ table, long long n, long long capacity, int log2_slots)
{
    long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    table_t node;
    if (p >= n + capacity || !node_at(p, n, rows_of(real_rows, n), block_indptr[n], dst,
                                      sources, &node))
        return;
    long long s = claim(table, node, log2_slots);
    atomicMin(&table[2 * s + 1], (table_t)p);
}

extern "C" __global__ void relabel_flags(
    const src_t* __restrict__ sources, const long long* __restrict__ block_indptr,
    const table_t* __restrict__ table, long long* __restrict__ flags, long long n,
    long long capacity, int log2_slots)
{
    long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (e >= capacity) return;
    bool first = false;
    if (e < block_indptr[n]) {
        long long s = find(table, (table_t)sources[e], log2_slots);
        first = table[2 * s + 1] == (table_t)(n + e);
    }
    flags[e] = first;
}

extern "C" __global__ void relabel_assign(
    const long long* __restrict__ dst, const long long* __restrict__ real_rows,
    const src_t* __restrict__ sources, const long long* __restrict__ block_indptr,
    const table_t* __restrict__ table, const long long* __restrict__ new_rank,
    long long* __restrict__ src_nodes, long long* __restrict__ local,
    long long* __restrict__ counts, long long n, long long capacity, int log2_slots)
{
    long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long num_edges = block_indptr[n], rows = rows_of(real_rows, n);
    if (p == 0) {
        counts[0] = num_edges;
        counts[1] = rows + (num_edges ? new_rank[num_edges - 1] : 0);
    }
    if (p < rows) { src_nodes[p] = dst[p]; return; }
    table_t node;
    if (p >= n + capacity || !node_at(p, n, rows, num_edges, dst, sources, &node)) return;
    long long first = (long long)table[2 * find(table, node, log2_slots) + 1];
    long long id = first < n ? first : rows + new_rank[first - n] - 1;
    local[p - n] = id;
    if (first == p) src_nodes[id] = (long long)node;
}
