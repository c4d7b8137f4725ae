/* CPU softmax-family row kernels, written once and instantiated for float and double storage and for
 * each CPU code path.
 *
 * Included by xent_kernels.h with XF_T (storage type), XF_SFX (name suffix), XF_COMPENSATED and XF_KERNEL
 * (linkage) defined; a path is a translation unit (xent_kernels.h).  All arithmetic is double and comes from
 * xentfast/numerics.h, the header the CUDA kernels include too.
 *
 * Design (see also the block comment of _xent.pyx):
 * (a) A row is cut into fixed blocks of XF_BLOCK classes.  Every pass (max, sum of exponentials, loss
 *     terms, gradient) is a function of one block, and block results are merged in block order.  Whether
 *     one thread walks all blocks of a row or many threads share them (few rows, huge C), the merge order
 *     is the same, so results are bitwise identical for any thread count.
 * (b) Inside a block, sums run in XF_LANES fixed lanes (element j feeds lane j % XF_LANES) combined by a
 *     fixed tree: the order does not depend on the vector width the compiler picks.
 * (c) float64 sums are compensated (TwoSum per lane, double-double across lanes and blocks): S is a sum of
 *     up to 10^5 positive terms and a plain sum would drift by ~sqrt(C) ULP.  float32 data is summed in
 *     plain double: 29 spare bits absorb the drift, and the compensation would cost speed for nothing.
 * (d) The max term contributes exactly exp(0) = 1; it is kept out of the sum s so that log S = log1p(s)
 *     and 1 - p_argmax = s/S keep their accuracy on confident rows.
 */

#define XF_CAT_(a, b) a##_##b
#define XF_CAT(a, b) XF_CAT_(a, b)
#define XF_FN(name) XF_CAT(name, XF_SFX)

/* exp(x_j - m) for this storage type (see (c) and xentfast/softmax_row.h). */
#if XF_COMPENSATED
#define XF_EXP_MINUS(x, m) xf_exp_minus_f64((double)(x), (m))
#define XF_EXP_MINUS_NORMAL(x, m) xf_exp_minus_f64_normal((double)(x), (m))
#define XF_EXP_MINUS_MASKED(x, m) xf_exp_minus_f64_masked((double)(x), (m))
#else
/* x: a float entry, or one already widened to double (exact; xf_group_sum_form widens a group's) */
#define XF_EXP_MINUS(x, m) xf_exp_minus_f32((x), (m))
#define XF_EXP_MINUS_NORMAL(x, m) xf_exp_minus_f32_normal((x), (m))
#define XF_EXP_MINUS_MASKED(x, m) xf_exp_minus_f32_masked((x), (m))
#endif
/* `normal` (job->exp_normal: 0 the clamped form, 1 the normal form, 2 the normal form on a row with
 * masked entries, -inf or a finite mask) is a literal at every expansion inside the always-inlined bodies below, so each body is
 * compiled once per form, with no per-element test. */
#define XF_EXP_FORM(normal, x, m)                                                                          \
    ((normal) == 1 ? XF_EXP_MINUS_NORMAL(x, m) : (normal) == 2 ? XF_EXP_MINUS_MASKED(x, m) : XF_EXP_MINUS(x, m))
/* the short-row groups' loops widen a column's entries in a loop of their own in the avx512 unit
 * (xf_group_sum_form) */
#if defined(__AVX512F__)
#define XF_GROUP_WIDE_ENTRIES 1
#else
#define XF_GROUP_WIDE_ENTRIES 0
#endif
/* the compensated lane step: a normal-form block (1 or 2) sums at most XF_BLOCK exponentials <= 1, never inf */
#define XF_ACC_FORM(normal, acc, cmp, v) \
    ((normal) ? xf_acc_add_finite((acc), (cmp), (v)) : xf_acc_add((acc), (cmp), (v)))

/* Pass 1 of a block: max (NaN-blind), first index of the max, NaN and finite counts. */
#define XF_MAX_LANES 16

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* First index j < n with x[j] == m, n if none.  The answer is an integer, so the paths may find it
 * differently and still agree.  The AVX2 unit compares 32 floats (16 doubles) per step and reads the
 * index off the compare masks; elsewhere a vectorized test per 64-entry chunk, then a scan of that chunk
 * (C microbenchmark, float32 rows of 1000 in cache: 55 -> 22 ns per row, ~4 % of the forward pass).  The
 * avx512 unit compares 64 floats (32 doubles) per step into mask registers: in a profile of the forward
 * pass at 4096x1000 float32, one thread, 6.5 -> 3.7 % of the samples.  Since 2026-12-07 the max pass
 * of the avx512 unit, and of the AVX2 unit's floats, finds the index itself (xf_max_argmax_ps512,
 * xf_max_argmax_ps256), and this scan serves shorter blocks than their vectors, the baseline path, the
 * AVX2 unit's doubles, and the next row's max read ahead. */
XF_KERNEL long long XF_FN(xf_first_equal)(const XF_T *x, long long n, XF_T m)
{
    long long j = 0;
#if defined(__AVX2__)
    if (sizeof(XF_T) == sizeof(float)) {
        const float *xf = (const float *)x;
#if defined(__AVX512F__)
        /* the avx512 unit: 64 floats per step, the compares straight into mask registers (no movemask,
         * no or of vectors): half the operations per float of the loop below */
        {
            const __m512 wv = _mm512_set1_ps((float)m);
            for (; j + 64 <= n; j += 64) {
                __mmask16 k0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(xf + j), wv, _CMP_EQ_OQ);
                __mmask16 k1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(xf + j + 16), wv, _CMP_EQ_OQ);
                __mmask16 k2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(xf + j + 32), wv, _CMP_EQ_OQ);
                __mmask16 k3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(xf + j + 48), wv, _CMP_EQ_OQ);
                if ((k0 | k1 | k2 | k3) != 0) {
                    unsigned long long hit = (unsigned long long)k0 | ((unsigned long long)k1 << 16) |
                                             ((unsigned long long)k2 << 32) | ((unsigned long long)k3 << 48);
                    return j + __builtin_ctzll(hit);
                }
            }
        }
#endif
        const __m256 mv = _mm256_set1_ps((float)m);
        for (; j + 32 <= n; j += 32) {
            __m256 c0 = _mm256_cmp_ps(_mm256_loadu_ps(xf + j), mv, _CMP_EQ_OQ);
            __m256 c1 = _mm256_cmp_ps(_mm256_loadu_ps(xf + j + 8), mv, _CMP_EQ_OQ);
            __m256 c2 = _mm256_cmp_ps(_mm256_loadu_ps(xf + j + 16), mv, _CMP_EQ_OQ);
            __m256 c3 = _mm256_cmp_ps(_mm256_loadu_ps(xf + j + 24), mv, _CMP_EQ_OQ);
            if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(c0, c1), _mm256_or_ps(c2, c3)))) {
                unsigned hit = (unsigned)_mm256_movemask_ps(c0) | ((unsigned)_mm256_movemask_ps(c1) << 8) |
                               ((unsigned)_mm256_movemask_ps(c2) << 16) | ((unsigned)_mm256_movemask_ps(c3) << 24);
                return j + __builtin_ctz(hit);
            }
        }
    } else {
        const double *xd = (const double *)x;
#if defined(__AVX512F__)
        {
            const __m512d wv = _mm512_set1_pd((double)m);
            for (; j + 32 <= n; j += 32) {
                __mmask8 k0 = _mm512_cmp_pd_mask(_mm512_loadu_pd(xd + j), wv, _CMP_EQ_OQ);
                __mmask8 k1 = _mm512_cmp_pd_mask(_mm512_loadu_pd(xd + j + 8), wv, _CMP_EQ_OQ);
                __mmask8 k2 = _mm512_cmp_pd_mask(_mm512_loadu_pd(xd + j + 16), wv, _CMP_EQ_OQ);
                __mmask8 k3 = _mm512_cmp_pd_mask(_mm512_loadu_pd(xd + j + 24), wv, _CMP_EQ_OQ);
                if ((k0 | k1 | k2 | k3) != 0) {
                    unsigned hit = (unsigned)k0 | ((unsigned)k1 << 8) | ((unsigned)k2 << 16) | ((unsigned)k3 << 24);
                    return j + __builtin_ctz(hit);
                }
            }
        }
#endif
        const __m256d mv = _mm256_set1_pd((double)m);
        for (; j + 16 <= n; j += 16) {
            __m256d c0 = _mm256_cmp_pd(_mm256_loadu_pd(xd + j), mv, _CMP_EQ_OQ);
            __m256d c1 = _mm256_cmp_pd(_mm256_loadu_pd(xd + j + 4), mv, _CMP_EQ_OQ);
            __m256d c2 = _mm256_cmp_pd(_mm256_loadu_pd(xd + j + 8), mv, _CMP_EQ_OQ);
            __m256d c3 = _mm256_cmp_pd(_mm256_loadu_pd(xd + j + 12), mv, _CMP_EQ_OQ);
            if (_mm256_movemask_pd(_mm256_or_pd(_mm256_or_pd(c0, c1), _mm256_or_pd(c2, c3)))) {
                unsigned hit = (unsigned)_mm256_movemask_pd(c0) | ((unsigned)_mm256_movemask_pd(c1) << 4) |
                               ((unsigned)_mm256_movemask_pd(c2) << 8) | ((unsigned)_mm256_movemask_pd(c3) << 12);
                return j + __builtin_ctz(hit);
            }
        }
    }
    for (; j < n; j++) {
        if (x[j] == m) {
            return j;
        }
    }
    return n;
#else
    long long c0;
    for (c0 = 0; c0 < n; c0 += 64) {
        long long len = (n - c0 < 64) ? n - c0 : 64;
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (j = 0; j < len; j++) {
            hit |= (x[c0 + j] == m);
        }
        for (j = 0; hit && j < len; j++) {
            if (x[c0 + j] == m) {
                return c0 + j;
            }
        }
    }
    return n;
#endif
}

/* The counting part of pass 1, for blocks that hold a NaN or a -inf (rare: masked classes): the min over
 * the entries above -inf and their count, lane by lane as xf_max_block, and the NaN count where its
 * marker saw one.  The max is xf_max_block's own (NaN-blind either way).  The min is taken over
 * `v > -inf ? v : +inf`, which does not wait on the running min (a NaN leaves it alone either way: its
 * compares are false).  This pass had kept a max and a NaN count of its own, with the -inf test inside
 * the min's select, each step's compare and blend waiting on the last: one 512-bit vector of floats per
 * ~6 cycles, 18 % of a forward pass over rows with 30 % -inf (benchmarks/README.md, fourteenth round). */
XF_KERNEL void XF_FN(xf_max_block_counted)(const XF_T *x, long long n, int any_nan, XF_T *mn_out, int *n_nan_out,
                                           int *n_finite_out)
{
    const XF_T neg_inf = (XF_T)-XF_INF, pos_inf = (XF_T)XF_INF;
    XF_T lmn[XF_MAX_LANES];
    int lfin[XF_MAX_LANES];
    int k, n_nan = 0;
    long long j = 0;
    for (k = 0; k < XF_MAX_LANES; k++) {
        lmn[k] = pos_inf;
        lfin[k] = 0;
    }
    for (; j + XF_MAX_LANES <= n; j += XF_MAX_LANES) {
#pragma omp simd
        for (k = 0; k < XF_MAX_LANES; k++) {
            const XF_T v = x[j + k];
            const XF_T above = (v > neg_inf) ? v : pos_inf;
            lmn[k] = (above < lmn[k]) ? above : lmn[k];
            lfin[k] += (v > neg_inf);
        }
    }
    for (k = 0; j + k < n; k++) {
        const XF_T v = x[j + k];
        const XF_T above = (v > neg_inf) ? v : pos_inf;
        lmn[k] = (above < lmn[k]) ? above : lmn[k];
        lfin[k] += (v > neg_inf);
    }
    /* the lanes folded in halves, not one after another in a chain */
    int half;
    for (half = XF_MAX_LANES / 2; half > 0; half /= 2) {
#pragma omp simd
        for (k = 0; k < half; k++) {
            lmn[k] = (lmn[k + half] < lmn[k]) ? lmn[k + half] : lmn[k];
            lfin[k] += lfin[k + half];
        }
    }
    const XF_T mn = lmn[0];
    const int n_finite = lfin[0];
    if (any_nan) {
#pragma omp simd reduction(+ : n_nan)
        for (j = 0; j < n; j++) {
            n_nan += (x[j] != x[j]);
        }
    }
    *mn_out = mn;
    *n_nan_out = n_nan;
    *n_finite_out = n_finite;
}

#ifndef XF_FLOAT_NEXT_UP_DEFINED
#define XF_FLOAT_NEXT_UP_DEFINED 1
/* the least float above f, for f finite or -inf and below FLT_MAX (-inf gives -FLT_MAX): one step of the
 * magnitude's bits, up for positive f and down for negative */
static inline float xf_float_next_up(float f)
{
    unsigned int bits;
    if (f == 0.0f) {
        return 1.40129846e-45f;
    }
    memcpy(&bits, &f, sizeof bits);
    bits = (f > 0.0f) ? bits + 1u : bits - 1u;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#endif

#if defined(__AVX2__) && !defined(XF_MAX_FOLD_DEFINED)
#define XF_MAX_FOLD_DEFINED 1
/* one vector into xf_max_block's running max, min and NaN marker.  max_ps(v, acc) is (v > acc) ? v : acc,
 * NaN-blind as the generic loop's selects (and min_ps likewise); the marker collects unordered compares. */
static inline __attribute__((always_inline)) void xf_max_fold_ps(__m256 v, __m256 *mx, __m256 *mn,
                                                                 __m256 *marker)
{
    *mx = _mm256_max_ps(v, *mx);
    *mn = _mm256_min_ps(v, *mn);
    *marker = _mm256_or_ps(*marker, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

static inline __attribute__((always_inline)) void xf_max_fold_pd(__m256d v, __m256d *mx, __m256d *mn,
                                                                 __m256d *marker)
{
    *mx = _mm256_max_pd(v, *mx);
    *mn = _mm256_min_pd(v, *mn);
    *marker = _mm256_or_pd(*marker, _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
}
#endif

#if defined(__AVX512F__) && !defined(XF_MAX_ARGMAX_PS512_DEFINED)
#define XF_MAX_ARGMAX_PS512_DEFINED 1
/* xf_max_block's float pass in the avx512 unit with the first index of the max found on the way (for
 * 16 <= n < 2^31): each of 32 lanes keeps the position where its max last rose (a strictly greater entry
 * replaces it, so among equal entries the first stays), and the lanes' positions only grow, the tail's
 * last 16 entries included (they start past every position the main loop gave that lane).  The first
 * index of the max is then the least position among the lanes holding it; -1 where no entry rose above
 * -inf (every entry -inf or NaN: xf_first_equal decides).  The positions' selects stay off the max's
 * chain (each compares against the running max before it is updated).  Replaces xf_first_equal's scan
 * of the block after the pass (4.8 % of a profile of the forward pass at 4096x1000 float32, one thread,
 * AMD Zen 5).  The max is the lanes' reduced in another order than the other paths' folds: a row whose
 * max is a zero held by entries of both signs may get either zero here, which no result shows (two
 * tied entries make log S >= log 2, which absorbs the sign; tests/test_dispatch.py).  One thread, AMD
 * Zen 5, median of 5 alternated runs: forward 4096x1000 float32 1.53 -> 1.49 ms, float64 3.37 -> 3.13;
 * fused float32 1.84 -> 1.76, float64 3.98 -> 3.67 (benchmarks/README.md, 2026-12-07, later). */
static inline __attribute__((always_inline)) long long xf_max_argmax_ps512(const float *xf, long long n,
                                                                         float *m_out, float *mn_out,
                                                                         int *any_nan_out)
{
    const __m512i none = _mm512_set1_epi32(0x7fffffff), sixteen = _mm512_set1_epi32(16);
    __m512 wm0 = _mm512_set1_ps(-XF_INF), wm1 = wm0, wn0 = _mm512_set1_ps(XF_INF), wn1 = wn0;
    __m512i wi0 = none, wi1 = none;
    __m512i pos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 wnan = 0;
    long long j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 a = _mm512_loadu_ps(xf + j), b = _mm512_loadu_ps(xf + j + 16);
        __m512i pos_b = _mm512_add_epi32(pos, sixteen);
        wi0 = _mm512_mask_mov_epi32(wi0, _mm512_cmp_ps_mask(a, wm0, _CMP_GT_OQ), pos);
        wi1 = _mm512_mask_mov_epi32(wi1, _mm512_cmp_ps_mask(b, wm1, _CMP_GT_OQ), pos_b);
        wm0 = _mm512_max_ps(a, wm0);
        wn0 = _mm512_min_ps(a, wn0);
        wm1 = _mm512_max_ps(b, wm1);
        wn1 = _mm512_min_ps(b, wn1);
        wnan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
        pos = _mm512_add_epi32(pos_b, sixteen);
    }
    if (j + 16 <= n) {
        __m512 a = _mm512_loadu_ps(xf + j);
        wi0 = _mm512_mask_mov_epi32(wi0, _mm512_cmp_ps_mask(a, wm0, _CMP_GT_OQ), pos);
        wm0 = _mm512_max_ps(a, wm0);
        wn0 = _mm512_min_ps(a, wn0);
        wnan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        pos = _mm512_add_epi32(pos, sixteen);
        j += 16;
    }
    if (j < n) {
        __m512 b = _mm512_loadu_ps(xf + n - 16);
        __m512i pos_b = _mm512_add_epi32(pos, _mm512_set1_epi32((int)(n - 16 - j)));
        wi1 = _mm512_mask_mov_epi32(wi1, _mm512_cmp_ps_mask(b, wm1, _CMP_GT_OQ), pos_b);
        wm1 = _mm512_max_ps(b, wm1);
        wn1 = _mm512_min_ps(b, wn1);
        wnan |= _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    }
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(wm1, wm0));
    const __m512 mv = _mm512_set1_ps(m);
    __m512i at0 = _mm512_mask_mov_epi32(none, _mm512_cmp_ps_mask(wm0, mv, _CMP_EQ_OQ), wi0);
    __m512i at1 = _mm512_mask_mov_epi32(none, _mm512_cmp_ps_mask(wm1, mv, _CMP_EQ_OQ), wi1);
    const int first = _mm512_reduce_min_epi32(_mm512_min_epi32(at0, at1));
    *m_out = m;
    *mn_out = _mm512_reduce_min_ps(_mm512_min_ps(wn1, wn0));
    *any_nan_out = wnan != 0;
    return (first == 0x7fffffff) ? -1 : (long long)first;
}

/* the same for doubles (for 8 <= n < 2^31): 16 lanes, their positions as 32-bit integers in 256-bit
 * vectors.  The other paths' double max pass runs 256-bit vectors. */
static inline __attribute__((always_inline)) long long xf_max_argmax_pd512(const double *xd, long long n,
                                                                         double *m_out, double *mn_out,
                                                                         int *any_nan_out)
{
    const __m256i none = _mm256_set1_epi32(0x7fffffff), eight = _mm256_set1_epi32(8);
    __m512d wm0 = _mm512_set1_pd(-XF_INF), wm1 = wm0, wn0 = _mm512_set1_pd(XF_INF), wn1 = wn0;
    __m256i wi0 = none, wi1 = none;
    __m256i pos = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __mmask8 wnan = 0;
    long long j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512d a = _mm512_loadu_pd(xd + j), b = _mm512_loadu_pd(xd + j + 8);
        __m256i pos_b = _mm256_add_epi32(pos, eight);
        wi0 = _mm256_mask_mov_epi32(wi0, _mm512_cmp_pd_mask(a, wm0, _CMP_GT_OQ), pos);
        wi1 = _mm256_mask_mov_epi32(wi1, _mm512_cmp_pd_mask(b, wm1, _CMP_GT_OQ), pos_b);
        wm0 = _mm512_max_pd(a, wm0);
        wn0 = _mm512_min_pd(a, wn0);
        wm1 = _mm512_max_pd(b, wm1);
        wn1 = _mm512_min_pd(b, wn1);
        wnan |= _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q);
        pos = _mm256_add_epi32(pos_b, eight);
    }
    if (j + 8 <= n) {
        __m512d a = _mm512_loadu_pd(xd + j);
        wi0 = _mm256_mask_mov_epi32(wi0, _mm512_cmp_pd_mask(a, wm0, _CMP_GT_OQ), pos);
        wm0 = _mm512_max_pd(a, wm0);
        wn0 = _mm512_min_pd(a, wn0);
        wnan |= _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q);
        pos = _mm256_add_epi32(pos, eight);
        j += 8;
    }
    if (j < n) {
        __m512d b = _mm512_loadu_pd(xd + n - 8);
        __m256i pos_b = _mm256_add_epi32(pos, _mm256_set1_epi32((int)(n - 8 - j)));
        wi1 = _mm256_mask_mov_epi32(wi1, _mm512_cmp_pd_mask(b, wm1, _CMP_GT_OQ), pos_b);
        wm1 = _mm512_max_pd(b, wm1);
        wn1 = _mm512_min_pd(b, wn1);
        wnan |= _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q);
    }
    const double m = _mm512_reduce_max_pd(_mm512_max_pd(wm1, wm0));
    const __m512d mv = _mm512_set1_pd(m);
    __m256i at = _mm256_min_epi32(_mm256_mask_mov_epi32(none, _mm512_cmp_pd_mask(wm0, mv, _CMP_EQ_OQ), wi0),
                                  _mm256_mask_mov_epi32(none, _mm512_cmp_pd_mask(wm1, mv, _CMP_EQ_OQ), wi1));
    const int first = _mm512_reduce_min_epi32(_mm512_inserti64x4(_mm512_set1_epi32(0x7fffffff), at, 0));
    *m_out = m;
    *mn_out = _mm512_reduce_min_pd(_mm512_min_pd(wn1, wn0));
    *any_nan_out = wnan != 0;
    return (first == 0x7fffffff) ? -1 : (long long)first;
}
#endif


#if defined(__AVX2__) && !defined(__AVX512F__) && !defined(XF_MAX_ARGMAX_PS256_DEFINED)
#define XF_MAX_ARGMAX_PS256_DEFINED 1
/* the AVX2 unit's float pass with the first index (for 8 <= n < 2^31), as xf_max_argmax_ps512 with two
 * vectors of 8 lanes and the positions held as the bits of floats (blendv selects by the compare's sign
 * bit).
 * One thread, on AMD Zen 5 with XENTFAST_CPU=avx2, median of 5 alternated runs: forward 4096x1000
 * float32 2.47 -> 2.38 ms (the scan had 3.8 % of its samples), fused 3.17 -> 3.14.  The AVX2 unit's
 * doubles keep the scan (2.3 % of that forward pass in float64). */
