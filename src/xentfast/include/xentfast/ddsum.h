/* xentfast/ddsum.h: the double-double sum of a float64 vector (reductions of per-element and per-row
 * losses), one fixed-shape algorithm for the CPU (xentfast._core._xent.dd_sum, OpenMP) and the GPU
 * (xentfast._cuda.dd_sum, reduce.cu).
 *
 * Shape, fixed by the length n alone (never by a thread count or a launch shape):
 *   1. blocks of XF_DDSUM_BLOCK consecutive elements, the last one possibly shorter.  Inside a block,
 *      element i (counted from the block's start) goes to lane i % XF_DDSUM_LANES; each lane sums its
 *      elements in index order from (0, 0) with xf_acc_add (a plain running sum, the TwoSum error of
 *      each addition summed beside it), and the lanes merge as double-doubles (xf_dd_add) in the same
 *      fixed pairwise tree as step 2 (lane k absorbs lane k + s, s = 1, 2, 4), giving the block's
 *      partial (hi, lo) (xf_ddsum_block).  Independent lanes, because one chain of dependent additions
 *      waits on their latency at every element (one chain of xf_dd_adds: ~4.8 ns per element on one
 *      core, the bulk of a `mean` over the binary family's per-element losses); and xf_acc_add rather
 *      than xf_dd_add inside a lane, because only its running sum is a dependent chain (one addition,
 *      not xf_dd_add's seven): 1.17 -> 0.61 ns per element on one core;
 *   2. the partials merge in a fixed pairwise tree: at level s = 1, 2, 4, ... (while s < nb) partial i
 *      absorbs partial i + s for every i that is a multiple of 2s with i + s < nb (xf_ddsum_merge);
 *      the result is partial 0.
 * Each merge is one xf_dd_add of two (hi, lo) pairs and the merges of a level touch disjoint pairs, so a
 * level may run in any order or in parallel: every operation sees the same operands on every device and
 * every thread count, and CPU and GPU give the same bits.  A vector of at most XF_DDSUM_BLOCK elements is
 * one block, and one of at most three elements is the plain index-order double-double sum.
 *
 * Accuracy.  A lane of m = XF_DDSUM_BLOCK / XF_DDSUM_LANES = 128 terms: its running sum plus its error
 * sum is the exact sum up to the roundings of the error sum, at most gamma_{m-1}^2 sum |v| (Ogita, Rump
 * and Oishi's Sum2 before its final rounding; gamma_k = k u / (1 - k u), u = 2^-53), about
 * 127^2 2^-106 < 2^11 2^-103 of the lane's sum |v|, whatever the signs.  Each xf_dd_add of the merges
 * adds about 2^-103 of its operands' magnitudes, and a term passes log2 XF_DDSUM_LANES lane merges and
 * ceil(log2 nb) block merges, so
 *     |hi + lo - sum| <= (2^11 + 3 + ceil(log2 nb)) * 2^-103 * sum |v|:
 * ~2^-92 relative for any n that fits in memory, far below the 2^-53 of the final rounding of the mean
 * / sum (the <= 4 ULP contract keeps its margin).
 *
 * Limits (as the serial sum): a NaN term makes the sum NaN; +inf and -inf terms together make it NaN;
 * one sign of infinity (and no NaN) gives that infinity; finite terms of one sign whose sum overflows
 * give that infinity (xf_dd_add keeps an infinite hi with lo = 0).  Only finite terms of BOTH signs
 * whose partial sums overflow could come out otherwise than in index order; the callers reduce
 * non-negative losses.
 */
#ifndef XENTFAST_DDSUM_H
#define XENTFAST_DDSUM_H

#include "numerics.h"

#define XF_DDSUM_BLOCK 1024
#define XF_DDSUM_LANES 8

#if !defined(__CUDACC__) && defined(__FMA__) && (defined(__AVX512F__) || defined(__AVX2__))
#include <immintrin.h>
#define XF_DDSUM_FMA_LANES 1
#else
#define XF_DDSUM_FMA_LANES 0
#endif

/* number of blocks of a vector of n elements (0 for n = 0) */
XF_HD long long xf_ddsum_nblocks(long long n) { return (n + XF_DDSUM_BLOCK - 1) / XF_DDSUM_BLOCK; }

#if XF_DDSUM_FMA_LANES
/* Step 1's lanes (xf_acc_add on each, in index order) where the CPU has the fused multiply-add: the values
 * xf_acc_add gives, but four of the nine operations per step (TwoSum's three differences other than
 * a - (s - bb), and the guard's s - s) written as fma(y, -1, x), which is x - y rounded once, the same
 * result in every case (signed zeros, infinities and NaN included).  AMD's Zen cores execute additions
 * on two pipes and multiply-adds on two others; as additions the nine kept the two adder pipes busy
 * about 8 cycles per eight elements on Zen 4 (an eighth of a float32 BCE `mean` call on one core),
 * split this way each pair gets about half.  The running sum stays an addition: it is the dependent
 * chain.  The -1 reaches the instructions through an empty asm, so that no compiler turns them back
 * into subtractions.  Returns the first element after the whole lane steps. */
