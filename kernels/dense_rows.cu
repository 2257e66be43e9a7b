// Row-wise kernels over dense N x d matrices, one warp per row (d <= 32 * RV: the row is
// held in registers).
//
// cbsr_to_dense: the dense rows of a CBSR matrix (values N x k, indices N x k): a warp
//   writes its row's zeros, then the k values at their columns (the row is still in L1/L2,
//   so it leaves for DRAM once: one pass, where zeros + scatter make two). Raw bits are
//   copied, so it serves fp32, fp16 and bf16 alike. Also MaxK's backward.
// layer_norm: y = (x - mean) * rstd * weight + bias with mean and rstd = 1 / sqrt(var + eps)
//   per row (the biased variance, as torch's LayerNorm), fp32; mean and rstd are written
//   for torch's backward. Two passes over the row in registers: the mean, then the variance
//   of x - mean.
//
// Compile-time constants (-D):
//   ELEM_BYTES 4 or 2 (cbsr_to_dense), IDX_BYTES 1 or 2 (CBSR indices), RV elements per lane
//   (layer_norm), WARPS per block.

#ifndef ELEM_BYTES
#define ELEM_BYTES 4
#endif
#ifndef IDX_BYTES
#define IDX_BYTES 1
#endif
#ifndef RV
#define RV 8
#endif
#ifndef WARPS
#define WARPS 4
#endif
#define FULL_MASK 0xffffffffu

#if ELEM_BYTES == 4
typedef unsigned int raw_t;
#else
typedef unsigned short raw_t;
#endif
#if IDX_BYTES == 1
typedef unsigned char idx_t;
#else
typedef unsigned short idx_t;
#endif

extern "C" __global__ void __launch_bounds__(WARPS * 32)
cbsr_to_dense(const raw_t* __restrict__ values, const idx_t* __restrict__ indices,
              raw_t* __restrict__ out, long long n_rows, int d, int k) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    raw_t* dst = out + row * (long long)d;
    if (((d * ELEM_BYTES) & 15) == 0) {  // rows of whole 16-byte vectors (out is aligned)
        for (int c = lane; c < d * ELEM_BYTES / 16; c += 32)
            reinterpret_cast<uint4*>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
    } else {
        for (int c = lane; c < d; c += 32) dst[c] = (raw_t)0;
    }
    __syncwarp();  // the zeros land before the values that overwrite some of them
    const long long base = row * (long long)k;
    for (int j = lane; j < k; j += 32) dst[(int)indices[base + j]] = values[base + j];
}

__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Lane l holds columns l * 4 + 128 * i (+0..3) for i < RV / 4 (float4 loads; d % 4 == 0).
extern "C" __global__ void __launch_bounds__(WARPS * 32)
layer_norm(const float* __restrict__ x, const float* __restrict__ weight,
           const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ mean_out,
           float* __restrict__ rstd_out, long long n_rows, int d, float eps) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const float* src = x + row * (long long)d;
    float4 v[RV / 4];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        v[i] = c < d ? *reinterpret_cast<const float4*>(src + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
    }
    const float mean = warp_sum_f(sum) / d;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        if (lane * 4 + 128 * i < d) {
            const float a = v[i].x - mean, b = v[i].y - mean, c = v[i].z - mean,
                        e = v[i].w - mean;
            sq += (a * a + b * b) + (c * c + e * e);
        }
    }
    const float rstd = rsqrtf(warp_sum_f(sq) / d + eps);
    float* dst = y + row * (long long)d;
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        if (c < d) {
            const float4 w = *reinterpret_cast<const float4*>(weight + c);
            const float4 b = *reinterpret_cast<const float4*>(bias + c);
            *reinterpret_cast<float4*>(dst + c) = make_float4(
                (v[i].x - mean) * rstd * w.x + b.x, (v[i].y - mean) * rstd * w.y + b.y,
                (v[i].z - mean) * rstd * w.z + b.z, (v[i].w - mean) * rstd * w.w + b.w);
        }
    }
    if (lane == 0) { mean_out[row] = mean; rstd_out[row] = rstd; }
}
