// Row-wise kernels over dense N x d matrices, one warp per row (d <= 32 * RV: the row is
// held in registers), and cbsr_gather, one thread per entry.
//
// cbsr_to_dense: the dense rows of a CBSR matrix (values N x k, indices N x k). STAGED (rows
//   of whole 16-byte vectors): a warp builds its row in shared memory (zeros, then the k
//   values) and writes it once in 16-byte vectors; else it writes the zeros, then the values
//   over them (k scattered stores a row into L2: H200, 233k rows of 256 fp32, k = 32, the
//   STAGED rows took 0.100 ms against 0.129; k = 8, 0.096 against 0.101). Raw
//   bits are copied, so it serves fp32, fp16 and bf16 alike. Also MaxK's backward.
// cbsr_to_dense_sums: cbsr_to_dense of fp32 rows of whole float4 vectors (built in shared
//   memory as STAGED does), on persistent warps that also add their rows up column by column
//   into one row of partial sums each (the caller adds those rows up, in a fixed order): the
//   column sums (a Linear's bias gradient, when the CBSR is MaxK's gradient of its output)
//   without reading the dense rows again.
// zero_rows: zeros over the listed rows of an N x d matrix (cbsr_spgemm's output rows that
//   several warps add into), a warp a row.
// cbsr_gather: the entries of a dense N x d matrix at a CBSR pattern (N x k; the gradient of
//   cbsr_to_dense), one thread per entry, the uint8 / uint16 indices read as they are.
// layer_norm: y = (x - mean) * rstd * weight + bias with mean and rstd = 1 / sqrt(var + eps)
//   per row (the biased variance, as torch's LayerNorm), fp32; mean and rstd are written
//   for the backward. Two passes over the row in registers: the mean, then the variance
//   of x - mean.
// layer_norm_backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight
//   and xhat = (x - mean) * rstd, per row; persistent warps also sum dy * xhat and dy over
//   their rows, column by column, into one row of partial sums each (the caller adds the
//   rows up: the gradients of weight and bias, in a fixed order).
// layer_norm_backward_cbsr: the same with dy given as CBSR (MaxK's gradient), never dense.
//
// Compile-time constants (-D):
//   ELEM_BYTES 4 or 2 (cbsr_to_dense, cbsr_gather, zero_rows), IDX_BYTES 1 or 2 (CBSR indices), STAGED
//   (cbsr_to_dense: d * WARPS * ELEM_BYTES bytes of dynamic shared memory), RV elements per
//   lane (layer_norm, layer_norm_backward: a multiple of 4), WARPS per block.

#ifndef ELEM_BYTES
#define ELEM_BYTES 4
#endif
#ifndef RV
#define RV 8
#endif
#ifndef WARPS
#define WARPS 4
#endif
#ifndef STAGED
#define STAGED 0
#endif

#include "cbsr_types.cuh"
#include "layer_norm_row.cuh"

