/* The AVX-512 path of the softmax family's kernels: xent_kernels.h compiled on its own with AVX2, FMA and
 * AVX-512 F/DQ/VL/BW, 512-bit vectors preferred (setup.py).  The same source as avx2_softmax.c: eight double
 * lanes per instruction instead of four, the same operations on every lane, so the same bits.  Defines
 * xf_softmax_f32_avx512 and xf_softmax_f64_avx512, chosen at import on CPUs that have all of them. */
#if defined(__x86_64__) || defined(__i386__)  /* empty for any other target (a multi-arch build) */
#define XF_AVX512_PATH_UNIT 1
#include "xent_kernels.h"
#endif
