/* xentfast/softmax_row.h: the per-row bookkeeping of the softmax family, shared by the CPU kernels
 * (_core/softmax_rows.h, instantiated in _core/xent_kernels.h) and the CUDA kernels (_cuda/kernels.cu).
 *
 * A row's life: xf_rowjob_init (targets, weights, options) -> max pass -> xf_rowjob_set_max ->
 * xf_rowjob_plan -> sum-of-exponentials pass -> xf_rowjob_set_sum (+ rescue) -> [loss-terms pass] ->
 * xf_rowjob_finish (loss, and the gradient coefficients) -> gradient pass.  The passes themselves are
 * device-specific loops; every number they combine comes from the functions here and in numerics.h.
 */
#ifndef XENTFAST_SOFTMAX_ROW_H
#define XENTFAST_SOFTMAX_ROW_H

#include "numerics.h"
#include "xf_fixed.h"

/* Block of classes that one task handles; fixed, so the merge order never depends on threads. */
#define XF_BLOCK 4096
/* Fixed accumulation lanes inside a block (element j -> lane j % XF_LANES), see softmax_rows.h (b);
 * xf_lanes_to_dd's merge tree is written out for exactly 8. */
#define XF_LANES 8

enum { XF_ROW_OK = 0, XF_ROW_NAN = 1 };

typedef struct {
    double m;            /* max of the non-NaN entries (-inf if none) */
    long long argmax;    /* first index attaining m */
    long long n_nan;     /* NaN entries */
    long long n_finite;  /* entries > -inf (includes +inf; a +inf row is NaN anyway) */
    double min_finite;   /* smallest entry > -inf (+inf if none) */
} xf_rowmax;

typedef struct {
    /* set by xf_rowjob_init */
    long long y;         /* target index, or -1 for probability targets */
    double w_y;          /* weight of the target class (1 without weights) */
    double eps;          /* label smoothing */
    double z;            /* z-loss coefficient */
    double scale;        /* upstream gradient of this row's loss (grad_output, 1/denominator) */
    double loss_scale;   /* power of two applied to the row loss (a mean's 2^-ceil(log2 den)): exact, and
                            keeps weighted losses near DBL_MAX finite when their mean is */
    int prob;            /* probability targets */
    int simple;          /* index target, eps == 0, z == 0: the exact-target-gradient path */
    int needs_terms;     /* loss needs a pass over all classes (probability targets or smoothing) */
    int targets_nonneg;  /* probability targets all >= 0 (xf_terms_plain); set by the row drivers before
                            pass 3, float32 rows only; 0 until then */
    int stored;          /* float64: the sum pass keeps exp(x_j - m) in the gradient buffer, or in a long
                          * row's scratch row (xf_rowjob_plan; CPU softmax_rows.h, XF_STREAMED_ROWS, and
                          * xf_xent_row: rows beyond the plan's spread, out of place) */
    int has_grad;        /* a gradient follows (xf_rowjob_plan; 1 until planned): finish forms coef_per_S */
    double x_y;          /* target logit, read before any pass may overwrite the logits (inplace) */
    /* set by the max pass */
    int status;
    int has_nan;
    double m;
    long long argmax;
    long long n_finite;
    double min_finite;
    double eps_per_class; /* eps / C_eff: smoothing spreads over classes with finite logits */
    int exp_normal;      /* CPU passes may use the unclamped exponentials: 1, or 2 with masked entries,
                            -inf or a finite mask (xf_rowjob_set_exp_form, xf_row_mask_form) */
    /* in the padding after exp_normal: a field that grew the struct made the GPU row kernel spill */
    int prob_terms_never_slow; /* CPU: no entry of the row's probability targets needs the loss-terms
                                * pass's rare forms (softmax_rows.h, xf_prob_terms_never_slow); 0 unless
                                * the row driver found so */
    /* set by the sum pass */
    double s_hi, s_lo;   /* s = sum over j != argmax of exp(x_j - m) */
    double S;            /* 1 + s */
    int rescued;         /* float64, s < 2^-900: s is also held as s_scaled = s * 2^600 */
    int diffs_exact;     /* CPU, float32 rows: m - x_j is exact in double for every finite x_j, so the loss-
                          * terms pass takes -log p_j without TwoSum's error term, the same bits
                          * (softmax_rows.h, xf_row_diffs_exact); 0 unless the row driver found so.  In
                          * the padding after `rescued`: the GPU row kernel spills by the layout (see
                          * log_s_unused) */
    double s_scaled;
    double log_s;        /* log S = log1p(s) */
    double lse;          /* m + log S */
    int log_s_unused;    /* set by the driver after init (0 until then), CPU row kernel: it reads neither
                          * log S, lse nor the loss (softmax without its logsumexp), and the sum pass leaves
                          * the first two NaN rather than spend a scalar log1p and division on them
                          * (softmax_rows.h, xf_row_sum_writing).  Here, not beside the driver's other
                          * fields: the CUDA row kernel, which never reads it, spills by the layout
                          * (tests/test_cuda.py, XENT_KERNEL_SPILL_BYTES): after x_y 44 bytes (budget 32),
                          * here the 28 (float32: 24) it spilled without the field */
    double lse_lo;       /* z-loss rows: lse + lse_lo carries the logsumexp beyond a double (xf_rowjob_z_lse) */
    /* set by finish */
    double coef;         /* gradient: coef * p_j * coef_mult - scale * q_j */
    double coef_mult;    /* power of two kept apart so coef stays finite (logits or upstream near DBL_MAX) */
    double coef_per_S;   /* coef / S rounded once (xf_rowjob_div_S): coef p_j = e_j * coef_per_S */
    int grad_scaled;     /* float64 rows with subnormal p_j and |coef| > 1: see xf_exp_shifted_pow2 */
    int z_exact;         /* GPU row kernel: the z-loss needs what it leaves to a second kernel (kernels.cu) */
    double w_min_pos;    /* CPU: the call's least positive class weight (1 without weights, inf without a
                          * positive one), set by the driver after init; 0: not known (softmax_rows.h,
                          * xf_index_masses_may_underflow) */
} xf_rowjob;

XF_HD void xf_rowmax_init(xf_rowmax *st)
{
    st->m = -XF_INF;
    st->argmax = -1;
    st->n_nan = 0;
    st->n_finite = 0;
    st->min_finite = XF_INF;
}

/* Merge block statistics in block order: a strictly larger max moves the argmax, a tie keeps the
 * earlier index, so the result is the first index of the row's max. */
XF_HD void xf_rowmax_merge(xf_rowmax *st, const xf_rowmax *blk)
{
    if (st->argmax < 0 || blk->m > st->m) {
        st->m = blk->m;
        st->argmax = blk->argmax;
    }
    st->n_nan += blk->n_nan;
    st->n_finite += blk->n_finite;
    st->min_finite = (blk->min_finite < st->min_finite) ? blk->min_finite : st->min_finite;
}

XF_HD void xf_rowjob_init(xf_rowjob *job, long long y, double w_y, double eps, double z, double scale,
                          double loss_scale, int prob)
{
    job->loss_scale = loss_scale;
    job->y = prob ? -1 : y;
    job->w_y = w_y;
    job->eps = eps;
    job->z = z;
    job->scale = scale;
    job->prob = prob;
    job->simple = (!prob && eps == 0.0 && z == 0.0);
    job->needs_terms = (prob || eps != 0.0);
    job->targets_nonneg = 0;
    job->prob_terms_never_slow = 0;
    job->stored = 0;
    job->has_grad = 1;
    job->x_y = 0.0;
    job->status = XF_ROW_OK;
    job->has_nan = 0;
    job->m = 0.0;
    job->argmax = 0;
    job->n_finite = 0;
    job->min_finite = XF_INF;
    job->eps_per_class = 0.0;
    job->rescued = 0;
    job->diffs_exact = 0;
    job->s_scaled = 0.0;
    job->grad_scaled = 0;
    job->s_hi = job->s_lo = 0.0;
    job->S = 1.0;
    job->log_s = 0.0;
    job->lse = 0.0;
    job->lse_lo = 0.0;
    job->log_s_unused = 0;
    job->z_exact = 0;
    job->coef = 0.0;
    job->coef_mult = 1.0;
    job->coef_per_S = 0.0;
    job->w_min_pos = 0.0;
}

/* A row has a softmax only if its max is finite and it holds no NaN; any other row is NaN throughout
 * (loss and gradient): NaN in, +inf (no limit exists without knowing how it was reached), all -inf. */
XF_HD void xf_rowjob_set_max(xf_rowjob *job, const xf_rowmax *st)
{
    int finite_max = (st->m > -XF_INF) && (st->m < XF_INF);
    job->status = (st->n_nan == 0 && finite_max) ? XF_ROW_OK : XF_ROW_NAN;
    job->has_nan = (st->n_nan != 0);
    job->m = st->m;
    job->argmax = st->argmax;
    job->n_finite = st->n_finite;
    job->min_finite = st->min_finite;
    job->eps_per_class = (st->n_finite > 0) ? job->eps / (double)st->n_finite : 0.0;
    job->exp_normal = 0;
}

/* After the max pass: remember the target logit, and decide whether the sum pass may keep the
 * exponentials in the gradient buffer (float64: exact there; float32 rows keep them as doubles in a
 * scratch row whatever this says, softmax_rows.h xf_xent_row, since the two forms give the same bits).
 * Only simple rows (their gradient is p_j times a constant, the target entry apart) and only rows without
 * a spread beyond 600: those may need x again after the sum pass (the tiny-sum rescue, the scaled float64
 * gradient), and with inplace=True x is the buffer.  Until 2026-12-04 float32 buffers kept float(e 2^64),
 * on float32's subnormal grid below e = 2^-190, an error that a factor past 2^62 magnified to 1e7 ULP
 * (grad_output 1e30 on [0, -150]), and such rows were kept out too. */