static inline __attribute__((always_inline)) long long xf_max_argmax_ps256(const float *xf, long long n,
                                                                         float *m_out, float *mn_out,
                                                                         int *any_nan_out)
{
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256 none = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vm0 = _mm256_set1_ps(-XF_INF), vm1 = vm0, vn0 = _mm256_set1_ps(XF_INF), vn1 = vn0;
    __m256 nan0 = _mm256_setzero_ps();
    __m256 vi0 = none, vi1 = none;
    __m256i pos = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    long long j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 a = _mm256_loadu_ps(xf + j), b = _mm256_loadu_ps(xf + j + 8);
        __m256i pos_b = _mm256_add_epi32(pos, eight);
        vi0 = _mm256_blendv_ps(vi0, _mm256_castsi256_ps(pos), _mm256_cmp_ps(a, vm0, _CMP_GT_OQ));
        vi1 = _mm256_blendv_ps(vi1, _mm256_castsi256_ps(pos_b), _mm256_cmp_ps(b, vm1, _CMP_GT_OQ));
        vm0 = _mm256_max_ps(a, vm0);
        vn0 = _mm256_min_ps(a, vn0);
        vm1 = _mm256_max_ps(b, vm1);
        vn1 = _mm256_min_ps(b, vn1);
        nan0 = _mm256_or_ps(nan0, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
        pos = _mm256_add_epi32(pos_b, eight);
    }
    if (j + 8 <= n) {
        __m256 a = _mm256_loadu_ps(xf + j);
        vi0 = _mm256_blendv_ps(vi0, _mm256_castsi256_ps(pos), _mm256_cmp_ps(a, vm0, _CMP_GT_OQ));
        vm0 = _mm256_max_ps(a, vm0);
        vn0 = _mm256_min_ps(a, vn0);
        nan0 = _mm256_or_ps(nan0, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        pos = _mm256_add_epi32(pos, eight);
        j += 8;
    }
    if (j < n) {
        __m256 b = _mm256_loadu_ps(xf + n - 8);
        __m256i pos_b = _mm256_add_epi32(pos, _mm256_set1_epi32((int)(n - 8 - j)));
        vi1 = _mm256_blendv_ps(vi1, _mm256_castsi256_ps(pos_b), _mm256_cmp_ps(b, vm1, _CMP_GT_OQ));
        vm1 = _mm256_max_ps(b, vm1);
        vn1 = _mm256_min_ps(b, vn1);
        nan0 = _mm256_or_ps(nan0, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    }
    __m256 vm = _mm256_max_ps(vm1, vm0), vn = _mm256_min_ps(vn1, vn0);
    __m128 hm = _mm_max_ps(_mm256_extractf128_ps(vm, 1), _mm256_castps256_ps128(vm));
    __m128 hn = _mm_min_ps(_mm256_extractf128_ps(vn, 1), _mm256_castps256_ps128(vn));
    hm = _mm_max_ps(_mm_movehl_ps(hm, hm), hm);
    hn = _mm_min_ps(_mm_movehl_ps(hn, hn), hn);
    hm = _mm_max_ss(_mm_movehdup_ps(hm), hm);
    hn = _mm_min_ss(_mm_movehdup_ps(hn), hn);
    const float m = _mm_cvtss_f32(hm);
    const __m256 mv = _mm256_set1_ps(m);
    __m256i at = _mm256_min_epi32(
        _mm256_castps_si256(_mm256_blendv_ps(none, vi0, _mm256_cmp_ps(vm0, mv, _CMP_EQ_OQ))),
        _mm256_castps_si256(_mm256_blendv_ps(none, vi1, _mm256_cmp_ps(vm1, mv, _CMP_EQ_OQ))));
    __m128i h = _mm_min_epi32(_mm256_extracti128_si256(at, 1), _mm256_castsi256_si128(at));
    h = _mm_min_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_min_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    const int first = _mm_cvtsi128_si32(h);
    *m_out = m;
    *mn_out = _mm_cvtss_f32(hn);
    *any_nan_out = _mm256_movemask_ps(nan0) != 0;
    return (first == 0x7fffffff) ? -1 : (long long)first;
}
#endif

XF_KERNEL void XF_FN(xf_max_block)(const XF_T *x, long long n, long long offset, xf_rowmax *out)
{
    /* in the storage type (8 float lanes per AVX2 vector instead of 4 doubles; float -> double is exact
     * and monotone, so the max is the same number).  XF_MAX_LANES independent accumulators, not an
     * OpenMP reduction: a single max chain waits on the compare latency at every vector (measured 0.8 ->
     * 0.15 ns per float).  max and min do not depend on the order they are taken in, so the lanes change
     * no result.  The common block (no NaN, no -inf) needs neither count: n_finite is n, and the plain
     * min is the min over the finite entries.  So the loop keeps max, plain min and a NaN marker (four
     * operations per vector instead of nine), and a block whose min is -inf or that marks a NaN is
     * counted again by xf_max_block_counted. */
    const XF_T neg_inf = (XF_T)-XF_INF;
    XF_T m, mn;
    int any_nan;
    long long j = 0, first = -1;
#if defined(__AVX2__)
    /* the same lanes in registers (xf_max_fold_*), folded to one number at the end: a short row spent
     * ~40 ns here on the scalar tail and the lane-by-lane merge through memory */
#if defined(__AVX512F__)
    if (sizeof(XF_T) == sizeof(float) && n >= 16 && n < (1LL << 31)) {
        float mf, mnf;
        first = xf_max_argmax_ps512((const float *)x, n, &mf, &mnf, &any_nan);
        m = (XF_T)mf;
        mn = (XF_T)mnf;
    } else if (sizeof(XF_T) == sizeof(double) && n >= 8 && n < (1LL << 31)) {
        double md, mnd;
        first = xf_max_argmax_pd512((const double *)x, n, &md, &mnd, &any_nan);
        m = (XF_T)md;
        mn = (XF_T)mnd;
    } else
#else
    if (sizeof(XF_T) == sizeof(float) && n >= 8 && n < (1LL << 31)) {
        float mf, mnf;
        first = xf_max_argmax_ps256((const float *)x, n, &mf, &mnf, &any_nan);
        m = (XF_T)mf;
        mn = (XF_T)mnf;
    } else
#endif
    if (sizeof(XF_T) == sizeof(float)) {
        const float *xf = (const float *)x;
        __m256 vm0 = _mm256_set1_ps(-XF_INF), vm1 = vm0, vn0 = _mm256_set1_ps(XF_INF), vn1 = vn0;
        __m256 nan0 = _mm256_setzero_ps(), nan1 = nan0;
        for (; j + 16 <= n; j += 16) {
            xf_max_fold_ps(_mm256_loadu_ps(xf + j), &vm0, &vn0, &nan0);
            xf_max_fold_ps(_mm256_loadu_ps(xf + j + 8), &vm1, &vn1, &nan1);
        }
        /* the tail as whole vectors that end at the block's end, overlapping entries already seen: max,
         * min and the NaN marker are idempotent, so seeing an entry twice changes nothing.  (Masked
         * loads would do too, but no kernel here uses a masked move, see tests/test_build.py.)  The
         * last 16 entries; a block of 8 to 15 its first 8 and last 8; below 8, one by one. */
        if (j < n && n >= 8) {
            xf_max_fold_ps(_mm256_loadu_ps((n >= 16) ? xf + n - 16 : xf), &vm0, &vn0, &nan0);
            xf_max_fold_ps(_mm256_loadu_ps(xf + n - 8), &vm1, &vn1, &nan1);
        }
        for (; n < 8 && j < n; j++) {
            xf_max_fold_ps(_mm256_set1_ps(xf[j]), &vm0, &vn0, &nan0);
        }
        __m256 vm = _mm256_max_ps(vm1, vm0), vn = _mm256_min_ps(vn1, vn0);
        __m128 hm = _mm_max_ps(_mm256_extractf128_ps(vm, 1), _mm256_castps256_ps128(vm));
        __m128 hn = _mm_min_ps(_mm256_extractf128_ps(vn, 1), _mm256_castps256_ps128(vn));
        hm = _mm_max_ps(_mm_movehl_ps(hm, hm), hm);
        hn = _mm_min_ps(_mm_movehl_ps(hn, hn), hn);
        hm = _mm_max_ss(_mm_movehdup_ps(hm), hm);
        hn = _mm_min_ss(_mm_movehdup_ps(hn), hn);
        m = (XF_T)_mm_cvtss_f32(hm);
        mn = (XF_T)_mm_cvtss_f32(hn);
        any_nan = _mm256_movemask_ps(_mm256_or_ps(nan0, nan1)) != 0;
    } else {
        const double *xd = (const double *)x;
        __m256d vm0 = _mm256_set1_pd(-XF_INF), vm1 = vm0, vm2 = vm0, vm3 = vm0;
        __m256d vn0 = _mm256_set1_pd(XF_INF), vn1 = vn0, vn2 = vn0, vn3 = vn0;
        __m256d nan0 = _mm256_setzero_pd(), nan1 = nan0, nan2 = nan0, nan3 = nan0;
        for (; j + 16 <= n; j += 16) {
            xf_max_fold_pd(_mm256_loadu_pd(xd + j), &vm0, &vn0, &nan0);
            xf_max_fold_pd(_mm256_loadu_pd(xd + j + 4), &vm1, &vn1, &nan1);
            xf_max_fold_pd(_mm256_loadu_pd(xd + j + 8), &vm2, &vn2, &nan2);
            xf_max_fold_pd(_mm256_loadu_pd(xd + j + 12), &vm3, &vn3, &nan3);
        }
        /* the tail in whole vectors, the last one ending at the block's end (see the float case) */
        for (; j + 4 <= n; j += 4) {
            xf_max_fold_pd(_mm256_loadu_pd(xd + j), &vm0, &vn0, &nan0);
        }
        if (j < n && n >= 4) {
            xf_max_fold_pd(_mm256_loadu_pd(xd + n - 4), &vm1, &vn1, &nan1);
        }
        for (; n < 4 && j < n; j++) {
            xf_max_fold_pd(_mm256_set1_pd(xd[j]), &vm0, &vn0, &nan0);
        }
        __m256d vm = _mm256_max_pd(_mm256_max_pd(vm2, vm0), _mm256_max_pd(vm3, vm1));
        __m256d vn = _mm256_min_pd(_mm256_min_pd(vn2, vn0), _mm256_min_pd(vn3, vn1));
        __m128d hm = _mm_max_pd(_mm256_extractf128_pd(vm, 1), _mm256_castpd256_pd128(vm));
        __m128d hn = _mm_min_pd(_mm256_extractf128_pd(vn, 1), _mm256_castpd256_pd128(vn));
        hm = _mm_max_sd(_mm_unpackhi_pd(hm, hm), hm);
        hn = _mm_min_sd(_mm_unpackhi_pd(hn, hn), hn);
        m = (XF_T)_mm_cvtsd_f64(hm);
        mn = (XF_T)_mm_cvtsd_f64(hn);
        any_nan = _mm256_movemask_pd(_mm256_or_pd(_mm256_or_pd(nan0, nan1), _mm256_or_pd(nan2, nan3))) != 0;
    }
#else
    XF_T lm[XF_MAX_LANES], lmn[XF_MAX_LANES], lnan[XF_MAX_LANES];
    int k;
    for (k = 0; k < XF_MAX_LANES; k++) {
        lm[k] = neg_inf;
        lmn[k] = (XF_T)XF_INF;
        lnan[k] = (XF_T)0;
    }
    for (; j + XF_MAX_LANES <= n; j += XF_MAX_LANES) {
#pragma omp simd
        for (k = 0; k < XF_MAX_LANES; k++) {
            XF_T v = x[j + k];
            lm[k] = (v > lm[k]) ? v : lm[k];
            lmn[k] = (v < lmn[k]) ? v : lmn[k];
            lnan[k] = (v != v) ? v : lnan[k];
        }
    }
    for (k = 0; j + k < n; k++) {
        XF_T v = x[j + k];
        lm[k] = (v > lm[k]) ? v : lm[k];
        lmn[k] = (v < lmn[k]) ? v : lmn[k];
        lnan[k] = (v != v) ? v : lnan[k];
    }
    m = neg_inf;
    mn = (XF_T)XF_INF;
    any_nan = 0;
    for (k = 0; k < XF_MAX_LANES; k++) {
        m = (lm[k] > m) ? lm[k] : m;
        mn = (lmn[k] < mn) ? lmn[k] : mn;
        any_nan |= (lnan[k] != lnan[k]);
    }
#endif
    int n_nan = 0, n_finite = (int)n;
    if (any_nan || !(mn > neg_inf)) {
        XF_FN(xf_max_block_counted)(x, n, any_nan, &mn, &n_nan, &n_finite);
    }
    if (first < 0) {
        first = XF_FN(xf_first_equal)(x, n, m);
    }
    out->m = (double)m;
    out->argmax = offset + (first < n ? first : 0);
    out->n_nan = n_nan;
    out->n_finite = n_finite;
    out->min_finite = (double)mn;
}

/* elements per exponential chunk in the sum pass, a multiple of XF_LANES */
#define XF_CHUNK 64

/* ---- the next row's max pass, inside this row's sum pass ------------------------------------------------
 * The sum pass is bound by its exponentials' arithmetic and leaves the loads idle, while the max pass
 * after it reads the next row once more at load speed (~15 % of a fused float32 row of 32000 classes).
 * Where the driver allows it (xf_row_scratch_read_ahead), each full chunk of the sum pass also folds the
 * same chunk of the next row into XF_MAX_LANES lanes of max, min and an inf/NaN marker, and that row's
 * max pass (xf_row_max_next) folds the lanes, takes the entries past the last full chunk, and finds the
 * first index of the max.  Max and min are exact and independent of the order they are taken in, so
 * the row's statistics are xf_row_max's, up to which of +0 and -0 is the max (or min) where both attain
 * it, which no output depends on (see xf_max_block); a row with a NaN, an inf or a -inf takes
 * xf_row_max itself. */
typedef struct {
    XF_T m[XF_MAX_LANES], mn[XF_MAX_LANES], mark[XF_MAX_LANES];
} XF_FN(xf_next_max);
typedef char XF_FN(xf_next_max_fits)[(sizeof(XF_FN(xf_next_max)) <= sizeof(((xf_row_scratch *)0)->next_lanes))
                                         ? 1 : -1];
/* the next row's chunks cover a prefix of it: whole blocks, then the last block's whole chunks */
typedef char XF_FN(xf_next_max_blocks)[(XF_BLOCK % XF_CHUNK == 0) ? 1 : -1];
/* how far past its reads in the next row the sum pass prefetches that row (bytes, ~4 chunks of work) */
#define XF_NEXT_PREFETCH_BYTES 1024

static inline __attribute__((always_inline)) void XF_FN(xf_next_max_init)(XF_FN(xf_next_max) *a)
{
    int k;
    for (k = 0; k < XF_MAX_LANES; k++) {
        a->m[k] = (XF_T)-XF_INF;
        a->mn[k] = (XF_T)XF_INF;
        a->mark[k] = (XF_T)0;
    }
}

/* n a multiple of XF_MAX_LANES.  max and min as xf_max_block's (NaN-blind selects); e - e is +0 for a
 * finite entry and NaN for +-inf or NaN, so the marker stays +0 exactly where the row may take the
 * common form. */
static inline __attribute__((always_inline)) void XF_FN(xf_next_max_add)(XF_FN(xf_next_max) *a, const XF_T *v,
                                                                         long long n)
{
    long long i;
    int k;
    for (i = 0; i < n; i += XF_MAX_LANES) {
#pragma omp simd
        for (k = 0; k < XF_MAX_LANES; k++) {
            const XF_T e = v[i + k];
            a->m[k] = (e > a->m[k]) ? e : a->m[k];
            a->mn[k] = (e < a->mn[k]) ? e : a->mn[k];
            a->mark[k] += e - e;
        }
    }
}
/* How far ahead of its stores the sum pass touches the output buffer (bytes).  A store to a line that is
 * in no cache first reads it from memory, and with every store of a chunk waiting on such reads the
 * exponentials stall behind them: the fused pass ran as if memory and arithmetic took turns (AMD EPYC
 * VM, ~9 GB/s per core: fused 1024x32000 float32 3.0 ns per element, the forward pass alone 1.55).  A
 * prefetch 4 KB ahead (~1 us of work) starts those reads early; gcc emits prefetcht0 without -mprfchw,
 * which serves as well on a core that holds the line alone.  No result depends on it. */
#ifndef XF_STORE_AHEAD_BYTES
#define XF_STORE_AHEAD_BYTES 4096
#endif

/* Long rows of the stored form (float32: every simple row) where this unit is compiled for AVX2
 * (xf_xent_row): the sum pass keeps its
 * exponentials in the thread's scratch row instead of the output, and the gradient goes out by streaming
 * stores (ordinary ones into a new array's pages, xf_pending_stream), during the same thread's next row
 * (xf_pending_step) or at the driver's release.  Storing into
 * the output made every output line travel twice: read from memory before the sum pass's first store to
 * it (the core must own a line it writes part of), written back after the gradient pass.  A streaming
 * store of whole lines skips the read, and the scratch row stays in L2 from row to row.  Fused
 * 2048x128256 float32, one thread: 0.316-0.319 -> 0.266-0.283 s; 8192x32000 about 2 %
 * (benchmarks/README.md, 2026-12-04), the gradient then written after the row's own sum pass; written
 * during the next row's, 0.27 -> 0.23 s and 0.25 -> 0.21 s.  Only from XF_STREAM_MIN_CLASSES per row
 * (xent_kernels.h).  float32, while the stored form kept float32 exponentials in the output: rows of 2048
 * classes ran 5-9 % slower streamed (a row's fixed costs: the pending gradient's start, its partial
 * chunks), rows of 4096 and more 10-13 % faster, even where the caller reads the gradient next (a 16 MB
 * gradient, 4096x4096).  Since float32 rows keep doubles in the scratch row anyway (xf_stored_entry),
 * streaming paid from 1024 classes (two threads, 1 GB of logits: 1024 classes 0.17 -> 0.15 s, 2048
 * 0.17 -> 0.14 s; 512 and 700 classes lost 5-10 %, while a row's tail still streamed a partial line);
 * since 2026-12-05, eighth round, from 256 on the avx512 path (xent_kernels.h).  Without the streaming stores the baseline unit
 * writes the gradient in its own pass.  float64 rows, whose stored form kept the exponentials in the
 * output too, from 2048 classes (16 KB): fused 8192x8000, one thread, 0.119 -> 0.104 s, 1024x64000
 * 0.150 -> 0.113 s; rows of 2048 0.113 -> 0.104 s. */
#if defined(__AVX2__)
#define XF_STREAMED_ROWS 1
#else
#define XF_STREAMED_ROWS 0
#endif

/* The stored form's gradient entry from its kept exponential k, exp(x_j - m) as the double the sum pass
 * made, and the row's factors coef_per_S and coef_mult: (k * coef_per_S) * coef_mult
 * rounded once to the storage type, the recompute path's bits for both types.  Until 2026-12-04 float32
 * rows kept k as a float (scaled by 2^64) and multiplied by one factor; rounding k to float and widening it
 * back cost ~12 % of the fused 8192x32000 call, and the gradient two roundings instead of one.  The output
 * pass (xf_xent_grad_block) and the pending gradients (xf_pending_put) both take it from here;
 * xf_pending_values is its vector form. */
static inline __attribute__((always_inline)) XF_T XF_FN(xf_stored_entry)(double k, double f, double f2)
{
    return (XF_T)((k * f) * f2);
}

#if XF_STREAMED_ROWS
/* elements per 32-byte streaming store */
#define XF_STREAM_LANES (32 / (int)sizeof(XF_T))

/* xf_stored_entry of n kept exponentials, n a multiple of XF_STREAM_LANES, into `out`, 32-byte aligned,
 * by streaming stores when `stream` (a literal), else by aligned ordinary stores: each lane makes the
 * operations of the scalar form.  `unit_mult` (a literal): coef_mult is 1, whose product changes no value
 * and is left out (almost every row; ~2.5 % of the fused 8192x32000 float32 call). */
static inline __attribute__((always_inline)) void XF_FN(xf_pending_values_form)(
    const xf_row_scratch *p, const double *kept, XF_T *out, long long n, const int stream, const int unit_mult)
{
    long long j;
#if XF_COMPENSATED || !defined(__AVX512F__)
    const __m256d vf = _mm256_set1_pd(p->factor);
    const __m256d vm = _mm256_set1_pd(p->factor2);
#endif
#if XF_COMPENSATED
    for (j = 0; j < n; j += 4) {
        __m256d v = _mm256_mul_pd(_mm256_loadu_pd(kept + j), vf);
        v = unit_mult ? v : _mm256_mul_pd(v, vm);
        if (stream) {
            _mm256_stream_pd(out + j, v);
        } else {
            _mm256_store_pd(out + j, v);
        }
    }
#elif defined(__AVX512F__)
    /* the avx512 unit: 8 doubles per product, converted by one instruction into 8 floats, one 32-byte
     * streaming store (the 256-bit form below needs two products, two conversions and two 16-byte
     * stores per 8 entries; joining its halves into one 32-byte store had gained nothing on the avx2
     * path).  Fused 8192x32000 float32, two threads: 98.8-99.8 -> 83.6-89.1 ms (benchmarks/README.md,
     * 2026-12-04, late).  A 64-byte store per 16 entries (two conversions joined) was slower again. */
    const __m512d wf = _mm512_set1_pd(p->factor);
    const __m512d wm = _mm512_set1_pd(p->factor2);
    for (j = 0; j < n; j += 8) {
        __m512d a = _mm512_mul_pd(_mm512_loadu_pd(kept + j), wf);
        a = unit_mult ? a : _mm512_mul_pd(a, wm);
        const __m256 v = _mm512_cvtpd_ps(a);
        if (stream) {
            _mm256_stream_ps(out + j, v);
        } else {
            _mm256_store_ps(out + j, v);
        }
    }
#else
    for (j = 0; j < n; j += 8) {
        __m256d a = _mm256_mul_pd(_mm256_loadu_pd(kept + j), vf);
        __m256d b = _mm256_mul_pd(_mm256_loadu_pd(kept + j + 4), vf);
        a = unit_mult ? a : _mm256_mul_pd(a, vm);
        b = unit_mult ? b : _mm256_mul_pd(b, vm);
        const __m128 lo = _mm256_cvtpd_ps(a);
        const __m128 hi = _mm256_cvtpd_ps(b);
        if (stream) {
            _mm_stream_ps(out + j, lo);
            _mm_stream_ps(out + j + 4, hi);
        } else {
            _mm_store_ps(out + j, lo);
            _mm_store_ps(out + j + 4, hi);
        }
    }
#endif
}

static inline __attribute__((always_inline)) void XF_FN(xf_pending_values)(const xf_row_scratch *p,
                                                                           const double *kept, XF_T *out,
                                                                           long long n, const int stream)
{
    if (p->factor2 == 1.0) {
        XF_FN(xf_pending_values_form)(p, kept, out, n, stream, 1);
    } else {
        XF_FN(xf_pending_values_form)(p, kept, out, n, stream, 0);
    }
}

/* the pending gradient's element j (xf_row_scratch), by ordinary store */
static inline void XF_FN(xf_pending_put)(xf_row_scratch *p, long long j)
{
    XF_T *out = (XF_T *)p->out;
    out[j] = (j == p->target) ? (XF_T)p->target_grad
                              : XF_FN(xf_stored_entry)(p->kept[j], p->factor, p->factor2);
}

/* n elements of a pending gradient from its `done` on, n a multiple of XF_STREAM_LANES, `done` 64-byte
 * aligned in `out` (xf_pending_start), by streaming stores when `stream` (a literal), else by ordinary
 * ones.  The target entry goes into its group before the group is stored: an ordinary store after a
 * streaming one to the same line would need a fence to land last, and a fence per row waits for every
 * line in flight. */
static inline __attribute__((always_inline)) void XF_FN(xf_pending_stream_form)(xf_row_scratch *p, long long n,
                                                                                const int stream)
{
    const double *kept = p->kept + p->done;
    XF_T *out = (XF_T *)p->out + p->done;
    const long long t = p->target - p->done;
    if (t >= 0 && t < n) {
        const long long g = t & ~(long long)(XF_STREAM_LANES - 1);
        XF_T group[XF_STREAM_LANES] __attribute__((aligned(32)));
        XF_FN(xf_pending_values)(p, kept, out, g, stream);
        XF_FN(xf_pending_values)(p, kept + g, group, XF_STREAM_LANES, 0);
        group[t - g] = (XF_T)p->target_grad;
        XF_FN(xf_pending_values)(p, kept + g + XF_STREAM_LANES, out + g + XF_STREAM_LANES,
                                 n - g - XF_STREAM_LANES, stream);
#if XF_COMPENSATED
        if (stream) {
            _mm256_stream_pd(out + g, _mm256_load_pd(group));
        } else {
            _mm256_store_pd(out + g, _mm256_load_pd(group));
        }
#else
        if (stream) {
            _mm256_stream_ps(out + g, _mm256_load_ps(group));
        } else {
            _mm256_store_ps(out + g, _mm256_load_ps(group));
        }
#endif
    } else {
        XF_FN(xf_pending_values)(p, kept, out, n, stream);
    }
    p->done += n;
}

/* Streaming stores write whole lines without reading them first, which pays where the output's pages are
 * in memory already (a caller's `out`, a reused buffer).  A new array's pages are not: each first store to
 * one faults, and the kernel zeroes the page through the cache, where ordinary stores then find its lines
 * and streaming ones must evict them first.  Fused 512x32000 float32 into a new gradient, one thread:
 * 17-18 ms by streaming stores, 12-14 ms by ordinary ones; into the same `out` each call, 8.8-9.6 against
 * 10.3-10.9 ms (benchmarks/README.md, 2026-12-05).  The driver says which (xf_row_scratch_new_output). */
static inline __attribute__((always_inline)) void XF_FN(xf_pending_stream)(xf_row_scratch *p, long long n)
{
    if (p->streaming) {
        XF_FN(xf_pending_stream_form)(p, n, 1);
    } else {
        XF_FN(xf_pending_stream_form)(p, n, 0);
    }
}

/* The rest of a pending gradient.  `fence`: also order its streaming stores, if it took them (and those of
 * the rows before), before the caller's next reads and the other threads' (the driver's release after its
 * last row). */
static void XF_FN(xf_pending_finish)(xf_row_scratch *p, int fence)
{
    long long j;
    if (p->pending) {
        /* whole lines only, the rest by ordinary stores: a streaming store that leaves part of its line
         * unwritten goes out as a partial write, and the ordinary stores that fill the rest of that line
         * (this row's last entries, the next row's first) must then fetch it back.  Rows whose gradient
         * ended that way, by the offset of `out` in its line, ran 25-40 % slower (float32 rows of 1024
         * and 1200 classes: benchmarks/README.md, 2026-12-05, eighth round) */
        XF_FN(xf_pending_stream)(p, (p->n - p->done) & ~(long long)(64 / (int)sizeof(XF_T) - 1));
        for (j = p->done; j < p->n; j++) {
            XF_FN(xf_pending_put)(p, j);
        }
        p->pending = 0;
    }
    if (fence) {
        _mm_sfence();
    }
}

/* One chunk's share of the pending gradient, written by the next row's sum pass before each chunk of
 * its exponentials (xf_sumexp_block_form): 64 elements, whole lines (xf_pending_start aligns them), for
 * ~25 ns of arithmetic on one core (float32; ~90 ns float64), so the write-combining buffers drain while
 * the exponentials run.  Written after the sum pass instead, the same stores stalled it for as long as
 * memory took to take them (benchmarks/README.md).  Both rows keep their exponentials in the same scratch
 * row: the pending one starts at most 15 elements in (the alignment; 7 for float64), and each chunk at
 * position a of the row (a multiple of 64: XF_BLOCK is one) comes after a / 64 + 1 steps, so the pending
 * gradient has read [0, a + 64) before the chunk overwrites [a, a + 64); where fewer than 64 elements are
 * left, the step writes them all, and the row's partial last chunk finishes the rest first.  One scratch
 * row shared this way instead of one per row (two halves of the scratch) left the L2 cache room for the
 * logits: 2048x128256 float32, one core, 0.26 -> 0.23 s. */
typedef char XF_FN(xf_blocks_are_whole_chunks)[(XF_BLOCK % XF_CHUNK == 0 && XF_CHUNK % 16 == 0) ? 1 : -1];
static inline __attribute__((always_inline)) void XF_FN(xf_pending_step)(xf_row_scratch *p)
{
    if (p->done + XF_CHUNK <= p->n) {
        XF_FN(xf_pending_stream)(p, XF_CHUNK);
    } else if (p->pending) {
        XF_FN(xf_pending_finish)(p, 0);
    }
}
#endif

/* Pass 2 of a block: sum of exp(x_j - m) over the block, leaving out local index `skip` (the row's
 * argmax when it lies in this block, else -1).  Result as a double-double (hi, lo).  When `store` is
 * given (float64 only: a stored row's gradient buffer, possibly the logits themselves with
 * inplace=True), each exponential is also written there, exactly, so the output pass multiplies instead
 * of evaluating exp a second time; `keep` (below) does the same in the scratch row. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_sumexp_block_form)(
    const XF_T *x, long long n, double m, long long skip, double *hi, double *lo, XF_T *store, double *keep,
    const int normal, const int has_store, long long ahead, xf_row_scratch *pend, const int has_pend,
    XF_FN(xf_next_max) *next, const int has_next)
{
    double acc[XF_LANES], cmp[XF_LANES];
    int k;
    long long j = 0;
    for (k = 0; k < XF_LANES; k++) {
        acc[k] = 0.0;
        cmp[k] = 0.0;
    }
    /* exponentials of a chunk into a small buffer (one flat vectorized loop), then added to the lanes
     * with the accumulators held in registers: the same operations in the same order as adding each
     * exponential to its lane as it is made.  With `keep` the buffer is the row's own place there, so the
     * doubles stay for the gradient pass at no extra store. */
    double chunk_buf[XF_CHUNK];
    for (; j + XF_CHUNK <= n; j += XF_CHUNK) {
        long long i;
        double *buf = keep ? keep + j : chunk_buf;
        if (has_next) {
            /* the next row's chunk read here, and its lines a few chunks on fetched ahead of those reads */
            const char *pf = (const char *)(x + j + ahead) + XF_NEXT_PREFETCH_BYTES;
            for (i = 0; i < XF_CHUNK * (long long)sizeof(XF_T); i += 64) {
                __builtin_prefetch(pf + i, 0, 3);
            }
            XF_FN(xf_next_max_add)(next, x + j + ahead, XF_CHUNK);
        } else if (ahead) {
            const char *pf = (const char *)(x + j + ahead);
            for (i = 0; i < XF_CHUNK * (long long)sizeof(XF_T); i += 64) {
                __builtin_prefetch(pf + i, 0, 3);
            }
        }
        if (has_store) {
            const char *pfw = (const char *)(store + j) + XF_STORE_AHEAD_BYTES;
            for (i = 0; i < XF_CHUNK * (long long)sizeof(XF_T); i += 64) {
                __builtin_prefetch(pfw + i, 1, 3);
            }
        }
#if XF_STREAMED_ROWS
        if (has_pend) {
            /* before this chunk's stores take the places the pending gradient reads (xf_pending_step) */
            XF_FN(xf_pending_step)(pend);
        }
#endif
#if defined(__AVX512F__) && !XF_COMPENSATED
        if (normal == 1 && !has_store && !keep) {
            /* nothing kept (the forward pass, logsumexp, log_softmax): each vector added to the lanes as
             * it is made, the lanes in a register, the chunk never stored and read back; the same
             * additions in the same order as the loops below.  The argmax's lane is left out of its
             * vector's addition where the loop below adds +0 to it: the same sum, since a lane that
             * starts at +0 and adds exponentials never holds -0 (forward 1024x32000 float32, one
             * thread, 14.38-14.46 -> 14.16-14.21 ms, benchmarks/README.md, eleventh round) */
            const __m512d mv = _mm512_set1_pd(m);
            const long long skip_at = skip - j;
            __m512d lanes = _mm512_loadu_pd(acc);
            for (i = 0; i < XF_CHUNK; i += 8) {
                const __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps((const float *)x + j + i)), mv);
                const __mmask8 add_lanes =
                    (skip_at >= i && skip_at < i + 8) ? (__mmask8)~(1u << (skip_at - i)) : (__mmask8)0xFF;
                lanes = _mm512_mask_add_pd(lanes, add_lanes, lanes, xf_exp_lite_normal_pd512(d));
            }
            _mm512_storeu_pd(acc, lanes);
            continue;
        }
        if (normal == 1 && !has_store) {
            /* the normal form's exponentials with the scale in one instruction (xf_exp_lite_normal_pd512) */
            const __m512d mv = _mm512_set1_pd(m);
            for (i = 0; i < XF_CHUNK; i += 8) {
                const __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps((const float *)x + j + i)), mv);
                _mm512_storeu_pd(buf + i, xf_exp_lite_normal_pd512(d));
            }
        } else
