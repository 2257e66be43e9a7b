// MaxK to CBSR: the k largest entries of each row of a dense N x d matrix, written as CBSR
// (values N x k, indices N x k), ties broken toward the lower column, each row's entries in
// ascending column order or in the bank order (ORDER_L, below).
//
// One warp per row. Each element gets an order-preserving unsigned key (NaN largest, -0 == +0).
// The k-th largest key T is found by a bitwise threshold search (RTop-K style): for each bit
// from the top, keep it if at least k keys are >= the candidate prefix (one warp reduction per
// bit: 32 steps for fp32, 16 for fp16/bf16). Then every key > T is kept, plus the first
// (k - #{key > T}) keys == T in column order; ballots give each kept element its output slot,
// so the output is in ascending column order (or the bank order). The kept values are copied
// bit for bit.
//
// Compile-time constants (-D):
//   ELEM_BYTES 4 (fp32) or 2 (fp16 / bf16: the same sign-magnitude key rule on 16 bits)
//   IS_BF16    1 for bf16 (NaN test), else 0
//   IDX_BYTES  1 (uint8 indices, d <= 256) or 2 (uint16)
//   VEC        elements per lane per vector load (VEC * ELEM_BYTES in {2, 4, 8, 16})
//   CH         chunks of 32 * VEC columns held in registers (maxk_reg only)
//   WARPS      warps per block
//   ORDER_L    0: each row's entries in ascending column order; else the order in which
//              the forward's lanes hit distinct shared-memory banks (maxk_reg only, below)
//   ORDER_QV   with ORDER_L: the forward's entries per lane-load
//   ORDER_STEPS with ORDER_L: k / ORDER_L (a constant: the division is per kept element)
//   FULL_ROWS  1: d == CH * 32 * VEC (maxk_reg: every lane's vectors lie in the row, no
//              bounds tests)
//   LAYER_NORM  1: maxk_reg first normalises the row as dense_rows.cu's layer_norm does
//              (the same sums in the same order, so the same bits: fp32, VEC 4), writes
//              its mean and rstd, and takes the top k of the normalised row: the
//              LayerNorm's output is never written to memory nor read back
// maxk_reg keeps the row in registers (CH * VEC <= 32 elements per lane, d <= 1024 for
// fp32); maxk_smem keeps the keys in shared memory (d * 4 bytes per warp) for any d.
//
// The bank order (ORDER_L = L lanes per edge in cbsr_spgemm, k a multiple of L * ORDER_QV):
// the forward accumulates a row in k / L steps, lane l of step s taking entry
// (l + (s / QV) * L) * QV + s % QV, into column c's bank c % L of its window. Ranked by
// (c % L, c), entry m goes to step m % (k / L) as its (m / (k / L))-th lane: each column
// residue is dealt round the steps, so one step's L entries share a bank only when their
// residue holds more than k / L of the row's entries.
//
// The search stops early at a prefix with exactly k keys at or above it: those k are the
// top k (no key equal to the k-th lies outside), so T becomes prefix - 1 and no tie is
// needed. Rows of spread values get there in about log2(d) + a few steps instead of 32.
//
// nan_stats (optional, two zeroed unsigned 64-bit counters): each row holding NaN adds its
// NaN count to [0] and raises [1] to n_rows * d - (flat position of its first NaN), so the
// input's first NaN is n_rows * d - [1]. The layers' NaN check costs no extra pass.

#ifndef ELEM_BYTES
#define ELEM_BYTES 4
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef CH
#define CH 1
#endif
#ifndef WARPS
#define WARPS 4
#endif
#ifndef ORDER_L
#define ORDER_L 0
#endif
#ifndef ORDER_QV
#define ORDER_QV 1
#endif
#ifndef ORDER_STEPS
#define ORDER_STEPS 1
#endif
#ifndef LAYER_NORM
#define LAYER_NORM 0
#endif
#ifndef FULL_ROWS
#define FULL_ROWS 0
#endif
#define IN_ROW(c) (FULL_ROWS || (c) < d)

#define VB (VEC * ELEM_BYTES)
#define KEY_BITS (8 * ELEM_BYTES)

#include "cbsr_types.cuh"

__device__ __forceinline__ int warp_sum(int v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(FULL_MASK, v);
#else
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
#endif
}

