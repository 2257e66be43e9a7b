// The types every kernel file shares, set by the launch's -D constants (a file that takes
// ELEM_BYTES defines its default before including this one):
//   idx_t, a CBSR column index (IDX_BYTES 1: uint8 for widths up to 256, 2: uint16 for
//   widths up to 32768), read as an int by IDX_TO_INT;
//   raw_t, the bits of one feature value (ELEM_BYTES 4: fp32, 2: fp16 or bf16), for kernels
//   that compare or move values without doing arithmetic on them.

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
#endif

#endif  // CBSR_TYPES_CUH
