/* xentfast/config.h: the only place that knows which compiler is reading the headers.
 *
 * Every header under include/xentfast/ is written in the common subset of C99 and C++17 that gcc, g++,
 * nvcc and NVRTC all accept, so the CPU kernels (Cython -> C) and the CUDA kernels include the SAME
 * arithmetic.  Compiler differences are confined to the macros below (the xsf pattern):
 *
 *   XF_HD      function qualifiers: `__host__ __device__ __forceinline__` under CUDA, `static inline`
 *              (always inlined, see below) for C.
 *   XF_RESTRICT  `restrict` (C99) / `__restrict__` (C++ and CUDA).
 *
 * Host helpers are forced inline: an out-of-line copy would be compiled once for the baseline ISA and
 * then be called from an ISA-specific kernel, silently losing the wider vectors.
 *
 * No <math.h> and no <stdint.h>: NVRTC has no system headers, and our own exp/log/log1p make the
 * results independent of the platform's libm (the premise of bitwise CPU/GPU parity).
 */
#ifndef XENTFAST_CONFIG_H
#define XENTFAST_CONFIG_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#  define XF_CUDA 1
#  define XF_HD __host__ __device__ __forceinline__
   /* rare, heavy paths (exact logsumexp of cancelling rows): kept out of line so that their registers
    * and local arrays do not weigh on the hot kernels (their register and spill budgets: tests/test_cuda.py) */
#  define XF_HD_COLD __host__ __device__ __noinline__
#  define XF_RESTRICT __restrict__
#  if !defined(__CUDACC_RTC__)
#    include <string.h>
#  endif
#else
#  define XF_CUDA 0
#  include <string.h>
#  if defined(__GNUC__)
#    define XF_HD static inline __attribute__((always_inline))
#    define XF_HD_COLD static __attribute__((noinline, cold, unused))
#  else
#    define XF_HD static inline
#    define XF_HD_COLD static
#  endif
#  if defined(__cplusplus)
#    define XF_RESTRICT __restrict__
#  else
#    define XF_RESTRICT restrict
#  endif
#endif

/* Bit casts.  memcpy is the portable spelling and vectorizes under gcc; the CUDA intrinsics exist only in
 * the device pass (guarded by __CUDA_ARCH__, otherwise the host pass of a full nvcc build fails). */
XF_HD unsigned long long xf_bits_from_double(double d)
{
#if defined(__CUDA_ARCH__)
    return (unsigned long long)__double_as_longlong(d);
#else
    unsigned long long u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}

XF_HD double xf_double_from_bits(unsigned long long u)
{
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

/* IEEE special values without <math.h>. */
#define XF_INF (xf_double_from_bits(0x7ff0000000000000ULL))
#define XF_NAN (xf_double_from_bits(0x7ff8000000000000ULL))

XF_HD int xf_isnan(double x) { return x != x; }
XF_HD double xf_fabs(double x) { return xf_double_from_bits(xf_bits_from_double(x) & 0x7fffffffffffffffULL); }

#endif /* XENTFAST_CONFIG_H */