#endif
        {
#pragma omp simd
            for (i = 0; i < XF_CHUNK; i++) {
                double e = XF_EXP_FORM(normal, x[j + i], m);
                if (has_store) {
                    /* the sum below still adds the double e: a forward-only call gets the same loss bits */
                    store[j + i] = (XF_T)e;
                }
                buf[i] = e;
            }
        }
        /* the left-out argmax as one store after the loop, not a compare and select per element (~5 %
         * of the float32 sum pass); the lanes add the same numbers */
        const int skip_here = (skip >= j && skip < j + XF_CHUNK);
        const double e_skip = skip_here ? buf[skip - j] : 0.0;
        if (skip_here) {
            buf[skip - j] = 0.0;
        }
        for (i = 0; i < XF_CHUNK; i += XF_LANES) {
#pragma omp simd
            for (k = 0; k < XF_LANES; k++) {
#if XF_COMPENSATED
                XF_ACC_FORM(normal, &acc[k], &cmp[k], buf[i + k]);
#else
                acc[k] += buf[i + k];
#endif
            }
        }
        if (skip_here) {
            buf[skip - j] = e_skip;
        }
    }
#if XF_STREAMED_ROWS
    if (has_pend && j < n) {
        /* the row's last, partial chunk: all the rest first */
        XF_FN(xf_pending_finish)(pend, 0);
    }
#else
    (void)pend;
    (void)has_pend;
#endif
    for (; j + XF_LANES <= n; j += XF_LANES) {
        /* the argmax test in double, on the lane's index (exact): SSE2 has no 64-bit integer compare, and
         * with `j + k == skip` the baseline path left this loop scalar, which ran rows of 63 classes at
         * twice the time per element of rows of 64 */
        const double skip_lane = (double)(skip - j);
#pragma omp simd
        for (k = 0; k < XF_LANES; k++) {
            double e = XF_EXP_FORM(normal, x[j + k], m);
            if (has_store) {
                store[j + k] = (XF_T)e;
            }
            if (keep) {
                keep[j + k] = e;
            }
            e = ((double)k == skip_lane) ? 0.0 : e;
#if XF_COMPENSATED
            XF_ACC_FORM(normal, &acc[k], &cmp[k], e);
#else
            acc[k] += e;
#endif
        }
    }
    for (k = 0; j + k < n; k++) {
        double e = XF_EXP_FORM(normal, x[j + k], m);
        if (has_store) {
            store[j + k] = (XF_T)e;
        }
        if (keep) {
            keep[j + k] = e;
        }
        e = (j + k == skip) ? 0.0 : e;
#if XF_COMPENSATED
        XF_ACC_FORM(normal, &acc[k], &cmp[k], e);
#else
        acc[k] += e;
#endif
    }
    xf_lanes_to_dd(acc, cmp, hi, lo);
}

/* `normal`: the row qualifies for the unclamped exponentials (job->exp_normal, 1 or 2); same bits every way.
 * `ahead` (0: none): also prefetch the elements that many positions further on, one cache line per 64
 * bytes of each chunk (a hint: no result depends on it, and a prefetch never faults, even past the
 * array).  The one-thread-per-row driver passes the row length, i.e. the same place in the next row: the sum pass is
 * bound by the exponential's arithmetic and leaves the memory idle, while the next row's max pass would
 * otherwise wait on that memory (the hardware prefetcher does not follow a new row across the page
 * boundary).  Measured on one core: fused 4096x1000 float64 4.4 -> 3.8 ns per element, 256x32000 float32
 * 2.07 -> 1.73, 4096x1000 float32 1.88 -> 1.82. */
/* `keep` (or NULL): where to leave each exp(x_j - m) as the double it is (see xf_xent_row); a literal NULL
 * in its own copies, so the rows without it run the loops they ran before.  A row never has both: `store`
 * serves float64 stored rows whose gradient buffer holds their exponentials, `keep` the rest (softmax
 * included, as a gradient since 2026-12-05).  `store` is a literal too (has_store): a store under a
 * run-time test inside the vectorized loop became a masked store (vmaskmovps with an all-ones mask), which
 * AMD's Zen cores execute as many micro-operations; the fused float32 sum pass spent about a third of its
 * time there. */
static inline __attribute__((always_inline)) void XF_FN(xf_sumexp_block_forms)(
    const XF_T *x, long long n, double m, long long skip, int normal, double *hi, double *lo, XF_T *store,
    double *keep, long long ahead, xf_row_scratch *pend, XF_FN(xf_next_max) *next, const int has_next)
{
#if XF_STREAMED_ROWS
    /* `pend` (or NULL): a pending gradient to write a chunk at a time (xf_pending_step); only where the
     * exponentials are kept (the scratch row it reads from too) */
    if (pend && keep) {
        if (normal == 1) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 1, 0, ahead, pend, 1, next, has_next);
        } else if (normal == 2) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 2, 0, ahead, pend, 1, next, has_next);
        } else {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 0, 0, ahead, pend, 1, next, has_next);
        }
        return;
    }
#endif
    (void)pend;
    if (keep) {
        if (normal == 1) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 1, 0, ahead, 0, 0, next, has_next);
        } else if (normal == 2) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 2, 0, ahead, 0, 0, next, has_next);
        } else {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, keep, 0, 0, ahead, 0, 0, next, has_next);
        }
    } else if (XF_COMPENSATED && store) {
        if (normal == 1) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, store, 0, 1, 1, ahead, 0, 0, next, has_next);
        } else if (normal == 2) {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, store, 0, 2, 1, ahead, 0, 0, next, has_next);
        } else {
            XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, store, 0, 0, 1, ahead, 0, 0, next, has_next);
        }
    } else if (normal == 1) {
        XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, 0, 1, 0, ahead, 0, 0, next, has_next);
    } else if (normal == 2) {
        XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, 0, 2, 0, ahead, 0, 0, next, has_next);
    } else {
        XF_FN(xf_sumexp_block_form)(x, n, m, skip, hi, lo, 0, 0, 0, 0, ahead, 0, 0, next, has_next);
    }
}

/* `next` (or NULL): the next row's max lanes to fold this block's chunks of that row into (xf_next_max); a
 * literal in the copies, so that the rows without it run the loops they ran before */
XF_KERNEL void XF_FN(xf_sumexp_block_ahead)(const XF_T *x, long long n, double m, long long skip, int normal,
                                            double *hi, double *lo, XF_T *store, double *keep, long long ahead,
                                            xf_row_scratch *pend, XF_FN(xf_next_max) *next)
{
    if (next) {
        XF_FN(xf_sumexp_block_forms)(x, n, m, skip, normal, hi, lo, store, keep, ahead, pend, next, 1);
    } else {
        XF_FN(xf_sumexp_block_forms)(x, n, m, skip, normal, hi, lo, store, keep, ahead, pend, 0, 0);
    }
}

/* the dispatch table's entry (the phased path): no prefetch, nothing kept */
XF_KERNEL void XF_FN(xf_sumexp_block)(const XF_T *x, long long n, double m, long long skip, int normal,
                                      double *hi, double *lo, XF_T *store)
{
    XF_FN(xf_sumexp_block_ahead)(x, n, m, skip, normal, hi, lo, store, 0, 0, 0, 0);
}

/* Whether no chunk of the row can be slow in xf_xent_terms_chunk, index targets, from the row's and the
 * call's numbers alone: every q_j with mass is at least fl(w_min eps / C_eff) >= 2^-969 (w_min: the
 * least positive class weight, xf_rowjob.w_min_pos, +inf if none; rounding is monotone), and no finite
 * x_j has a -log p_j that is not finite, since m - x_j <= m - min_finite < 2^1000 (any float32 row).
 * Rows where it fails (a subnormal smoothing mass under tiny weights, a float64 row spread beyond
 * 2^1000, weights not known, m not finite) keep the per-element tests. */
XF_KERNEL inline int XF_FN(xf_terms_chunk_never_slow)(const xf_rowjob *job, const int has_w)
{
    const double epc = job->eps_per_class, spread = job->m - job->min_finite;
    const double w_min = has_w ? job->w_min_pos : 1.0;
    return epc >= 0x1p-969 && w_min > 0.0 && w_min * (epc * 1.0) >= 0x1p-969 && spread - spread == 0.0 &&
           spread < 0x1p1000;
}

#if !XF_COMPENSATED
/* Whether m - x_j is exact in double for every finite x_j of a float32 row (m its max, one of them).  Two
 * normal floats below 2^(E + 1) in magnitude are multiples of 2^(e - 23), e the smaller exponent, and
 * their difference, below 2^(E + 2), is such a multiple: an integer below 2^(E - e + 25) times it, which
 * double holds exactly where E - e <= 28.  That holds for every pair where the row's least nonzero
 * magnitude is at least 2^-28 of its largest finite one.  A zero on either side gives an exact
 * difference anyway; a subnormal (a multiple of 2^-149) meets the test only where every magnitude is
 * below 2^-98, and the differences, below 2^-97, are then multiples of 2^-149 within 53 bits too.  Where
 * it holds, xf_neg_log_prob's TwoSum error is 0 for every entry.  tests/test_threads.py
 * (test_exact_differences_take_the_split_s_bits) checks rows on both sides of the bound. */
XF_KERNEL int XF_FN(xf_row_diffs_exact)(const float *x, long long C, double m, double min_finite)
{
    /* the largest finite magnitude is |m| or |min_finite| (every finite entry lies between them); the
     * least nonzero one from the magnitudes' bits, whose unsigned order is their order, as the least of
     * bits - 1 (a zero wraps to the largest): a plain integer min on the accumulator (with float tests on
     * it the loop ran 0.2 ns an entry, a compare and a blend on the accumulator's chain) */
    const double most = (xf_fabs(m) > xf_fabs(min_finite)) ? xf_fabs(m) : xf_fabs(min_finite);
    uint32_t least_m1 = 0xffffffffu;
    long long j;
#pragma omp simd reduction(min : least_m1)
    for (j = 0; j < C; j++) {
        uint32_t b;
        memcpy(&b, &x[j], sizeof b);
        const uint32_t mag_m1 = (b & 0x7fffffffu) - 1u;
        least_m1 = (mag_m1 < least_m1) ? mag_m1 : least_m1;
    }
    float least_f;
    const uint32_t least = least_m1 + 1u;
    memcpy(&least_f, &least, sizeof least_f);
    /* no nonzero entry: least wraps to 0, and every difference is exact */
    return least == 0u || (double)least_f >= most * 0x1p-28;
}
#endif

/* xf_neg_log_prob where m - x is exact (xf_row_diffs_exact): TwoSum's error is 0 there, so its
 * d + (log_s + 0) is d + log_s bit for bit (log_s >= +0; a -inf entry gives +inf either way), two
 * operations in place of about ten */
XF_KERNEL inline double XF_FN(xf_neg_log_prob_exact_diff)(double x, double m, double log_s)
{
    return (m - x) + log_s;
}

/* Pass 3's ordinary case, vectorized: the loss term and q_j of each element of a chunk (x, t, w at its
 * start) into tb / qb, by the operations of xf_xent_term for a class other than the index target.
 * Returns whether any element needs what xf_xent_term does beyond them: a q_j below 2^-969 that has
 * mass (formed scaled there), an m - x_j beyond DBL_MAX (halved there), a masked class with mass.
 * The argmax and the index target are the caller's. */
XF_KERNEL inline __attribute__((always_inline)) int XF_FN(xf_xent_terms_chunk)(
    const XF_T *x, long long len, const xf_rowjob *job, const XF_T *t, const double *w, double *tb,
    double *qb, const int has_t, const int has_w, const int diffs_exact)
{
    const double m = job->m, log_s = job->log_s, ls = job->loss_scale, eps = job->eps, epc = job->eps_per_class;
    int slow = 0;
    long long i;
    if (!has_t && XF_FN(xf_terms_chunk_never_slow)(job, has_w)) {
        /* the same values as the loop below without its per-element tests and their two reductions a
         * chunk (that loop's ~27 vector operations per 8 entries were most of the pass): has_mass is q_j >
         * 0 here, q_j = w_j (eps / C_eff [x_j > -inf]) with eps / C_eff > 0 and w_j >= 0 */
#pragma omp simd
        for (i = 0; i < len; i++) {
            const double xv = (double)x[i];
            const double fin = (xv > -XF_INF) ? 1.0 : 0.0;
            const double q = xf_target_q_other(0, eps, epc, has_w ? w[i] : 1.0, fin, 0.0);
            const double nlp = diffs_exact ? XF_FN(xf_neg_log_prob_exact_diff)(xv, m, log_s)
                                           : xf_neg_log_prob(xv, m, log_s);
            tb[i] = (q > 0.0) ? (q * ls) * nlp : 0.0;
            qb[i] = q;
        }
        return 0;
    }
    if (!has_t) {
        /* index targets (smoothing): the same test in doubles, a third of the pass in integer masks before.
         * With w_j >= 0 (validated) q_j != 0 implies mass, and mass a finite x_j: a rare element is a
         * q_j with mass below 2^-969 (qmin) or a finite x_j whose m - x_j is not (mark turns NaN).
         * Probability targets keep the loop below: the same test in doubles measured slower there
         * (11.0 -> 11.2 ms, benchmarks/README.md, fifteenth round), hence two loops, not one. */
        double qmin = XF_INF, mark = 0.0;
#pragma omp simd reduction(min : qmin) reduction(+ : mark)
        for (i = 0; i < len; i++) {
            double xv = (double)x[i];
            double fin = (xv > -XF_INF) ? 1.0 : 0.0;
            double wc = has_w ? w[i] : 1.0;
            double q = xf_target_q_other(0, eps, epc, wc, fin, 0.0);
            double nlp = xf_neg_log_prob(xv, m, log_s);
            int has_mass = xf_target_has_mass_from(0, eps, epc, 0, 0.0, wc, fin, 0.0);
            tb[i] = has_mass ? (q * ls) * nlp : 0.0;
            qb[i] = q;
            double q_mass = has_mass ? q : XF_INF;
            qmin = (q_mass < qmin) ? q_mass : qmin;
            double v = (xv > -XF_INF) ? nlp : 0.0;
            mark += v - v;
        }
        return (qmin < 0x1p-969) | !(mark == 0.0);
    }
    if (has_t && job->prob_terms_never_slow) {
        /* the loop below without its tests (the row's, xf_prob_terms_never_slow): the same q_j and term,
         * has_mass as the double test xf_target_mass_min > 0 */
#pragma omp simd
        for (i = 0; i < len; i++) {
            const double xv = (double)x[i];
            const double fin = (xv > -XF_INF) ? 1.0 : 0.0;
            const double wc = has_w ? w[i] : 1.0;
            const double tj = (double)t[i];
            const double q = xf_target_q_other(1, eps, epc, wc, fin, tj);
            const double nlp = diffs_exact ? XF_FN(xf_neg_log_prob_exact_diff)(xv, m, log_s)
                                           : xf_neg_log_prob(xv, m, log_s);
            tb[i] = (xf_target_mass_min(eps, epc, wc, fin, tj) > 0.0) ? (q * ls) * nlp : 0.0;
            qb[i] = q;
        }
        return 0;
    }
#pragma omp simd reduction(| : slow)
    for (i = 0; i < len; i++) {
        double xv = (double)x[i];
        double fin = (xv > -XF_INF) ? 1.0 : 0.0;
        double wc = has_w ? w[i] : 1.0;
        double tj = has_t ? (double)t[i] : 0.0;
        double q = xf_target_q_other(has_t, eps, epc, wc, fin, tj);
        double nlp = xf_neg_log_prob(xv, m, log_s);
        int has_mass = xf_target_has_mass_from(has_t, eps, epc, 0, 0.0, wc, fin, tj);
        /* xf_mass_term where -log p_j is finite; a masked class with mass is rare, and its sign select
         * here cost a third of the pass (register spills) */
        tb[i] = has_mass ? (q * ls) * nlp : 0.0;
        qb[i] = q;
        slow |= ((xf_fabs(q) < 0x1p-969) & ((q != 0.0) | has_mass)) |
                ((nlp - nlp != 0.0) & (has_mass | (xv > -XF_INF)));
    }
    return slow;
}