XF_HD void xf_rowjob_plan(xf_rowjob *job, double x_y, int has_grad)
{
    const double spread = job->m - job->min_finite;
    job->x_y = x_y;
    job->has_grad = (has_grad != 0);
    job->stored = has_grad && job->simple && job->status == XF_ROW_OK && (spread <= 600.0);
}

/* log S = log1p(s) of the double-double s: the low part enters through the derivative 1/(1+s) */
XF_HD double xf_row_log_S(double s_hi, double s_lo)
{
    return xf_log1p(s_hi) + s_lo / (1.0 + s_hi);
}

/* the row's sum with its logarithm log_s = xf_row_log_S(s_hi, s_lo), evaluated by the caller (the
 * forward pass's and logsumexp's rows take theirs side by side, softmax_rows.h xf_rows_max_sum) */
XF_HD void xf_rowjob_set_sum_log(xf_rowjob *job, double s_hi, double s_lo, double log_s)
{
    job->s_hi = s_hi;
    job->s_lo = s_lo;
    job->S = 1.0 + s_hi;
    job->log_s = log_s;
    job->lse = job->m + job->log_s;
    job->lse_lo = 0.0;
}

XF_HD void xf_rowjob_set_sum(xf_rowjob *job, double s_hi, double s_lo)
{
    xf_rowjob_set_sum_log(job, s_hi, s_lo, xf_row_log_S(s_hi, s_lo));
}

/* a / (1 + s) for the row's double-double s = s_hi + s_lo, rounded once (within 0.5 ULP plus ~2^-100
 * relative), for the gradient's p_j term (e_j * (coef / S)) * coef_mult: one rounding of e_j's product
 * with it, against two for the division coef * (e_j / S) (S itself rounded, then the quotient), and a
 * multiplication per element instead of a division (float64: ~0.4 ns of the gradient pass's 0.6).
 * Method: q = fl(a / S), S = fl(1 + s_hi); the residual a - q (S + S_lo) is computed exactly in its
 * large part (q S by Dekker's product; a - fl(q S) is exact, the two being within a few ULP of each
 * other), and q + residual / S rounds once.  Dekker's split must neither overflow nor lose the low
 * product's bits to underflow, hence the exact power-of-two rescaling of a beyond 2^+-900 (for
 * |a| < 2^-900 the last scaling can round a second time, onto the subnormal grid).  A non-finite a
 * (NaN rows, an infinite upstream factor) gives a / S. */
XF_HD double xf_div_S(double a, double s_hi, double s_lo)
{
    double k = xf_fabs(a) > 0x1p900 ? 0x1p200 : (xf_fabs(a) < 0x1p-900 ? 0x1p-200 : 1.0);
    double as = a / k;
    double S, S_lo, p, p_lo;
    xf_two_sum(1.0, s_hi, &S, &S_lo);
    S_lo += s_lo;
    double q = as / S;
    xf_two_prod(q, S, &p, &p_lo);
    double r = ((as - p) - p_lo) - q * S_lo;
    double f = (q + r / S) * k;
    return (q - q == 0.0) ? f : a / (1.0 + s_hi);
}

/* the row's S is 1 + s_hi, rounded (xf_rowjob_set_sum) */
XF_HD double xf_rowjob_div_S(const xf_rowjob *job, double a)
{
    return xf_div_S(a, job->s_hi, job->s_lo);
}

/* float64 rows whose non-max terms all lie ~620+ below the max: s is then a sum of subnormal
 * exponentials, each rounded to the fixed subnormal grid, so their absolute errors add up (C/2 ULP of
 * a subnormal loss).  Such rows are re-summed with every term scaled by 2^600 (xf_exp_shifted_pow2) and
 * keep that scaled sum for the loss and the target gradient, which multiply it by weights before the
 * one rounding back.  Per row, so no thread count changes it.
 * s = 0 with every finite logit within XF_RESCUE_SKIP of the max (each term underflowed) is rescued too
 * where the scaled sum settles it: a weight above ~2^53 lifts such a loss back into the normals (w_y =
 * 1e300 at a gap of 760: 8.6e-31, which came out 0).  A scaled term stays normal down to 708.4 + 600
 * ln 2 = 1124.3 below the max; further down it is rounded on the subnormal grid (under 2^-1075 off), so
 * with n such terms the rescue stands only where the scaled sum is at least n 2^-1020, their errors
 * then under 2^-55 of it: [0, -760, -1130], [0, -1121] and [0, -1121, -1190] are rescued, [0, -1159.9] (its one term 30 %
 * off when scaled) is not and stays 0.  Rows with a logit beyond XF_RESCUE_SKIP (finite masks such as -1e9 or
 * the dtype's minimum) are not tried, nor rows whose other logits are all -inf (min_finite = m): their s
 * stays 0 at no cost.  Entries more than XF_RESCUE_SKIP below the max add +0 (their scaled exponential
 * is +0) and are evaluated from m instead: a far argument costs a microcode assist (64 rows of 200000
 * -inf entries and one at -800: 353 ms, ~56 without).
 * The sum: class j goes to lane j mod XF_RESCUE_LANES, each lane a TwoSum-compensated sum in class
 * order (xf_rescue_lane), the lanes then added in order as double-doubles (xf_rowjob_rescue_finish;
 * relative error ~C 2^-106 before the one rounding).  The CPU runs the lanes side by side, as vectors
 * (one serial double-double chain had cost ~15 ns a class: a 1000-class row 15 us, 10x an ordinary
 * one); the GPU runs a lane per thread (kernels.cu, xf_cu_rescue).  The same additions in the same
 * order per lane: the same bits. */
#define XF_TINY_SUM 0x1p-900
#define XF_RESCUE_SKIP 1200.0
#define XF_RESCUE_LANES 8

/* whether the row's sum is summed again (the conditions above) */
XF_HD int xf_rowjob_rescue_wanted(const xf_rowjob *job)
{
    const int underflowed = job->s_hi == 0.0;
    return job->status == XF_ROW_OK && job->s_hi < XF_TINY_SUM &&
           (!underflowed || (job->min_finite < job->m && job->m - job->min_finite <= XF_RESCUE_SKIP));
}

/* the rescue's scaled term of class j (+0 for the argmax and the far entries); *subnormal = 1 where a
 * term taken is below the normals (its rounding is on the fixed grid) */
XF_HD double xf_rescue_term(const double *x, long long j, double m, long long argmax, double *subnormal)
{
    const int taken = (j != argmax) & (x[j] - m >= -XF_RESCUE_SKIP);
    const double e = xf_exp_shifted_pow2(taken ? x[j] : m, m);
    *subnormal = (taken & (e < 0x1p-1022)) ? 1.0 : 0.0;
    return taken ? e : 0.0;
}

/* lane k of the rescue's sum, by itself */
XF_HD void xf_rescue_lane(const double *x, long long C, double m, long long argmax, int k, double *acc,
                          double *err, double *n_subnormal)
{
    double a = 0.0, e = 0.0, n = 0.0;
    long long j;
    for (j = k; j < C; j += XF_RESCUE_LANES) {
        double sub;
        xf_acc_add_finite(&a, &e, xf_rescue_term(x, j, m, argmax, &sub));
        n += sub;
    }
    *acc = a;
    *err = e;
    *n_subnormal = n;
}

/* the lanes added in order; the row keeps the scaled sum, except an underflowed row whose scaled sum
 * does not settle it (the n 2^-1020 test above) */
XF_HD void xf_rowjob_rescue_finish(xf_rowjob *job, const double *acc, const double *err,
                                   const double *n_subnormal)
{
    double hi = 0.0, lo = 0.0, n_sub = 0.0;
    int k;
    for (k = 0; k < XF_RESCUE_LANES; k++) {
        xf_dd_add(&hi, &lo, acc[k], err[k]);
        n_sub += n_subnormal[k];
    }
    if (job->s_hi == 0.0 && !(hi >= n_sub * 0x1p-1020)) {
        return;
    }
    xf_rowjob_set_sum(job, (hi + lo) * XF_POW2_UNSCALE, 0.0);
    job->rescued = 1;
    job->s_scaled = hi + lo;
}

/* the rescue on one CPU thread: xf_rescue_lane's eight lanes side by side, as vectors */
XF_HD void xf_rowjob_rescue_tiny_sum(xf_rowjob *job, const double *x, long long C)
{
    if (!xf_rowjob_rescue_wanted(job)) {
        return;
    }
    const double m = job->m;
    const long long argmax = job->argmax;
    const long long whole = C / XF_RESCUE_LANES * XF_RESCUE_LANES;
    double acc[XF_RESCUE_LANES], err[XF_RESCUE_LANES], subs[XF_RESCUE_LANES];
    long long j;
    int k;
    for (k = 0; k < XF_RESCUE_LANES; k++) {
        acc[k] = err[k] = subs[k] = 0.0;
    }
    for (j = 0; j < whole; j += XF_RESCUE_LANES) {
#pragma omp simd
        for (k = 0; k < XF_RESCUE_LANES; k++) {
            double sub;
            xf_acc_add_finite(&acc[k], &err[k], xf_rescue_term(x, j + k, m, argmax, &sub));
            subs[k] += sub;
        }
    }
    for (k = 0; k < C - whole; k++) {
        double sub;
        xf_acc_add_finite(&acc[k], &err[k], xf_rescue_term(x, whole + k, m, argmax, &sub));
        subs[k] += sub;
    }
    xf_rowjob_rescue_finish(job, acc, err, subs);
}

