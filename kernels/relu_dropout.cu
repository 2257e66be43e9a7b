// ReLU, then dropout, of a dense fp32 tensor: one pass forward and one backward, where torch
// takes a pass for the ReLU, one for the NaN check and one for the dropout forward (which
// writes its mask), and two backward (the mask read back, then the ReLU's test).
//
// Forward, a thread per 16-byte word (4 elements; flat position 4w + e):
//   out = x * scale where x > 0 and the element is kept, else 0 (NaN stays NaN, as in
//   torch). Kept: the element's 32 random bits >= threshold = ceil(p 2^32) (never at p = 1).
//   The bits are Philox4x32-10 (Salmon et al., SC 2011) of the counter (w, 0, 0) under the
//   64-bit key *seed, which torch's generator draws for each call: the same bits for the
//   same seed on any launch, and new ones on each CUDA graph replay, as torch's dropout.
//   The first head_words words (a block's destination rows) are also written to head, a
//   tensor of their own: autograd then hands the backward their gradient apart, where a
//   view would have it pad that gradient with zeros to the whole tensor and add it in
//   (a fill and an add over N x d).
//   counters (optional): the NaN check (nan_scan.cuh) of x as it is read.
// Backward: grad_x = (grad + grad_head on the head's words) * scale where out != 0, else 0.
//   out is nonzero exactly where the element was kept and x > 0 (scale >= 1: x * scale
//   never underflows), so no mask is kept. (Where a NaN gradient meets a dropped element
//   torch's product gives NaN and this gives 0; where a dropped +inf made a NaN, this
//   passes the gradient and torch's gives 0.)
//
// Compile-time constants (-D): WARPS, warps per block.

#ifndef WARPS
#define WARPS 8
#endif
#define WORD_BYTES 16
#define ELEM_BYTES 4
#define IS_BF16 0

#include "nan_scan.cuh"

// Philox4x32-10 of counter (lo, hi, 0, 0) under key (seed's low, high 32 bits).
__device__ __forceinline__ uint4 philox(unsigned long long counter, unsigned long long seed) {
    unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32), c2 = 0u,
                 c3 = 0u;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ float relu_dropped(float x, unsigned int bits,
                                              unsigned long long threshold, float scale) {
    return x > 0.f || x != x ? x * (bits >= threshold ? scale : 0.f) : 0.f;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
relu_dropout(const float4* __restrict__ x, float4* __restrict__ out, float4* __restrict__ head,
             long long num_words, long long head_words,
             const unsigned long long* __restrict__ seed, unsigned long long threshold,
             float scale, unsigned long long* __restrict__ counters) {
    const long long w = (long long)blockIdx.x * WARPS * 32 + threadIdx.x;
    unsigned int count = 0;
    long long first = 4 * num_words;
    if (w < num_words) {
        const float4 v = x[w];
        if (counters) scan_word(reinterpret_cast<const uint4&>(v), w, count, first);
        const uint4 r = threshold ? philox(w, *seed) : make_uint4(0u, 0u, 0u, 0u);
        const float4 o = make_float4(relu_dropped(v.x, r.x, threshold, scale),
                                     relu_dropped(v.y, r.y, threshold, scale),
                                     relu_dropped(v.z, r.z, threshold, scale),
                                     relu_dropped(v.w, r.w, threshold, scale));
        out[w] = o;
        if (w < head_words) head[w] = o;
    }
    if (counters) add_nan_counts(count, first, 4 * num_words, counters);
}

__device__ __forceinline__ float passed(float out, float grad, float scale) {
    return out != 0.f ? grad * scale : 0.f;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
relu_dropout_backward(const float4* __restrict__ out, const float4* __restrict__ grad,
                      const float4* __restrict__ grad_head, float4* __restrict__ grad_x,
                      long long num_words, long long head_words, float scale) {
    const long long w = (long long)blockIdx.x * WARPS * 32 + threadIdx.x;
    if (w >= num_words) return;
    const float4 o = out[w];
    float4 g = grad[w];
    if (w < head_words) {
        const float4 h = grad_head[w];
        g = make_float4(g.x + h.x, g.y + h.y, g.z + h.z, g.w + h.w);
    }
    grad_x[w] = make_float4(passed(o.x, g.x, scale), passed(o.y, g.y, scale),
                            passed(o.z, g.z, scale), passed(o.w, g.w, scale));
}