// Order-preserving key of the raw bits: larger value -> larger key; NaN -> the largest key
// (torch.sort puts NaN above +inf); -0 and +0 equal. Real keys are never 0 (padding's key).
// Selects, no branches.
__device__ __forceinline__ unsigned int key_of(unsigned int bits) {
#if ELEM_BYTES == 4
    const unsigned int flip = (unsigned int)((int)bits >> 31) | 0x80000000u;
    const unsigned int key = bits == 0x80000000u ? 0x80000000u : bits ^ flip;
    return is_nan_bits(bits) ? 0xffffffffu : key;
#else
    const unsigned int key = bits == 0x8000u ? 0x8000u : bits ^ ((bits & 0x8000u) ? 0xffffu : 0x8000u);
    return is_nan_bits(bits) ? 0xffffu : key;
#endif
}

// Load VEC consecutive elements (the address is VB-aligned) as raw bits.
__device__ __forceinline__ void load_vec(const raw_t* p, unsigned int (&w)[VEC]) {
#if VB == 16
    uint4 v = *reinterpret_cast<const uint4*>(p);
    unsigned int t[4] = {v.x, v.y, v.z, v.w};
#elif VB == 8
    uint2 v = *reinterpret_cast<const uint2*>(p);
    unsigned int t[2] = {v.x, v.y};
#elif VB == 4
    unsigned int t[1] = {*reinterpret_cast<const unsigned int*>(p)};
#else
    unsigned int t[1] = {(unsigned int)*reinterpret_cast<const unsigned short*>(p)};
#endif
#pragma unroll
    for (int h = 0; h < VEC; ++h) {
#if ELEM_BYTES == 4
        w[h] = t[h];
#else
        w[h] = (h & 1) ? (t[h >> 1] >> 16) : (t[h >> 1] & 0xffffu);
#endif
    }
}

#define NAN_KEY ((1u << (KEY_BITS - 1)) | ((1u << (KEY_BITS - 1)) - 1u))  // key_of(NaN)

// One step of the threshold search: keep bit b of T if >= k keys reach T | bit; true when
// exactly k reach it (T is then prefix - 1 and the search is over).
__device__ __forceinline__ bool search_step(int count, int k, unsigned int cand,
                                            unsigned int& T) {
    if (count < k) return false;
    T = count == k ? cand - 1u : cand;
    return count == k;
}

// #{keys >= cand} of this lane, for 1 <= cand <= 2^32 (cand 0 stands for 2^32: none): the
// carry out of key + (2^32 - cand), added up by add-with-carry, two instructions a key
// where compare and select take three (the search is most of the kernel's instructions).
__device__ __forceinline__ int count_at_least(const unsigned int (&key)[CH][VEC],
                                              unsigned int cand) {
    const unsigned int neg = 0u - cand;
    unsigned int cnt = 0u;
#pragma unroll
    for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            asm("{\n\t.reg .u32 t;\n\tadd.cc.u32 t, %1, %2;\n\taddc.u32 %0, %0, 0;\n\t}"
                : "+r"(cnt) : "r"(key[i][v]), "r"(neg));
    return (int)cnt;
}

// Record a row's NaN: lane `first` (its lowest NaN column, or d) and per-lane counts.
__device__ __forceinline__ void record_nan(unsigned long long* nan_stats, long long row,
                                           long long n_rows, int d, int nan_count, int first) {
    const int total = warp_sum(nan_count);
    if (total == 0) return;  // uniform over the warp
#if __CUDA_ARCH__ >= 800
    first = (int)__reduce_min_sync(FULL_MASK, (unsigned int)first);
#else
    for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(FULL_MASK, first, o));
#endif
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(nan_stats, (unsigned long long)total);
        atomicMax(nan_stats + 1, (unsigned long long)(n_rows * d - (row * d + first)));
    }
}

#if ORDER_L
// Where the bank order puts each kept element of this lane (see the header): sel[i][v] is
// the ballot of kept elements of chunk i, vector slot v; returns the slot for (i, v).
struct BankOrder {
    static constexpr int P = ORDER_L / VEC;  // lanes whose columns share a residue mod L
    unsigned int cls;                         // those lanes, for this lane's columns
    int before[VEC];                          // kept entries of lower residues, per slot v

