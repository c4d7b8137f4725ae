/* CPU element loops of the binary family, written once for float and double storage (binary_blocks.h)
 * around the shared arithmetic of xentfast/binary.h.
 *
 * Design (see also the block comment of _binary.pyx):
 * (a) The unit of work is a block of XF_BIN_BLOCK consecutive elements (or one row for CE from class
 *     probabilities).  An element's result depends on that element only, so any assignment of blocks to
 *     threads gives the same bits.
 * (b) Broadcast weights (torch: `weight` broadcasts to the input, `pos_weight` along the last axis) are
 *     addressed as w[(i / div) % mod], which covers every broadcast whose non-trivial axes are
 *     contiguous; the API materialises the rare other patterns.  A block gathers its weights into a
 *     small stack buffer first (integer work only), so the arithmetic loop reads them with stride 1.
 * (c) Each element is read before its gradient is written, and the same index is written, so the
 *     gradient may overwrite the input (inplace=True); this holds lane by lane in the vectorized loops
 *     too (a vector of x is loaded before the same vector of the gradient is stored).
 * (d) Every kernel exists once per CPU code path (baseline, avx2 with fma, avx512), picked through the
 *     tables below by the same selection as the softmax family; the paths give the same bits.
 */
#ifndef XENTFAST_BINARY_KERNELS_H
#define XENTFAST_BINARY_KERNELS_H

/* gcc's partial redundancy elimination turns the selects of binary.h (p.pos ? a : b, then a comparison
 * of the selected value) into phis of booleans that the vectorizer cannot if-convert: with it, the
 * element loops of BCE with logits and of the focal loss stay scalar (gcc 12, -fopt-info-vec).  It
 * removes recomputation only, never changes a rounding, so switching it off for this header changes
 * speed, not bits.  Jump threading is off for the same reason: where two selects test one condition
 * (xf_bin_log1p_unit's `big`), it copies the short code between them onto each outcome, and the
 * vectorizer then evaluates both copies, division and polynomial included (BCE float32: 156 divisions
 * in the fast-chunk function instead of 108). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#pragma GCC push_options
#pragma GCC optimize("no-tree-pre", "no-thread-jumps")
#define XF_BIN_POP_OPTIONS 1
#endif

#include "xentfast/binary.h"
#include "xentfast/ddsum.h"

/* one block of elements is one block of the reduction's dd_sum, so a block can hand over its partial
 * (xf_bin_args.part) */
#define XF_BIN_BLOCK 1024
typedef char xf_bin_block_is_ddsum_block[(XF_BIN_BLOCK == XF_DDSUM_BLOCK) ? 1 : -1];

typedef struct {
    const double *w;     /* element weight, NULL: 1 */
    long long w_div, w_mod;
    int w_full;          /* w has one entry per element (no gather needed) */
    const double *pw;    /* pos_weight, NULL: 1 */
    long long pw_div, pw_mod;
    int pw_full;
    const double *g;     /* per-element upstream gradient (reduction="none"), NULL: none */
    const float *g_f32;  /* the same held as float32 (CPU only: widened block by block, exactly, instead of a
                            float64 copy of the whole array made beforehand); NULL: none */
    double scale;        /* scalar upstream factor (grad_output / denominator) */
    int has_ignore;
    double ignore;       /* targets equal to it are ignored */
    double alpha, gamma; /* focal */
    xf_bin_prob_mode mode;
    double loss_k;       /* losses written times 2^loss_k (0, or 600 for reductions of tiny terms) */
    double *part;        /* NULL, or the reduction's dd_sum partials: block b writes part[2b], part[2b + 1]
                            (xentfast/ddsum.h step 1) instead of storing its double losses */
    unsigned char *unit_fail; /* NULL, or (CPU, float32 BCE with logits, plain instance) one byte per block:
                                 block b sets unit_fail[b] to 1 where one of its targets lies outside
                                 [0, 1] or is NaN, the target check made by the fast-form test */
} xf_bin_args;

/* w[(i / div) % mod] for i in [off, off + n), see (b) */
XF_HD const double *xf_bin_gather(const double *w, long long div, long long mod, int full, long long off,
                                  long long n, double *buf)
{
    long long j;
    if (w == 0) {
        for (j = 0; j < n; j++) {
            buf[j] = 1.0;
        }
        return buf;
    }
    if (full) {
        return w + off;
    }
    /* in spans: a run of consecutive weights (div = 1, a weight per class broadcast over rows) or a run of
     * one weight repeated (div > 1); element by element, with two tests each, the gather of a weight of
     * shape (C,) had cost a float32 BCE call about as much as its kernel */
    long long idx = (off / div) % mod;
    long long r = off % div;
    j = 0;
    while (j < n) {
        const long long left = n - j;
        if (div == 1) {
            const long long span = (mod - idx < left) ? mod - idx : left;
            const double *src = w + idx;
            double *dst = buf + j;
            long long k;
#pragma omp simd
            for (k = 0; k < span; k++) {
                dst[k] = src[k];
            }
            j += span;
            idx = 0;
        } else {
            const long long span = (div - r < left) ? div - r : left;
            const double v = w[idx];
            double *dst = buf + j;
            long long k;
#pragma omp simd
            for (k = 0; k < span; k++) {
                dst[k] = v;
            }
            j += span;
            r = 0;
            idx = (idx + 1 == mod) ? 0 : idx + 1;
        }
    }
    return buf;
}