/* xf_xent_term of the block's element c (x, t, w: the block's) into *term and *q */
XF_KERNEL inline void XF_FN(xf_xent_term_into)(const XF_T *x, const XF_T *t, const double *w, long long c,
                                              long long offset, const xf_rowjob *job, double *term, double *q)
{
    *term = xf_xent_term(job, offset + c, (double)x[c], w ? w[c] : 1.0, t ? (double)t[c] : 0.0, q);
}

/* A chunk's terms and masses (tb, qb) into the lanes, element i to lane i % XF_LANES, plainly or
 * compensated (`plain`, a literal: xf_terms_plain) */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_terms_lanes_add)(
    double *acc, double *cmp, double *qacc, double *qcmp, const double *tb, const double *qb, long long len,
    const int plain)
{
    long long i;
    int k;
    for (i = 0; i + XF_LANES <= len; i += XF_LANES) {
#pragma omp simd
        for (k = 0; k < XF_LANES; k++) {
            xf_terms_lane_add(&acc[k], &cmp[k], tb[i + k], plain);
            xf_terms_lane_add(&qacc[k], &qcmp[k], qb[i + k], plain);
        }
    }
    for (k = 0; i + k < len; k++) {
        xf_terms_lane_add(&acc[k], &cmp[k], tb[i + k], plain);
        xf_terms_lane_add(&qacc[k], &qcmp[k], qb[i + k], plain);
    }
}

/* Whether every target probability of a row is >= 0 (a NaN is not): xf_rowjob's targets_nonneg; and
 * the least positive one into *least (+inf if none) */
XF_KERNEL inline int XF_FN(xf_targets_scan)(const XF_T *t, long long C, double *least)
{
    int ok = 1;
    double lo = XF_INF;
    long long j;
#pragma omp simd reduction(& : ok) reduction(min : lo)
    for (j = 0; j < C; j++) {
        const double tj = (double)t[j];
        ok &= (tj >= 0.0);
        const double pos = (tj > 0.0) ? tj : XF_INF;
        lo = (pos < lo) ? pos : lo;
    }
    *least = lo;
    return ok;
}

/* Whether no chunk of a row of probability targets can be slow in xf_xent_terms_chunk, from the row's
 * numbers: every target >= 0 (nonneg) and every logit finite (n_finite = C, so no -inf logit carries a
 * mass, and m - x_j <= m - min_finite < 2^1000 keeps -log p_j finite), and every q_j with mass at least
 * 2^-969.  q_j = w_j ((1 - eps) t_j + eps / C_eff) is non-decreasing in w_j and t_j in every rounded step,
 * so a class with t_j > 0 has q_j >= fl(w_min fl((1 - eps) t_least)) (eps < 1; none has mass through
 * t_j otherwise), one with t_j = 0 has q_j = fl(w_min eps / C_eff) or more (eps > 0) or no mass, and a
 * zero weight no mass (w_min: xf_rowjob.w_min_pos, the least positive weight; t_least: the least
 * positive target, xf_targets_scan). */
XF_KERNEL inline int XF_FN(xf_prob_terms_never_slow)(const xf_rowjob *job, long long C, const int has_w,
                                                     int nonneg, double t_least)
{
    const double eps = job->eps, epc = job->eps_per_class, spread = job->m - job->min_finite;
    const double w_min = has_w ? job->w_min_pos : 1.0;
    const double by_target = (eps < 1.0) ? w_min * ((1.0 - eps) * t_least) : XF_INF;
    const double by_smoothing = (epc > 0.0) ? w_min * (epc * 1.0) : XF_INF;
    return nonneg && job->n_finite == C && spread - spread == 0.0 && spread < 0x1p1000 && w_min > 0.0 &&
           by_target >= 0x1p-969 && by_smoothing >= 0x1p-969;
}

/* Pass 3 of a block (soft targets, label smoothing): sum_c q_c * (-log p_c) and A = sum_c q_c, both as
 * double-doubles (out[0..1], out[2..3]).  q_c follows xf_row_target_q.  The lanes are compensated but
 * for float32 rows of index targets or of probability targets all >= 0 (xf_terms_plain).
 * Element j goes to lane j % XF_LANES, in order.  The terms of a chunk come from the vectorized
 * xf_xent_terms_chunk; a chunk that holds a rare element is redone by xf_xent_term, element by element,
 * and so is the argmax: the same numbers either way (one form per element, equal where both apply).
 * With the vectorized general gradient below, fused calls on one core, 4096x1000 float32: label
 * smoothing 13-15 -> 4.7-5.1 ns per element, probability targets 14-15 -> 5.8-6.5 (float64: 15-19 ->
 * 6.8-8.4, 17-22 -> 7.7-8.4). */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_xent_terms_block_form)(
    const XF_T *x, long long n, long long offset, const xf_rowjob *job, const XF_T *t, const double *w,
    double out[4], const int has_t, const int has_w, const int diffs_exact)
{
    double acc[XF_LANES], cmp[XF_LANES], qacc[XF_LANES], qcmp[XF_LANES];
    double tb[XF_CHUNK], qb[XF_CHUNK];
    /* float32 rows of index targets (a literal in their expansions), or of probability targets all >= 0
     * (xf_terms_plain) */
    const int plain = xf_terms_plain(!XF_COMPENSATED, has_t, job->targets_nonneg);
    const long long amax = job->argmax - offset, y = job->y - offset;
    int k;
    long long j, i;
    for (k = 0; k < XF_LANES; k++) {
        acc[k] = cmp[k] = qacc[k] = qcmp[k] = 0.0;
    }
    for (j = 0; j < n; j += XF_CHUNK) {
        const long long len = (n - j < XF_CHUNK) ? n - j : XF_CHUNK;
        /* a full chunk with its length a constant: with a variable one gcc's cost model put the vector
         * loop behind a trip-count check that 64 did not pass */
        const int slow = (len == XF_CHUNK)
                             ? XF_FN(xf_xent_terms_chunk)(x + j, XF_CHUNK, job, has_t ? t + j : t, has_w ? w + j : w, tb,
                                                          qb, has_t, has_w, diffs_exact)
                             : XF_FN(xf_xent_terms_chunk)(x + j, len, job, has_t ? t + j : t, has_w ? w + j : w, tb, qb,
                                                          has_t, has_w, diffs_exact);
        /* every element of a chunk with a rare one, else the argmax and the index target only */
        if (slow) {
            for (i = 0; i < len; i++) {
                XF_FN(xf_xent_term_into)(x, t, w, j + i, offset, job, &tb[i], &qb[i]);
            }
        } else {
            if (amax >= j && amax < j + len) {
                XF_FN(xf_xent_term_into)(x, t, w, amax, offset, job, &tb[amax - j], &qb[amax - j]);
            }
            if (y >= j && y < j + len && y != amax) {
                XF_FN(xf_xent_term_into)(x, t, w, y, offset, job, &tb[y - j], &qb[y - j]);
            }
        }
        if (plain) {
            XF_FN(xf_terms_lanes_add)(acc, cmp, qacc, qcmp, tb, qb, len, 1);
        } else {
            XF_FN(xf_terms_lanes_add)(acc, cmp, qacc, qcmp, tb, qb, len, 0);
        }
    }
    xf_lanes_to_dd(acc, cmp, &out[0], &out[1]);
    xf_lanes_to_dd(qacc, qcmp, &out[2], &out[3]);
}

XF_KERNEL void XF_FN(xf_xent_terms_block)(const XF_T *x, long long n, long long offset, const xf_rowjob *job,
                                      const XF_T *t, const double *w, double out[4])
{
/* the four combinations of targets and weights, each with and without exact differences (float32 rows
 * only: float64 has no such flag) */
#define XF_TERMS_BLOCK_FORM(HT, HW)                                                                          \
    do {                                                                                                     \
        if (!XF_COMPENSATED && job->diffs_exact) {                                                           \
            XF_FN(xf_xent_terms_block_form)(x, n, offset, job, t, w, out, (HT), (HW), 1);                    \
        } else {                                                                                             \
            XF_FN(xf_xent_terms_block_form)(x, n, offset, job, t, w, out, (HT), (HW), 0);                    \
        }                                                                                                    \
    } while (0)
    if (w) {
        if (job->prob) {
            XF_TERMS_BLOCK_FORM(1, 1);
        } else {
            XF_TERMS_BLOCK_FORM(0, 1);
        }
    } else {
        if (job->prob) {
            XF_TERMS_BLOCK_FORM(1, 0);
        } else {
            XF_TERMS_BLOCK_FORM(0, 0);
        }
    }
#undef XF_TERMS_BLOCK_FORM
}

/* Pass 4's general form (probability targets, smoothing, z-loss), one loop per combination of targets and
 * weights so that it vectorizes: the loads are unconditional and xf_target_grad_q_from's branch becomes a
 * select, the same operations as the scalar loop it replaces.  The loop sees the row without its index
 * target (a 64-bit compare per element kept gcc from vectorizing float32 rows); that entry is evaluated
 * before the loop, from x still unchanged (inplace), and stored after it. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_xent_grad_general)(
    const XF_T *x, XF_T *out, long long n, long long offset, const xf_rowjob *job, const XF_T *t, const double *w,
    const int has_t, const int has_w, const double *keep, const int apart)
{
    const double m = job->m, coef_per_S = job->coef_per_S, mult = job->coef_mult;
    const long long y = job->y - offset;
    const int has_y = (y >= 0 && y < n);
    const double eps = job->eps, epc = job->eps_per_class, scale = job->scale;
    double g_y = 0.0;
    if (has_y) {
        double xv = (double)x[y];
        /* t_y = 1 for an index target: xf_target_grad_q_from's mass a_y */
        double w_y = has_w ? w[y] : 1.0, fin_y = (xv > -XF_INF) ? 1.0 : 0.0, t_y = has_t ? (double)t[y] : 1.0;
        double q_y = xf_row_target_q(job, job->y, w_y, fin_y, t_y);
        g_y = xf_general_grad_entry(XF_EXP_MINUS(x[y], m) * coef_per_S, mult,
                                    xf_target_grad_q_from(has_t, eps, epc, scale, q_y, w_y, fin_y, t_y, 1), q_y, scale,
                                    mult);
    }
    long long j;
#pragma omp simd
    for (j = 0; j < n; j++) {
        double xv = (double)x[j];
        /* keep: the sum pass's exponential, the same double (see xf_xent_row) */
        double e = keep ? keep[j] : XF_EXP_MINUS(x[j], m);
        double wc = has_w ? w[j] : 1.0;
        double fin = (xv > -XF_INF) ? 1.0 : 0.0;
        double tj = has_t ? (double)t[j] : 0.0;
        double q = xf_target_q_other(has_t, eps, epc, wc, fin, tj);
        /* index targets test in the rare loop only (xf_index_masses_may_underflow) */
        double sq = xf_target_grad_q_from(has_t, eps, epc, scale, q, wc, fin, tj, apart);
        /* apart (a literal): xf_general_grad_entry's second form, for rows whose coef overflowed */
        out[j] = (XF_T)(apart ? xf_general_grad_entry(e * coef_per_S, mult, sq, q, scale, mult)
                              : (e * coef_per_S) * mult - sq);
    }
    if (has_y) {
        out[y] = (XF_T)g_y;
    }
}

/* Whether a class other than the index target can have a mass w_j eps/C_eff > 0 below 2^-1022 under a
 * scale that xf_target_grad_q_from's second form serves.  From the call's least positive weight
 * (xf_rowjob.w_min_pos; w NULL: all 1; not known: yes), so the rows it leaves out get the same bits with
 * or without that form's test.  Index targets only; the target class itself is evaluated with the test.
 * (A pass over the weights per row instead had cost weighted label smoothing 5-8 %, 4096x1000.) */
XF_KERNEL inline int XF_FN(xf_index_masses_may_underflow)(const xf_rowjob *job, const double *w)
{
    const double epc = job->eps_per_class;
    if (!(epc > 0.0) || !(xf_fabs(job->scale) >= 0x1p-400)) {
        return 0;
    }
    /* fl(w_j epc) < 2^-1022 implies w_j epc < 2^-1022 (rounding is monotone) and so w_j < 2^-1022 / epc,
     * below `below` (the quotient's rounding, 2^-53 relative, covered; inf for a subnormal epc) */
    const double below = (0x1p-1022 / epc) * (1.0 + 0x1p-50);
    const double least = w ? job->w_min_pos : 1.0;
    return !(least > 0.0) || least < below;
}

/* xf_xent_grad_general for the row's targets and weights; keep: see xf_xent_grad_general (NULL or not is
 * a literal in each expansion, so the loop has no per-element test), and so are the targets, the weights
 * and `apart` (read under a runtime test, they became masked loads, test_build) */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_xent_grad_general_of)(
    const XF_T *x, XF_T *out, long long n, long long offset, const xf_rowjob *job, const XF_T *t, const double *w,
    const double *keep, const int apart)
{
    if (w) {
        if (job->prob) {
            XF_FN(xf_xent_grad_general)(x, out, n, offset, job, t, w, 1, 1, keep, apart);
        } else {
            XF_FN(xf_xent_grad_general)(x, out, n, offset, job, t, w, 0, 1, keep, apart);
        }
    } else if (job->prob) {
        XF_FN(xf_xent_grad_general)(x, out, n, offset, job, t, w, 1, 0, keep, apart);
    } else {
        XF_FN(xf_xent_grad_general)(x, out, n, offset, job, t, w, 0, 0, keep, apart);
    }
}

XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_xent_grad_general_for)(
    const XF_T *x, XF_T *out, long long n, long long offset, const xf_rowjob *job, const XF_T *t, const double *w,
    const double *keep)
{
    /* rare (coef overflowed, xf_rowjob_finish; a tiny weight's smoothing mass under a large scale):
     * entries whose two terms may both overflow, and xf_target_grad_q_from's test for index targets
     * (where g is not NaN, xf_general_grad_entry's bits are the ordinary loop's) */
    if (job->coef_mult != 1.0 || (!job->prob && XF_FN(xf_index_masses_may_underflow)(job, w))) {
        XF_FN(xf_xent_grad_general_of)(x, out, n, offset, job, t, w, keep, 1);
    } else {
        XF_FN(xf_xent_grad_general_of)(x, out, n, offset, job, t, w, keep, 0);
    }
}

/* The stored form's target entry: x may already be overwritten (inplace), so from the saved x_y. */
XF_KERNEL inline double XF_FN(xf_stored_target_grad)(const xf_rowjob *job)
{
    return xf_target_grad(job, XF_EXP_MINUS((XF_T)job->x_y, job->m));
}

#if XF_STREAMED_ROWS
/* Pass 4 of a long simple row whose exponentials are in `kept` (XF_STREAM_MIN_CLASSES above), left pending
 * in `p` (xf_row_scratch): the stored form's gradient, the same bits, written by the next row's sum pass or by
 * xf_pending_finish.  The elements before the first 64-byte boundary of `out` are written here, so that
 * each step of the stores (streaming ones, xf_pending_stream) fills whole lines. */
XF_KERNEL void XF_FN(xf_pending_start)(xf_row_scratch *p, const double *kept, XF_T *out, long long n,
                                      const xf_rowjob *job)
{
    long long j;
    p->kept = kept;
    p->out = out;
    p->n = n;
    p->factor = job->coef_per_S;
    p->factor2 = job->coef_mult;
    p->target = (job->y >= 0 && job->y < n) ? job->y : -1;
    p->target_grad = (p->target >= 0) ? XF_FN(xf_stored_target_grad)(job) : 0.0;
    p->pending = 1;
    p->write = XF_FN(xf_pending_finish);
    for (j = 0; j < n && (((unsigned long long)(out + j)) & 63); j++) {
        XF_FN(xf_pending_put)(p, j);
    }
    p->done = j;
}
#endif

/* Pass 4 of a block: the gradient  out_j = coef * p_j - scale * q_j  (p_j = e_j / S), see xf_rowjob.
 * coef p_j is (e_j * coef_per_S) * coef_mult (xf_rowjob_div_S) on every path, whether e_j is evaluated
 * here or kept from the sum pass.
 * `out` may alias `x` (inplace): each element is read before it is written, and every row statistic was
 * computed by the earlier passes.  `keep` (or NULL): the block's exponentials as the sum pass left them
 * (xf_xent_row), read instead of evaluated again: the general gradient's (`out` itself for float64) and
 * float32's simple rows'. */
XF_KERNEL void XF_FN(xf_xent_grad_block)(const XF_T *x, XF_T *out, long long n, long long offset,
                                     const xf_rowjob *job, const XF_T *t, const double *w, const double *keep)
{
    long long j;
    const double m = job->m, coef_per_S = job->coef_per_S, mult = job->coef_mult;
#if XF_COMPENSATED
    if (job->grad_scaled) {
        /* rare: subnormal probabilities times |coef| > 1 (see xf_exp_shifted_pow2) */
        const long long y = job->y - offset;
        const double g_y = (y >= 0 && y < n) ? xf_target_grad(job, xf_exp_shifted((double)x[y], m)) : 0.0;
        for (j = 0; j < n; j++) {
            double xv = (double)x[j];
            /* scaled only where exp(x - m) is subnormal: near the max, 2^600 * coef_per_S could overflow */
            int tiny = (xv - m < -700.0);
            double e = tiny ? xf_exp_shifted_pow2(xv, m) : xf_exp_shifted(xv, m);
            double unscale = tiny ? mult * XF_POW2_UNSCALE : mult;
            double sq = 0.0, q = 0.0;
            if (!job->simple) {
                double wc = w ? w[j] : 1.0;
                double fin = (xv > -XF_INF) ? 1.0 : 0.0;
                double tj = t ? (double)t[j] : 0.0;
                q = xf_row_target_q(job, offset + j, wc, fin, tj);
                sq = xf_target_grad_q_from(job->prob, job->eps, job->eps_per_class, job->scale, q, wc, fin,
                                           xf_grad_mass_t(job, offset + j, tj), 1);
            }
            out[j] = (XF_T)xf_general_grad_entry(e * coef_per_S, unscale, sq, q, job->scale, mult);
        }
        if (job->simple && y >= 0 && y < n) {
            out[y] = (XF_T)g_y;
        }
        return;
    }
    if (job->stored) {
        /* the sum pass left exp(x_j - m) in `out` (float64 only: float32's keeps them in `keep`, or the
         * loop below evaluates them again); x may already be overwritten (inplace), so the target entry
         * comes from the saved x_y */
        const long long y = job->y - offset;
        const int has_y = (y >= 0 && y < n);
        const double g_y = has_y ? XF_FN(xf_stored_target_grad)(job) : 0.0;
#pragma omp simd
        for (j = 0; j < n; j++) {
            out[j] = XF_FN(xf_stored_entry)(out[j], coef_per_S, mult);
        }
        if (has_y) {
            out[y] = (XF_T)g_y;
        }
        return;
    }
#endif
    if (job->simple) {
        /* index target, no smoothing, no z-loss: q is scale*w_y at y only */
        const long long y = job->y - offset;
        const int has_y = (y >= 0 && y < n);
        /* read before the loop: with inplace=True the loop overwrites x[y] */
        const double g_y = has_y ? xf_target_grad(job, XF_EXP_MINUS(x[y], m)) : 0.0;
        if (keep) {
            /* float32: the sum pass's exponentials, the same doubles */
#pragma omp simd
            for (j = 0; j < n; j++) {
                out[j] = XF_FN(xf_stored_entry)(keep[j], coef_per_S, mult);
            }
        } else if (job->exp_normal == 2) {
            /* masked classes beyond the stored rows' spread (a finite mask, xf_row_mask_form): the sum
             * pass's form, the same bits as the general one */
#pragma omp simd
            for (j = 0; j < n; j++) {
                double e = XF_EXP_FORM(2, x[j], m);
                out[j] = (XF_T)((e * coef_per_S) * mult);
            }
        } else {
#pragma omp simd
            for (j = 0; j < n; j++) {
                double e = XF_EXP_MINUS(x[j], m);
                out[j] = (XF_T)((e * coef_per_S) * mult);
            }
        }
        if (has_y) {
            out[y] = (XF_T)g_y;
        }
        return;
    }
    /* rows whose sum pass kept the exponentials (xf_xent_row) */
    if (keep) {
        XF_FN(xf_xent_grad_general_for)(x, out, n, offset, job, t, w, keep);
        return;
    }
    XF_FN(xf_xent_grad_general_for)(x, out, n, offset, job, t, w, 0);
}

/* log_softmax of a block from the row statistics.  float storage: xf_log_prob_single, every row.
 * xf_log_softmax_columns below takes the same operations across a group's rows: change both or neither.
 * double: finite, every x_j - m of the row is finite (job->exp_normal == 1), so xf_log_prob_finite gives
 * the same bits with ~a quarter fewer operations. */