/* w * log S for a row's argmax class (log S = s when rescued: log1p(s) = s below 2^-900). */
XF_HD double xf_weighted_log_s(const xf_rowjob *job, double w)
{
    return job->rescued ? (w * job->s_scaled) * XF_POW2_UNSCALE : w * job->log_s;
}

/* q_j of a class other than an index target, from the row's parameters: the vectorized loops
 * (softmax_rows.h) pass them as constants, so that the selects on `prob` fold away. */
XF_HD double xf_target_q_other(int prob, double eps, double eps_per_class, double w_j, double finite, double t_j)
{
    double smooth = eps_per_class * finite;
    return prob ? w_j * ((1.0 - eps) * t_j + smooth) : w_j * smooth;
}

/* The effective (unscaled) target mass of class j, see the README's semantics:
 *   index targets:        q_j = (1 - eps) w_y [j == y] + eps/C_eff * w_j [x_j > -inf]
 *   probability targets:  q_j = w_j ((1 - eps) t_j + eps/C_eff [x_j > -inf])                      */
XF_HD double xf_row_target_q(const xf_rowjob *job, long long j, double w_j, double finite, double t_j)
{
    double q = xf_target_q_other(job->prob, job->eps, job->eps_per_class, w_j, finite, t_j);
    return (j == job->y) ? q + (1.0 - job->eps) * job->w_y : q;
}

/* q_j 2^1200, for a loss term whose q_j lies below 2^-969 (xf_xent_term): the weights and the masses
 * (smoothing, probability, 1 - eps) each scaled by 2^600.  Exact scalings, and no overflow: q_j < 2^-969
 * bounds every non-negative addend, so each scaled one stays below 2^231 (w_j > 2^423 would need a mass
 * below 2^-1392, which no double above 0 is).  The products round once, as normal numbers, where the
 * unscaled ones were subnormal or 0.  Not covered: a smoothing mass eps / C_eff that is itself subnormal. */
XF_HD double xf_row_target_q_2p1200(const xf_rowjob *job, long long j, double w_j, double finite, double t_j)
{
    double smooth = (job->eps_per_class * finite) * 0x1p600;
    double ws = w_j * 0x1p600;
    double q = job->prob ? ws * ((1.0 - job->eps) * (t_j * 0x1p600) + smooth) : ws * smooth;
    return (j == job->y) ? q + (((1.0 - job->eps) * 0x1p600) * job->w_y) * 0x1p600 : q;
}

/* scale * q_j, the target part of the gradient.  A subnormal probability t_j makes (1 - eps) t_j round
 * on the subnormal grid, and the later factors (w_j, the upstream factor) magnify that absolute error:
 * 6 ULP of a subnormal gradient entry was measured against the 5 allowed.  So where the result is below
 * 2^-500, probability targets are evaluated with t_j and the smoothing mass scaled by 2^600 and scaled
 * back once at the end; a rounding then lands on the subnormal grid only in that last step.  This covers
 * w_j and scale of at least 2^-400 (then every intermediate is normal, or the result is far below the
 * smallest subnormal).
 * A tiny weight times a tiny smoothing mass under a large scale (a mean over tiny weights): q_j = w_j a_j
 * itself subnormal or 0 while scale q_j is a normal number (weights 2.97e-159, label_smoothing 1.2e-271,
 * 28 classes: q_j = 1.3e-431 became 0, 6.8 ULP of its gradient entry 2.6e-259, found by Hypothesis), for
 * index targets as for probabilities.  There q_j 2^1200 = (w_j 2^600) (a_j 2^600) is normal (w_j a_j <
 * 2^-1022 keeps it below 2^178; w_j >= 2^-1074 and a_j >= 2^-1074 above 2^-948) and scale 2^-600 exact
 * (scale >= 2^-400), so two roundings before the last scaling, as for the form above.  Only for a_j > 0:
 * a weight that took a large power of two (reduction='none' under tiny factors) beside a zero mass gave
 * inf * 0 there, and a_j > 0 with w_j a_j < 2^-1022 bounds w_j 2^600 by 2^652.  a_j = (1 - eps)
 * t_j + eps/C_eff [x_j > -inf], so index targets pass t_j = 1 at their target class and 0 elsewhere
 * (q_j ignores t_j there).  Not covered: a smoothing mass eps/C_eff or a probability that is itself
 * subnormal, with subnormal weights.  `check`: 0 lets index targets skip both forms (a literal in the
 * CPU's vectorized loop, whose rows xf_index_masses_may_underflow in softmax_rows.h sends elsewhere; the
 * test per element cost that loop 8-15 %); probability targets always test. */
XF_HD double xf_target_grad_q_from(int prob, double eps, double eps_per_class, double scale, double q, double w_j,
                                   double finite, double t_j, int check)
{
    double sq = scale * q;
    if ((prob | check) && xf_fabs(sq) < 0x1p-500 && xf_fabs(scale) >= 0x1p-400) {
        double a = (1.0 - eps) * (t_j * 0x1p600) + (eps_per_class * finite) * 0x1p600;
        if (prob && xf_fabs(w_j) >= 0x1p-400) {
            sq = (scale * (w_j * a)) * 0x1p-600;
        } else if (xf_fabs(q) < 0x1p-1022 && a > 0.0) {
            sq = ((scale * 0x1p-600) * ((w_j * 0x1p600) * a)) * 0x1p-600;
        }
    }
    return sq;
}

/* xf_target_grad_q_from's t_j for class j of a row: its probability target, or for index targets 1 at
 * the target class and 0 elsewhere */
XF_HD double xf_grad_mass_t(const xf_rowjob *job, long long j, double t_j)
{
    return job->prob ? t_j : ((j == job->y) ? 1.0 : 0.0);
}

/* A gradient entry of the general path, p_j coef - scale q_j, from its two terms formed apart: e_cps =
 * e_j coef_per_S, `unscale` the power of two it still carries (coef_mult, times 2^-600 where e_j was
 * taken 2^600 larger), sq = scale q_j (xf_target_grad_q_from), q = q_j.  Where coef overflowed
 * (coef_mult = 2^1000, the only way the first term reaches inf) scale q_j can overflow too, while the
 * entry is finite or overflows to one sign, and inf - inf gave NaN: a mean with label smoothing under a
 * subnormal target weight beside ordinary ones, whose fold of 1 / sum(w_y) into the weights leaves a
 * factor beyond DBL_MAX / q_j (weights [5e-324, 1], logits [0, 0]: NaN for -5.06e321, that is -inf).
 * There both terms are formed 2^-1000 smaller, exactly (scale q_j overflowed, so scale > 1), and the
 * difference is scaled back once.  Every other entry keeps its bits; a NaN input stays NaN. */
XF_HD double xf_general_grad_entry(double e_cps, double unscale, double sq, double q, double scale, double mult)
{
    double g = e_cps * unscale - sq;
    double apart = (e_cps * (unscale / mult) - (scale / mult) * q) * mult;
    return (g == g) ? g : apart;
}

/* "a, b and c all > 0" as min(a, b, c) > 0: one comparison per element for the vectorized loops (gcc 12
 * gives up on a loop where a loop-invariant condition meets a per-element one).  The callers' values
 * are never NaN. */
XF_HD int xf_all_positive(double a, double b, double c)
{
    double ab = (a < b) ? a : b;
    return ((c < ab) ? c : ab) > 0.0;
}

/* Whether q_j != 0 in exact arithmetic (the computed q_j of a subnormal weight or probability may round
 * to 0, and a class with mass on a -inf logit must still make the loss +inf), or is NaN.  A negative or
 * NaN probability counts: its term q_j (-log p_j) is in the loss as it is in the gradient (torch's
 * semantics; before, such a class was left out of the loss alone). */
XF_HD int xf_target_has_mass_from(int prob, double eps, double eps_per_class, int is_y, double w_y, double w_j,
                                  double finite, double t_j)
{
    /* 1 - eps > 0 is eps < 1 (exact near 1 by Sterbenz); a negative or NaN t_j has mass too */
    int smooth = xf_all_positive(eps_per_class, finite, w_j);
    int direct = prob ? xf_all_positive(w_j, (t_j != 0.0) ? 1.0 : 0.0, 1.0 - eps)
                      : (is_y && w_y > 0.0 && eps < 1.0);
    return smooth | direct;
}

/* xf_target_has_mass_from for a probability target (prob = 1) as a double, positive exactly where that
 * is true: the larger of xf_all_positive's two minima, min(w_j, [t_j != 0]) taken as w_j or 0.  For the
 * CPU's vector loops, which an int test per element kept at half their vectors' width (softmax_rows.h).
 * eps, eps_per_class and w_j are not NaN (validated), so neither minimum is. */
XF_HD double xf_target_mass_min(double eps, double eps_per_class, double w_j, double finite, double t_j)
{
    double smooth_ab = (eps_per_class < finite) ? eps_per_class : finite;
    double smooth = (w_j < smooth_ab) ? w_j : smooth_ab;
    double direct_ab = (t_j != 0.0) ? w_j : 0.0;
    double direct = (1.0 - eps < direct_ab) ? 1.0 - eps : direct_ab;
    return (smooth < direct) ? direct : smooth;
}

XF_HD int xf_row_target_has_mass(const xf_rowjob *job, long long j, double w_j, double finite, double t_j)
{
    return xf_target_has_mass_from(job->prob, job->eps, job->eps_per_class, j == job->y, job->w_y, w_j, finite,
                                   t_j);
}

/* q_loss (-log p_j) of a class with mass, 0 without: a masked class (-log p_j = +inf) with mass gives
 * +-inf by the sign of its mass even where q_loss rounded to 0, and NaN for a NaN one. */
