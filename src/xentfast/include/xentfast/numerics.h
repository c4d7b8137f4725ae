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
    /* an infinite (or NaN) sum has no error term: inf - inf in the EFT would turn +inf into NaN, and so
     * would h - s where a finite s rounds up to an infinite h */
    int finite = (s - s == 0.0);
    *hi = finite ? h : s;
    *lo = (finite & (h - h == 0.0)) ? e - (h - s) : 0.0;
}

/* Compensated accumulation step (TwoSum, error collected separately), inf-safe like xf_dd_add. */
XF_HD void xf_acc_add(double *acc, double *err, double v)
{
    double s, e;
    xf_two_sum(*acc, v, &s, &e);
    *acc = s;
    *err += (s - s == 0.0) ? e : 0.0;
}

/* xf_acc_add where the running sum cannot become infinite (the normal-form exponential sums: terms in
 * [0, 1], far fewer than 2^1000 of them): the same bits without the guard, three operations fewer. */
XF_HD void xf_acc_add_finite(double *acc, double *err, double v)
{
    double s, e;
    xf_two_sum(*acc, v, &s, &e);
    *acc = s;
    *err += e;
}

/* ---- double-double arithmetic for rare exact paths (about 2^-104 relative) ----------------------- */

/* p + e == a * b exactly (Dekker; Veltkamp split: xf_fma's emulation would cost more on the baseline path).
 * Finite inputs with |a * b| well inside the normal range. */
XF_HD void xf_two_prod(double a, double b, double *p, double *e)
{
    const double split = 134217729.0; /* 2^27 + 1 */
    double ca = split * a, cb = split * b;
    double ah = ca - (ca - a), al = a - ah;
    double bh = cb - (cb - b), bl = b - bh;
    *p = a * b;
    *e = ((ah * bh - *p) + ah * bl + al * bh) + al * bl;
}

XF_HD void xf_dd_mul(double ah, double al, double bh, double bl, double *h, double *l)
{
    double p, e;
    xf_two_prod(ah, bh, &p, &e);
    e += ah * bl + al * bh;
    *h = p + e;
    *l = e - (*h - p);
}

/* exp(hi + lo) as a double-double, for hi in [-80, 12] (the exact-logsumexp path needs no more):
 * n = round(x / ln 2), r = x - n ln 2 with ln 2 in three parts (n * LN2_A exact), then Taylor to r^23
 * in double-double (0.347^24 / 24! < 2^-112) and an exact scaling by 2^n. */
XF_HD void xf_dd_exp(double hi, double lo, double *eh, double *el)
{
    static const double inv_fact[22][2] = {
        {0x1.5555555555555p-3, 0x1.5555555555555p-57},   {0x1.5555555555555p-5, 0x1.5555555555555p-59},
        {0x1.1111111111111p-7, 0x1.1111111111111p-63},   {0x1.6c16c16c16c17p-10, -0x1.f49f49f49f49fp-65},
        {0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-73},  {0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-76},
        {0x1.71de3a556c734p-19, -0x1.c154f8ddc6c00p-73}, {0x1.27e4fb7789f5cp-22, 0x1.cbbc05b4fa99ap-76},
        {0x1.ae64567f544e4p-26, -0x1.c062e06d1f209p-80}, {0x1.1eed8eff8d898p-29, -0x1.2aec959e14c06p-83},
        {0x1.6124613a86d09p-33, 0x1.f28e0cc748ebep-87},  {0x1.93974a8c07c9dp-37, 0x1.05d6f8a2efd1fp-92},
        {0x1.ae7f3e733b81fp-41, 0x1.1d8656b0ee8cbp-97},  {0x1.ae7f3e733b81fp-45, 0x1.1d8656b0ee8cbp-101},
        {0x1.952c77030ad4ap-49, 0x1.ac981465ddc6cp-103}, {0x1.6827863b97d97p-53, 0x1.eec01221a8b0bp-107},
        {0x1.2f49b46814157p-57, 0x1.2650f61dbdcb4p-112}, {0x1.e542ba4020225p-62, 0x1.ea72b4afe3c2fp-120},
        {0x1.71b8ef6dcf572p-66, -0x1.d043ae40c4647p-120}, {0x1.0ce396db7f853p-70, -0x1.aebcdbd20331cp-124},
        {0x1.761b41316381ap-75, -0x1.3423c7d91404fp-130}, {0x1.f2cf01972f578p-80, -0x1.9ada5fcc1ab14p-135},
    }; /* 1/3! .. 1/24! */
    double t = hi * XF_MATH_LOG2E + XF_MATH_SHIFTER;
    double n = t - XF_MATH_SHIFTER;
    double rh, rl, ph, pl, e1, e2;
    /* r = (hi - n A) + (lo - n B - n C); n A is exact (A has 32 bits), hi - n A exact (Sterbenz) */
    xf_two_prod(-n, 0x1.a39ef35793c76p-33, &ph, &pl);
    xf_two_sum(hi - n * 0x1.62e42feep-1, ph, &rh, &e1);
    e2 = e1 + pl + lo - n * 0x1.cc01f97b57a08p-87;
    xf_two_sum(rh, e2, &rh, &rl);
    int k;
    ph = inv_fact[21][0];
    pl = inv_fact[21][1];
    for (k = 20; k >= 0; k--) { /* p = p * r + 1/(k+3)! */
        xf_dd_mul(ph, pl, rh, rl, &ph, &pl);
        xf_dd_add(&ph, &pl, inv_fact[k][0], inv_fact[k][1]);
    }
    xf_dd_mul(ph, pl, rh, rl, &ph, &pl); /* p = p * r + 1/2 */
    xf_dd_add(&ph, &pl, 0.5, 0.0);
    xf_dd_mul(ph, pl, rh, rl, &ph, &pl); /* p = p * r + 1 */
    xf_dd_add(&ph, &pl, 1.0, 0.0);
    xf_dd_mul(ph, pl, rh, rl, &ph, &pl); /* p = p * r + 1 */
    xf_dd_add(&ph, &pl, 1.0, 0.0);
    double scale = xf_double_from_bits((xf_bits_from_double(t) + 1023ULL) << 52); /* 2^n, n in [-117, 18] */
    *eh = ph * scale;
    *el = pl * scale;
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

/* xf_exp_shifted for finite x with x - m in [-708, 0]: the same bits (xf_exp_dd_normal), no special
 * cases. */
XF_HD double xf_exp_shifted_normal(double x, double m)
{
    double d, d_err;
    xf_two_sum(x, -m, &d, &d_err);
    return xf_exp_dd_normal(d, d_err);
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

/* log p_j = (x_j - m) - log S: xf_neg_log_prob's evaluation with every sign flipped.  TwoSum's error is
 * exact whatever the order of its operands, and round-to-nearest is symmetric, so the result is
 * -xf_neg_log_prob bit for bit (log_softmax and the per-row loss agree), except at an exact zero: a
 * probability of exactly 1 gives +0.0, as torch's (x - max) - logsumexp does, where the negated sum gave
 * -0.0. */
XF_HD double xf_log_prob(double x, double m, double log_s)
{
    double d, d_err;
    xf_two_sum(x, -m, &d, &d_err);
    d_err = (d - d == 0.0) ? d_err : 0.0;
    return d - (log_s - d_err);
}

/* xf_log_prob where x - m is finite (x finite, as in a row the unclamped exponentials take): the same
 * bits without the test for an infinite difference */
XF_HD double xf_log_prob_finite(double x, double m, double log_s)
{
    double d, d_err;
    xf_two_sum(x, -m, &d, &d_err);
    return d - (log_s - d_err);
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