XF_KERNEL void XF_FN(xf_log_softmax_block)(const XF_T *x, XF_T *out, long long n, double m, double log_s,
                                           int finite)
{
    long long j;
#if XF_COMPENSATED
    if (finite) {
#pragma omp simd
        for (j = 0; j < n; j++) {
            out[j] = (XF_T)xf_log_prob_finite((double)x[j], m, log_s);
        }
        return;
    }
#pragma omp simd
    for (j = 0; j < n; j++) {
        out[j] = (XF_T)xf_log_prob((double)x[j], m, log_s);
    }
#else
#if XF_FMA_NATIVE && (defined(__AVX2__) || defined(__AVX512F__))
    if (finite) {
        /* xf_log_prob_single with both subtractions as fma(b, -1, a), a - b rounded once: the same value
         * for finite x_j - m, signed zeros included (rows that may hold a NaN keep the subtractions, whose
         * NaN the fma's operand order could change).  Between its two conversions the loop's four
         * vector operations went to AMD's two adder pipes, whose conversions they share, while the
         * multiply-add pipes idled (log_softmax's float32 groups of 256 classes spent a quarter of their
         * time here on Zen 4; one thread, 2^21 entries, 1000 classes 1.53 -> 1.44 ms, 4096 1.37 -> 1.27,
         * benchmarks/README.md, eleventh round).  The -1 passes through an empty asm so that the
         * compiler keeps the fma. */
        double minus_one = -1.0;
        __asm__("" : "+x"(minus_one));
#pragma omp simd
        for (j = 0; j < n; j++) {
            out[j] = (XF_T)xf_fma(log_s, minus_one, xf_fma(m, minus_one, (double)x[j]));
        }
        return;
    }
#endif
    (void)finite;
#pragma omp simd
    for (j = 0; j < n; j++) {
        out[j] = (XF_T)xf_log_prob_single((double)x[j], m, log_s);
    }
#endif
}

/* xf_log_softmax_block's operations across a group's rows in torch's layout: xt[j][r] is row r's entry j
 * (xf_group_stats), written to out[j D + r], each row with its own m[r] and log_s[r] */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_log_softmax_columns)(
    XF_T (*xt)[XF_GROUP_ROWS], XF_T *out, long long C, long long D, const double *m, const double *log_s,
    int finite)
{
    enum { R = XF_GROUP_ROWS };
    long long j;
    int r;
#if XF_COMPENSATED
    if (finite) {
        for (j = 0; j < C; j++) {
#pragma omp simd
            for (r = 0; r < R; r++) {
                out[j * D + r] = (XF_T)xf_log_prob_finite((double)xt[j][r], m[r], log_s[r]);
            }
        }
        return;
    }
    for (j = 0; j < C; j++) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            out[j * D + r] = (XF_T)xf_log_prob((double)xt[j][r], m[r], log_s[r]);
        }
    }
#else
#if XF_FMA_NATIVE && (defined(__AVX2__) || defined(__AVX512F__))
    if (finite) {
        double minus_one = -1.0;
        __asm__("" : "+x"(minus_one));
        for (j = 0; j < C; j++) {
#pragma omp simd
            for (r = 0; r < R; r++) {
                out[j * D + r] = (XF_T)xf_fma(log_s[r], minus_one, xf_fma(m[r], minus_one, (double)xt[j][r]));
            }
        }
        return;
    }
#endif
    (void)finite;
    for (j = 0; j < C; j++) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            out[j * D + r] = (XF_T)xf_log_prob_single((double)xt[j][r], m[r], log_s[r]);
        }
    }
#endif
}

/* xf_row_mask_form's pass: the min over m and the entries at or above far_t, in XF_MAX_LANES lanes (a min
 * in any order is the same number), folded in halves at the end */
XF_KERNEL XF_T XF_FN(xf_near_min)(const XF_T *x, long long C, XF_T far_t, XF_T m)
{
    XF_T lane_min[XF_MAX_LANES];
    long long j = 0;
    int k, half;
    for (k = 0; k < XF_MAX_LANES; k++) {
        lane_min[k] = m;
    }
    for (; j + XF_MAX_LANES <= C; j += XF_MAX_LANES) {
#pragma omp simd
        for (k = 0; k < XF_MAX_LANES; k++) {
            const XF_T v = x[j + k];
            const XF_T kept = (v >= far_t) ? v : m;
            lane_min[k] = (kept < lane_min[k]) ? kept : lane_min[k];
        }
    }
    for (k = 0; j + k < C; k++) {
        const XF_T v = x[j + k];
        const XF_T kept = (v >= far_t) ? v : m;
        lane_min[k] = (kept < lane_min[k]) ? kept : lane_min[k];
    }
    for (half = XF_MAX_LANES / 2; half > 0; half /= 2) {
#pragma omp simd
        for (k = 0; k < half; k++) {
            lane_min[k] = (lane_min[k + half] < lane_min[k]) ? lane_min[k + half] : lane_min[k];
        }
    }
    return lane_min[0];
}

/* A row beyond the normal form's spread (xf_rowjob_set_exp_form gave 0) whose far entries are a finite
 * mask: every finite entry either within XF_NORMAL_SPREAD of the max or below fl(m - XF_MASK_FAR) (none
 * in the band between, where the exponential is subnormal; one exactly 746 below keeps the row on the
 * general form) takes the masked normal form
 * (exp_normal = 2, xf_exp_minus_*_masked), the same bits as the general form.  One more pass over such
 * rows only (from the cache the max pass left them in): the smallest entry not far below the max. */
XF_HD void XF_FN(xf_row_mask_form)(const XF_T *x, long long C, xf_rowjob *job)
{
    const double m = job->m;
    if (job->status != XF_ROW_OK || job->exp_normal != 0 || !(m - m == 0.0)) {
        return;
    }
    /* In the storage type, lane by lane: (double)v >= far exactly where v >= far_t, the least XF_T at or
     * above far (far itself for double; a float a step up where rounding went down, -FLT_MAX where far
     * lies below every finite float), and m is an XF_T (the max of the entries), so the min is the same
     * number.  The double form took 8 floats per 512-bit vector, widening each, in one min chain: 18 %
     * of a float32 forward pass over rows with 30 % of the entries at -1e9 (benchmarks/README.md,
     * fourteenth round). */
    const double far = m - XF_MASK_FAR;
    XF_T far_t = (XF_T)far;
    if ((double)far_t < far) {
        far_t = (XF_T)xf_float_next_up((float)far_t);
    }
    const double near_min = (double)XF_FN(xf_near_min)(x, C, far_t, (XF_T)m);
    if (m - near_min <= XF_NORMAL_SPREAD) {
        job->exp_normal = 2;
    }
}

/* Row statistics of a whole row, block by block (the one-thread-per-row path): the max pass, then the
 * sum pass (xf_row_sum_writing: optionally keeping the exponentials).  The phased path in _xent.pyx calls
 * the same block functions and the same merges in the same order. */
XF_KERNEL void XF_FN(xf_row_max)(const XF_T *x, long long C, xf_rowjob *job)
{
    long long b0;
    xf_rowmax st, blk;
    xf_rowmax_init(&st);
    for (b0 = 0; b0 < C; b0 += XF_BLOCK) {
        long long nb = (C - b0 < XF_BLOCK) ? C - b0 : XF_BLOCK;
        XF_FN(xf_max_block)(x + b0, nb, b0, &blk);
        xf_rowmax_merge(&st, &blk);
    }
    xf_rowjob_set_max(job, &st);
    xf_rowjob_set_exp_form(job, C);
    XF_FN(xf_row_mask_form)(x, C, job);
}

/* The max pass of a row the previous sum pass has read ahead (`s`, xf_next_max), else xf_row_max. */
XF_KERNEL void XF_FN(xf_row_max_next)(const XF_T *x, long long C, xf_rowjob *job, xf_row_scratch *s)
{
    if (s == NULL || s->next_row != (const void *)x) {
        XF_FN(xf_row_max)(x, C, job);
        return;
    }
    XF_FN(xf_next_max) lanes;
    const long long done = s->next_done;
    const long long whole = done + (C - done) / XF_MAX_LANES * XF_MAX_LANES;
    long long j;
    int k;
    memcpy(&lanes, s->next_lanes, sizeof lanes);
    s->next_row = NULL;
    XF_FN(xf_next_max_add)(&lanes, x + done, whole - done);
    XF_T m = (XF_T)-XF_INF, mn = (XF_T)XF_INF, mark = (XF_T)0;
    for (k = 0; k < XF_MAX_LANES; k++) {
        m = (lanes.m[k] > m) ? lanes.m[k] : m;
        mn = (lanes.mn[k] < mn) ? lanes.mn[k] : mn;
        mark += lanes.mark[k];
    }
    for (j = whole; j < C; j++) {
        m = (x[j] > m) ? x[j] : m;
        mn = (x[j] < mn) ? x[j] : mn;
        mark += x[j] - x[j];
    }
    if (mark != (XF_T)0) {
        /* an inf or a NaN: the counting pass, as xf_row_max would run it */
        XF_FN(xf_row_max)(x, C, job);
        return;
    }
    /* every entry finite: what xf_row_max's block merge gives (the first index of the max, no NaN,
     * every entry counted finite) */
    xf_rowmax st;
    st.m = (double)m;
    st.argmax = XF_FN(xf_first_equal)(x, C, m);
    st.n_nan = 0;
    st.n_finite = C;
    st.min_finite = (double)mn;
    xf_rowjob_set_max(job, &st);
    xf_rowjob_set_exp_form(job, C);
    XF_FN(xf_row_mask_form)(x, C, job);
}

/* `pend` (or NULL): a pending gradient the sum pass writes as it goes (xf_pending_step).  `next` (or
 * NULL): the thread's scratch, where the sum pass leaves the next row's max lanes (xf_next_max) when
 * the driver allows it and that row lies inside the input.  The row's double-double sum goes to (*s_hi,
 * *s_lo), not yet into the job (xf_row_sum_writing puts it there with its logarithm); returns 0, with
 * nothing summed, for a row that is not OK. */
XF_KERNEL int XF_FN(xf_row_sum_parts)(const XF_T *x, long long C, const xf_rowjob *job, XF_T *store,
                                      double *keep, xf_row_scratch *pend, xf_row_scratch *next, double *s_hi,
                                      double *s_lo)
{
    long long b0;
    XF_FN(xf_next_max) lanes, *ahead = 0;
    if (next) {
        next->next_row = NULL;
    }
    if (job->status != XF_ROW_OK) {
        return 0;
    }
    if (next && next->x_end && C >= XF_READ_AHEAD_MIN_CLASSES &&
        (size_t)((const char *)next->x_end - (const char *)x) >= 2 * (size_t)C * sizeof(XF_T)) {
        XF_FN(xf_next_max_init)(&lanes);
        ahead = &lanes;
    }
    double hi = 0.0, lo = 0.0;
    for (b0 = 0; b0 < C; b0 += XF_BLOCK) {
        long long nb = (C - b0 < XF_BLOCK) ? C - b0 : XF_BLOCK;
        long long skip = job->argmax - b0;
        double bhi, blo;
        XF_FN(xf_sumexp_block_ahead)(x + b0, nb, job->m, (skip >= 0 && skip < nb) ? skip : -1,
                                     job->exp_normal, &bhi, &blo, store ? store + b0 : 0, keep ? keep + b0 : 0, C,
                                     pend, ahead);
        if (b0 == 0) {
            /* the first block as it is: xf_lanes_to_dd's pair is normalized (bhi = fl(bhi + blo)), so
             * adding it to (0, 0) returns it unchanged, as the phased path's merge does */
            hi = bhi;
            lo = blo;
        } else {
            xf_dd_add(&hi, &lo, bhi, blo);
        }
    }
    *s_hi = hi;
    *s_lo = lo;
    if (ahead) {
        memcpy(next->next_lanes, &lanes, sizeof lanes);
        next->next_done = C / XF_CHUNK * XF_CHUNK;
        next->next_row = x + C;
    }
    return 1;
}

/* the row's sum and its logarithm into the job (`log_s`: xf_row_log_S of the sum, evaluated by the
 * caller), then float64's rescue of a sum of subnormal terms */
static inline void XF_FN(xf_row_sum_set)(const XF_T *x, long long C, xf_rowjob *job, double s_hi, double s_lo,
                                         double log_s)
{
    xf_rowjob_set_sum_log(job, s_hi, s_lo, log_s);
#if XF_COMPENSATED
    /* reads x again: rows that may need it are never given a store aliasing x (xf_rowjob_plan) */
    xf_rowjob_rescue_tiny_sum(job, (const double *)x, C);
#else
    (void)x;
    (void)C;
#endif
}

/* the sum pass (xf_row_sum_parts) and its results into the job.  Without a use for log S (softmax's rows
 * without their logsumexp: job->log_s_unused) the scalar chain of its log1p and division is left out, NaN
 * in its place: softmax 4096x1000 float32 3-5 % faster, float64 within noise (benchmarks/README.md,
 * 2026-12-07, fourth round). */
XF_KERNEL void XF_FN(xf_row_sum_writing)(const XF_T *x, long long C, xf_rowjob *job, XF_T *store, double *keep,
                                         xf_row_scratch *pend, xf_row_scratch *next)
{
    double hi, lo;
    if (XF_FN(xf_row_sum_parts)(x, C, job, store, keep, pend, next, &hi, &lo)) {
        XF_FN(xf_row_sum_set)(x, C, job, hi, lo, job->log_s_unused ? XF_NAN : xf_row_log_S(hi, lo));
    }
}

/* the sum pass alone (logsumexp, log_softmax): nothing kept, nothing pending */
XF_KERNEL void XF_FN(xf_row_sum)(const XF_T *x, long long C, xf_rowjob *job)
{
    XF_FN(xf_row_sum_writing)(x, C, job, 0, 0, 0, 0);
}

/* Per-row loss terms of a whole row (soft targets / smoothing), block by block. */
XF_KERNEL void XF_FN(xf_row_terms)(const XF_T *x, long long C, const xf_rowjob *job, const XF_T *t,
                               const double *w, double acc[4])
{
    long long b0;
    int i;
    for (i = 0; i < 4; i++) {
        acc[i] = 0.0;
    }
    for (b0 = 0; b0 < C; b0 += XF_BLOCK) {
        long long nb = (C - b0 < XF_BLOCK) ? C - b0 : XF_BLOCK;
        double blk[4];
        XF_FN(xf_xent_terms_block)(x + b0, nb, b0, job, t ? t + b0 : 0, w ? w + b0 : 0, blk);
        xf_terms_merge(acc, blk);
    }
}

/* The z-loss's logsumexp for finish (xentfast/softmax_row.h, "logsumexp for the z-loss"): level 1 from
 * the row's statistics (the exact logsumexp where m + log S cancels), level 2 re-reads the row where
 * A + 2 z r lse cancels.  Serial and per row: the first level is a few dozen operations, the second
 * rare. */
XF_KERNEL void XF_FN(xf_row_z_lse)(const XF_T *x, long long C, xf_rowjob *job, const XF_T *t, const double *w,
                               double *terms)
{
    if (job->z == 0.0 || job->status != XF_ROW_OK) {
        return;
    }
#if XF_COMPENSATED
    const double exact = xf_rowjob_exact_lse_f64(job, (const double *)x, C);
    xf_rowjob_z_lse_row(job, (const float *)0, (const double *)x, (const float *)0, (const double *)t, w, C, exact,
                        terms);
#else
    const double exact = xf_rowjob_exact_lse_f32(job, (const float *)x, C);
    xf_rowjob_z_lse_row(job, (const float *)x, (const double *)0, (const float *)t, (const double *)0, w, C, exact,
                        terms);
#endif
}

/* The loss of a row whose sum is in its job (xf_row_sum_writing): the loss-terms pass where the row needs
 * one, float64's tiny-loss rerun, the z-loss's logsumexp, xf_rowjob_finish */
XF_KERNEL double XF_FN(xf_row_loss)(const XF_T *x, long long C, xf_rowjob *job, const XF_T *t, const double *w)
{
    double terms[4] = {0.0, 0.0, 0.0, 0.0};
    if (job->status == XF_ROW_OK && job->needs_terms) {
        /* float32 rows only: for float64 the scan is a pass of its own, and the loop without the tests
         * measured no faster there (benchmarks/README.md, 2026-12-07, eleventh round) */
        if (!XF_COMPENSATED && job->prob) {
            double t_least;
            job->targets_nonneg = XF_FN(xf_targets_scan)(t, C, &t_least);
            job->prob_terms_never_slow =
                XF_FN(xf_prob_terms_never_slow)(job, C, w != 0, job->targets_nonneg, t_least);
        }
#if !XF_COMPENSATED
        job->diffs_exact = XF_FN(xf_row_diffs_exact)((const float *)x, C, job->m, job->min_finite);
#endif
        XF_FN(xf_row_terms)(x, C, job, t, w, terms);
    }
#if XF_COMPENSATED
    xf_rowjob_tiny_loss_row(job, (const double *)x, (const double *)t, w, C, terms);
#endif
    XF_FN(xf_row_z_lse)(x, C, job, t, w, terms);
    return xf_rowjob_finish(job, terms);
}

/* The one-thread-per-row driver: statistics, loss, gradient.  Returns the row loss (double; the
 * caller reduces or rounds it).  grad may be NULL (forward only) and may alias x (inplace).
 * scratch (or NULL): the calling thread's own (xf_row_scratch, xent_kernels.h), the same for all the rows
 * it runs, and released by the driver after the last of them.  On rows the general gradient serves, the
 * sum pass keeps each exp(x_j - m) in its row, exactly, and the gradient pass multiplies instead of
 * evaluating it again; float64 rows whose gradient buffer is not the logits keep them in that buffer
 * instead (the loss terms and the z-loss read x again after the sum pass).  A float32 buffer would round
 * them, and the gradient's q_j may cancel most of p_j.  Every float32 row keeps its exponentials in the
 * scratch row too; float64 rows of the stored form keep theirs in the gradient buffer (exact there,
 * inplace included).  The bits are those of the evaluating form every way, and without a scratch row the
 * rows evaluate the exponentials again.  Long simple rows (float64: of the stored form) keep their
 * exponentials in the scratch row whatever the type, and leave their gradient pending for the next row's
 * sum pass to write (XF_STREAMED_ROWS): it is whole only once the driver has released the scratch. */
XF_KERNEL double XF_FN(xf_xent_row)(const XF_T *x, XF_T *grad, long long C, xf_rowjob *job, const XF_T *t,
                                const double *w, xf_row_scratch *scratch)
{
    long long b0;
    double *const row = scratch ? scratch->row : 0;
    XF_FN(xf_row_max_next)(x, C, job, scratch);
    xf_rowjob_plan(job, (job->y >= 0) ? (double)x[job->y] : 0.0, grad != 0);
    double *keep = 0;
    if (grad && job->status == XF_ROW_OK) {
#if XF_COMPENSATED
        if (!job->simple) {
            keep = (grad != x) ? (double *)grad : row;
        }
#else
        /* every float32 row: kept or evaluated again, an exponential gives the same entry (xf_stored_entry),
         * so rows beyond the stored form's spread (a finite mask, far logits) keep theirs too */
        keep = row;
#endif
    }
    int streamed = 0;
    xf_row_scratch *pending = 0;
#if XF_STREAMED_ROWS
    if (grad && scratch && (XF_COMPENSATED ? job->stored : job->simple) && job->status == XF_ROW_OK &&
        C >= XF_STREAM_MIN_CLASSES(!XF_COMPENSATED)) {
        /* the pending gradient's exponentials are there too: the sum pass writes it as it goes
         * (xf_pending_step) */
        keep = row;
        streamed = 1;
        pending = scratch->pending ? scratch : 0;
    }
#endif
    if (!streamed) {
        /* this row may keep its exponentials where the pending gradient reads them */
        xf_row_scratch_finish(scratch);
    }
#if XF_COMPENSATED
    /* float64 simple rows beyond the stored form's spread (a finite mask such as -1e9, logits far apart)
     * keep theirs in the gradient buffer too where that buffer is not the logits: the tiny-sum rescue and
     * the scaled gradient (grad_scaled, checked first in xf_xent_grad_block) read x again, and it is
     * still there.  (Only stored rows stream their gradient, and the pending writer has no scaled form:
     * `!streamed` keeps it so.)  They had evaluated
     * every exponential a second time (fused 4096x1000 float64 with 30 % of the entries at -1e9, one
     * thread: benchmarks/README.md, fourteenth round). */
    if (grad && grad != x && !streamed && !job->stored && job->simple && job->status == XF_ROW_OK) {
        job->stored = 1;
    }
#endif
    /* float64 stored rows not streamed keep their exponentials in the gradient buffer (exact there) */
    XF_T *store = (XF_COMPENSATED && job->stored && !streamed) ? grad : 0;
    XF_FN(xf_row_sum_writing)(x, C, job, store, keep, pending, scratch);
    double loss = XF_FN(xf_row_loss)(x, C, job, t, w);
    if (grad) {
        if (job->status != XF_ROW_OK) {
            for (b0 = 0; b0 < C; b0++) {
                grad[b0] = (XF_T)XF_NAN;
            }
        } else if (streamed) {
#if XF_STREAMED_ROWS
            /* the previous row's last chunks (the sum pass wrote the rest), then this row pending */
            xf_row_scratch_finish(scratch);
            XF_FN(xf_pending_start)(scratch, keep, grad, C, job);
#endif
        } else {
            for (b0 = 0; b0 < C; b0 += XF_BLOCK) {
                long long nb = (C - b0 < XF_BLOCK) ? C - b0 : XF_BLOCK;
                XF_FN(xf_xent_grad_block)(x + b0, grad + b0, nb, b0, job, t ? t + b0 : 0, w ? w + b0 : 0,
                                          keep ? keep + b0 : 0);
            }
        }
    }
    return loss;
}

/* The max and sum passes of R <= XF_GROUP_ROWS rows of x (rows[r] the r-th one's index) with the jobs the
 * driver set up for them, as xf_xent_row makes them without a gradient, then the R logarithms of the
 * sums side by side (one vector; each had run scalar after its own sum pass, a chain of dependent
 * operations that the next row's max pass did not hide: a build without the logarithm ran the forward
 * pass at 4096x1000 7 % faster in float32, 3 % in float64, one thread, AMD Zen 5; this took 3-5 % off it,
 * benchmarks/README.md, 2026-12-07, third round), and each row's sum and logarithm into its job.  The
 * same functions on the same operands: every row's job gets the bits the row kernel gives it, whatever
 * rows share its vector. */
XF_KERNEL void XF_FN(xf_rows_max_sum)(const XF_T *x, long long C, const long long *rows, int R, xf_rowjob *jobs)
{
    double hi[XF_GROUP_ROWS], lo[XF_GROUP_ROWS], log_s[XF_GROUP_ROWS];
    int r;
    for (r = 0; r < XF_GROUP_ROWS; r++) {
        hi[r] = 0.0;
        lo[r] = 0.0;
    }
    for (r = 0; r < R; r++) {
        const XF_T *xr = x + rows[r] * C;
        xf_rowjob *job = &jobs[r];
        XF_FN(xf_row_max)(xr, C, job);
        /* logsumexp's jobs (no target) get x_y = 0 and no stored form here, which nothing of theirs reads */
        xf_rowjob_plan(job, (job->y >= 0) ? (double)xr[job->y] : 0.0, 0);
        XF_FN(xf_row_sum_parts)(xr, C, job, 0, 0, 0, 0, &hi[r], &lo[r]);
    }
#pragma omp simd
    for (r = 0; r < XF_GROUP_ROWS; r++) {
        log_s[r] = xf_row_log_S(hi[r], lo[r]);
    }
    for (r = 0; r < R; r++) {
        /* the rows the sum pass summed (xf_row_sum_parts: those OK after the max pass) */
        if (jobs[r].status == XF_ROW_OK) {
            XF_FN(xf_row_sum_set)(x + rows[r] * C, C, &jobs[r], hi[r], lo[r], log_s[r]);
        }
    }
}