XF_HD double xf_mass_term(double q_loss, double nlp, int has_mass)
{
    double masked = (q_loss < 0.0) ? -XF_INF : ((q_loss == q_loss) ? XF_INF : q_loss);
    return has_mass ? ((nlp == XF_INF) ? masked : q_loss * nlp) : 0.0;
}

/* A class's loss term from q_loss = q_j loss_scale (or a power-of-two multiple of it, see below).  0 * inf
 * = 0: a class the target gives no mass adds nothing, even when masked (-inf); where m - x_j exceeds
 * DBL_MAX the term is evaluated halved. */
XF_HD double xf_xent_term_from(const xf_rowjob *job, long long j, double x_j, double nlp, double q_loss,
                               int has_mass)
{
    double term = xf_mass_term(q_loss, nlp, has_mass);
    if (!(nlp - nlp == 0.0) && x_j > -XF_INF) {
        term = (q_loss * xf_neg_log_prob(0.5 * x_j, 0.5 * job->m, 0.5 * job->log_s)) * 2.0;
    }
    return (j == job->argmax) ? xf_weighted_log_s(job, q_loss) : term;
}

/* One class's part of the loss-terms pass (probability targets, smoothing): returns the loss term
 * loss_scale * q_j * (-log p_j) and stores q_j.
 * q_j below the normal range (a tiny weight times a tiny smoothing mass: 0, or rounded on the subnormal
 * grid) while q_j (-log p_j) may be far larger: q_j = 1e-400 times -log p_j = 1e300 is a normal 1e-100,
 * and came out 0.  Such a term is also formed from q_j 2^1200 (xf_row_target_q_2p1200) and scaled back
 * by 2^-1200 in exact steps and one final rounding: after the product with -log p_j where that is at
 * most 2^400, half before it otherwise (q_j 2^600 is exact for q_j >= 2^-1622; a smaller mass with
 * -log p_j above 2^400 is not covered).  Of the two steps after the product, the first is exact wherever
 * the result can be above 0, the second rounds once.  Where that form overflows (a mean over a
 * subnormal denominator scales the losses by up to 2^1000), the 2^-1200 goes into that power of two
 * instead, before the product (loss_scale 2^-1200 is then a normal power of two: exact); subnormal
 * class weights under smoothing were ~200-360 ULP off through the direct form. */
XF_HD double xf_xent_term(const xf_rowjob *job, long long j, double x_j, double w_j, double t_j, double *q_out)
{
    double finite = (x_j > -XF_INF) ? 1.0 : 0.0;
    double q = xf_row_target_q(job, j, w_j, finite, t_j);
    double nlp = xf_neg_log_prob(x_j, job->m, job->log_s);
    int has_mass = xf_row_target_has_mass(job, j, w_j, finite, t_j);
    /* loss_scale is a power of two: q_j loss_scale is exact (or q_j's own rounding on the subnormal grid) */
    double term = xf_xent_term_from(job, j, x_j, nlp, q * job->loss_scale, has_mass);
    *q_out = q;
    if (xf_fabs(q) < 0x1p-969) {
        int huge = nlp > 0x1p400;
        double q_term = xf_row_target_q_2p1200(job, j, w_j, finite, t_j) * (huge ? 0x1p-600 : 1.0);
        double scaled = xf_xent_term_from(job, j, x_j, nlp, q_term * job->loss_scale, has_mass);
        scaled = (scaled * (huge ? 1.0 : 0x1p-600)) * 0x1p-600;
        if (!(scaled - scaled == 0.0) && job->loss_scale >= 0x1p200) {
            /* 2^-1200 itself is below the subnormals: two steps of 2^-600 */
            double unscale = (job->loss_scale * 0x1p-600) * 0x1p-600;
            double q_lifted = xf_row_target_q_2p1200(job, j, w_j, finite, t_j) * unscale;
            scaled = xf_xent_term_from(job, j, x_j, nlp, q_lifted, has_mass);
        }
        term = (scaled - scaled == 0.0) ? scaled : term;
    }
    return term;
}

/* ---- float64 rows whose loss is tiny: the terms summed 2^1200 larger -----------------------------------
 * xf_xent_term hands each term over unscaled, so a term below 2^-1022 has already been rounded on the
 * subnormal grid (half its step, 2^-1075) before the row's sum: where every term is that small the row
 * loss carried up to C/2 of its own ULP (65 probability masses of 4.45e-311 and equal logits: 8.5 ULP;
 * smoothing 1.0 over 15 classes weighted 5e-324: 0 for 2.35e-323).  So a float64 row whose loss sum
 * comes out below 2^-969 (or 0) is summed again, serially in class order, from its terms times 2^1200,
 * and scaled back once: one rounding on the subnormal grid instead of one per term.  In such a row, with
 * every mass >= 0 and loss_scale r in [2^-50, 2^50], every term q_j r (-log p_j) is below 2^-969, so
 * each scaled one is below 2^231; and since -log p_j >= log 2 off the argmax, a class other than the
 * argmax has q_j r below 2^-968: q_j r 2^1200 < 2^232 is exact (or, for q_j below 2^-969, formed from
 * the masses scaled, xf_row_target_q_2p1200).  The argmax's -log p_j = log S may be tiny while its mass
 * is not: its term takes 2^600 on each factor (log S >= ~2^-900 unless the row is rescued, so q_j r <
 * 2^-69), or the rescued s 2^600 and then 2^600.  Rows that fall outside (a negative or NaN mass, a
 * term that is not finite, a loss scale outside that range) keep the first sum.  The z-loss's term is
 * added after (xf_rowjob_finish), to the sum redone.
 * float32 rows do not need it: their loss rounds to float32, whose grain lies 2^925 above these errors. */
#define XF_TINY_LOSS 0x1p-969

XF_HD int xf_rowjob_tiny_loss_wanted(const xf_rowjob *job, const double *terms)
{
    return job->status == XF_ROW_OK && job->needs_terms && job->loss_scale >= 0x1p-50 &&
           job->loss_scale <= 0x1p50 && xf_fabs(terms[0] + terms[1]) < XF_TINY_LOSS;
}

/* class j's term q_j loss_scale (-log p_j) times 2^1200 (see above); NaN for a negative or NaN mass */
XF_HD double xf_xent_term_2p1200(const xf_rowjob *job, long long j, double x_j, double w_j, double t_j)
{
    double finite = (x_j > -XF_INF) ? 1.0 : 0.0;
    double q = xf_row_target_q(job, j, w_j, finite, t_j);
    double nlp = xf_neg_log_prob(x_j, job->m, job->log_s);
    int has_mass = xf_row_target_has_mass(job, j, w_j, finite, t_j);
    double ls = job->loss_scale;
    if (!(q >= 0.0)) {
        return XF_NAN;
    }
    if (q < 0x1p-969) {
        return xf_xent_term_from(job, j, x_j, nlp, xf_row_target_q_2p1200(job, j, w_j, finite, t_j) * ls, has_mass);
    }
    if (j == job->argmax) {
        return job->rescued ? ((q * ls) * job->s_scaled) * 0x1p600 : ((q * ls) * 0x1p600) * (job->log_s * 0x1p600);
    }
    return xf_xent_term_from(job, j, x_j, nlp, ((q * ls) * 0x1p600) * 0x1p600, has_mass);
}

/* Whether any class of a row has target mass below 2^-969 (xf_row_target_has_mass with q_j of
 * xf_row_target_q), with the row's layout constant so that the loop vectorizes.  Only such masses put
 * more than one term on the subnormal grid: off the argmax -log p_j >= log 2, so a mass of 2^-969 or
 * more makes a normal term, and the argmax's own term is one rounding.  Rows without them (padding rows
 * without any mass, confident rows whose loss underflows) skip the serial sum below, which cost such
 * rows, float64 1000 classes, about 1.8 times the whole row.  Without smoothing a logit's finiteness
 * does not matter (eps / C_eff = 0), and the logits are not read. */
XF_HD int xf_row_has_tiny_mass_form(const xf_rowjob *job, const double *x, const double *t, const double *w,
                                    long long C, const int has_t, const int has_w, const int smooth,
                                    const int none_summed)
{
    int any = 0;
    long long j;
#pragma omp simd reduction(| : any)
    for (j = 0; j < C; j++) {
        const double finite = smooth ? ((x[j] > -XF_INF) ? 1.0 : 0.0) : 1.0;
        const double w_j = has_w ? w[j] : 1.0, t_j = has_t ? t[j] : 0.0;
        const int is_y = (j == job->y);
        const double q_other = xf_target_q_other(has_t, job->eps, job->eps_per_class, w_j, finite, t_j);
        const double q = is_y ? q_other + (1.0 - job->eps) * job->w_y : q_other;
        const int mass = xf_target_has_mass_from(has_t, job->eps, job->eps_per_class, is_y, job->w_y, w_j,
                                                 finite, t_j);
        any |= none_summed ? mass : mass & (xf_fabs(q) < XF_TINY_LOSS);
    }
    return any;
}

/* none_summed: the masses summed to 0 (a padding row, or masses that all rounded to 0), where any mass
 * is a tiny one and its test alone is the cheaper loop */
XF_HD int xf_row_has_tiny_mass(const xf_rowjob *job, const double *x, const double *t, const double *w,
                               long long C, int none_summed)
{
#define XF_TINY_MASS_FORMS(HT, HW, SM)                                                                      \
    (none_summed ? xf_row_has_tiny_mass_form(job, x, t, w, C, HT, HW, SM, 1)                                 \
                 : xf_row_has_tiny_mass_form(job, x, t, w, C, HT, HW, SM, 0))
    if (t && job->eps == 0.0) {
        return w ? XF_TINY_MASS_FORMS(1, 1, 0) : XF_TINY_MASS_FORMS(1, 0, 0);
    }
    if (t) {
        return w ? XF_TINY_MASS_FORMS(1, 1, 1) : XF_TINY_MASS_FORMS(1, 0, 1);
    }
    return w ? XF_TINY_MASS_FORMS(0, 1, 1) : XF_TINY_MASS_FORMS(0, 0, 1);
#undef XF_TINY_MASS_FORMS
}