    __device__ __forceinline__ BankOrder(const unsigned int (&sel)[CH][VEC], int lane) {
        const unsigned int period = P == 32 ? 1u : 0xffffffffu / ((1u << P) - 1u);
        cls = period << (lane % P);
        int cnt = 0;  // lane r < L counts residue r: slot r % VEC of lanes r / VEC (mod P)
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            // a zero mask, not a branch, for the other slots: the branch had the compiler
            // pick sel[i][lane % VEC] through chains of selects (160 instructions a row)
            const unsigned int mask =
                lane < ORDER_L && v == lane % VEC ? period << (lane / VEC) : 0u;
#pragma unroll
            for (int i = 0; i < CH; ++i) cnt += __popc(sel[i][v] & mask);
        }
        int incl = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += t;
        }
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            before[v] = __shfl_sync(FULL_MASK, incl - cnt, (lane * VEC + v) % ORDER_L);
    }

    __device__ __forceinline__ int slot(const unsigned int (&sel)[CH][VEC], int i, int v,
                                        unsigned int lt_mask) const {
        int m = before[v] + __popc(sel[i][v] & cls & lt_mask);
#pragma unroll
        for (int i2 = 0; i2 < CH; ++i2)
            if (i2 < i) m += __popc(sel[i2][v] & cls);
        const int step = m % ORDER_STEPS, lane = m / ORDER_STEPS;
        return (lane + (step / ORDER_QV) * ORDER_L) * ORDER_QV + step % ORDER_QV;
    }
};
#endif

#if LAYER_NORM
static_assert(ELEM_BYTES == 4 && VEC == 4, "LAYER_NORM takes fp32 rows read as float4");

#include "layer_norm_row.cuh"

// The LayerNorm of the row in `raw` (lane's columns i * 128 + lane * 4 + v, zeros past d),
// in place, with the LayerNorm kernel's arithmetic; its mean and rstd to memory.
__device__ __forceinline__ void layer_norm_row(unsigned int (&raw)[CH][VEC], int d, int lane,
                                               long long row, const float* __restrict__ weight,
                                               const float* __restrict__ bias,
                                               float* __restrict__ mean_out,
                                               float* __restrict__ rstd_out, float eps) {
    float4 v[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i)
        v[i] = make_float4(__uint_as_float(raw[i][0]), __uint_as_float(raw[i][1]),
                           __uint_as_float(raw[i][2]), __uint_as_float(raw[i][3]));
    float mean, rstd;
    row_mean_rstd(v, d, lane, eps, mean, rstd);
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        const int c = lane * 4 + 128 * i;
        if (IN_ROW(c)) {
            const float4 y = normalise4(v[i], mean, rstd,
                                        *reinterpret_cast<const float4*>(weight + c),
                                        *reinterpret_cast<const float4*>(bias + c));
            raw[i][0] = __float_as_uint(y.x);
            raw[i][1] = __float_as_uint(y.y);
            raw[i][2] = __float_as_uint(y.z);
            raw[i][3] = __float_as_uint(y.w);
        }
    }
    if (lane == 0) { mean_out[row] = mean; rstd_out[row] = rstd; }
}
#endif

extern "C" __global__ void __launch_bounds__(WARPS * 32)
maxk_reg(const raw_t* __restrict__ h, raw_t* __restrict__ out_val, idx_t* __restrict__ out_idx,
         long long n_rows, int d, int k, unsigned long long* __restrict__ nan_stats
#if LAYER_NORM
         , const float* __restrict__ ln_weight, const float* __restrict__ ln_bias,
         float* __restrict__ ln_mean, float* __restrict__ ln_rstd, float ln_eps
#endif
         ) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return;  // uniform over the warp; no block-wide barrier below
    const raw_t* src = h + row * (long long)d;

    unsigned int raw[CH][VEC], key[CH][VEC];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        const int c0 = i * 32 * VEC + lane * VEC;
        if (IN_ROW(c0)) {  // d % VEC == 0: a vector is wholly inside or wholly outside the row
            load_vec(src + c0, raw[i]);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) raw[i][v] = 0u;
        }
    }
#if LAYER_NORM
    layer_norm_row(raw, d, lane, row, ln_weight, ln_bias, ln_mean, ln_rstd, ln_eps);
#endif
#pragma unroll
    for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int v = 0; v < VEC; ++v)  // padding's key is 0, below every real key
            key[i][v] = IN_ROW(i * 32 * VEC + lane * VEC) ? key_of(raw[i][v]) : 0u;

    if (nan_stats) {
        int nan_count = 0, first = d;
#pragma unroll
        for (int i = CH - 1; i >= 0; --i)
#pragma unroll
            for (int v = VEC - 1; v >= 0; --v)
                if (key[i][v] == NAN_KEY) { ++nan_count; first = i * 32 * VEC + lane * VEC + v; }
        record_nan(nan_stats, row, n_rows, d, nan_count, first);
    }

    // T = the largest value with #{key >= T} >= k, i.e. the k-th largest key.
    unsigned int T = 0u;
    bool exact = false;  // the search stopped at exactly k keys above T: no tie to break
