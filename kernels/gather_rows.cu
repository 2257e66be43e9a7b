// Rows of a table gathered into a dense output, out[i] = table[index[i]], raw bytes copied
// (any dtype), one warp per row. The table may be pinned host memory, read over the bus
// through its device pointer (UVA: features larger than the GPU's memory), or device memory.
// Row offsets are 64-bit: tables of any size.
//
// Compile-time constants (-D): WORD_BYTES, the bytes each lane moves per load (16, 8, 4, 2
// or 1: the largest that divides the row and the tables' alignment), WARPS per block.

#ifndef WORD_BYTES
#define WORD_BYTES 16
#endif
#ifndef WARPS
#define WARPS 8
#endif

#include "cbsr_types.cuh"

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gather_rows(const word_t* __restrict__ table, const long long* __restrict__ index,
            word_t* __restrict__ out, long long n, long long row_words) {
    const long long i = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (i >= n) return;
    const word_t* src = table + index[i] * row_words;
    word_t* dst = out + i * row_words;
    for (long long c = threadIdx.x & 31; c < row_words; c += 32) dst[c] = src[c];
}