/* terms[0..1] of such a row (x, t, w: the row's float64 logits and targets, the class weights or NULL),
 * redone where xf_rowjob_tiny_loss_wanted says so */
XF_HD void xf_rowjob_tiny_loss_row(const xf_rowjob *job, const double *x, const double *t, const double *w,
                                   long long C, double *terms)
{
    double hi = 0.0, lo = 0.0;
    long long j;
    if (!xf_rowjob_tiny_loss_wanted(job, terms)) {
        return;
    }
    if (!xf_row_has_tiny_mass(job, x, t, w, C, terms[2] + terms[3] == 0.0)) {
        return;
    }
    for (j = 0; j < C; j++) {
        const double term = xf_xent_term_2p1200(job, j, x[j], w ? w[j] : 1.0, t ? t[j] : 0.0);
        if (!(term - term == 0.0)) {
            return;
        }
        if (term != 0.0) {
            xf_dd_add(&hi, &lo, term, 0.0);
        }
    }
    /* the first step is exact wherever the result can be above 0 (hi >= 2^-422), the second rounds */
    terms[0] = ((hi + lo) * 0x1p-600) * 0x1p-600;
    terms[1] = 0.0;
}

/* lane k of the row at acc[k * stride] (the short-row groups of softmax_rows.h keep rows side by side) */
XF_HD void xf_lanes_to_dd_strided(const double *acc, const double *cmp, long long stride, double *hi,
                                  double *lo)
{
    /* a fixed pairwise tree, ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)): three dependent double-double
     * additions where the lane-order chain had seven (each ~25 cycles of latency), about a quarter of a
     * short row's time.  Merged in locals, stored once (the output pointers may alias each other). */
    double h01 = acc[0], l01 = cmp[0], h23 = acc[2 * stride], l23 = cmp[2 * stride];
    double h45 = acc[4 * stride], l45 = cmp[4 * stride], h67 = acc[6 * stride], l67 = cmp[6 * stride];
    xf_dd_add(&h01, &l01, acc[stride], cmp[stride]);
    xf_dd_add(&h23, &l23, acc[3 * stride], cmp[3 * stride]);
    xf_dd_add(&h45, &l45, acc[5 * stride], cmp[5 * stride]);
    xf_dd_add(&h67, &l67, acc[7 * stride], cmp[7 * stride]);
    xf_dd_add(&h01, &l01, h23, l23);
    xf_dd_add(&h45, &l45, h67, l67);
    xf_dd_add(&h01, &l01, h45, l45);
    *hi = h01;
    *lo = l01;
}

XF_HD void xf_lanes_to_dd(const double *acc, const double *cmp, double *hi, double *lo)
{
    xf_lanes_to_dd_strided(acc, cmp, 1, hi, lo);
}

/* Whether the loss-terms pass (pass 3: sum_c q_c (-log p_c) and A = sum_c q_c, lane j % XF_LANES of each
 * block) adds plainly instead of compensated: for float32 storage with index targets (label smoothing),
 * or with probability targets that are all >= 0 in the row (`targets_nonneg`, which the row drivers
 * find before the pass: a row, not a block, since blocks of both signs would cancel in the row's merge).
 * Every term is then >= 0 (q_j = (1 - eps) w_y [j = y] + eps / C_eff w_j [x_j > -inf], or
 * w_j ((1 - eps) t_j + eps / C_eff [x_j > -inf]), weights >= 0, and -log p_j >= 0), so a lane's sum of
 * at most XF_BLOCK / XF_LANES = 512 terms is within 511 u = 2^-44 of its exact value, relatively; the
 * lanes and blocks are merged as double-doubles as before (the CUDA twin's tree order,
 * XF_CU_TREE_ORDER, chains C / threads terms, 32 threads or more: within 2^-27 up to 2^31 classes).  A
 * float32 result's one rounding (2^-24) leaves the 2 ULP bound unchanged, and so does the gradient's
 * p_j A - q_j, bounded in ULPs of |p_j A| + |q_j|.  float64 results and rows with a negative (or NaN)
 * target probability keep the compensated lanes.  Measured: fused 4096x1000 float32, one thread, with
 * smoothing 0.1 9.4 -> 7.4 ms by this alone, with probability targets 11.1 -> 10.0 (benchmarks/README.md,
 * fifteenth round). */
XF_HD int xf_terms_plain(int storage_is_float, int prob, int targets_nonneg)
{
    return storage_is_float && (!prob || targets_nonneg);
}

XF_HD void xf_terms_lane_add(double *acc, double *err, double v, int plain)
{
    if (plain) {
        *acc += v;
    } else {
        xf_acc_add(acc, err, v);
    }
}

XF_HD void xf_terms_merge(double *acc, const double *blk)
{
    xf_dd_add(&acc[0], &acc[1], blk[0], blk[1]);
    xf_dd_add(&acc[2], &acc[3], blk[2], blk[3]);
}

/* A + z2 r (lh + ll) for the z-loss's gradient coefficient (z2 = 2 z), with A = a_hi + a_lo: the
 * products exact (Dekker) and the sum rounded once, so that where A and 2 z r lse cancel only the
 * operands' own errors remain (see xf_rowjob_z_lse); within ~2^-104 of the larger term otherwise. */
XF_HD double xf_a_eff_dd(double a_hi, double a_lo, double z2, double r, double lh, double ll)
{
    double zh, zl, ph, pl, sh, se;
    xf_two_prod(z2, r, &zh, &zl);
    xf_two_prod(zh, lh, &ph, &pl);
    pl += zh * ll + zl * lh;
    xf_two_sum(a_hi, ph, &sh, &se);
    return sh + (se + (pl + a_lo));
}

/* Where xf_a_eff_dd's splits cannot overflow and its error terms stay normal: every factor and product
 * between 2^-960 and 2^990.  Outside (subnormal weights, logits near the overflow threshold) finish
 * keeps its range-safe forms, and the cancellation of A + 2 z r lse is not resolved there. */
XF_HD int xf_a_eff_dd_in_range(double A, double z2, double r, double lse, double zr2, double zlse)
{
    double big = 0x1p990, small = 0x1p-960;
    return xf_fabs(A) <= big && xf_fabs(z2) <= big && xf_fabs(r) <= big && xf_fabs(lse) <= big &&
           xf_fabs(zr2) >= small && xf_fabs(zr2) <= big && xf_fabs(zlse) >= small && xf_fabs(zlse) <= big;
}

/* w_y (x_y - m + log S) scaled by the loss's power of two (w_loss = w_y loss_scale): an index target's loss
 * where the target is not the argmax (xf_rowjob_finish; the short-row groups of softmax_rows.h too) */
XF_HD double xf_index_target_ce(double x_y, double m, double log_s, double w_y, double w_loss)
{
    double nlp = xf_neg_log_prob(x_y, m, log_s);
    /* a zero-weight class contributes 0 even if its logit is -inf (0 * inf = 0 by convention) */
    double ce = (w_y == 0.0) ? 0.0 : ((nlp == XF_INF) ? XF_INF : w_loss * nlp);
    if (!(nlp - nlp == 0.0) && x_y > -XF_INF && w_y != 0.0) {
        /* m - x_y beyond DBL_MAX while the weighted loss may not be: halve, as xf_xent_term does */
        ce = (w_loss * xf_neg_log_prob(0.5 * x_y, 0.5 * m, 0.5 * log_s)) * 2.0;
    }
    return ce;
}

/* Row loss and gradient coefficient (x_y from xf_rowjob_plan).  terms: see pass 3.
 *   loss = sum_c q_c (-log p_c) + z r lse^2         (r = w_y for index targets, 1 for probabilities)
 *   d loss / d x_j = p_j (A + 2 z r lse) - q_j       (A = sum_c q_c)                                   */
