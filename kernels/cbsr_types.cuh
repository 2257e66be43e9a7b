// The types every kernel file shares, set by the launch's -D constants (a file that takes
// ELEM_BYTES defines its default before including this one):
//   idx_t, a CBSR column index (IDX_BYTES 1: uint8 for widths up to 256, 2: uint16 for
//   widths up to 32768), read as an int by IDX_TO_INT;
//   raw_t, the bits of one feature value (ELEM_BYTES 4: fp32, 2: fp16 or bf16, IS_BF16 1 for
//   bf16), for kernels that compare or move values without doing arithmetic on them, and
//   is_nan_bits, whether such bits are a NaN;
//   word_t, the unit a thread loads at a time (WORD_BYTES 16, 8, 4, 2 or 1), for kernels
//   that stream raw bytes;
//   src_t, a graph's node id as the sampling kernels read it (SRC_BYTES 4: int32, 8: int64).

#ifndef CBSR_TYPES_CUH
#define CBSR_TYPES_CUH

#define FULL_MASK 0xffffffffu

#ifndef IDX_BYTES
#define IDX_BYTES 1
#endif
#if IDX_BYTES == 1
typedef unsigned char idx_t;
#else
typedef unsigned short idx_t;
#endif
#define IDX_TO_INT(x) ((int)(x))

#ifdef ELEM_BYTES
#if ELEM_BYTES == 4
typedef unsigned int raw_t;
#else
typedef unsigned short raw_t;
#endif

// Whether the raw bits of one value (in the low ELEM_BYTES bytes) are a NaN.
__device__ __forceinline__ bool is_nan_bits(unsigned int bits) {
#if ELEM_BYTES == 4
    return (bits & 0x7fffffffu) > 0x7f800000u;
#elif IS_BF16
    return (bits & 0x7fffu) > 0x7f80u;
#else
    return (bits & 0x7fffu) > 0x7c00u;
#endif
}
#endif

#ifdef WORD_BYTES
#if WORD_BYTES == 16
typedef uint4 word_t;
#elif WORD_BYTES == 8
typedef uint2 word_t;
#elif WORD_BYTES == 4
typedef unsigned int word_t;
#elif WORD_BYTES == 2
typedef unsigned short word_t;
#else
typedef unsigned char word_t;
#endif
#endif

#ifdef SRC_BYTES
#if SRC_BYTES == 4
typedef int src_t;
#else
typedef long long src_t;
#endif
#endif

// The rows of a sampled block's destination nodes that are nodes: *real_rows where the
// caller counted them on the device (the rest of the n rows is room), else all n; never
// more than n (a count past the rows the caller made room for reads none past them).
__device__ __forceinline__ long long rows_of(const long long* real_rows, long long n) {
    if (!real_rows) return n;
    long long rows = *real_rows;
    return rows < n ? rows : n;
}

#endif  // CBSR_TYPES_CUH