/* log(eps) and log1p(-eps) once per call, with the header's own functions (same bits on every device);
 * the clamp's thresholds come from the caller (xentfast.api_binary, exact: see xf_bin_prob_logs) */
XF_HD void xf_bin_prob_mode_init(xf_bin_prob_mode *m, int clip, double eps, int clamp, double c, double clamp_lo,
                                 double clamp_hi)
{
    m->clip = clip;
    m->eps = eps;
    m->log_eps = clip ? xf_log(eps) : 0.0;
    m->log1m_eps = clip ? xf_log1p(-eps) : 0.0;
    m->clamp = clamp;
    m->c = c;
    m->clamp_lo = clamp_lo;
    m->clamp_hi = clamp_hi;
}

#if !XF_CUDA
/* Whether every value lies in [0, 1] (a NaN does not): the common case of the front end's target and
 * probability checks, one pass with no branch per element.  Written in Cython, the float64 loop came out
 * with a branch on each value (2.5 ns per element on 0/1 targets, 0.17 for float32's); with an int
 * reduction the baseline unit packs each pair of 64-bit masks (1.2-1.5 ns), so float64's counts the
 * values outside in double (exact far beyond any array: one per value), ~0.35 ns, memory speed. */
static inline int xf_bin_all_unit_f32(const float *t, long long n)
{
    int ok = 1;
    long long i;
#pragma omp simd reduction(& : ok)
    for (i = 0; i < n; i++) {
        ok &= (t[i] >= 0.0f) & (t[i] <= 1.0f);
    }
    return ok;
}

static inline int xf_bin_all_unit_f64(const double *t, long long n)
{
    double outside = 0.0;
    long long i;
#pragma omp simd reduction(+ : outside)
    for (i = 0; i < n; i++) {
        outside += ((t[i] >= 0.0) & (t[i] <= 1.0)) ? 0.0 : 1.0;
    }
    return outside == 0.0;
}

/* One table of entry points per storage type; the Cython driver calls only through these. */
#define XF_BIN_DECLARE_TABLE(T, SFX)                                                                      \
    typedef struct {                                                                                      \
        void (*bce_logits_block)(const T *, const T *, long long, long long, const xf_bin_args *, double *, \
                                 T *, T *);                                                               \
        void (*focal_block)(const T *, const T *, long long, long long, const xf_bin_args *, double *, T *, \
                            T *);                                                                         \
        void (*bce_prob_block)(const T *, const T *, long long, long long, const xf_bin_args *, double *,  \
                               T *, T *);                                                                 \
        double (*ce_probs_row)(const T *, long long, long long, double, const T *, const double *, double, \
                               const xf_bin_prob_mode *, double, T *);                                    \
    } xf_binary_table_##SFX;
XF_BIN_DECLARE_TABLE(float, f32)
XF_BIN_DECLARE_TABLE(double, f64)
#undef XF_BIN_DECLARE_TABLE

/* What _binary exports to the XLA FFI handlers (_binary._kernel_exports; see xf_softmax_exports in
 * xent_kernels.h): the tables by path, the path being the softmax family's. */
typedef struct {
    const xf_binary_table_f32 *(*f32)(int path);
    const xf_binary_table_f64 *(*f64)(int path);
} xf_binary_exports;
#endif

/* XF_KERNEL_TABLES_ONLY: the types above without the kernels (the FFI handlers' unit) */
#ifndef XF_KERNEL_TABLES_ONLY

/* ---- instantiation: storage type x CPU code path ----------------------------------------------------
 * As in xent_kernels.h: the baseline path is compiled here, for the build's target (x86-64: SSE2, 2
 * double lanes); on x86-64 with gcc or clang the AVX2+FMA path (4 double lanes, the fma instruction in
 * xf_fma) is avx2_binary.c, a unit of its own that includes this header with XF_AVX2_PATH_UNIT defined,
 * and the avx512 path (8 double lanes) avx512_binary.c, with XF_AVX512_PATH_UNIT.
 * The path is the softmax family's choice (xentfast._core._xent.cpu_path(), set at import from
 * XENTFAST_CPU); _binary.pyx follows it.  Contraction is off in the whole build, xf_fma rounds once on
 * every path, and the arithmetic is the same sequence of IEEE operations on every lane, so the paths
 * give the same bits (tests/test_dispatch.py). */
#if XF_CUDA
/* the CUDA twin (_cuda/binary.cu) restates the element loops and calls only xf_ce_probs_row: one
 * host-and-device copy, no CPU paths, no tables */