/* The losses without a gradient of R <= XF_GROUP_ROWS rows (xf_rows_max_sum), each finished as xf_xent_row
 * finishes it (xf_row_loss).  t: the targets at x's layout, or NULL. */
XF_KERNEL void XF_FN(xf_xent_rows_forward)(const XF_T *x, const XF_T *t, long long C, const long long *rows,
                                           int R, xf_rowjob *jobs, const double *w, double *loss)
{
    int r;
    XF_FN(xf_rows_max_sum)(x, C, rows, R, jobs);
    for (r = 0; r < R; r++) {
        loss[r] = XF_FN(xf_row_loss)(x + rows[r] * C, C, &jobs[r], t ? t + rows[r] * C : 0, w);
    }
}

/* ---- short rows, XF_GROUP_ROWS side by side ------------------------------------------------------------
 * A row of a few classes is mostly bookkeeping: the lane merge, log1p of the sum, the loss, a dozen scalar
 * chains of ~900 instructions at C = 10, against ~100 for its exponentials.  Here XF_GROUP_ROWS
 * consecutive rows are transposed into a small buffer and every step runs across the rows, one row per
 * vector lane: the same functions (xf_exp_minus_*_normal, xf_acc_add_finite, xf_lanes_to_dd_strided,
 * xf_row_log_S, xf_index_target_ce, xf_div_S, xf_target_grad_of) on the same operands in the same order as
 * xf_xent_row, so each row's loss and gradient have the bits the row kernel gives them.  What differs is
 * only which of +0 and -0 is the max where both attain it (the row kernel's max pass may pick either too;
 * no output depends on it, see xf_max_block).
 * Only the common case: index targets, no smoothing, no z-loss, and rows whose entries are all finite and
 * within XF_NORMAL_SPREAD of the max (the unclamped exponentials); float64 rows whose sum needs no rescue;
 * with a gradient, rows the row kernel would give the kept-exponential form (xf_rowjob_plan: a spread of
 * at most 600) and a finite coefficient.  Ignored rows count as done (loss 0, gradient 0, as
 * _xent_one_row).  Returns the rows done as a bit mask; the caller runs the others through xf_xent_row,
 * which overwrites whatever was left in their places. */
/* Where the groups pay (one core, C microbenchmark, ns per row, row kernel -> groups):
 *   float32 forward  C = 10 139 -> 27, 32 172 -> 64, 100 222 -> 138, 128 234 -> 175
 *   float64 forward  C = 10 158 -> 48, 32 197 -> 122, 48 241 -> 177, 64 345 -> 289, 80 308 -> 294,
 *                    100 437 -> 441
 *   float32 fused    C = 10 226 -> 70, 32 179 -> 107, 64 224 -> 185, 80 244 -> 232, 100 299 -> 296,
 *                    128 310 -> 370
 *   float64 fused    C = 10 212 -> 89, 32 232 -> 156, 48 272 -> 247, 64 301 -> 308
 * float64's compensated lanes make each step dearer, and a gradient is written back through the
 * transposed buffer.  On the AVX2 path that write-back goes 4x4 blocks of doubles at a time through
 * registers (xf_group_grad_columns; float32 gradients went 8x8 blocks of floats then), which moved the
 * fused limits (same microbenchmark,
 * another day; row kernel -> groups before -> groups now):
 *   float32 fused    C = 64 206 -> 166 -> 127, 80 220 -> 203 -> 154, 100 257 -> 254 -> 191,
 *                    128 281 -> 319 -> 239
 *   float64 fused    C = 64 284 -> 266 -> 247, 80 329 -> 320 -> 304, 100 382 -> 395 -> 378
 * With the float32 max, min and argmax in float lanes as well (below), the float32 groups pay up to 256
 * classes (buffers of 256; row kernel -> groups): forward C = 160 236 -> 170, 192 250 -> 201, 256 298
 * -> 264; fused 321 -> 268, 353 -> 317, 429 -> 418.  The float64 ones are unchanged by the buffers'
 * size.  Once float32 rows kept their exponentials as doubles (xf_stored_entry), the row kernel's fused
 * rows got faster than the groups' from about 150 classes (16384 rows, another machine, groups -> row
 * kernel): C = 64 115-128 -> 175-254, 100 171 -> 214, 128 216-219 -> 231-233, 136 231 -> 242, 144 241
 * -> 247, 152 257 -> 257, 160 268-269 -> 256-261, 200 337 -> 290-303, 256 430 -> 332-336, so float32
 * groups with a gradient stop at 144. */
#if defined(__AVX512F__)
/* the avx512 unit, once its groups took 512-bit vectors (xf_group_sum_form, XF_GROUP_WIDE_ENTRIES; one
 * core, 4096 rows, us, rows -> groups): float32 forward C = 208 816 -> 707, 256 866 -> 852, fused 176
 * 1019 -> 802, 208 1022 -> 956, 256 1030 -> 1158; float64 forward 128 952 -> 865, 160 1176 -> 1079, 200
 * 1252 -> 1348, fused 160 1451 -> 1387, 200 1522 -> 1806 (benchmarks/README.md, 2026-12-05).  Once the
 * groups fetched the next group during their sum pass (xf_group_sum_form), measured again (one core,
 * ns per entry, 2^22 float32 or 2^21 float64 entries, rows -> groups, benchmarks/README.md, 2026-12-05,
 * seventh round): float32 fused C = 224 1.43 -> 1.02, 256 1.19-1.25 -> 0.96-1.01; float64 forward 192
 * 1.81-1.86 -> 1.61-1.72, 224 1.95 -> 1.69, 240 1.86 -> 1.64, 256 1.67 -> 1.62 (logsumexp and
 * log_softmax slower there, 1.63 -> 1.67, 2.04 -> 2.15), fused 192 2.19 -> 2.27, 224 2.26 -> 2.29 (minima),
 * so float32 groups take every width of the buffers (256 then) and float64 ones stop at 240 without a
 * gradient and stay at 160 with one.  With buffers of 512 (rows -> groups, same units and rounds):
 * float32 C = 300 logsumexp 0.97 -> 0.63, forward 1.01 -> 0.63, log_softmax 1.15 -> 0.88, softmax 1.17
 * -> 0.88, fused 1.21 -> 0.94; 384 0.78 -> 0.63, 0.80 -> 0.54, 0.95 -> 0.83, 0.95 -> 0.92, 0.98 -> 0.95;
 * 448 0.72 -> 0.61, 0.75 -> 0.56, 0.90 -> 0.73, 0.91 -> 0.89, 0.96 -> 0.87; 512 0.67 -> 0.59, 0.69 ->
 * 0.61, 0.88 -> 0.85, softmax 0.87 -> 0.94 and fused 0.93 -> 0.90 (minima), so float32 groups take 512
 * classes without a gradient and 448 with one (softmax, whose groups share the fused pass's limit, lost
 * at 512). */
#if XF_COMPENSATED
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 160 : 240)
#else
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 448 : 512)
#endif
#elif defined(__AVX2__)
/* float32 without a gradient: the groups lost beyond 256 classes here (one core, ns per entry, 2^22
 * entries, rows -> groups: logsumexp C = 300 0.93 -> 1.12, 384 0.86 -> 1.13, 512 0.79 -> 1.12; forward
 * alike; benchmarks/README.md, 2026-12-05, seventh round) */
#if XF_COMPENSATED
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 80 : 64)
#else
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 144 : 256)
#endif
#elif defined(__x86_64__) || defined(__i386__)
/* x86's baseline path (SSE2, the fma emulated): no groups.  Once the row kernel's last lanes were
 * vectorized there (their loop had stayed scalar on a 64-bit integer compare, which SSE2 lacks), the row
 * kernel was ahead at every width, also of groups whose loop of exponentials was vectorized the same way
 * (its argmax test made a double compare; one core, 2048 rows, us, rows / groups):
 * float32 C = 8 872 / 962, 32 2918 / 3715, 63 5893 / 7258, 64 4791 / 7546, 128 9461 / 14524; float64
 * C = 8 957 / 1138, 32 3311 / 4383, 63 7799 / 9000, 64 8953 / 9679 (benchmarks/README.md, 2026-12-05) */
#define XF_GROUP_C_LIMIT(has_grad) 0
#else
/* other targets' baseline path (aarch64: the fma instruction, 128-bit vectors), not measured: the limits
 * measured on x86's baseline path before its row kernel's last lanes were vectorized (above) */
#if XF_COMPENSATED
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 48 : 64)
#else
#define XF_GROUP_C_LIMIT(has_grad) ((has_grad) ? 64 : 128)
#endif
#endif
/* the groups that take XF_GROUP_CHAINS chains in their max and argmax (xf_group_max; one core, float32,
 * 400000 entries, us, benchmarks/README.md, "2026-12-05, later"): the avx512 unit from 32 classes (one
 * chain -> four, the argmax in a pass of its own: forward C = 32 521 -> 506, 64 432 -> 392, 128 408 ->
 * 343, fused 128 529 -> 463; at C = 16 four chains lost 4-8 %; then the argmax in the chains, another
 * run: forward 32 458 -> 424, 64 363 -> 328, 128 329 -> 299, fused 128 466 -> 436), the avx2 unit from
 * 64 (forward 64 551 -> 543, 256 504 -> 478, at 10-32 a loss of about 5 %; the argmax in the chains then
 * cost that unit, with its 16 vector registers, 2 %); float64 never, its compensated sums hiding it
 * (0.89-1.11 either way).
 * Other targets' baseline path takes the avx2 unit's threshold, not measured. */
#if XF_COMPENSATED
#define XF_GROUP_CHAINS_FROM_C (XF_GROUP_MAX_C + 1)
#elif defined(__AVX512F__)
#define XF_GROUP_CHAINS_FROM_C 32
#else
#define XF_GROUP_CHAINS_FROM_C 64
#endif
/* a group's transposed buffers, on the stack: float64 groups stop at 240 classes on every path, so their
 * buffers (64 KB at 512 classes) take 256 */
#define XF_GROUP_BUF_C (XF_COMPENSATED ? 256 : XF_GROUP_MAX_C)
/* the loss-terms pass's groups (xf_short_rows_terms_form), within XF_GROUP_C_LIMIT.  Label smoothing, one core, ns
 * per entry, 2^21 entries, label_smoothing=0.1, groups / row kernel (benchmarks/README.md, 2026-12-07, sixth
 * round), avx512: float32 forward C = 128 1.45 / 1.69, 160 1.51 / 1.57, 192 1.45 / 1.56, 256 1.37 / 1.21, fused 160
 * 1.76 / 2.00, 192 1.76 / 1.71; float64 forward 96 2.34 / 2.73, 128 2.29 / 2.22, fused 96 3.05 / 3.39, 128 2.99 /
 * 2.76.  avx2 (its own group limits: float64 64 and 80): float32 forward 96 2.24 / 2.35, 128 2.13 / 2.07, fused 128
 * 2.48 / 2.52, 160 2.40 / 2.44.  Probability targets (has_t), the same measurement (benchmarks/README.md,
 * 2026-12-07, seventh round): avx512 float32 forward 96 2.01 / 2.17, 112 2.05 / 2.09, 128 1.99 / 1.84, fused 96
 * 2.69 / 2.74, 112 2.66 / 2.58; float64 forward 64 3.21 / 3.41, 80 3.31 / 3.20, fused 64 4.18 / 4.27, 80 4.42 /
 * 3.88; avx2 float32 forward 128 2.69 / 2.73, 144 2.78 / 2.69, fused 128 3.53 / 3.68, 144 3.60 / 3.40.  Since the
 * loop runs in 512-bit vectors for probability targets too (benchmarks/README.md, 2026-12-07, tenth round), the
 * avx512 unit's float32 groups of them lead up to 160 classes as well (one core, ms, 2^21 entries, row kernel ->
 * groups: forward 128 4.01-4.13 -> 3.12-3.21, 160 3.83-3.93 -> 2.94-3.08, fused 128 5.11-5.21 -> 4.36-4.56, 160
 * 4.69-4.77 -> 4.21-4.33); the avx2 unit's were too noisy to tell apart and keep 112 */
#if defined(__AVX512F__)
#define XF_GROUP_TERMS_MAX_C(has_t) ((has_t) ? (XF_COMPENSATED ? 64 : 160) : (XF_COMPENSATED ? 96 : 160))
#else
#define XF_GROUP_TERMS_MAX_C(has_t) ((has_t) ? (XF_COMPENSATED ? 64 : 112) : (XF_COMPENSATED ? 96 : 160))
#endif
typedef char XF_FN(xf_group_limit_fits_the_buffers)[(XF_GROUP_C_LIMIT(0) <= XF_GROUP_BUF_C &&
                                                      XF_GROUP_C_LIMIT(1) <= XF_GROUP_BUF_C &&
                                                      XF_GROUP_BUF_C <= XF_GROUP_MAX_C) ? 1 : -1];

#if defined(__AVX2__)
/* A group's output rows from a buffer that holds the group's rows side by side (kept[j][r]) while the
 * output wants each row whole, so blocks of it are transposed in registers (4 x 4 doubles, each half of
 * the group), and each row's entries get the element loop's operations and are stored at once: the fused
 * gradient (and softmax, xf_short_rows_family) from the kept exponentials, doubles for either storage
 * type, multiplied by f[r] and rounded once to the storage type.  The loop it replaces compiled to ~4
 * instructions per float entry, a permute-and-blend gather for every 8 entries of one row.  Only rows done
 * and not ignored are written: the others are the caller's, and a row left to the row kernel may be the
 * logits themselves (inplace).  Returns the first column not written. */
XF_KERNEL inline __attribute__((always_inline)) long long XF_FN(xf_group_grad_columns)(
    const double *kept, long long C, const double *f, const int *ok, const int *ignored, XF_T *grad)
{
    long long j0 = 0;
    int r, half;
#if defined(__AVX512F__) && !XF_COMPENSATED
    /* float32 in the avx512 unit: 16 columns at a time, each column's 8 entries multiplied and rounded to
     * float while they lie side by side (one 512-bit product and conversion for 8 entries, where the 4x4
     * blocks below take two of each), then the 8 x 16 floats transposed in 512-bit registers, both 8 x 8
     * halves at once: 32 shuffles for 128 entries against 64 for the 4x4 blocks of doubles, and a row's
     * 16 entries in one store */
    {
        const __m512d fv = _mm512_loadu_pd(f);
        /* vz[p]: column j0 + p's rows in the lower half, column j0 + 8 + p's in the upper; the last stage
         * takes 128-bit lanes 0 and 2 (or 1 and 3) of a and b as a, b, a, b */
        const __m512i lanes_02 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        const __m512i lanes_13 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        for (; j0 + 16 <= C; j0 += 16) {
            __m512 vz[8], t[8], u[8];
            int p;
            for (p = 0; p < 8; p++) {
                const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_loadu_pd(kept + (j0 + p) * XF_GROUP_ROWS), fv));
                const __m256 hi =
                    _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_loadu_pd(kept + (j0 + 8 + p) * XF_GROUP_ROWS), fv));
                vz[p] = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
            }
            for (p = 0; p < 8; p += 2) {
                t[p] = _mm512_unpacklo_ps(vz[p], vz[p + 1]);
                t[p + 1] = _mm512_unpackhi_ps(vz[p], vz[p + 1]);
            }
            for (p = 0; p < 8; p += 4) {
                u[p] = _mm512_shuffle_ps(t[p], t[p + 2], 0x44);
                u[p + 1] = _mm512_shuffle_ps(t[p], t[p + 2], 0xEE);
                u[p + 2] = _mm512_shuffle_ps(t[p + 1], t[p + 3], 0x44);
                u[p + 3] = _mm512_shuffle_ps(t[p + 1], t[p + 3], 0xEE);
            }
            for (r = 0; r < 4; r++) {
                if (ok[r] && !ignored[r]) {
                    _mm512_storeu_ps(grad + r * C + j0, _mm512_permutex2var_ps(u[r], lanes_02, u[r + 4]));
                }
                if (ok[r + 4] && !ignored[r + 4]) {
                    _mm512_storeu_ps(grad + (r + 4) * C + j0, _mm512_permutex2var_ps(u[r], lanes_13, u[r + 4]));
                }
            }
        }
    }
#endif
    for (; j0 + 4 <= C; j0 += 4) {
        for (half = 0; half < XF_GROUP_ROWS; half += 4) {
            const double *k0 = kept + j0 * XF_GROUP_ROWS + half;
            __m256d a0 = _mm256_loadu_pd(k0), a1 = _mm256_loadu_pd(k0 + XF_GROUP_ROWS);
            __m256d a2 = _mm256_loadu_pd(k0 + 2 * XF_GROUP_ROWS), a3 = _mm256_loadu_pd(k0 + 3 * XF_GROUP_ROWS);
            __m256d b0 = _mm256_unpacklo_pd(a0, a1), b1 = _mm256_unpackhi_pd(a0, a1);
            __m256d b2 = _mm256_unpacklo_pd(a2, a3), b3 = _mm256_unpackhi_pd(a2, a3);
            __m256d rows[4];
            rows[0] = _mm256_permute2f128_pd(b0, b2, 0x20);
            rows[1] = _mm256_permute2f128_pd(b1, b3, 0x20);
            rows[2] = _mm256_permute2f128_pd(b0, b2, 0x31);
            rows[3] = _mm256_permute2f128_pd(b1, b3, 0x31);
            for (r = 0; r < 4; r++) {
                if (ok[half + r] && !ignored[half + r]) {
                    const __m256d v = _mm256_mul_pd(rows[r], _mm256_set1_pd(f[half + r]));
#if XF_COMPENSATED
                    _mm256_storeu_pd(grad + (half + r) * C + j0, v);
#else
                    _mm_storeu_ps(grad + (half + r) * C + j0, _mm256_cvtpd_ps(v));
#endif
                }
            }
        }
    }
    return j0;
}
/* the transposition above is written for 8 rows */
typedef char XF_FN(xf_group_grad_columns_wants_8_rows)[(XF_GROUP_ROWS == 8) ? 1 : -1];
#endif

/* A group's gradient rows once xf_group_grad_columns wrote their columns [0, j_vec): an ignored row all
 * zeros, a row done its other entries from kept[j][r] (with `stored`, a literal, xf_stored_entry's product
 * by f[r]; else kept holds the entries themselves, rounded once here) and, with_target (a literal), its
 * target entry g_y[r]; the other rows are the caller's. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_grad_rows)(
    XF_T *grad, long long C, double (*kept)[XF_GROUP_ROWS], const double *f, const int *ok, const int *ignored,
    const long long *target, const double *g_y, long long j_vec, const int stored, const int with_target)
{
    long long j;
    int r;
    for (r = 0; r < XF_GROUP_ROWS; r++) {
        XF_T *g = grad + r * C;
        if (ignored[r]) {
            for (j = 0; j < C; j++) {
                g[j] = (XF_T)0.0;
            }
        } else if (ok[r]) {
            for (j = j_vec; j < C; j++) {
                g[j] = stored ? XF_FN(xf_stored_entry)(kept[j][r], f[r], 1.0) : (XF_T)kept[j][r];
            }
            if (with_target) {
                g[target[r]] = (XF_T)g_y[r];
            }
        }
    }
}

/* xf_group_grad_rows in torch's layout (xf_group_stats, D > 0), its arguments but j_vec: class j's
 * entries of the group's rows lie side by side at grad + j D, as kept[j] holds them, so each column goes
 * out as one vector with no transposition, the entries of the rows not done keeping what the memory
 * holds (a row handed back to the row kernel may lie in the logits themselves, inplace, and is read
 * after the group). */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_grad_positions)(
    XF_T *grad, long long C, long long D, double (*kept)[XF_GROUP_ROWS], const double *f, const int *ok,
    const int *ignored, const long long *target, const double *g_y, const int stored, const int with_target)
{
    long long j;
    int r;
    for (j = 0; j < C; j++) {
        XF_T *g = grad + j * D;
        /* every value loaded and selected, none loaded under a condition (gcc made those masked loads,
         * and a loop of the target entries after this one a scatter under a mask, which test_build
         * forbids) */
#pragma omp simd
        for (r = 0; r < XF_GROUP_ROWS; r++) {
            const XF_T other = stored ? XF_FN(xf_stored_entry)(kept[j][r], f[r], 1.0) : (XF_T)kept[j][r];
            const XF_T at_target = with_target ? (XF_T)g_y[r] : other;
            const XF_T prior = g[r];
            const int done = ok[r], skipped = ignored[r];
            const XF_T entry = (j == target[r]) ? at_target : other;
            g[r] = skipped ? (XF_T)0.0 : (done ? entry : prior);
        }
    }
}

/* The group's sums of exp(x_j - m) in the exponential form `form` (a literal: 1 normal, 2 masked, see
 * XF_EXP_FORM), as xf_sumexp_block_form adds them: element j into lane j % XF_LANES, in order, the argmax
 * as 0.0; with want_kept (a literal) each exponential also kept in `kept_d` as the double it is (the
 * gradient's and softmax's, as xf_xent_row keeps them). */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_sum_form)(
    XF_T (*xt)[XF_GROUP_ROWS], double (*kept_d)[XF_GROUP_ROWS], const double *m, const long long *argmax,
    double (*acc)[XF_GROUP_ROWS], double (*cmp)[XF_GROUP_ROWS], long long C, const char *next,
    const int want_kept, const int form)
{
    enum { R = XF_GROUP_ROWS };
    /* The next group's rows (`next`), one cache line per column here, as the row kernel's sum pass
     * fetches the next row (a hint: a prefetch never faults, also past the array).  Without it the
     * transposition's strided reads wait on memory (C = 100 float32, 16384 rows from memory: 199 ns per
     * row without, 156 with all lines fetched at once).  All at once, before the transposition, the loop
     * of prefetches itself waited for the line fill buffers, about a seventh of a float32 logsumexp group
     * of 256 classes, with no arithmetic beside it; spread over this loop, the exponentials' work covers
     * the reads (one core, avx512, 2^21 entries: float32 logsumexp C = 256 1.60-1.67 -> 1.25-1.40 ms,
     * forward 176 1.70-1.81 -> 1.43-1.53, float64 forward 160 4.06-4.19 -> 3.44-3.62; benchmarks/README.md,
     * 2026-12-05, seventh round).  The R * C * sizeof(XF_T) bytes take at most C lines (float64: C,
     * float32: C / 2).  NULL: nothing fetched (torch's layout, whose groups read a block the caller
     * has just copied, xf_short_rows). */
    const long long n_next = next ? (R * C * (long long)sizeof(XF_T) + 63) / 64 : 0;
    long long j;
    int r, k;
    /* In the avx512 unit (XF_GROUP_WIDE_ENTRIES) the loop below holds doubles alone: the entries are
     * widened first (exact).  With the floats in it, gcc sized the loop by the 8 floats, one 256-bit
     * vector, and took the doubles in two 256-bit halves although that unit prefers 512-bit vectors;
     * without, one 512-bit vector holds the group's 8 exponentials (float32 groups 8-17 % faster there).
     * The avx2 unit, whose doubles take two vectors either way, lost 2-9 % on rows of 8-16 classes to the
     * extra steps, and keeps the one loop. */
    double xd[R];
    for (j = 0; j < C; j++) {
        k = (int)(j % XF_LANES);
        if (j < n_next) {
            __builtin_prefetch(next + j * 64, 0, 3);
        }
        if (XF_GROUP_WIDE_ENTRIES) {
            for (r = 0; r < R; r++) {
                xd[r] = (double)xt[j][r];
            }
        }
#pragma omp simd
        for (r = 0; r < R; r++) {
            double e = XF_EXP_FORM(form, XF_GROUP_WIDE_ENTRIES ? xd[r] : (double)xt[j][r], m[r]);
            if (want_kept) {
                kept_d[j][r] = e;
            }
            e = (j == argmax[r]) ? 0.0 : e;
#if XF_COMPENSATED
            xf_acc_add_finite(&acc[k][r], &cmp[k][r], e);
#else
            acc[k][r] += e;
#endif
        }
    }
}

