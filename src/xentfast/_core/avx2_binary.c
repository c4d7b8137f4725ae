/* The AVX2+FMA path of the binary family's kernels: binary_kernels.h compiled on its own with -mavx2 -mfma
 * (setup.py; see avx2_softmax.c).  Defines xf_binary_f32_avx2 and xf_binary_f64_avx2. */
#if defined(__x86_64__) || defined(__i386__)  /* empty for any other target (a multi-arch build) */
#define XF_AVX2_PATH_UNIT 1
#include "binary_kernels.h"
#endif
