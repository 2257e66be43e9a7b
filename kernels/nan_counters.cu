// The NaN check of a dense tensor in one read: its NaN count is added to counters[0] and
// counters[1] is raised to numel - (flat position of its first NaN), the format of
// maxk_cbsr.cu's nan_stats (two zeroed unsigned 64-bit counters; no NaN leaves both 0).
// torch's scan takes three passes (the mask, its count, its first position), each as long
// as this kernel on a large tensor.
//
// Threads stride over the tensor a word at a time (UNROLL words in flight each); a warp
// that holds a NaN reduces its count and lowest position, and its lane 0 adds them.
//
// Compile-time constants (-D):
//   WORD_BYTES bytes each thread loads at a time (16, 8, 4 or 2: the widest that divides
//              the tensor's address and size)
//   ELEM_BYTES 4 (fp32) or 2 (fp16 / bf16)
//   IS_BF16    1 for bf16 (its exponent field is fp32's), else 0
//   WARPS      warps per block
//   UNROLL     words each thread loads before it tests them

#ifndef WORD_BYTES
#define WORD_BYTES 16
#endif
#ifndef ELEM_BYTES
#define ELEM_BYTES 4
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef UNROLL
#define UNROLL 4
#endif

#include "nan_scan.cuh"

extern "C" __global__ void __launch_bounds__(WARPS * 32)
nan_counters(const word_t* __restrict__ x, long long num_words, long long numel,
             unsigned long long* __restrict__ counters) {
    unsigned int count = 0;
    long long first = numel;
    const long long stride = (long long)gridDim.x * WARPS * 32;
    for (long long w0 = (long long)blockIdx.x * WARPS * 32 + threadIdx.x; w0 < num_words;
         w0 += stride * UNROLL) {
        word_t v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)  // past the end: zero bits, not NaN
            v[u] = w0 + u * stride < num_words ? x[w0 + u * stride] : word_t{};
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) scan_word(v[u], w0 + u * stride, count, first);
    }
    add_nan_counts(count, first, numel, counters);
}