/* the argmax as an index of the storage type's lane width (C <= XF_GROUP_MAX_C): float32's max and
 * argmax run in float lanes, float64's in double lanes, as wide as long long */
#if XF_COMPENSATED
typedef long long XF_FN(xf_group_index);
#else
typedef int XF_FN(xf_group_index);
#endif

/* One column of a group into a running max, min (NaN-blind) and NaN test, row by row. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_max_column)(const XF_T *column, XF_T *m,
                                                                               XF_T *mn, int *ok)
{
    int r;
#pragma omp simd
    for (r = 0; r < XF_GROUP_ROWS; r++) {
        const XF_T v = column[r];
        ok[r] &= (v == v);
        m[r] = (v > m[r]) ? v : m[r];
        mn[r] = (v < mn[r]) ? v : mn[r];
    }
}

/* The same, and the column's index j where the running max grows (its first index, as a strict
 * comparison keeps it). */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_max_column_at)(
    const XF_T *column, long long j, XF_T *m, XF_T *mn, int *ok, XF_FN(xf_group_index) *at)
{
    int r;
#pragma omp simd
    for (r = 0; r < XF_GROUP_ROWS; r++) {
        const XF_T v = column[r];
        const int grows = v > m[r];
        ok[r] &= (v == v);
        m[r] = grows ? v : m[r];
        at[r] = grows ? (XF_FN(xf_group_index))j : at[r];
        mn[r] = (v < mn[r]) ? v : mn[r];
    }
}

/* A group's max, min (NaN-blind) and NaN test (ok) per row, in the storage type, with `chains` (a
 * literal) running maxima, minima and NaN tests, each taking every chains-th column, merged after: one
 * running max and min through every column waited on the compare's latency at each (a fifth of a
 * float32 C = 128 group), and a short group pays more for the merges than it waits
 * (XF_GROUP_CHAINS_FROM_C).  Max and min are exact, so the order changes no result but which of +0 and
 * -0 is the max where both attain it, which no output depends on (see above).  One chain runs without
 * the merges' arrays (rows of 16 classes lost 3-5 % to them) and leaves the argmax to xf_group_argmax;
 * the chains find it as they go: each chain's first index of its max, the least of those equal to the
 * row's max (the first index attaining it), 0 where no entry rose above -inf.  That is xf_group_argmax's
 * answer on every row without a NaN; a row with one is handed back to the row path, its argmax unused. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_max)(
    XF_T (*xt)[XF_GROUP_ROWS], long long C, XF_T *m_t, XF_T *mn_t, int *ok, XF_FN(xf_group_index) *argmax_t,
    const int chains)
{
    enum { R = XF_GROUP_ROWS };
    typedef XF_FN(xf_group_index) index_t;
    XF_T mq[XF_GROUP_CHAINS][R], mnq[XF_GROUP_CHAINS][R];
    int okq[XF_GROUP_CHAINS][R];
    index_t aq[XF_GROUP_CHAINS][R];
    long long j;
    int r, q;
    if (chains == 1) {
        for (r = 0; r < R; r++) {
            m_t[r] = (XF_T)-XF_INF;
            mn_t[r] = (XF_T)XF_INF;
            ok[r] = 1;
        }
        for (j = 0; j < C; j++) {
            XF_FN(xf_group_max_column)(xt[j], m_t, mn_t, ok);
        }
        return;
    }
    for (q = 0; q < chains; q++) {
        for (r = 0; r < R; r++) {
            mq[q][r] = (XF_T)-XF_INF;
            mnq[q][r] = (XF_T)XF_INF;
            okq[q][r] = 1;
            aq[q][r] = (index_t)C;
        }
    }
    for (j = 0; j + chains <= C; j += chains) {
        for (q = 0; q < chains; q++) {
            XF_FN(xf_group_max_column_at)(xt[j + q], j + q, mq[q], mnq[q], okq[q], aq[q]);
        }
    }
    for (q = 0; j + q < C; q++) {
        XF_FN(xf_group_max_column_at)(xt[j + q], j + q, mq[q], mnq[q], okq[q], aq[q]);
    }
#pragma omp simd
    for (r = 0; r < R; r++) {
        int c;
        index_t a;
        m_t[r] = mq[0][r];
        mn_t[r] = mnq[0][r];
        ok[r] = okq[0][r];
        for (c = 1; c < chains; c++) {
            m_t[r] = (mq[c][r] > m_t[r]) ? mq[c][r] : m_t[r];
            mn_t[r] = (mnq[c][r] < mn_t[r]) ? mnq[c][r] : mn_t[r];
            ok[r] &= okq[c][r];
        }
        a = (index_t)C;
        for (c = 0; c < chains; c++) {
            a = ((mq[c][r] == m_t[r]) & (aq[c][r] < a)) ? aq[c][r] : a;
        }
        argmax_t[r] = (a == (index_t)C) ? 0 : a;
    }
}

/* The first index attaining the max in each of a group's rows, m_t from xf_group_max's one chain:
 * scanning backward, the last match found is the least j; none (a row of NaN alone) gives 0. */
XF_KERNEL inline __attribute__((always_inline)) void XF_FN(xf_group_argmax)(
    XF_T (*xt)[XF_GROUP_ROWS], long long C, const XF_T *m_t, XF_FN(xf_group_index) *argmax_t)
{
    enum { R = XF_GROUP_ROWS };
    long long j;
    int r;
    for (r = 0; r < R; r++) {
        argmax_t[r] = 0;
    }
    for (j = C - 1; j >= 0; j--) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            argmax_t[r] = (xt[j][r] == m_t[r]) ? (XF_FN(xf_group_index))j : argmax_t[r];
        }
    }
}

/* What every group needs of its rows, by the row kernel's steps (see above): the rows transposed into xt
 * (xt[j][r] = row r's entry j: x[r C + j], or x[j D + r] where D > 0, torch's layout), each row's max m
 * (as double), first argmax and double-double sum hi + lo of exp(x_j - m) over every class but the
 * argmax, and ok: the row is finite, within max_spread of its max
 * (the unclamped exponentials: XF_NORMAL_SPREAD, or 600 where the row kernel keeps the exponentials for a
 * gradient) and, float64, needs no rescued sum.  want_kept: each exponential kept as xf_group_sum_form
 * says (0: none).  allow_masked: rows with -inf entries (masked classes; with 2, float32
 * also finite entries below fl(max - XF_MASK_FAR), finite masks) are ok too, their spread taken over
 * the other entries, with the row kernel's masked normal form (exp_normal = 2: each masked entry's
 * exponential +0); the group's rows take that form when one of them has a masked entry (the same bits as
 * the normal form on the others).  Returns whether one has. */
XF_KERNEL inline __attribute__((always_inline)) int XF_FN(xf_group_stats)(
    const XF_T *x, long long C, long long D, XF_T (*xt)[XF_GROUP_ROWS], double (*kept_d)[XF_GROUP_ROWS],
    double *m, double *hi, double *lo, long long *argmax, int *ok, const double max_spread, const int want_kept,
    const int allow_masked)
{
    enum { R = XF_GROUP_ROWS };
    double mn[R];
    int any_masked = 0;
    double acc[XF_LANES][R], cmp[XF_LANES][R];
    long long j;
    int r, k;
    if (D > 0) {
        for (j = 0; j < C; j++) {
            for (r = 0; r < R; r++) {
                xt[j][r] = x[j * D + r];
            }
        }
    } else {
        for (j = 0; j < C; j++) {
            for (r = 0; r < R; r++) {
                xt[j][r] = x[r * C + j];
            }
        }
    }
    /* max, min, the NaN test and the argmax in the storage type, as xf_max_block takes them: float ->
     * double is exact and monotone, so every comparison decides as it would in double, and a vector holds
     * 8 float lanes (the whole group) without conversions; the argmax as an index of the lanes' width
     * (C <= XF_GROUP_MAX_C), widened once.  (In double, the two loops were a fifth of a float32 C = 128
     * group.) */
#if XF_COMPENSATED
    double *const m_t = m, *const mn_t = mn;
    long long *const argmax_t = argmax;
#else
    float m_t[R], mn_t[R];
    int argmax_t[R];
#endif
    /* float64's never take chains: the first test is then a false constant, and no code for them */
    const int chains =
        (XF_GROUP_CHAINS_FROM_C <= XF_GROUP_MAX_C && C >= XF_GROUP_CHAINS_FROM_C) ? XF_GROUP_CHAINS : 1;
    if (chains == XF_GROUP_CHAINS) {
        XF_FN(xf_group_max)(xt, C, m_t, mn_t, ok, argmax_t, XF_GROUP_CHAINS);
    } else {
        XF_FN(xf_group_max)(xt, C, m_t, mn_t, ok, argmax_t, 1);
    }
    if (allow_masked == 1 || (allow_masked && XF_COMPENSATED)) {
        for (r = 0; r < R; r++) {
            any_masked |= (mn_t[r] == (XF_T)-XF_INF);
        }
        /* only a group with a -inf entry pays for the min over the finite entries (folded into the loop
         * above, the test cost ordinary groups 6-13 %) */
        if (any_masked) {
            for (r = 0; r < R; r++) {
                mn_t[r] = (XF_T)XF_INF;
            }
            for (j = 0; j < C; j++) {
#pragma omp simd
                for (r = 0; r < R; r++) {
                    const XF_T v = xt[j][r];
                    mn_t[r] = ((v < mn_t[r]) & (v > (XF_T)-XF_INF)) ? v : mn_t[r];
                }
            }
        }
    } else if (allow_masked == 2) {
        /* float32, allow_masked = 2: an entry below fl(max - XF_MASK_FAR), -inf or a finite mask (-1e9,
         * the dtype's minimum), is masked, as in xf_row_mask_form (the same double arithmetic); the spread is taken over
         * the others, so an entry in the band between (708-746 below) keeps the row out.  float64 rows
         * keep -inf alone: a finite far entry within 1200 may call for the rescue of an underflowed sum,
         * and a row beyond 700 for the scaled gradient, which the groups do not do. */
        double far[R];
        for (r = 0; r < R; r++) {
            far[r] = (double)m_t[r] - XF_MASK_FAR;
            any_masked |= ((double)mn_t[r] < far[r]);
        }
        if (any_masked) {
            for (r = 0; r < R; r++) {
                mn_t[r] = m_t[r];
            }
            for (j = 0; j < C; j++) {
#pragma omp simd
                for (r = 0; r < R; r++) {
                    const XF_T v = xt[j][r];
                    mn_t[r] = ((v < mn_t[r]) & ((double)v >= far[r])) ? v : mn_t[r];
                }
            }
        }
    }
    for (r = 0; r < R; r++) {
        m[r] = (double)m_t[r];
        mn[r] = (double)mn_t[r];
    }
    /* xf_rowjob_set_max and xf_rowjob_set_exp_form: no NaN, a finite max, every entry finite (or -inf,
     * allow_masked) and within XF_NORMAL_SPREAD of it; with a gradient also xf_rowjob_plan's kept
     * exponentials (600) */
#pragma omp simd
    for (r = 0; r < R; r++) {
        ok[r] &= (m[r] < XF_INF) & (m[r] > -XF_INF) & (mn[r] > -XF_INF) & (m[r] - mn[r] <= max_spread);
    }
    if (chains == 1) {
        XF_FN(xf_group_argmax)(xt, C, m_t, argmax_t);
    }
    for (r = 0; r < R; r++) {
        argmax[r] = argmax_t[r];
    }
    for (k = 0; k < XF_LANES; k++) {
        for (r = 0; r < R; r++) {
            acc[k][r] = 0.0;
            cmp[k][r] = 0.0;
        }
    }
    /* xf_sumexp_block_form: element j into lane j % XF_LANES, in order, the argmax as 0.0.  Rows that are
     * not ok may hold inf or NaN here; their lanes are computed and never read. */
    const char *next = D > 0 ? 0 : (const char *)(x + R * C);
    if (want_kept) {
        if (any_masked) {
            XF_FN(xf_group_sum_form)(xt, kept_d, m, argmax, acc, cmp, C, next, 1, 2);
        } else {
            XF_FN(xf_group_sum_form)(xt, kept_d, m, argmax, acc, cmp, C, next, 1, 1);
        }
    } else if (any_masked) {
        XF_FN(xf_group_sum_form)(xt, kept_d, m, argmax, acc, cmp, C, next, 0, 2);
    } else {
        XF_FN(xf_group_sum_form)(xt, kept_d, m, argmax, acc, cmp, C, next, 0, 1);
    }
#pragma omp simd
    for (r = 0; r < R; r++) {
        xf_lanes_to_dd_strided(&acc[0][r], &cmp[0][r], R, &hi[r], &lo[r]);
#if XF_COMPENSATED
        /* float64 sums below 2^-900 are summed again, scaled (xf_rowjob_rescue_tiny_sum) */
        ok[r] &= !((hi[r] < XF_TINY_SUM) & (hi[r] != 0.0));
#endif
    }
    return any_masked;
}

XF_KERNEL inline __attribute__((always_inline)) unsigned XF_FN(xf_short_rows_form)(
    const XF_T *x, XF_T *grad, long long C, long long D, const int64_t *y, long long ignore_index, const double *w,
    double loss_scale, double scale, const double *row_scale, double *loss, const int has_grad)
{
    enum { R = XF_GROUP_ROWS };
    XF_T xt[XF_GROUP_BUF_C][R];
    /* with a gradient: each exp(x_j - m) as the row kernel keeps it, the double it is */
    double kept[XF_GROUP_BUF_C][R];
    double m[R], hi[R], lo[R], f[R], g_y[R], x_y[R], w_y[R], scale_r[R];
    long long argmax[R], target[R];
    int ok[R], ignored[R], y_is_max[R];
    unsigned done = 0;
    int r;
    /* finite masks (float32) with a gradient too: the row kernel gives such a row the masked form and
     * the formula of the kept doubles (xf_stored_entry) whether it keeps them or evaluates them again, so
     * the bits agree; until the float32 exponentials were kept as doubles such a row was not of the
     * stored form (xf_rowjob_plan: the spread over every finite entry) and the two roundings differed */
    XF_FN(xf_group_stats)(x, C, D, xt, kept, m, hi, lo, argmax, ok, has_grad ? 600.0 : XF_NORMAL_SPREAD,
                          has_grad, 2);
    /* the labels' lookups, one row at a time (64-bit indices keep gcc from vectorizing the loop below) */
    for (r = 0; r < R; r++) {
        const long long y_r = (long long)y[r];
        ignored[r] = (y_r == ignore_index);
        target[r] = ignored[r] ? 0 : y_r;
        x_y[r] = (double)xt[target[r]][r];
        /* a -inf target (loss +inf) is the row kernel's (allow_masked lets -inf entries in) */
        ok[r] &= ignored[r] | (x_y[r] > -XF_INF);
        w_y[r] = w ? w[target[r]] : 1.0;
        y_is_max[r] = (target[r] == argmax[r]);
        /* the row's upstream factor as _row_job_init forms it (read under a test inside the vector loop,
         * it became a masked load, which test_build forbids) */
        scale_r[r] = row_scale ? scale * row_scale[r] : scale;
    }
#pragma omp simd
    for (r = 0; r < R; r++) {
        const double S = 1.0 + hi[r];
        const double log_s = xf_row_log_S(hi[r], lo[r]);
        const double w_loss = w_y[r] * loss_scale;
        double ce = xf_index_target_ce(x_y[r], m[r], log_s, w_y[r], w_loss);
        /* xf_weighted_log_s of a row without the rescue */
        ce = y_is_max[r] ? w_loss * log_s : ce;
        if (has_grad) {
            /* xf_rowjob_finish's coefficient (no z-loss: A = w_y, coef_mult = 1; its rescaling of an
             * infinite one is left to the row kernel), the stored form's factor (xf_xent_grad_block) and
             * the target entry (xf_target_grad) */
            const double coef = scale_r[r] * w_y[r];
            ok[r] &= (coef - coef == 0.0);
            f[r] = xf_div_S(coef, hi[r], lo[r]);
            g_y[r] = xf_target_grad_of(y_is_max[r], coef, 1.0, hi[r], lo[r], S,
                                       XF_EXP_MINUS((XF_T)x_y[r], m[r]));
        }
        loss[r] = ignored[r] ? 0.0 : ce;
        ok[r] |= ignored[r];
    }
    if (has_grad && D > 0) {
        XF_FN(xf_group_grad_positions)(grad, C, D, kept, f, ok, ignored, target, g_y, 1, 1);
    } else if (has_grad) {
        long long j_vec = 0;
#if defined(__AVX2__)
        j_vec = XF_FN(xf_group_grad_columns)(&kept[0][0], C, f, ok, ignored, grad);
#endif
        XF_FN(xf_group_grad_rows)(grad, C, kept, f, ok, ignored, target, g_y, j_vec, 1, 1);
    }
    for (r = 0; r < R; r++) {
        done |= (unsigned)(ok[r] != 0) << r;
    }
    return done;
}

/* The rows whose loss takes the loss-terms pass, label smoothing (index targets, eps > 0) or probability
 * targets (t, has_t; smoothed or not), and the rows with a z-loss (z != 0, with or without the pass),
 * XF_GROUP_ROWS of them side by side, with the row kernel's bits.  A row of few classes spent most of its
 * time in the loss-terms pass's bookkeeping, one row at a time: a chunk shorter than XF_CHUNK, the
 * argmax's and the target's terms redone, two lane merges of seven dependent double-double additions
 * (~200 ns a row of 21 float32 classes on one core, 7x the same row without smoothing;
 * benchmarks/README.md, 2026-12-07, sixth round).  Here the statistics are
 * xf_group_stats's, and each row gets the job the row kernel gives it (xf_rowjob_set_max, _plan,
 * _set_sum_log on the same numbers), then the terms go across the rows, element j into lane j % XF_LANES
 * in class order as xf_xent_terms_block adds them, by the operations of xf_xent_terms_chunk, with the
 * argmax's and the target's terms from xf_xent_term as that pass takes them; the lanes merge as
 * xf_lanes_to_dd does, and xf_terms_merge, float64's tiny-loss rerun, the z-loss's logsumexp and
 * xf_rowjob_finish run per row.
 * The gradient is xf_xent_grad_general's ordinary form from the kept exponentials.  Only rows whose
 * entries are all finite (C_eff = C) within the groups' spread, whose masses take no rare form (a mass
 * below 2^-969: xf_xent_terms_chunk's slow chunk; xf_index_masses_may_underflow) and, with a gradient,
 * whose coefficient is finite without its power of two (coef_mult = 1); the others go back to the row
 * kernel; float32 rows of probability targets also where one of them is negative (the row kernel's
 * compensated lanes there, xf_terms_plain), and in torch's layout (D > 0, xf_short_rows) float64 rows
 * whose sum or loss the row kernel would redo from the row itself (xf_rowjob_rescue_tiny_sum,
 * xf_rowjob_tiny_loss_row), and z-loss rows whose logsumexp the row kernel would take from the row
 * (xf_row_z_lse: m + log S or A + 2 z r lse cancelling).  Ignored rows count as done (loss 0, gradient 0). */
XF_KERNEL inline __attribute__((always_inline)) unsigned XF_FN(xf_short_rows_terms_form)(
    const XF_T *x, const XF_T *t, XF_T *grad, long long C, long long D, const int64_t *y, long long ignore_index,
    const double *w, double loss_scale, double scale, const double *row_scale, double *loss, double eps, double z,
    double w_min_pos, const int has_grad, const int has_w, const int has_t, const int has_z)
{
    enum { R = XF_GROUP_ROWS };
    XF_T xt[XF_GROUP_BUF_C][R];
    /* the target probabilities, transposed as xt (has_t) */
    XF_T tt[XF_GROUP_BUF_C][R];
    /* float32's logits and target probabilities as doubles (xd, td), so that the loss-terms loop below
     * loads no float, whose 32-bit lanes made gcc take it in 256-bit vectors, each double operation
     * twice (its avx512 loop 95 -> 35 instructions a class of the group; float32 smoothing, two threads,
     * ms, forward 131072x21 3.60 -> 3.23, 32768x100 2.19 -> 1.93, fused 5.11 -> 4.53, 3.06 -> 2.67).
     * Probability targets need their mass test in doubles as well (xf_target_mass_min): with td alone,
     * its int lanes kept the loop at 256 bits and no faster (benchmarks/README.md, 2026-12-07, ninth and
     * tenth rounds).  xf_short_rows calls this form within XF_GROUP_TERMS_MAX_C classes. */
#if XF_COMPENSATED
    double (*const xd)[R] = xt;
    double (*const td)[R] = tt;
#else
    double xd[XF_GROUP_TERMS_MAX_C(0)][R];
    double td[XF_GROUP_TERMS_MAX_C(1)][R];
#endif
    /* the exponentials as the row kernel keeps them, then the gradient's entries in their place */
    double kept[XF_GROUP_BUF_C][R];
    double m[R], mn[R], hi[R], lo[R], log_s[R], epc[R], cps[R], scale_r[R], g_y[R];
    double term_am[R], q_am[R], term_y[R], q_y[R];
    double acc[XF_LANES][R], cmp[XF_LANES][R], qacc[XF_LANES][R], qcmp[XF_LANES][R];
    long long argmax[R], target[R];
    int ok[R], ignored[R];
    /* the rare-mass test's least |q| and the negative-target test as doubles, lanes of the loop's width */
    double q_least[R], nonneg[R];
    xf_rowjob jobs[R];
    unsigned done = 0;
    long long j;
    int r, k;
    /* the z-loss alone (has_z: z != 0; index targets, no smoothing) has no loss-terms pass:
     * xf_rowjob_finish reads no terms then (needs_terms), and the lanes stay 0 */
    const int needs_terms = !has_z || has_t || eps != 0.0;
    const long long terms_c = needs_terms ? C : 0;
    XF_FN(xf_group_stats)(x, C, D, xt, kept, m, hi, lo, argmax, ok, has_grad ? 600.0 : XF_NORMAL_SPREAD, has_grad,
                          0);
#pragma omp simd
    for (r = 0; r < R; r++) {
        log_s[r] = xf_row_log_S(hi[r], lo[r]);
        mn[r] = m[r];
    }
    /* the max pass's min_finite, across the rows (row by row, a scalar chain over the column stride: 57 %
     * of a group of 256 float32 classes) */
    for (j = 0; j < C; j++) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            const double v = (double)xt[j][r];
            mn[r] = (v < mn[r]) ? v : mn[r];
        }
    }
    if (has_t && D > 0) {
        /* torch's layout: the targets lie as the logits do, a class's entries of the group adjacent */
        for (j = 0; j < C; j++) {
#pragma omp simd
            for (r = 0; r < R; r++) {
                tt[j][r] = t[j * D + r];
            }
        }
    } else if (has_t) {
        for (j = 0; j < C; j++) {
            for (r = 0; r < R; r++) {
                tt[j][r] = t[r * C + j];
            }
        }
    }