XF_HD double xf_rowjob_finish(xf_rowjob *job, const double *terms)
{
    if (job->status != XF_ROW_OK) {
        job->coef = XF_NAN;
        job->coef_per_S = XF_NAN;
        return XF_NAN;
    }
    double ce, A;
    if (job->needs_terms) {
        ce = terms[0] + terms[1];
        A = terms[2] + terms[3];
    } else {
        double w_loss = job->w_y * job->loss_scale;
        ce = xf_index_target_ce(job->x_y, job->m, job->log_s, job->w_y, w_loss);
        ce = (job->y == job->argmax) ? xf_weighted_log_s(job, w_loss) : ce;
        A = job->w_y;
    }
    double r = job->prob ? 1.0 : job->w_y;
    double loss = ce;
    double a_eff = A;
    job->coef_mult = 1.0;
    if (job->z != 0.0) {
        /* lse * lse first could overflow needlessly */
        /* the power of two first: exact (also the 2^600 of a reduction of tiny losses, which would
         * otherwise come after z r's rounding on the subnormal grid); the other order only where
         * r 2^600 overflows */
        double rl = r * job->loss_scale;
        double zr = (rl - rl == 0.0) ? job->z * rl : (job->z * r) * job->loss_scale;
        double zterm = (zr * job->lse) * job->lse;
        if (zr < 0x1p-1022 && job->z != 0.0 && r != 0.0) {
            /* a subnormal class weight, or z r below even the subnormals: z r would round onto the
             * subnormal grid (or to 0) and carry that error times lse^2; with r last the term rounds
             * there once.  Where z lse^2 overflows while the term does not (r = 5e-324, lse = 1e300:
             * 5e272), r 2^600 goes first and lse 2^-600 last (kept only where it stays finite) */
            double alt = r * (((job->z * job->loss_scale) * job->lse) * job->lse);
            if (!(alt - alt == 0.0)) {
                alt = (((job->z * job->loss_scale) * (r * 0x1p600)) * job->lse) * (job->lse * 0x1p-600);
            }
            zterm = (alt - alt == 0.0) ? alt : zterm;
        }
        loss = ce + zterm;
        double zr2 = 2.0 * job->z * r;
        double zlse = zr2 * job->lse;
        if (zr2 < 0x1p-1022 && job->z != 0.0 && r != 0.0) {
            /* a subnormal class weight, or 2 z r below the subnormals: (2 z r) lse would carry 2 z r's
             * rounding on the subnormal grid (or its 0) times |lse|; r last rounds there once (kept only
             * where 2 z lse does not overflow) */
            double alt = r * ((2.0 * job->z) * job->lse);
            zlse = (alt - alt == 0.0) ? alt : zlse;
        }
        a_eff = A + zlse;
        double a_lo = job->needs_terms ? terms[3] : 0.0;
        if (xf_a_eff_dd_in_range(A, 2.0 * job->z, r, job->lse, zr2, zlse)) {
            a_eff = xf_a_eff_dd(job->needs_terms ? terms[2] : A, a_lo, 2.0 * job->z, r, job->lse, job->lse_lo);
        }
        if (!(a_eff - a_eff == 0.0)) {
            /* 2 z r lse overflowed (logits near DBL_MAX) though p_j times it may not: carry 2^1000
             * separately (powers of two scale exactly; near that magnitude A is far below a rounding) */
            a_eff = A * 0x1p-1000 + ((job->z * 0x1p-999) * r) * job->lse;
            job->coef_mult = 0x1p1000;
        }
    }
    job->coef = job->scale * a_eff;
    if (!(job->coef - job->coef == 0.0) && (a_eff - a_eff == 0.0) && (job->scale - job->scale == 0.0) &&
        job->coef_mult == 1.0) {
        /* the upstream factor times A overflowed; the gradient entries (times p_j <= 1) may not */
        job->coef = job->scale * (a_eff * 0x1p-1000);
        job->coef_mult *= 0x1p1000;
    }
    if (job->coef_mult != 1.0 && xf_fabs(job->scale) < 0x1p23) {
        /* a_eff carries 2^-1000 (the z-loss under logits near DBL_MAX, above), and a small upstream factor
         * times it rounds on the subnormal grid (grad_output 5e-324: 1.8e8 ULP).  Where the factor's product
         * with the whole a_eff is finite, the power of two goes back first: the same bits wherever the
         * split form's intermediates were normal (powers of two scale exactly) */
        double lifted = (job->scale * job->coef_mult) * a_eff;
        if (lifted - lifted == 0.0) {
            job->coef = lifted;
            job->coef_mult = 1.0;
        }
    }
    /* p_j below the normal range only where x_j - m < -708; with |coef| <= 1 its rounding is not
     * magnified, so the scaled evaluation is needed only beyond both */
    job->grad_scaled = (job->m - job->min_finite > 700.0) && (xf_fabs(job->coef) * job->coef_mult > 1.0);
    /* only the gradient pass reads it: a forward-only row skips its two dependent divisions (~5 % of a
     * short row) */
    job->coef_per_S = job->has_grad ? xf_rowjob_div_S(job, job->coef) : 0.0;
    return loss;
}

/* xf_target_grad of a row without the rescue, from its numbers (the short-row groups of softmax_rows.h) */
XF_HD double xf_target_grad_of(int y_is_argmax, double coef, double coef_mult, double s_hi, double s_lo,
                               double S, double e_y)
{
    return y_is_argmax ? -(coef * ((s_hi + s_lo) / S)) * coef_mult : (coef * (e_y / S - 1.0)) * coef_mult;
}

/* Target entry of the gradient on the simple path, without the p_y - 1 cancellation:
 *   y is the argmax:  -scale w_y * s / S          (s = sum of the other exponentials)
 *   otherwise:        scale w_y * (p_y - 1), where p_y <= 1/2, so the subtraction is benign. */
XF_HD double xf_target_grad(const xf_rowjob *job, double e_y)
{
    if (job->y == job->argmax && job->rescued) {
        return -(job->coef * job->s_scaled) * (job->coef_mult * XF_POW2_UNSCALE);
    }
    return xf_target_grad_of(job->y == job->argmax, job->coef, job->coef_mult, job->s_hi, job->s_lo, job->S, e_y);
}

/* ---- logsumexp where m and log S cancel ---------------------------------------------------------
 * lse = m + log S with log S >= 0 cancels only for m < 0: where log S > 2 |lse| (xf_rowjob_lse_cancels),
 * the fast path's error, a few ULP of log S, is many ULP of the result.  How small can the
 * result be?  With T = S e^m = sum_j e^(x_j), lse = log T = log1p(T - 1), and T - 1 is never 0 for
 * x_j < 0 (Lindemann-Weierstrass), but it can be made as small as one likes: C - 1 logits fix T - 1
 * to ~2^-53 (C equal logits float64(-log C)), and each further logit log(1 - partial sum), rounded, cancels
 * another ~53 bits; 21 of them take lse below the subnormal range.  So no fixed precision will do:
 * the answer needs D = T - 1 to relative 2^-56 (f64; 2^-34 for float32 results) or, once below the
 * normals, to an absolute 2^-1077 (2^-153): up to ~1100 bits of each e^(x_j).
 *
 * Hence Ziv's strategy: evaluate D at a precision, bound its error, and stop as soon as the bound is
 * small enough against the D found; otherwise redo the row at the next precision.
 *   1. double-double (xf_dd_exp, ~2^-100 relative): enough while |D| >~ C 2^-44 (f64).  Realistic
 *      cancellations (a row of log-probabilities, D ~ rounding error) are 2^-53 and need step 2.
 *   2. fixed point with G = 5, 15 and 38 fraction limbs of 32 bits (xf_fixed.h): the error is at most
 *      (C + 1) 2^15 units of 2^-32G, so 160 bits settle |D| >~ C 2^-89 (float32: C 2^-111), 480 bits
 *      C 2^-409 and 1216 bits every float64 row (subnormal results included) up to C = 2^120.
 *      Float32 stops at 480 bits, where the bound is below its floor.
 * The last step stops whatever the bound says.  From D: lse = log1p(D) with xf_log1p (0.63 ULP) and the
 * low part through the derivative (log T where T = 1 + D is outside [1/2, 2]: nothing cancels there), or
 * D - D^2/2 for |D| < 2^-60, computed 2^600 up and rounded once on the way down (subnormal results).
 * Measured at most 0.9 ULP (float64) and 0.5 ULP (float32) on the tests' worst cases.
 * The cost falls only on such rows, but it is steep: a row of 500 log-probabilities, one thread, takes
 * ~0.05 ms as float32 (the double-double step) and ~0.3 ms as float64, 150 and 400-450 times an
 * ordinary row; float64's is nearly all the 160-bit step's series (about 20 terms of G-limb products
 * per distinct logit, after a table of exp(j/32), xf_fix_exp_neg). */

/* lse = log(1 + D) for a double-double D with |D| >= 2^-61: log1p, the low part through the derivative,
 * while 1 + D is within [1/2, 2]; beyond, where log(1 + D) no longer cancels, log of 1 + D formed as a
 * double-double (a row whose sum T = 1 + D is far below 1 would otherwise see D = -1 in the high part). */
XF_HD double xf_lse_from_d(double dh, double dl)
{
    double th, tl;
    if (dh >= -0.5 && dh <= 1.0) {
        return xf_log1p(dh) + dl / (1.0 + dh);
    }
    xf_two_sum(1.0, dh, &th, &tl);
    tl += dl;
    return xf_log(th) + tl / th;
}

/* lse = log(1 + D) from sign(D) and |D| 2^600 as a double-double */
XF_HD double xf_log1p_scaled_dd(int sign, double hi, double lo)
{
    double s = (sign > 0) ? 1.0 : -1.0;
    double ah = hi * 0x1p-600; /* |D|, possibly subnormal (only used where it is a small correction) */
    if (ah >= 0x1p-60) {
        return xf_lse_from_d(s * ah, s * (lo * 0x1p-600));
    }
    /* log1p(D) = D - D^2/2 + ..., where D^2/2 is below 2^-61 |D| and the cube far below the rounding */
    return (s * (hi + (lo - s * (0.5 * hi) * ah))) * 0x1p-600;
}

XF_HD double xf_lse_load(const float *xf, const double *xd, long long j)
{
    return xd ? xd[j] : (double)xf[j];
}

/* Step 1: D in double-double.  Error: each exponential ~2^-100 relative (terms below e^-80 come from
 * xf_exp, 2^-53 of under 2^-115), each addition 2^-104 of the partial sum, which stays below max(T, 1):
 * under (C + 16) 2^-100 max(T, 1).  Returns 0 where that is not below |D| / rel. */
XF_HD int xf_lse_step_dd(const float *xf, const double *xd, long long C, double rel, double *out)
{
    double th = 0.0, tl = 0.0, eh, el, dh, dl, e;
    long long j;
    for (j = 0; j < C; j++) {
        double v = xf_lse_load(xf, xd, j);
        if (v >= -80.0) {
            xf_dd_exp(v, 0.0, &eh, &el);
            xf_dd_add(&th, &tl, eh, el);
        } else {
            xf_dd_add(&th, &tl, xf_exp(v), 0.0); /* -inf gives 0 */
        }
    }
    xf_two_sum(th, -1.0, &dh, &e);
    dl = e + tl;
    xf_two_sum(dh, dl, &dh, &dl);
    double err = ((double)C + 16.0) * 0x1p-100 * (th > 1.0 ? th : 1.0);
    if (!(xf_fabs(dh) >= rel * err)) {
        return 0;
    }
    *out = xf_lse_from_d(dh, dl);
    return 1;
}

