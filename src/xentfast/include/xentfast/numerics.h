/* xentfast/numerics.h: THE arithmetic of every xentfast kernel, CPU and GPU.
 *
 * All functions are scalar, branch-free where they sit in an element loop (selects, so gcc vectorizes
 * them under `#pragma omp simd`), and evaluate in double whatever the storage type: for float32 data the
 * double intermediates carry 29 spare bits, so the only error that survives is the final rounding.
 * For float64 data the formulas below carry the rounding error of the one subtraction that matters
 * (x_j - m) in an error-free transformation (TwoSum), which is what keeps tiny probabilities and
 * gradients within a few ULPs instead of |x_j - m| * eps.
 *
 * Error bounds quoted here are measured against mpmath (see tests/test_numerics.py) and use the
 * metric of the README: |computed - exact| / ulp(exact), ulp in the spacing of doubles at |exact|.
 */
#ifndef XENTFAST_NUMERICS_H
#define XENTFAST_NUMERICS_H

#include "config.h"
#include "xf_math.h"

/* ---- error-free transformations (Knuth, Dekker) -------------------------------------------------
 * Exact only without FP contraction: the build pins -ffp-contract=off (CPU) and --fmad=false (GPU). */

/* s + e == a + b exactly, s = fl(a + b); no precondition on |a|, |b|; six flops, no branch. */
XF_HD void xf_two_sum(double a, double b, double *s, double *e)
{
    double sum = a + b;
    double b_virtual = sum - a;
    double a_virtual = sum - b_virtual;
    *s = sum;
    *e = (a - a_virtual) + (b - b_virtual);
}

/* Double-double accumulation: (hi, lo) += (b_hi, b_lo), renormalized.  Relative error ~2^-104 for
 * same-sign operands, which is all the kernels ever add (sums of exponentials and of losses). */
XF_HD void xf_dd_add(double *hi, double *lo, double b_hi, double b_lo)
{
    double s, e;
    xf_two_sum(*hi, b_hi, &s, &e);
    e += *lo + b_lo;
    double h = s + e;
    /* an infinite (or NaN) sum has no error term: inf - inf in the EFT would turn +inf into NaN */
    int finite = (s - s == 0.0);
    *hi = finite ? h : s;
    *lo = finite ? e - (h - s) : 0.0;
}

/* Compensated accumulation step (TwoSum, error collected separately), inf-safe like xf_dd_add. */
XF_HD void xf_acc_add(double *acc, double *err, double v)
{
    double s, e;
    xf_two_sum(*acc, v, &s, &e);
    *acc = s;
    *err += (s - s == 0.0) ? e : 0.0;
}

/* ---- softmax pieces --------------------------------------------------------------------------------
 * Row notation: m = max_j x_j (finite), S = sum_j exp(x_j - m) = 1 + s, where s sums every term except
 * the one at the (first) argmax.  Keeping s apart from the exact 1 is the whole trick:
 *   log S            = log1p(s)               never log(1 + tiny) = 0  (confident rows)
 *   1 - p_argmax     = s / S                  never p - 1 by subtraction
 */

/* exp(x - m) for float64 data: x - m rounded would cost |x - m| * eps/2 of relative error in the
 * result (up to ~370 ULP at the underflow edge); the TwoSum remainder is folded into the reduced
 * argument of the exponential instead.  x = -inf gives exactly 0. */
XF_HD double xf_exp_shifted(double x, double m)
{
    double d, d_err;
    xf_two_sum(x, -m, &d, &d_err);
    /* for x = -inf the remainder is NaN (inf - inf): zero it so the exponential sees a clean (-inf, 0) */
    d_err = (d - d == 0.0) ? d_err : 0.0;
    return xf_exp_dd(d, d_err);
}

/* exp(x - m) * 2^600 for float64 data, the shift and the scale k ln 2 both carried as double-doubles
 * (k * LN2_HI is exact; k * LN2_LO is off by ~2^-80 relative).  Where exp(x - m) is subnormal, every
 * later product would scale up its fixed absolute rounding error; computed 2^600 larger, the value is
 * normal and the single rounding happens when the caller multiplies back by 2^-600.  x = -inf gives 0. */
#define XF_POW2_SCALE_K 600.0
#define XF_POW2_UNSCALE 0x1p-600
XF_HD double xf_exp_shifted_pow2(double x, double m)
{
    double d, d_err, a, a_err;
    xf_two_sum(x, -m, &d, &d_err);
    d_err = (d - d == 0.0) ? d_err : 0.0;
    xf_two_sum(d, XF_POW2_SCALE_K * XF_MATH_LN2_HI, &a, &a_err);
    a_err = (a - a == 0.0) ? a_err : 0.0;
    return xf_exp_dd(a, a_err + (d_err + XF_POW2_SCALE_K * XF_MATH_LN2_LO));
}

/* -log p_j = (m - x_j) + log S, for a class that is not the argmax.  Both terms are >= 0, so the sum
 * has no cancellation; m - x_j is carried exactly (TwoSum) and the error is that of log S
 * (<= 1.5 ULP of log S <= 1.5 ULP of the result) plus two roundings. x_j = -inf gives +inf. */
XF_HD double xf_neg_log_prob(double x, double m, double log_s)
{
    double d, d_err;
    xf_two_sum(m, -x, &d, &d_err);
    d_err = (d - d == 0.0) ? d_err : 0.0;
    return d + (log_s + d_err);
}

/* log p_j = (x_j - m) - log S: same evaluation as xf_neg_log_prob with the signs flipped (negation is
 * exact), so log_softmax and the per-row loss agree bit for bit. */
XF_HD double xf_log_prob(double x, double m, double log_s)
{
    return -xf_neg_log_prob(x, m, log_s);
}

/* ---- binary (sigmoid) pieces ---------------------------------------------------------------------- */

/* softplus(x) = log(1 + e^x), Maechler (2012, "Accurately computing log(1 - exp(-|a|))", eq. 10):
 *   x <= -37      e^x               (log1p(e^x) = e^x (1 - e^x/2 + ...), e^x/2 < 2^-54)
 *   x <=  18      log1p(e^x)
 *   x <=  33.3    x + e^-x          (the e^-2x/2 term is below half an ulp of x)
 *   else          x
 * Only the cutoff at 18 matters for accuracy; the others skip work. */
XF_HD double xf_log1pexp(double x)
{
    double ex = xf_exp(x);
    double emx = xf_exp(-x);
    double mid = xf_log1p(ex);
    double r = (x <= -37.0) ? ex : ((x <= 18.0) ? mid : ((x <= 33.3) ? x + emx : x));
    return r;
}

/* sigma(x) = 1 / (1 + e^-x), evaluated on the side where e = e^{-|x|} <= 1 so neither tail cancels:
 * x >= 0: 1/(1 + e); x < 0: e/(1 + e), one division each (e * (1/(1+e)) would add a rounding).
 * Exact 1/2 at x = +-0.  Bound: exp's 0.62 ULP (damped by e/(1+e) on the x >= 0 side) + two roundings. */
XF_HD double xf_sigmoid(double x)
{
    double e = xf_exp(-xf_fabs(x));
    double num = (x >= 0.0) ? 1.0 : e;
    return num / (1.0 + e);
}

#endif /* XENTFAST_NUMERICS_H */