#define XF_KERNEL XF_HD
#define XF_SFX_F32 f32
#define XF_SFX_F64 f64
#elif defined(XF_AVX512_PATH_UNIT)
#define XF_KERNEL static
#define XF_SFX_F32 f32_avx512
#define XF_SFX_F64 f64_avx512
#elif defined(XF_AVX2_PATH_UNIT)
#define XF_KERNEL static
#define XF_SFX_F32 f32_avx2
#define XF_SFX_F64 f64_avx2
#else
#define XF_KERNEL static
#define XF_SFX_F32 f32
#define XF_SFX_F64 f64
#endif
#define XF_T float
#define XF_SFX XF_SFX_F32
#define XF_BIN_FAST 1
#include "binary_blocks.h"
#undef XF_T
#undef XF_SFX
#undef XF_BIN_FAST
#define XF_T double
#define XF_SFX XF_SFX_F64
#define XF_BIN_FAST 2
#include "binary_blocks.h"
#undef XF_T
#undef XF_SFX
#undef XF_BIN_FAST
#undef XF_KERNEL
#undef XF_SFX_F32
#undef XF_SFX_F64

#if !XF_CUDA
#if defined(XF_AVX2_PATH_BUILT) && XF_AVX2_PATH_BUILT && (defined(__x86_64__) || defined(__i386__))
#define XF_BIN_HAVE_AVX2_PATH 1
#else
#define XF_BIN_HAVE_AVX2_PATH 0
#endif
#if XF_BIN_HAVE_AVX2_PATH && defined(XF_AVX512_PATH_BUILT) && XF_AVX512_PATH_BUILT
#define XF_BIN_HAVE_AVX512_PATH 1
#else
#define XF_BIN_HAVE_AVX512_PATH 0
#endif


#define XF_BIN_TABLE(PSFX) \
    {xf_bce_logits_block_##PSFX, xf_focal_block_##PSFX, xf_bce_prob_block_##PSFX, xf_ce_probs_row_##PSFX}
#if defined(XF_AVX512_PATH_UNIT)
/* the only symbols of the path's unit; hidden: each extension module links its own copy */
__attribute__((visibility("hidden"))) const xf_binary_table_f32 xf_binary_f32_avx512 = XF_BIN_TABLE(f32_avx512);
__attribute__((visibility("hidden"))) const xf_binary_table_f64 xf_binary_f64_avx512 = XF_BIN_TABLE(f64_avx512);
#elif defined(XF_AVX2_PATH_UNIT)
__attribute__((visibility("hidden"))) const xf_binary_table_f32 xf_binary_f32_avx2 = XF_BIN_TABLE(f32_avx2);
__attribute__((visibility("hidden"))) const xf_binary_table_f64 xf_binary_f64_avx2 = XF_BIN_TABLE(f64_avx2);
#else
static const xf_binary_table_f32 xf_binary_f32_baseline = XF_BIN_TABLE(f32);
static const xf_binary_table_f64 xf_binary_f64_baseline = XF_BIN_TABLE(f64);
#if XF_BIN_HAVE_AVX2_PATH
#ifdef __cplusplus
extern "C" {
#endif
__attribute__((visibility("hidden"))) extern const xf_binary_table_f32 xf_binary_f32_avx2;
__attribute__((visibility("hidden"))) extern const xf_binary_table_f64 xf_binary_f64_avx2;
#if XF_BIN_HAVE_AVX512_PATH
__attribute__((visibility("hidden"))) extern const xf_binary_table_f32 xf_binary_f32_avx512;
__attribute__((visibility("hidden"))) extern const xf_binary_table_f64 xf_binary_f64_avx512;
#endif
#ifdef __cplusplus
}
#endif
#endif
#undef XF_BIN_TABLE

/* The table of a path: 0 baseline, 1 avx2, 2 avx512 (the codes of xent_kernels.h; a path this build lacks
 * gives the baseline table, but the softmax module never selects one, since both are built alike). */
static const xf_binary_table_f32 *xf_binary_table_for_f32(int path)
{
#if XF_BIN_HAVE_AVX2_PATH
    if (path == 1) {
        return &xf_binary_f32_avx2;
    }
#endif
#if XF_BIN_HAVE_AVX512_PATH
    if (path == 2) {
        return &xf_binary_f32_avx512;
    }
#endif
    (void)path;
    return &xf_binary_f32_baseline;
}

static const xf_binary_table_f64 *xf_binary_table_for_f64(int path)
{
#if XF_BIN_HAVE_AVX2_PATH
    if (path == 1) {
        return &xf_binary_f64_avx2;
    }
#endif
#if XF_BIN_HAVE_AVX512_PATH
    if (path == 2) {
        return &xf_binary_f64_avx512;
    }
#endif
    (void)path;
    return &xf_binary_f64_baseline;
}
#endif /* no path unit */
#endif /* !XF_CUDA */

#endif /* !XF_KERNEL_TABLES_ONLY */

#ifdef XF_BIN_POP_OPTIONS
#pragma GCC pop_options
#undef XF_BIN_POP_OPTIONS
#endif

#endif /* XENTFAST_BINARY_KERNELS_H */