/* Step 2 at G fraction limbs.  Terms with x_j < -(32 G ln 2 + 1) are under one unit and skipped; equal
 * consecutive logits reuse the exponential.  Bound and stopping rule: see above; everything is scaled
 * by 2^600 so that the bound stays a normal double (floor_s: the absolute floor, scaled).  The sum
 * T < C (each term < 1) must fit the 32-bit integer limb: rows of fewer than 2^32 classes. */
XF_HD int xf_lse_step_fixed(const float *xf, const double *xd, long long C, int G, double rel,
                            double floor_s, int last, double *out)
{
    unsigned int acc[XF_FIX_N], e[XF_FIX_N];
    double ymax = 32.0 * G * 0.6931471805599453 + 1.0, prev = 1.0, hi, lo;
    int n = -1, sign;
    long long j;
    xf_fix_zero(acc, G);
    for (j = 0; j < C; j++) {
        double v = xf_lse_load(xf, xd, j);
        if (!(-v <= ymax)) {
            continue;
        }
        if (v != prev) {
            n = xf_fix_exp_neg(e, G, -v);
            prev = v;
        }
        if (n >= 0) {
            xf_fix_add_shifted(acc, G, e, G - n / 32, n % 32);
        }
    }
    sign = xf_fix_minus_one_dd(acc, G, &hi, &lo);
    double err_s = ((double)C + 1.0) * xf_fix_pow2(615 - 32 * G);
    if (!last && !(hi >= rel * err_s) && !(err_s <= floor_s)) {
        return 0;
    }
    *out = xf_log1p_scaled_dd(sign, hi, lo);
    return 1;
}

/* logsumexp of a cancelling row (x as float or as double, the other pointer NULL), to a float32
 * (is_f32) or float64 result's needs.  d_max: an upper bound on |D| the caller knows, or +inf.  Step 1
 * fails wherever |D| + its error bound err stays under rel err, and err >= (C + 16) 2^-100, so below
 * d_max < (rel - 1) (C + 16) 2^-100 it is skipped: the result is the same bits, only sooner (a float64
 * row of 500 log-probabilities, whose D is a few ulps of 1, spends ~15 % of its time there). */
XF_HD_COLD double xf_lse_cancelling(const float *xf, const double *xd, long long C, int is_f32, double d_max)
{
    double rel = is_f32 ? 0x1p34 : 0x1p56;
    double floor_s = is_f32 ? 0x1p447 : 0x1p-477; /* 2^-153, 2^-1077, times 2^600 */
    double out = 0.0;
    if (!(d_max < (rel - 1.0) * ((double)C + 16.0) * 0x1p-100) && xf_lse_step_dd(xf, xd, C, rel, &out)) {
        return out;
    }
    if (C >= 0x100000000LL) {
        /* the fixed-point integer limb holds sums below 2^32: wider rows keep the double-double value
         * (rel = 0 accepts it), whose bound is not proven; documented in logsumexp's docstring */
        xf_lse_step_dd(xf, xd, C, 0.0, &out);
        return out;
    }
    if (xf_lse_step_fixed(xf, xd, C, 5, rel, floor_s, 0, &out)) {
        return out;
    }
    /* float32 stops at 480 bits: the bound is then under 2^-153 for any C < 2^300 */
    if (xf_lse_step_fixed(xf, xd, C, 15, rel, floor_s, is_f32, &out)) {
        return out;
    }
    xf_lse_step_fixed(xf, xd, C, XF_FIX_MAXG, rel, floor_s, 1, &out);
    return out;
}

/* Whether a row's fast-path lse = m + log S may have cancelled: log S > 2 |lse|.  Elsewhere ulp(log S)
 * is at most 2 ulp(lse), so log S's error (under 1.8 ULP of it, float64) and the final rounding stay
 * within the bound; float32 rows carry ~2^-40 there, far below.  Where it holds, |lse| < |m| and
 * m lies in [-1.5 log C, 0): a test on two numbers per row, true only on rare rows. */
XF_HD int xf_rowjob_lse_cancels(const xf_rowjob *job)
{
    return job->status == XF_ROW_OK && job->log_s > 2.0 * xf_fabs(job->lse);
}

/* |D| = |expm1(lse)| <= 2 |lse| for |lse| <= 1/2, and a float64 row's fast lse is off by under 2 ULP of
 * log S (above), taken as 8 (2^-49 log S).  Float32 rows' fast sum is only good to ~2^-32, and their
 * step 1 rarely fails: no bound there. */
XF_HD double xf_rowjob_d_max_f64(const xf_rowjob *job)
{
    double l = xf_fabs(job->lse) + 0x1p-49 * job->log_s;
    return (l <= 0.5) ? 2.0 * l : XF_INF;
}

/* The logsumexp output of a row after the sum pass: job->lse, or for cancelling rows the value above. */
XF_HD double xf_rowjob_exact_lse_f64(const xf_rowjob *job, const double *x, long long C)
{
    return xf_rowjob_lse_cancels(job) ? xf_lse_cancelling((const float *)0, x, C, 0, xf_rowjob_d_max_f64(job))
                                      : job->lse;
}

XF_HD double xf_rowjob_exact_lse_f32(const xf_rowjob *job, const float *x, long long C)
{
    return xf_rowjob_lse_cancels(job) ? xf_lse_cancelling(x, (const double *)0, C, 1, XF_INF) : job->lse;
}

/* ---- logsumexp for the z-loss ---------------------------------------------------------------------
 * With z != 0 a row's loss carries z r lse^2 and every gradient entry p_j (A + 2 z r lse): lse must be
 * right relative to itself (the loss), and where A + 2 z r lse cancels (lse < 0: every logit below 0,
 * A > 0) right to a fraction of that sum's ULP.  The fast path's m + log S has three errors: the
 * exponentials' inside S, at most eps_s log S (log(1 + s) >= s / (1 + s) turns S's relative error
 * into one relative to log S; eps_s = 0.62 2^-53 for float64 rows, 2^-32 for float32 ones), log1p's
 * 0.63 ULP of log S, and the rounding of the sum.  And A, a sum of rounded target masses q_c, carries
 * those roundings.  Two levels, the second only where the first cannot hold the bound:
 *   1. every z-loss row: lse as a double-double, m plus log1p's unrounded kernel (~2^-57 of log S), so
 *      that only the exponentials' error remains (under 1.24 ULP of lse, as log S <= 2 |lse| where
 *      nothing cancels); where m + log S cancels (xf_rowjob_lse_cancels) the exact logsumexp instead.
 *      finish then forms A + 2 z r lse with exact products and one rounding (xf_a_eff_dd).
 *   2. where |A| + |2 z r lse| exceeds |A + 2 z r lse| twice over (float32: 2^5 times), the row is read
 *      again: S from double-double exponentials corrects lse by a Newton step on log,
 *      lse += log1p(S e^(m - lse) - 1), within (C + 18) 2^-100 absolute; and A is summed from
 *      double-double masses (1 - eps exact, eps / C_eff to 2^-106, exact products with t_j and w_j).
 *      The step keeps the correction only where its own error is below 2^-56 |lse|.
 * What is left: where A + 2 z r lse cancels to below about 2^-44 (|A| + C |2 z r|), an input made to put
 * lse at -A / (2 z r) to 44 bits, its error stays under ~(C + 18) 2^-99 |z r| + 2^-100 |A| absolute.
 * Cost: a log kernel per z-loss row; level 2 (~100x an ordinary row) on cancelling rows only, which in
 * training (z ~ 1e-4, lse > 0) never occur. */

/* lse + lse_lo := hi + lo, renormalised (an infinite or NaN hi stands alone) */
XF_HD void xf_rowjob_set_lse_dd(xf_rowjob *job, double hi, double lo)
{
    double h = hi + lo;
    int finite = (h - h == 0.0);
    job->lse = finite ? h : hi;
    job->lse_lo = finite ? lo - (h - hi) : 0.0;
}

/* Level 1 where m + log S does not cancel, from l + lo = xf_log1p_hilo(s_hi) (the CPU's short-row groups
 * take that logarithm for their rows side by side, softmax_rows.h) */
XF_HD void xf_rowjob_z_lse_from_log(xf_rowjob *job, double l, double lo)
{
    double h, e;
    /* the low part of s enters through the derivative 1 / (1 + s), as in xf_rowjob_set_sum */
    lo += job->s_lo / job->S;
    xf_two_sum(job->m, l, &h, &e);
    xf_rowjob_set_lse_dd(job, h, e + lo);
}

/* Level 1.  exact: the row's exact logsumexp (xf_lse_cancelling) where xf_rowjob_lse_cancels, unused
 * otherwise. */
XF_HD void xf_rowjob_z_lse(xf_rowjob *job, double exact)
{
    if (xf_rowjob_lse_cancels(job)) {
        job->lse = exact;
        job->lse_lo = 0.0;
        return;
    }
    double lo;
    double l = xf_log1p_hilo(job->s_hi, &lo);
    xf_rowjob_z_lse_from_log(job, l, lo);
}

