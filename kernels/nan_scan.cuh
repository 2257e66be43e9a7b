// Counting NaN as a kernel streams a tensor, into the counters of maxk_cbsr.cu's nan_stats
// (two zeroed unsigned 64-bit counters: [0] the NaN count, [1] raised to numel - (flat
// position of the first NaN); no NaN leaves both 0). Each thread counts the words it reads
// (scan_word); each warp then adds its count and lowest position once (add_nan_counts).
// Needs WORD_BYTES and ELEM_BYTES (cbsr_types.cuh).

#ifndef NAN_SCAN_CUH
#define NAN_SCAN_CUH

#include "cbsr_types.cuh"

#define PER_WORD (WORD_BYTES / ELEM_BYTES)

// A word's bits as 32-bit parts (the low half first for 2-byte words).
__device__ __forceinline__ void parts_of(const word_t& v, unsigned int (&p)[4]) {
#if WORD_BYTES == 16
    p[0] = v.x; p[1] = v.y; p[2] = v.z; p[3] = v.w;
#elif WORD_BYTES == 8
    p[0] = v.x; p[1] = v.y;
#else
    p[0] = (unsigned int)v;
#endif
}

// NaN among word w's elements (flat positions w * PER_WORD + e): count and the lowest
// position.
__device__ __forceinline__ void scan_word(const word_t& v, long long w, unsigned int& count,
                                          long long& first) {
    unsigned int parts[4];
    parts_of(v, parts);
#pragma unroll
    for (int e = 0; e < PER_WORD; ++e) {
#if ELEM_BYTES == 4
        const unsigned int bits = parts[e];
#else
        const unsigned int bits = (e & 1) ? parts[e >> 1] >> 16 : parts[e >> 1] & 0xffffu;
#endif
        if (is_nan_bits(bits)) {
            ++count;
            first = min(first, w * PER_WORD + e);
        }
    }
}

// The warp's counts into the counters (every lane of the warp calls it; first is numel
// where a lane saw no NaN).
__device__ __forceinline__ void add_nan_counts(unsigned int count, long long first,
                                               long long numel,
                                               unsigned long long* __restrict__ counters) {
    if (!__any_sync(FULL_MASK, count)) return;
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_xor_sync(FULL_MASK, count, o);
        first = min(first, __shfl_xor_sync(FULL_MASK, first, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(counters, (unsigned long long)count);
        atomicMax(counters + 1, (unsigned long long)(numel - first));
    }
}

#endif  // NAN_SCAN_CUH
