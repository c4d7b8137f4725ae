/* CPU kernels of the softmax family: the block kernels of softmax_rows.h instantiated for float (f32)
 * and double (f64) storage and for each CPU code path, and their dispatch tables.  The per-row
 * bookkeeping they share with the CUDA kernels is xentfast/softmax_row.h.  The Cython layer decides
 * who runs which block.
 */
#ifndef XENTFAST_XENT_KERNELS_H
#define XENTFAST_XENT_KERNELS_H

#include "xentfast/softmax_row.h"

/* ---- instantiation: storage type x CPU code path ----------------------------------------------------
 * The baseline path is compiled for the build's target (x86-64: SSE2).  On x86-64 with gcc or clang a
 * second copy is compiled with __attribute__((target("avx2"))) and chosen at import when the CPU has
 * AVX2 (xentfast._core._xent.cpu_path(); XENTFAST_CPU=baseline|avx2 overrides).  Contraction is off in
 * the whole build, so no fma appears on either path and both produce the SAME bits: the wider vectors
 * only change how many lanes run at once, never an operation's rounding (tests/test_dispatch.py). */
#define XF_KERNEL static
#define XF_T float
#define XF_SFX f32
#define XF_COMPENSATED 0
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#define XF_T double
#define XF_SFX f64
#define XF_COMPENSATED 1
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#undef XF_KERNEL

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define XF_HAVE_AVX2_PATH 1
#define XF_KERNEL static __attribute__((target("avx2")))
#define XF_T float
#define XF_SFX f32_avx2
#define XF_COMPENSATED 0
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#define XF_T double
#define XF_SFX f64_avx2
#define XF_COMPENSATED 1
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#undef XF_KERNEL
#else
#define XF_HAVE_AVX2_PATH 0
#endif

/* One table of entry points per storage type; the Cython driver calls only through these. */
#define XF_DECLARE_TABLE(T, SFX)                                                                          \
    typedef struct {                                                                                      \
        void (*max_block)(const T *, long long, long long, xf_rowmax *);                                 \
        void (*sumexp_block)(const T *, long long, double, long long, int, double *, double *, T *);     \
        void (*terms_block)(const T *, long long, long long, const xf_rowjob *, const T *, const double *, \
                            double *);                                                                    \
        void (*grad_block)(const T *, T *, long long, long long, const xf_rowjob *, const T *,            \
                           const double *);                                                               \
        void (*row_max)(const T *, long long, xf_rowjob *);                                              \
        void (*row_sum)(const T *, long long, xf_rowjob *, T *);                                         \
        double (*xent_row)(const T *, T *, long long, xf_rowjob *, const T *, const double *);           \
        void (*log_softmax_block)(const T *, T *, long long, double, double);                            \
        void (*softmax_block)(const T *, T *, long long, double, double);                                \
    } xf_softmax_table_##SFX;
XF_DECLARE_TABLE(float, f32)
XF_DECLARE_TABLE(double, f64)
#undef XF_DECLARE_TABLE

#define XF_TABLE(SFX, PSFX)                                                                             \
    {xf_max_block_##PSFX, xf_sumexp_block_##PSFX, xf_xent_terms_block_##PSFX, xf_xent_grad_block_##PSFX, \
     xf_row_max_##PSFX, xf_row_sum_##PSFX, xf_xent_row_##PSFX, xf_log_softmax_block_##PSFX, xf_softmax_block_##PSFX}
static const xf_softmax_table_f32 xf_softmax_f32_baseline = XF_TABLE(f32, f32);
static const xf_softmax_table_f64 xf_softmax_f64_baseline = XF_TABLE(f64, f64);
#if XF_HAVE_AVX2_PATH
static const xf_softmax_table_f32 xf_softmax_f32_avx2 = XF_TABLE(f32, f32_avx2);
static const xf_softmax_table_f64 xf_softmax_f64_avx2 = XF_TABLE(f64, f64_avx2);
#endif
#undef XF_TABLE

enum { XF_PATH_BASELINE = 0, XF_PATH_AVX2 = 1 };

/* Whether this CPU can run a path (the OS-support checks are part of __builtin_cpu_supports). */
static int xf_cpu_supports_path(int path)
{
    if (path == XF_PATH_BASELINE) {
        return 1;
    }
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    }
#endif
    return 0;
}

static const xf_softmax_table_f32 *xf_softmax_table_for_f32(int path)
{
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        return &xf_softmax_f32_avx2;
    }
#endif
    (void)path;
    return &xf_softmax_f32_baseline;
}

static const xf_softmax_table_f64 *xf_softmax_table_for_f64(int path)
{
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        return &xf_softmax_f64_avx2;
    }
#endif
    (void)path;
    return &xf_softmax_f64_baseline;
}

#endif /* XENTFAST_XENT_KERNELS_H */
