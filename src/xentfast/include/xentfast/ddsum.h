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

/* number of blocks of a vector of n elements (0 for n = 0) */
XF_HD long long xf_ddsum_nblocks(long long n) { return (n + XF_DDSUM_BLOCK - 1) / XF_DDSUM_BLOCK; }

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
    for (i = off; i + XF_DDSUM_LANES <= end; i += XF_DDSUM_LANES) {
#pragma omp simd
        for (k = 0; k < XF_DDSUM_LANES; k++) {
            xf_acc_add(&hi[k], &lo[k], v[i + k]);
        }
    }
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
