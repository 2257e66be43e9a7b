// What the LayerNorm kernels share (dense_rows.cu's layer_norm and layer_norm_backward,
// maxk_cbsr.cu's maxk_reg with LAYER_NORM): a row held by one warp as float4 vectors, lane
// `lane` holding columns lane * 4 + 128 * i (+0..3), zeros past d; its mean and rstd, and
// its normalised values. One copy, so that the LayerNorm + top-k kernel normalises to the
// same bits as the LayerNorm kernel.

#ifndef LAYER_NORM_ROW_CUH
#define LAYER_NORM_ROW_CUH

__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// mean and rstd = 1 / sqrt(var + eps) of the row (biased variance, taken around the mean).
template <int NV>
__device__ __forceinline__ void row_mean_rstd(const float4 (&v)[NV], int d, int lane,
                                              float eps, float& mean, float& rstd) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
    mean = warp_sum_f(sum) / d;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        if (lane * 4 + 128 * i < d) {
            const float a = v[i].x - mean, b = v[i].y - mean, c = v[i].z - mean,
                        e = v[i].w - mean;
            sq += (a * a + b * b) + (c * c + e * e);
        }
    }
    rstd = rsqrtf(warp_sum_f(sq) / d + eps);
}

// (v - mean) * rstd * w + b, four columns.
__device__ __forceinline__ float4 normalise4(float4 v, float mean, float rstd, float4 w,
                                             float4 b) {
    return make_float4((v.x - mean) * rstd * w.x + b.x, (v.y - mean) * rstd * w.y + b.y,
                       (v.z - mean) * rstd * w.z + b.z, (v.w - mean) * rstd * w.w + b.w);
}

#endif  // LAYER_NORM_ROW_CUH
