/* xentfast/ddsum.h: the double-double sum of a float64 vector (reductions of per-element and per-row
 * losses), one fixed-shape algorithm for the CPU (xentfast._core._xent.dd_sum, OpenMP) and the GPU
 * (xentfast._cuda.dd_sum, reduce.cu).
 *
 * Shape, fixed by the length n alone (never by a thread count or a launch shape):
 *   1. blocks of XF_DDSUM_BLOCK consecutive elements, the last one possibly shorter.  Inside a block,
 *      element i (counted from the block's start) goes to lane i % XF_DDSUM_LANES; each lane sums its
 *      elements in index order from (0, 0) with xf_dd_add, and the lanes merge in the same fixed
 *      pairwise tree as step 2 (lane k absorbs lane k + s, s = 1, 2, 4), giving the block's partial
 *      (hi, lo) (xf_ddsum_block).  Independent lanes, because one chain of dependent xf_dd_adds waits on
 *      their latency at every element (measured: ~4.8 ns per element on one core, the bulk of a `mean`
 *      over the binary family's per-element losses);
 *   2. the partials merge in a fixed pairwise tree: at level s = 1, 2, 4, ... (while s < nb) partial i
 *      absorbs partial i + s for every i that is a multiple of 2s with i + s < nb (xf_ddsum_merge);
 *      the result is partial 0.
 * Each merge is one xf_dd_add of two (hi, lo) pairs and the merges of a level touch disjoint pairs, so a
 * level may run in any order or in parallel: every operation sees the same operands on every device and
 * every thread count, and CPU and GPU give the same bits.  A vector of at most XF_DDSUM_BLOCK elements is
 * one block, and one of at most three elements is the plain index-order double-double sum.
 *
 * Accuracy.  For same-sign terms (the losses it reduces), each xf_dd_add has relative error about 2^-104
 * (numerics.h), and an element passes through at most XF_DDSUM_BLOCK / XF_DDSUM_LANES - 1 lane
 * additions, log2 XF_DDSUM_LANES lane merges and ceil(log2 nb) merges, so
 * |hi + lo - sum| <= (XF_DDSUM_BLOCK + log2 nb) * 2^-103 * sum |v| still holds (with room): ~2^-92
 * relative for any n that fits in memory, far below the 2^-53 of the final rounding of the mean / sum
 * (the <= 4 ULP contract keeps its margin).  The index-order sum it replaces had n instead of
 * XF_DDSUM_BLOCK + log2 nb in the same bound, so the tree is never less accurate.
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
            xf_dd_add(&hi[k], &lo[k], v[i + k], 0.0);
        }
    }
    for (k = 0; i + k < end; k++) {
        xf_dd_add(&hi[k], &lo[k], v[i + k], 0.0);
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
