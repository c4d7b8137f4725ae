/* The AVX2+FMA path of the softmax family's kernels: xent_kernels.h compiled on its own with -mavx2 -mfma
 * (setup.py), so that xf_fma is the fma instruction here and the exact emulation in the baseline path.
 * Defines xf_softmax_f32_avx2 and xf_softmax_f64_avx2, the tables the extension modules select at import
 * on CPUs with AVX2 and FMA. */
#if defined(__x86_64__) || defined(__i386__)  /* empty for any other target (a multi-arch build) */
#define XF_AVX2_PATH_UNIT 1
#include "xent_kernels.h"
#endif
