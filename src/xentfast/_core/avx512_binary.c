/* The AVX-512 path of the binary family's kernels: binary_kernels.h compiled on its own with the flags of
 * avx512_softmax.c (setup.py).  Defines xf_binary_f32_avx512 and xf_binary_f64_avx512. */
#if defined(__x86_64__) || defined(__i386__)  /* empty for any other target (a multi-arch build) */
#define XF_AVX512_PATH_UNIT 1
#include "binary_kernels.h"
#endif