// One warp writes zeros over a row (16-byte stores where the row is whole vectors; rows
// start 16-byte aligned then).
__device__ __forceinline__ void zero_row(raw_t* dst, int d, int lane) {
    if (((d * ELEM_BYTES) & 15) == 0) {
        for (int c = lane; c < d * ELEM_BYTES / 16; c += 32)
            reinterpret_cast<uint4*>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
    } else {
        for (int c = lane; c < d; c += 32) dst[c] = (raw_t)0;
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
zero_rows(const long long* __restrict__ rows, raw_t* __restrict__ out, long long n_rows, int d) {
    const long long i = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (i < n_rows) zero_row(out + rows[i] * (long long)d, d, threadIdx.x & 31);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
cbsr_to_dense(const raw_t* __restrict__ values, const idx_t* __restrict__ indices,
              raw_t* __restrict__ out, long long n_rows, int d, int k) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return;
#if STAGED
    extern __shared__ uint4 staged_rows[];
    const int vectors = d * ELEM_BYTES / 16;
    uint4* staged = staged_rows + (threadIdx.x >> 5) * vectors;
    raw_t* dst = reinterpret_cast<raw_t*>(staged);
#else
    raw_t* dst = out + row * (long long)d;
#endif
    zero_row(dst, d, lane);
    __syncwarp();  // the zeros land before the values that overwrite some of them
    const long long base = row * (long long)k;
    for (int j = lane; j < k; j += 32) dst[IDX_TO_INT(indices[base + j])] = values[base + j];
#if STAGED
    __syncwarp();
    uint4* out_row = reinterpret_cast<uint4*>(out + row * (long long)d);
    for (int c = lane; c < vectors; c += 32) out_row[c] = staged[c];
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
cbsr_gather(const raw_t* __restrict__ dense, const idx_t* __restrict__ indices,
            raw_t* __restrict__ out, int entries, int d, int k) {  // entries = N * k < 2^31
    const int e = blockIdx.x * (WARPS * 32) + threadIdx.x;
    if (e >= entries) return;
    out[e] = dense[(long long)(e / k) * d + IDX_TO_INT(indices[e])];
}


// A row's RV / 4 float4 vectors of lane `lane`: columns lane * 4 + 128 * i (+0..3), zeros
// past d (float4 loads: d % 4 == 0, 16-byte aligned rows).
__device__ __forceinline__ void load_row(const float* row, int d, int lane, float4 (&v)[RV / 4]) {
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        v[i] = c < d ? *reinterpret_cast<const float4*>(row + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// Row `row` of fp32 CBSR (k entries a row) built in a warp's d floats of shared memory
// (`staged`: zeros, then the values), then read as the lane's vectors, as load_row reads.
__device__ __forceinline__ void staged_cbsr_row(float* staged, const float* __restrict__ values,
                                                const idx_t* __restrict__ indices, long long row,
                                                int k, int d, int lane, float4 (&v)[RV / 4]) {
    for (int c = lane * 4; c < d; c += 128)
        *reinterpret_cast<float4*>(staged + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    __syncwarp();  // the zeros land before the values that overwrite some of them
    const long long base = row * (long long)k;
    for (int j = lane; j < k; j += 32) staged[IDX_TO_INT(indices[base + j])] = values[base + j];
    __syncwarp();
    load_row(staged, d, lane, v);
    __syncwarp();  // read before the next row's zeros
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
cbsr_to_dense_sums(const float* __restrict__ values, const idx_t* __restrict__ indices,
                   float* __restrict__ out, float* __restrict__ part, long long n_rows, int d,
                   int k) {
    extern __shared__ float4 staged_sums[];  // WARPS rows of d floats (d % 4 == 0)
    const int lane = threadIdx.x & 31;
    const long long warp = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const long long num_warps = (long long)gridDim.x * WARPS;
    float* staged = reinterpret_cast<float*>(staged_sums) + (threadIdx.x >> 5) * d;
    float4 acc[RV / 4];
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long long row = warp; row < n_rows; row += num_warps) {
        float4 v[RV / 4];
        staged_cbsr_row(staged, values, indices, row, k, d, lane, v);
        float* dst = out + row * (long long)d;
#pragma unroll
        for (int i = 0; i < RV / 4; ++i) {
            const int c = lane * 4 + 128 * i;
            if (c < d) {
                *reinterpret_cast<float4*>(dst + c) = v[i];
                acc[i].x += v[i].x; acc[i].y += v[i].y; acc[i].z += v[i].z; acc[i].w += v[i].w;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        if (c < d) *reinterpret_cast<float4*>(part + warp * d + c) = acc[i];
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
layer_norm(const float* __restrict__ x, const float* __restrict__ weight,
           const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ mean_out,
           float* __restrict__ rstd_out, long long n_rows, int d, float eps) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    float4 v[RV / 4];
    load_row(x + row * (long long)d, d, lane, v);
    float mean, rstd;
    row_mean_rstd(v, d, lane, eps, mean, rstd);
    float* dst = y + row * (long long)d;
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        if (c < d)
            *reinterpret_cast<float4*>(dst + c) = normalise4(
                v[i], mean, rstd, *reinterpret_cast<const float4*>(weight + c),
                *reinterpret_cast<const float4*>(bias + c));
    }
    if (lane == 0) { mean_out[row] = mean; rstd_out[row] = rstd; }
}

// The backward's rows, dy's rows loaded by `load_dy(row, gv)` (dense, or made from CBSR).
template <class LoadDy>
__device__ __forceinline__ void layer_norm_backward_rows(
        LoadDy load_dy, const float* __restrict__ x, const float* __restrict__ mean,
        const float* __restrict__ rstd, const float* __restrict__ weight, float* __restrict__ dx,
        float* __restrict__ part_weight, float* __restrict__ part_bias, long long n_rows, int d) {
    const int lane = threadIdx.x & 31;
    const long long warp = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const long long num_warps = (long long)gridDim.x * WARPS;
    float4 w[RV / 4], acc_w[RV / 4], acc_b[RV / 4];
    load_row(weight, d, lane, w);
#pragma unroll
    for (int i = 0; i < RV / 4; ++i)
        acc_w[i] = acc_b[i] = make_float4(0.f, 0.f, 0.f, 0.f);

    float4 x_next[RV / 4];  // the warp's next row of x, loaded while this one is worked
    if (warp < n_rows) load_row(x + warp * (long long)d, d, lane, x_next);
    for (long long row = warp; row < n_rows; row += num_warps) {
        float4 xv[RV / 4], gv[RV / 4];
#pragma unroll
        for (int i = 0; i < RV / 4; ++i) xv[i] = x_next[i];
        if (row + num_warps < n_rows) load_row(x + (row + num_warps) * (long long)d, d, lane, x_next);
        load_dy(row, gv);
        const float m = mean[row], r = rstd[row];
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int i = 0; i < RV / 4; ++i) {  // xv becomes xhat; padding stays 0 in every sum
            xv[i] = make_float4((xv[i].x - m) * r, (xv[i].y - m) * r, (xv[i].z - m) * r,
                                (xv[i].w - m) * r);
            acc_w[i].x += gv[i].x * xv[i].x; acc_w[i].y += gv[i].y * xv[i].y;
            acc_w[i].z += gv[i].z * xv[i].z; acc_w[i].w += gv[i].w * xv[i].w;
            acc_b[i].x += gv[i].x; acc_b[i].y += gv[i].y;
            acc_b[i].z += gv[i].z; acc_b[i].w += gv[i].w;
            gv[i] = make_float4(gv[i].x * w[i].x, gv[i].y * w[i].y, gv[i].z * w[i].z,
                                gv[i].w * w[i].w);
            s1 += (gv[i].x + gv[i].y) + (gv[i].z + gv[i].w);
            s2 += (gv[i].x * xv[i].x + gv[i].y * xv[i].y) + (gv[i].z * xv[i].z + gv[i].w * xv[i].w);
        }
        const float mean_g = warp_sum_f(s1) / d, mean_gx = warp_sum_f(s2) / d;
        float* out = dx + row * (long long)d;
#pragma unroll
        for (int i = 0; i < RV / 4; ++i) {
            const int c = lane * 4 + 128 * i;
            if (c < d)
                *reinterpret_cast<float4*>(out + c) = make_float4(
                    r * (gv[i].x - mean_g - xv[i].x * mean_gx), r * (gv[i].y - mean_g - xv[i].y * mean_gx),
                    r * (gv[i].z - mean_g - xv[i].z * mean_gx), r * (gv[i].w - mean_g - xv[i].w * mean_gx));
        }
    }
#pragma unroll
    for (int i = 0; i < RV / 4; ++i) {
        const int c = lane * 4 + 128 * i;
        if (c < d) {
            *reinterpret_cast<float4*>(part_weight + warp * d + c) = acc_w[i];
            *reinterpret_cast<float4*>(part_bias + warp * d + c) = acc_b[i];
        }
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
layer_norm_backward(const float* __restrict__ dy, const float* __restrict__ x,
                    const float* __restrict__ mean, const float* __restrict__ rstd,
                    const float* __restrict__ weight, float* __restrict__ dx,
                    float* __restrict__ part_weight, float* __restrict__ part_bias,
                    long long n_rows, int d) {
    const int lane = threadIdx.x & 31;
    layer_norm_backward_rows(
        [&](long long row, float4 (&gv)[RV / 4]) { load_row(dy + row * (long long)d, d, lane, gv); },
        x, mean, rstd, weight, dx, part_weight, part_bias, n_rows, d);
}

// dy given as CBSR (values, indices: N x k, the gradient MaxK passes back), as when the
// LayerNorm's output feeds a MaxK: each warp scatters a row into its d floats of shared
// memory, so the dense dy is never written to memory.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
layer_norm_backward_cbsr(const float* __restrict__ dy_values, const idx_t* __restrict__ dy_indices,
                         int k, const float* __restrict__ x, const float* __restrict__ mean,
                         const float* __restrict__ rstd, const float* __restrict__ weight,
                         float* __restrict__ dx, float* __restrict__ part_weight,
                         float* __restrict__ part_bias, long long n_rows, int d) {
    extern __shared__ float4 dy_rows[];  // WARPS rows of d floats (d % 4 == 0)
    const int lane = threadIdx.x & 31;
    float* dy_row = reinterpret_cast<float*>(dy_rows) + (threadIdx.x >> 5) * d;
    layer_norm_backward_rows(
        [&](long long row, float4 (&gv)[RV / 4]) {
            staged_cbsr_row(dy_row, dy_values, dy_indices, row, k, d, lane, gv);
        },
        x, mean, rstd, weight, dx, part_weight, part_bias, n_rows, d);
}