/* Whether level 2 is needed (after level 1, terms as for xf_rowjob_finish). */
XF_HD int xf_rowjob_z_cancels(const xf_rowjob *job, const double *terms, int is_f32)
{
    if (job->z == 0.0 || job->status != XF_ROW_OK) {
        return 0;
    }
    double A = job->needs_terms ? terms[2] + terms[3] : job->w_y;
    double r = job->prob ? 1.0 : job->w_y;
    double zl = ((2.0 * job->z) * r) * job->lse;
    double mag = xf_fabs(A) + xf_fabs(zl);
    return (mag - mag == 0.0) && mag > (is_f32 ? 0x1p5 : 2.0) * xf_fabs(A + zl);
}

/* Level 2's constants: 1 - eps exactly (mass[0] + mass[1]) and eps / C_eff to 2^-106 (mass[2] + mass[3]) */
XF_HD void xf_z_redo_masses(const xf_rowjob *job, double mass[4])
{
    double n = (double)job->n_finite, p, pe;
    xf_two_sum(1.0, -job->eps, &mass[0], &mass[1]);
    mass[2] = job->eps_per_class;
    mass[3] = 0.0;
    if (n > 0.0 && job->eps_per_class >= 0x1p-960) {
        /* eps / n - q = (eps - q n) / n, with q n = p + pe exactly */
        xf_two_prod(job->eps_per_class, n, &p, &pe);
        mass[3] = ((job->eps - p) - pe) / n;
    }
}

/* Level 2, one class: e^(x_j - m) into acc[0] + acc[1] (x_j - m exact by TwoSum; terms below e^-80,
 * under 2^-115 of S, from xf_exp) and, where the loss has terms, q_j into acc[2] + acc[3]
 * (see xf_row_target_q; masses from xf_z_redo_masses). */
XF_HD void xf_z_redo_add(const xf_rowjob *job, long long j, double x_j, double w_j, double t_j,
                         const double *mass, double *acc)
{
    double finite = (x_j > -XF_INF) ? 1.0 : 0.0;
    if (finite != 0.0) {
        double dh, dl, eh, el;
        xf_two_sum(x_j, -job->m, &dh, &dl);
        if (dh >= -80.0) {
            xf_dd_exp(dh, dl, &eh, &el);
        } else {
            eh = xf_exp(dh);
            el = 0.0;
        }
        xf_dd_add(&acc[0], &acc[1], eh, el);
    }
    if (!job->needs_terms) {
        return;
    }
    double qh = 0.0, ql = 0.0, ph, pl;
    if (job->prob) {
        xf_two_prod(mass[0], t_j, &qh, &ql);
        ql += mass[1] * t_j;
    }
    if (finite != 0.0) {
        xf_dd_add(&qh, &ql, mass[2], mass[3]);
    }
    xf_dd_mul(qh, ql, w_j, 0.0, &ph, &pl);
    if (j == job->y) {
        double yh, yl;
        xf_dd_mul(mass[0], mass[1], job->w_y, 0.0, &yh, &yl);
        xf_dd_add(&ph, &pl, yh, yl);
    }
    xf_dd_add(&acc[2], &acc[3], ph, pl);
}

/* Level 2's result: lse corrected (where that helps) and A replaced in terms (where finite). */
XF_HD void xf_rowjob_z_redo(xf_rowjob *job, long long C, const double *acc, double *terms)
{
    double kh, kl, eh, el, ph, pl, uh, ue;
    xf_two_sum(job->m, -job->lse, &kh, &kl);
    kl -= job->lse_lo;
    if (kh >= -80.0 && kh <= 12.0 && ((double)C + 18.0) * 0x1p-100 < 0x1p-56 * xf_fabs(job->lse)) {
        xf_dd_exp(kh, kl, &eh, &el);
        xf_dd_mul(acc[0], acc[1], eh, el, &ph, &pl);
        xf_two_sum(ph, -1.0, &uh, &ue);
        double u = uh + (ue + pl);
        /* |u| ~ the level-1 error, so the cubic term of log1p is far below 2^-100 */
        xf_rowjob_set_lse_dd(job, job->lse, job->lse_lo + (u - 0.5 * (u * u)));
    }
    if (job->needs_terms && (acc[2] - acc[2] == 0.0)) {
        terms[2] = acc[2];
        terms[3] = acc[3];
    }
}

/* Both levels for one row given as float (xf, tf) or as double (xd, td) data, the other pointers NULL;
 * tf / td NULL for index targets, w NULL without weights; exact as for xf_rowjob_z_lse (the caller's:
 * on the GPU, calling xf_lse_cancelling from here cost its own kernel 16 registers and a spill).  What
 * the CPU runs before finish on every z-loss row, and the GPU's second kernel on the rows its row kernel
 * flagged (kernels.cu). */
XF_HD void xf_rowjob_z_lse_row(xf_rowjob *job, const float *xf, const double *xd, const float *tf,
                               const double *td, const double *w, long long C, double exact, double *terms)
{
    long long j;
    const int is_f32 = (xf != 0);
    xf_rowjob_z_lse(job, exact);
    if (!xf_rowjob_z_cancels(job, terms, is_f32)) {
        return;
    }
    double mass[4], acc[4] = {0.0, 0.0, 0.0, 0.0};
    const int has_t = (tf != 0 || td != 0);
    xf_z_redo_masses(job, mass);
    for (j = 0; j < C; j++) {
        xf_z_redo_add(job, j, xf_lse_load(xf, xd, j), w ? w[j] : 1.0, has_t ? xf_lse_load(tf, td, j) : 0.0, mass,
                      acc);
    }
    xf_rowjob_z_redo(job, C, acc, terms);
}

/* exp(x_j - m) per storage type: exact shift and the 0.62-ULP exponential for double; for float the
 * double difference (error 2^-53 |x - m|, far below float32's grain) and the 2^-32 exponential, since
 * every use rounds to float32 or lands in a double sum of float32-accurate terms.  The float forms take
 * the float32 entry already widened (exact), so that a caller may widen several at once (the short-row
 * groups, softmax_rows.h).
 * Below XF_EXP_CLAMP_LO (xf_math.h) both exponentials clamp their argument there and return +0 (e^-745.2 is under
 * half the smallest subnormal).  They are given 0 instead and their result replaced by +0, the same
 * bits: evaluated, the clamped argument's scaling products underflow, and each such product costs a
 * microcode assist on x86 CPUs (subnormals are never flushed here), about a hundred cycles: rows with
 * masked classes (-inf, or a finite mask such as -1e9) ran 4-12x slower than rows without. */
XF_HD double xf_exp_minus_f64(double x, double m)
{
    /* x - m rounded is what the exponential's clamp tests too (xf_exp_kernel) */
    int zero = (x - m) < XF_EXP_CLAMP_LO;
    double e = xf_exp_shifted(zero ? m : x, m);
    return zero ? 0.0 : e;
}

XF_HD double xf_exp_minus_f32(double x, double m)
{
    double d = x - m;
    int zero = d < XF_EXP_CLAMP_LO;
    double e = xf_exp_lite(zero ? 0.0 : d);
    return zero ? 0.0 : e;
}

/* The same exponentials without the clamp and with the one-step scale, bit for bit equal where
 * they apply: rows whose entries are all finite and within XF_NORMAL_SPREAD of the max, so that every
 * 2^n is a normal number (xf_exp_scale_normal).  That is every row of ordinary logits; the sum pass
 * picks the form per row (xf_rowjob_set_exp_form, after the max pass). */
#define XF_NORMAL_SPREAD 708.0
XF_HD double xf_exp_minus_f64_normal(double x, double m)
{
    return xf_exp_shifted_normal(x, m);
}

XF_HD double xf_exp_minus_f32_normal(double x, double m)
{
    return xf_exp_lite_normal(x - m);
}

/* The normal form on a row with masked classes (a row of status OK has no NaN and no +inf): entries
 * that are -inf, or finite and below fl(m - XF_MASK_FAR) (a finite mask such as -1e9 or the dtype's
 * minimum), while every other entry lies within XF_NORMAL_SPREAD of the max.  Whether a row qualifies is
 * decided before (xf_rowjob_set_exp_form, xf_row_mask_form, xf_group_stats): an entry it leaves out has
 * fl(x - m) <= -746 (the subtraction of values within a factor 2 is exact, and a lower binade only
 * halves the spacing), below the general form's clamp XF_EXP_CLAMP_LO, where that form gives +0.  A
 * masked entry is given the max and its result replaced by that +0, so every entry keeps its bits; the
 * test (XF_MASK_TEST) only has to lie between the two groups.  A compare and two selects more per
 * element, where the general form's clamp and two-step scale cost about twice an ordinary row
 * (benchmarks/README.md, 2026-12-03). */
#define XF_MASK_FAR 746.0
#define XF_MASK_TEST (-727.0)
XF_HD double xf_exp_minus_f64_masked(double x, double m)
{
    int masked = x - m < XF_MASK_TEST;
    double e = xf_exp_shifted_normal(masked ? m : x, m);
    return masked ? 0.0 : e;
}

XF_HD double xf_exp_minus_f32_masked(double x, double m)
{
    double d = x - m;
    int masked = d < XF_MASK_TEST;
    double e = xf_exp_lite_normal(masked ? 0.0 : d);
    return masked ? 0.0 : e;
}

/* 1: every entry finite and within XF_NORMAL_SPREAD of the max; 2: the same of the finite entries, the
 * others -inf (rows with finite masks: xf_row_mask_form, on the CPU's row path); 0: the general form. */
XF_HD void xf_rowjob_set_exp_form(xf_rowjob *job, long long C)
{
    int spread_ok = job->status == XF_ROW_OK && job->m - job->min_finite <= XF_NORMAL_SPREAD;
    job->exp_normal = !spread_ok ? 0 : (job->n_finite == C) ? 1 : 2;
}

#endif /* XENTFAST_SOFTMAX_ROW_H */