#pragma unroll 1
    for (unsigned int bit = 1u << (KEY_BITS - 1); bit; bit >>= 1) {
        const unsigned int cand = T | bit;
        if (search_step(warp_sum(count_at_least(key, cand)), k, cand, T)) {
            exact = true;
            break;
        }
    }

    const unsigned int lt_mask = (1u << lane) - 1u;
    unsigned int sel[CH][VEC];  // ballots of the kept elements
    if (exact) {  // uniform over the warp; most rows of distinct values end here
#pragma unroll
        for (int i = 0; i < CH; ++i)
#pragma unroll
            for (int v = 0; v < VEC; ++v) sel[i][v] = __ballot_sync(FULL_MASK, key[i][v] > T);
    } else {
        const int need_eq = k - warp_sum(count_at_least(key, T + 1u));  // >= 1
        int eq_base = 0;
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            bool eq[VEC];
            int eq_before = 0, eq_total = 0;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                eq[v] = key[i][v] == T;
                const unsigned int m = __ballot_sync(FULL_MASK, eq[v]);
                eq_before += __popc(m & lt_mask);
                eq_total += __popc(m);
            }
            int r = eq_base + eq_before;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                sel[i][v] = __ballot_sync(FULL_MASK, key[i][v] > T || (eq[v] && r < need_eq));
                r += eq[v];
            }
            eq_base += eq_total;
        }
    }

    raw_t* ov = out_val + row * (long long)k;
    idx_t* oi = out_idx + row * (long long)k;
#if ORDER_L
    const BankOrder order(sel, lane);
#else
    int base = 0;
#endif
#pragma unroll
    for (int i = 0; i < CH; ++i) {
#if !ORDER_L
        int p = base;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            p += __popc(sel[i][v] & lt_mask);
            base += __popc(sel[i][v]);
        }
#endif
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            if ((sel[i][v] >> lane) & 1u) {
#if ORDER_L
                const int p = order.slot(sel, i, v, lt_mask);
#endif
                ov[p] = (raw_t)raw[i][v];
                oi[p] = (idx_t)(i * 32 * VEC + lane * VEC + v);
#if !ORDER_L
                ++p;
#endif
            }
        }
    }
}

// Any d: keys in shared memory (d unsigned ints per warp), lane l holds columns l, l+32, ...
extern "C" __global__ void __launch_bounds__(WARPS * 32)
maxk_smem(const raw_t* __restrict__ h, raw_t* __restrict__ out_val, idx_t* __restrict__ out_idx,
          long long n_rows, int d, int k, unsigned long long* __restrict__ nan_stats) {
    extern __shared__ unsigned int keys_all[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long row = (long long)blockIdx.x * WARPS + warp;
    if (row >= n_rows) return;  // uniform over the warp; no block-wide barrier below
    unsigned int* keys = keys_all + (long long)warp * d;
    const raw_t* src = h + row * (long long)d;
    int nan_count = 0, first = d;
    for (int c = lane; c < d; c += 32) {
        keys[c] = key_of((unsigned int)src[c]);
        if (keys[c] == NAN_KEY) { first = min(first, c); ++nan_count; }
    }
    __syncwarp();
    if (nan_stats) record_nan(nan_stats, row, n_rows, d, nan_count, first);

    unsigned int T = 0u;
#pragma unroll 1
    for (int b = KEY_BITS - 1; b >= 0; --b) {
        const unsigned int cand = T | (1u << b);
        int cnt = 0;
        for (int c = lane; c < d; c += 32) cnt += (keys[c] >= cand);
        if (search_step(warp_sum(cnt), k, cand, T)) break;
    }
    int gt = 0;
    for (int c = lane; c < d; c += 32) gt += (keys[c] > T);
    const int need_eq = k - warp_sum(gt);

    const unsigned int lt_mask = (1u << lane) - 1u;
    int base = 0, eq_base = 0;
    raw_t* ov = out_val + row * (long long)k;
    idx_t* oi = out_idx + row * (long long)k;
    for (int c0 = 0; c0 < d; c0 += 32) {  // uniform trip count over the warp
        const int c = c0 + lane;
        const unsigned int kk = c < d ? keys[c] : 0u;
        const bool eq = c < d && kk == T;
        const unsigned int me = __ballot_sync(FULL_MASK, eq);
        const bool sel = (c < d && kk > T) || (eq && eq_base + __popc(me & lt_mask) < need_eq);
        eq_base += __popc(me);
        const unsigned int ms = __ballot_sync(FULL_MASK, sel);
        if (sel) {
            const int p = base + __popc(ms & lt_mask);
            ov[p] = src[c];
            oi[p] = (idx_t)c;
        }
        base += __popc(ms);
    }
}