#if !XF_COMPENSATED
    for (j = 0; j < C; j++) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            xd[j][r] = (double)xt[j][r];
        }
    }
    for (j = 0; j < C && has_t; j++) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            td[j][r] = (double)tt[j][r];
        }
    }
#endif
    for (r = 0; r < R; r++) {
        xf_rowjob *job = &jobs[r];
        /* probability targets: no target index (-1), nothing ignored */
        const long long y_r = has_t ? -1 : (long long)y[r];
        ignored[r] = !has_t && (y_r == ignore_index);
        target[r] = ignored[r] ? 0 : y_r;
        scale_r[r] = row_scale ? scale * row_scale[r] : scale;
        /* _row_job_init, then what xf_xent_row's passes leave in the job of a row whose entries are all
         * finite: the max pass's statistics (n_finite = C; min_finite, which only the plan's stored
         * form and the scaled float64 gradient read, both out of reach within the spread), the plan,
         * the sum and its logarithm */
        xf_rowjob_init(job, target[r], (has_w && !has_t) ? w[target[r]] : 1.0, eps, has_z ? z : 0.0, scale_r[r],
                       loss_scale, has_t);
        job->w_min_pos = w_min_pos;
        xf_rowmax st;
        st.m = m[r];
        st.argmax = argmax[r];
        st.n_nan = 0;
        st.n_finite = C;
        st.min_finite = mn[r];
        xf_rowjob_set_max(job, &st);
        xf_rowjob_set_exp_form(job, C);
        xf_rowjob_plan(job, has_t ? 0.0 : (double)xt[target[r]][r], has_grad);
        xf_rowjob_set_sum_log(job, hi[r], lo[r], log_s[r]);
#if XF_COMPENSATED
        /* in torch's layout (D > 0) the row is not at hand in one piece: the row kernel rescues it */
        if (D > 0) {
            ok[r] &= !xf_rowjob_rescue_wanted(job);
        } else {
            xf_rowjob_rescue_tiny_sum(job, (const double *)(x + r * C), C);
            ok[r] &= !job->rescued;
        }
#endif
        ok[r] &= (job->status == XF_ROW_OK) & (job->exp_normal == 1);
        epc[r] = job->eps_per_class;
        /* the pass's two terms it takes from xf_xent_term: the argmax's, then the target's (a simd loop of
         * their own measured no faster) */
        term_am[r] = q_am[r] = term_y[r] = q_y[r] = 0.0;
        if (needs_terms) {
            term_am[r] = xf_xent_term(job, argmax[r], (double)xt[argmax[r]][r], has_w ? w[argmax[r]] : 1.0,
                                      has_t ? (double)tt[argmax[r]][r] : 0.0, &q_am[r]);
        }
        if (needs_terms && !has_t) {
            term_y[r] = xf_xent_term(job, target[r], (double)xt[target[r]][r], has_w ? w[target[r]] : 1.0, 0.0,
                                     &q_y[r]);
        }
        q_least[r] = XF_INF;
        nonneg[r] = 1.0;
        if (needs_terms && !has_t && has_w) {
            /* the least mass of the row's classes is fl(w_min eps / C_eff), every class being there */
            q_least[r] = XF_FN(xf_terms_chunk_never_slow)(job, has_w) ? XF_INF : 0.0;
        }
    }
    for (k = 0; k < XF_LANES; k++) {
        for (r = 0; r < R; r++) {
            acc[k][r] = cmp[k][r] = qacc[k][r] = qcmp[k][r] = 0.0;
        }
    }
    const double ls = loss_scale;
    for (j = 0; j < terms_c; j++) {
        k = (int)(j % XF_LANES);
        const double wc = has_w ? w[j] : 1.0;
#pragma omp simd
        for (r = 0; r < R; r++) {
            /* xf_xent_terms_chunk's loops.  Every entry of a row kept is finite and within the spread
             * (xf_group_stats), so fin = 1 and -log p_j is finite there: of its slow chunks' tests only a
             * q with mass below 2^-969 remains (the row's least such |q|, q_least), and the others' values
             * do not matter (their rows go back).  The tests as ints across rows of doubles cost a
             * repacking of lanes for each (float32 label smoothing, two threads, forward, ms: 32768x100
             * 2.65 -> 2.17, 131072x21 3.88 -> 3.47; benchmarks/README.md, 2026-12-07, ninth round) */
            const double xv = xd[j][r];
            const double fin = 1.0;
            const double tj = has_t ? td[j][r] : 0.0;
            double q = xf_target_q_other(has_t, eps, epc[r], wc, fin, tj);
            const double nlp = xf_neg_log_prob(xv, m[r], log_s[r]);
            /* probability targets: the mass test as a double, no int lanes in the loop (above) */
            const double mass_min = has_t ? xf_target_mass_min(eps, epc[r], wc, fin, tj) : 0.0;
            /* class weights under smoothing: has_mass is q > 0 (eps / C_eff > 0, w_j >= 0, every entry
             * finite) and the rare-mass test the row's (xf_terms_chunk_never_slow, before the loop), where
             * the int test and the least |q| per entry cost a quarter of the forward call (20971x100,
             * benchmarks/README.md, 2026-12-07, eleventh round); without weights these measured 3-6 %
             * faster than the row's test */
            const int has_mass = has_t ? (mass_min > 0.0)
                                       : (has_w ? (q > 0.0)
                                                : xf_target_has_mass_from(has_t, eps, epc[r], 0, 0.0, wc, fin, tj));
            double tb = has_mass ? (q * ls) * nlp : 0.0;
            if (has_t || !has_w) {
                const double q_tested = has_t ? (((q != 0.0) | (mass_min > 0.0)) ? xf_fabs(q) : XF_INF)
                                              : (has_mass ? q : XF_INF);
                q_least[r] = (q_tested < q_least[r]) ? q_tested : q_least[r];
                nonneg[r] = (has_t && !(tj >= 0.0)) ? 0.0 : nonneg[r];
            }
            tb = (j == argmax[r]) ? term_am[r] : ((j == target[r]) ? term_y[r] : tb);
            q = (j == argmax[r]) ? q_am[r] : ((j == target[r]) ? q_y[r] : q);
#if XF_COMPENSATED
            xf_acc_add(&acc[k][r], &cmp[k][r], tb);
            xf_acc_add(&qacc[k][r], &qcmp[k][r], q);
#else
            acc[k][r] += tb;
            qacc[k][r] += q;
#endif
        }
    }
    /* the lanes' merges side by side, as xf_group_stats makes the sums' */
    double blk[4][R];
    if (needs_terms) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            xf_lanes_to_dd_strided(&acc[0][r], &cmp[0][r], R, &blk[0][r], &blk[1][r]);
            xf_lanes_to_dd_strided(&qacc[0][r], &qcmp[0][r], R, &blk[2][r], &blk[3][r]);
        }
    } else {
        for (k = 0; k < 4; k++) {
            for (r = 0; r < R; r++) {
                blk[k][r] = 0.0;
            }
        }
    }
    /* the z-loss's logarithms (xf_rowjob_z_lse) side by side, as the sums' */
    double z_log[R], z_log_lo[R];
    if (has_z) {
#pragma omp simd
        for (r = 0; r < R; r++) {
            z_log[r] = xf_log1p_hilo(hi[r], &z_log_lo[r]);
        }
    }
    for (r = 0; r < R; r++) {
        xf_rowjob *job = &jobs[r];
        double terms[4] = {0.0, 0.0, 0.0, 0.0};
        const double row_blk[4] = {blk[0][r], blk[1][r], blk[2][r], blk[3][r]};
        xf_terms_merge(terms, row_blk);
#if XF_COMPENSATED
        if (D > 0) {
            ok[r] &= !xf_rowjob_tiny_loss_wanted(job, terms);
        } else {
            xf_rowjob_tiny_loss_row(job, (const double *)(x + r * C), has_t ? (const double *)(t + r * C) : 0, w,
                                    C, terms);
        }
#endif
        if (has_z && job->status == XF_ROW_OK) {
            /* xf_row_z_lse's first level, from the row's numbers alone; its exact logsumexp (where m + log S
             * cancels) and its second level (where A + 2 z r lse does) read the row again: those rows go
             * back to the row kernel */
            if (xf_rowjob_lse_cancels(job)) {
                ok[r] = 0;
            } else {
                xf_rowjob_z_lse_from_log(job, z_log[r], z_log_lo[r]);
                ok[r] &= !xf_rowjob_z_cancels(job, terms, !XF_COMPENSATED);
            }
        }
        const double ce = xf_rowjob_finish(job, terms);
        /* float32 probability rows with a negative target sum their terms compensated (xf_terms_plain) */
        ok[r] &= !(q_least[r] < 0x1p-969) & (XF_COMPENSATED || (nonneg[r] != 0.0));
        loss[r] = ignored[r] ? 0.0 : ce;
        if (has_grad) {
            /* xf_xent_grad_general_for's ordinary form (apart = 0) and its target entry */
            ok[r] &= (job->coef_mult == 1.0) & (job->coef - job->coef == 0.0) & !job->grad_scaled &
                     (has_t || !XF_FN(xf_index_masses_may_underflow)(job, w));
            cps[r] = job->coef_per_S;
            if (!has_t) {
                const double w_y = has_w ? w[target[r]] : 1.0;
                const double q_t = xf_row_target_q(job, target[r], w_y, 1.0, 1.0);
                g_y[r] = xf_general_grad_entry(
                    XF_EXP_MINUS(xt[target[r]][r], m[r]) * cps[r], job->coef_mult,
                    xf_target_grad_q_from(0, eps, epc[r], scale_r[r], q_t, w_y, 1.0, 1.0, 1), q_t, scale_r[r],
                    job->coef_mult);
            }
        }
        ok[r] |= ignored[r];
    }
    if (has_grad) {
        long long j_vec = 0;
        for (j = 0; j < C; j++) {
            const double wc = has_w ? w[j] : 1.0;
#pragma omp simd
            for (r = 0; r < R; r++) {
                const double tj = has_t ? td[j][r] : 0.0;
                const double q = xf_target_q_other(has_t, eps, epc[r], wc, 1.0, tj);
                const double sq = xf_target_grad_q_from(has_t, eps, epc[r], scale_r[r], q, wc, 1.0, tj, 0);
                /* coef_mult is 1 in the rows kept: (e cps) 1 - sq, the row kernel's operations */
                kept[j][r] = (kept[j][r] * cps[r]) * 1.0 - sq;
            }
        }
        if (D > 0) {
            XF_FN(xf_group_grad_positions)(grad, C, D, kept, cps, ok, ignored, target, g_y, 0, !has_t);
        } else {
#if defined(__AVX2__)
            /* the entries are the doubles to round once: times 1.0, exactly */
            double ones[R];
            for (r = 0; r < R; r++) {
                ones[r] = 1.0;
            }
            j_vec = XF_FN(xf_group_grad_columns)(&kept[0][0], C, ones, ok, ignored, grad);
#endif
            XF_FN(xf_group_grad_rows)(grad, C, kept, cps, ok, ignored, target, g_y, j_vec, 0, !has_t);
        }
    }
    for (r = 0; r < R; r++) {
        done |= (unsigned)(ok[r] != 0) << r;
    }
    return done;
}

/* logsumexp (mode 0, into lse), log_softmax (mode 1) or softmax (mode 2) of XF_GROUP_ROWS rows side by
 * side, with the bits of _xent.pyx's _softmax_family_row: its row statistics as xf_group_stats takes
 * them, then xf_rowjob_set_sum's lse (rows where it cancels, xf_rowjob_lse_cancels, are handed back to
 * the row path's exact logsumexp), log_softmax's xf_log_softmax_block over each row as it lies (an
 * entry needs its own logit and its row's statistics only), or softmax as xf_xent_row's gradient of a
 * row without a target (each kept exponential times 1 / S, xf_stored_entry) written back through the
 * transposition.  Returns the rows done as a bit mask; the others (not finite, a spread beyond the
 * unclamped exponentials, a rescued float64 sum) are the caller's, and nothing of theirs is written but
 * their lse, which the caller's row path writes again. */
XF_KERNEL inline __attribute__((always_inline)) unsigned XF_FN(xf_short_rows_family_form)(
    const XF_T *x, XF_T *out, double *lse, long long C, long long D, const int mode)
{
    enum { R = XF_GROUP_ROWS };
    XF_T xt[XF_GROUP_BUF_C][R];
    /* softmax's exponentials, the doubles the row path keeps (xf_xent_row) */
    double kept[XF_GROUP_BUF_C][R];
    double m[R], hi[R], lo[R], f[R];
    long long argmax[R];
    int ok[R];
    unsigned done = 0;
    long long j;
    int r;
    long long j_vec = 0;
    const int any_masked = XF_FN(xf_group_stats)(x, C, D, xt, kept, m, hi, lo, argmax, ok, XF_NORMAL_SPREAD,
                                                 mode == 2, 2);
    if (mode != 2) {
        /* the rows' logarithms side by side, one vector for the group (in the loop of rows below, beside
         * the call, each row's log1p ran scalar: a fifth of a float32 log_softmax group of 100 classes) */
        double log_s[R];
#pragma omp simd
        for (r = 0; r < R; r++) {
            log_s[r] = xf_row_log_S(hi[r], lo[r]);
            if (mode == 0) {
                const double row_lse = m[r] + log_s[r];
                ok[r] &= !(log_s[r] > 2.0 * xf_fabs(row_lse));
                /* every row's, unconditionally (a store under the test became a masked store): the row
                 * path writes the rows handed back again */
                lse[r] = row_lse;
            }
        }
        if (mode == 1 && D > 0) {
            /* torch's layout: each class's entries of the group as one vector, every row's (the caller
             * writes the rows handed back again) */
            XF_FN(xf_log_softmax_columns)(xt, out, C, D, m, log_s, !any_masked);
        }
        for (r = 0; r < R; r++) {
            if (mode == 1 && D == 0 && ok[r]) {
                XF_FN(xf_log_softmax_block)(x + r * C, out + r * C, C, m[r], log_s[r], !any_masked);
            }
            done |= (unsigned)(ok[r] != 0) << r;
        }
        return done;
    }
    for (r = 0; r < R; r++) {
        /* the row path's factor: coef_per_S = xf_rowjob_div_S(job, 1), coef_mult 1 (xf_rowjob_finish) */
        f[r] = xf_div_S(1.0, hi[r], lo[r]);
    }
    if (D > 0) {
        /* torch's layout: each class's entries of the group as one vector, every row's (the caller writes
         * the rows handed back again) */
        for (j = 0; j < C; j++) {
#pragma omp simd
            for (r = 0; r < R; r++) {
                out[j * D + r] = XF_FN(xf_stored_entry)(kept[j][r], f[r], 1.0);
            }
        }
        for (r = 0; r < R; r++) {
            done |= (unsigned)(ok[r] != 0) << r;
        }
        return done;
    }
#if defined(__AVX2__)
    {
        int ignored[R];
        for (r = 0; r < R; r++) {
            ignored[r] = 0; /* the write-back's rows to skip besides those not ok: none */
        }
        j_vec = XF_FN(xf_group_grad_columns)(&kept[0][0], C, f, ok, ignored, out);
    }
#endif
    for (r = 0; r < R; r++) {
        if (ok[r]) {
            for (j = j_vec; j < C; j++) {
                /* xf_stored_entry, one rounding of e_j / S */
                out[r * C + j] = XF_FN(xf_stored_entry)(kept[j][r], f[r], 1.0);
            }
        }
    }
    for (r = 0; r < R; r++) {
        done |= (unsigned)(ok[r] != 0) << r;
    }
    return done;
}

/* the table's entry: logsumexp within the forward pass's limits, and log_softmax too (the same
 * statistics; it then writes each row as the row path does) but on the avx2 unit's float32 rows, where
 * it stops at 128 (below); softmax, which keeps its exponentials, within
 * the fused pass's and at most XF_GROUP_FAMILY_MAX_C(2) classes, since its groups write every entry back
 * through the transposition: against the row path (one core, float32, 4096 rows, us, rows -> groups)
 * they gained up to 160 classes and lost beyond (softmax 128 1113-1122 -> 915-936, 160 1293-1336 ->
 * 1143-1195, 200 1520-1534 -> 1494-1551, 256 1793-1813 -> 1925-1995); in the avx512 unit, with its
 * 512-bit groups (4096 rows): float32 softmax C = 176 981 -> 859, 192 945 -> 991; float64 (2^21
 * entries) softmax 100 5454 -> 4785, 128 4438 -> 4833.  log_softmax's groups (one core, ns per entry,
 * 2^22 float32 or 2^21 float64 entries, rows -> groups, benchmarks/README.md, 2026-12-05, sixth round):
 * avx512 float32 C = 128 1.58 -> 1.06, 192 1.25 -> 1.02, 256 1.19 -> 1.06, float64 128 2.69 -> 2.35,
 * 160 2.61 -> 2.42; avx2 float32 C = 128 1.66-1.73 -> 1.62-1.64, 136 1.60-1.63 -> 1.61-1.62, 144
 * 1.57-1.58 -> 1.61-1.63, 160 1.49-1.51 -> 1.57-1.60, so the avx2 unit's stop at 128, the last width
 * measured faster (float64 at its forward limit, 64).  Once the groups fetched the next group during
 * their sum pass, softmax's avx512 groups measured again (same units, seventh round): float32 C = 192
 * 1.39 -> 0.99, 200 1.34 -> 0.97, 224 1.39 -> 0.98, 256 1.19-1.20 -> 0.94-0.97; float64 128
 * 2.37-2.57 -> 2.01-2.16, 160 2.45-2.52 -> 2.11-2.13, 192 2.12 -> 2.18 (minima), so they take the
 * fused pass's limits there.  Else 0 (no row done).  lse: mode 0's output, the group's first row first. */
#if defined(__AVX512F__)
#define XF_GROUP_FAMILY_MAX_C(mode) XF_GROUP_MAX_C
#else
#define XF_GROUP_FAMILY_MAX_C(mode) ((mode) == 1 ? 128 : 160)
#endif
XF_KERNEL unsigned XF_FN(xf_short_rows_family)(const XF_T *x, XF_T *out, double *lse, long long C, long long D,
                                               int mode)
{
    /* torch's layout (D > 0) has no transposition to pay for: every width the groups' buffers hold */
    if (C < 1 || C > XF_GROUP_C_LIMIT(mode == 2) || (D == 0 && mode != 0 && C > XF_GROUP_FAMILY_MAX_C(mode))) {
        return 0;
    }
    if (mode == 0) {
        return XF_FN(xf_short_rows_family_form)(x, out, lse, C, D, 0);
    }
    if (mode == 1) {
        return XF_FN(xf_short_rows_family_form)(x, out, lse, C, D, 1);
    }
    if (mode == 2) {
        return XF_FN(xf_short_rows_family_form)(x, out, lse, C, D, 2);
    }
    return 0;
}

/* grad (or NULL: the loss alone) may be x itself: the group reads its rows whole before it writes them.
 * row_scale (or NULL) is the group's own (its first row's entry first).  t (or NULL): probability targets
 * in x's layout, y then unread (may be NULL); eps: label smoothing; w_min_pos: xf_rowjob's.  D: 0, row r
 * at x + r C (and grad's, t's), else torch's layout, row r's class j at x[j D + r] (and grad's, t's). */
XF_KERNEL unsigned XF_FN(xf_short_rows)(const XF_T *x, const XF_T *t, XF_T *grad, long long C, long long D,
                                        const int64_t *y, long long ignore_index, const double *w, double loss_scale,
                                        double scale, const double *row_scale, double *loss, double eps, double z,
                                        double w_min_pos)
{
    if (C < 1 || C > XF_GROUP_C_LIMIT(grad != 0)) {
        return 0;
    }
    if (eps != 0.0 || t || z != 0.0) {
        if (C > XF_GROUP_TERMS_MAX_C(t != 0)) {
            return 0;
        }
        /* the z-loss a literal too: its code in the rows without it (the row's logarithms side by side,
         * its per-row level, the terms pass made optional) measured 6-7 % slower there (65536x32 float32
         * smoothing forward, one thread, 3.31-3.34 -> 3.52-3.58 ms) */
#define XF_TERMS_FORM(G, HW, HT, HZ)                                                                        \
    XF_FN(xf_short_rows_terms_form)(x, t, grad, C, D, y, ignore_index, w, loss_scale, scale, row_scale, loss,  \
                                    eps, z, w_min_pos, G, HW, HT, HZ)
#define XF_TERMS_FORM_Z(G, HW, HT) ((z != 0.0) ? XF_TERMS_FORM(G, HW, HT, 1) : XF_TERMS_FORM(G, HW, HT, 0))
        if (t) {
            if (grad) {
                return w ? XF_TERMS_FORM_Z(1, 1, 1) : XF_TERMS_FORM_Z(1, 0, 1);
            }
            return w ? XF_TERMS_FORM_Z(0, 1, 1) : XF_TERMS_FORM_Z(0, 0, 1);
        }
        if (grad) {
            return w ? XF_TERMS_FORM_Z(1, 1, 0) : XF_TERMS_FORM_Z(1, 0, 0);
        }
        return w ? XF_TERMS_FORM_Z(0, 1, 0) : XF_TERMS_FORM_Z(0, 0, 0);
#undef XF_TERMS_FORM_Z
#undef XF_TERMS_FORM
    }
    if (grad) {
        return XF_FN(xf_short_rows_form)(x, grad, C, D, y, ignore_index, w, loss_scale, scale, row_scale, loss, 1);
    }
    return XF_FN(xf_short_rows_form)(x, 0, C, D, y, ignore_index, w, loss_scale, scale, row_scale, loss, 0);
}

#undef XF_FN
#undef XF_CAT
#undef XF_CAT_
#undef XF_GROUP_C_LIMIT
#undef XF_GROUP_CHAINS_FROM_C
#undef XF_GROUP_FAMILY_MAX_C
#undef XF_GROUP_BUF_C
#undef XF_GROUP_TERMS_MAX_C
#undef XF_STREAMED_ROWS
#undef XF_STREAM_LANES
#undef XF_EXP_MINUS
#undef XF_EXP_MINUS_NORMAL
#undef XF_EXP_MINUS_MASKED
#undef XF_EXP_FORM
#undef XF_GROUP_WIDE_ENTRIES
#undef XF_CHUNK
#undef XF_MAX_LANES
