// Lane-group size and index/value types shared by cbsr_spgemm.cu and cbsr_sddmm.cu;
// dgl_maxk.cuda pastes this file in place of their #include line.
#define P_S (32 / P_L)
#define FULL_MASK 0xffffffffu

#if IDX_BYTES == 1
typedef unsigned char idx_t;
#define IDX_TO_INT(x) ((int)(x))
#else
typedef short idx_t;
#define IDX_TO_INT(x) ((int)(unsigned short)(x))
#endif

#if VAL_KIND == 0
typedef float val_t;
__device__ __forceinline__ float to_f32(float v) { return v; }
#else
typedef unsigned short val_t;
__device__ __forceinline__ float to_f32(unsigned short v) {
#if VAL_KIND == 1
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#else
    return __uint_as_float(((unsigned int)v) << 16);
#endif
}
#endif