static inline __attribute__((always_inline)) long long xf_ddsum_lanes_fma(const double *v, long long off,
                                                                         long long end, double *hi, double *lo)
{
    long long i;
#if defined(__AVX512F__)
    __m512d minus_one = _mm512_set1_pd(-1.0);
    __asm__("" : "+v"(minus_one));
    __m512d acc = _mm512_loadu_pd(hi), err = _mm512_loadu_pd(lo);
    for (i = off; i + XF_DDSUM_LANES <= end; i += XF_DDSUM_LANES) {
        const __m512d b = _mm512_loadu_pd(v + i);
        const __m512d s = _mm512_add_pd(acc, b);
        const __m512d bb = _mm512_fmadd_pd(acc, minus_one, s);
        const __mmask8 finite =
            _mm512_cmp_pd_mask(_mm512_fmadd_pd(s, minus_one, s), _mm512_setzero_pd(), _CMP_EQ_OQ);
        const __m512d a_err = _mm512_sub_pd(acc, _mm512_fmadd_pd(bb, minus_one, s));
        const __m512d b_err = _mm512_fmadd_pd(bb, minus_one, b);
        err = _mm512_add_pd(err, _mm512_maskz_add_pd(finite, a_err, b_err));
        acc = s;
    }
    _mm512_storeu_pd(hi, acc);
    _mm512_storeu_pd(lo, err);
#else
    __m256d minus_one = _mm256_set1_pd(-1.0);
    __asm__("" : "+x"(minus_one));
    __m256d acc[2], err[2];
    int h;
    for (h = 0; h < 2; h++) {
        acc[h] = _mm256_loadu_pd(hi + 4 * h);
        err[h] = _mm256_loadu_pd(lo + 4 * h);
    }
    for (i = off; i + XF_DDSUM_LANES <= end; i += XF_DDSUM_LANES) {
        for (h = 0; h < 2; h++) {
            const __m256d b = _mm256_loadu_pd(v + i + 4 * h);
            const __m256d s = _mm256_add_pd(acc[h], b);
            const __m256d bb = _mm256_fmadd_pd(acc[h], minus_one, s);
            const __m256d finite = _mm256_cmp_pd(_mm256_fmadd_pd(s, minus_one, s), _mm256_setzero_pd(), _CMP_EQ_OQ);
            const __m256d a_err = _mm256_sub_pd(acc[h], _mm256_fmadd_pd(bb, minus_one, s));
            const __m256d b_err = _mm256_fmadd_pd(bb, minus_one, b);
            err[h] = _mm256_add_pd(err[h], _mm256_and_pd(finite, _mm256_add_pd(a_err, b_err)));
            acc[h] = s;
        }
    }
    for (h = 0; h < 2; h++) {
        _mm256_storeu_pd(hi + 4 * h, acc[h]);
        _mm256_storeu_pd(lo + 4 * h, err[h]);
    }
#endif
    return i;
}
typedef char xf_ddsum_lanes_fma_wants_8_lanes[(XF_DDSUM_LANES == 8) ? 1 : -1];
#endif

/* step 1: partial b of v[0 .. n) into part[2b], part[2b + 1] (hi, lo) */
XF_HD void xf_ddsum_block(const double *v, long long n, long long b, double *part)
{
    const long long off = b * XF_DDSUM_BLOCK;
    const long long end = (n - off < XF_DDSUM_BLOCK) ? n : off + XF_DDSUM_BLOCK;
    double hi[XF_DDSUM_LANES], lo[XF_DDSUM_LANES];
    long long i;
    int k, s;
    for (k = 0; k < XF_DDSUM_LANES; k++) {
        hi[k] = 0.0;
        lo[k] = 0.0;
    }
#if XF_DDSUM_FMA_LANES
    i = xf_ddsum_lanes_fma(v, off, end, hi, lo);
#else
    for (i = off; i + XF_DDSUM_LANES <= end; i += XF_DDSUM_LANES) {
#pragma omp simd
        for (k = 0; k < XF_DDSUM_LANES; k++) {
            xf_acc_add(&hi[k], &lo[k], v[i + k]);
        }
    }
#endif
    for (k = 0; i + k < end; k++) {
        xf_acc_add(&hi[k], &lo[k], v[i + k]);
    }
    for (s = 1; s < XF_DDSUM_LANES; s *= 2) {
        for (k = 0; k + s < XF_DDSUM_LANES; k += 2 * s) {
            xf_dd_add(&hi[k], &lo[k], hi[k + s], lo[k + s]);
        }
    }
    part[2 * b] = hi[0];
    part[2 * b + 1] = lo[0];
}

/* step 2, one merge of level s: partial i absorbs partial i + s */
XF_HD void xf_ddsum_merge(double *part, long long i, long long s)
{
    xf_dd_add(&part[2 * i], &part[2 * i + 1], part[2 * (i + s)], part[2 * (i + s) + 1]);
}

/* step 2, serially: the whole tree over nb >= 1 partials; the sum is left in part[0], part[1] */
XF_HD void xf_ddsum_tree(double *part, long long nb)
{
    long long s, i;
    for (s = 1; s < nb; s *= 2) {
        for (i = 0; i + s < nb; i += 2 * s) {
            xf_ddsum_merge(part, i, s);
        }
    }
}

#endif /* XENTFAST_DDSUM_H */
