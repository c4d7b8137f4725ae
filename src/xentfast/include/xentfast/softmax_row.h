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

/* Block of classes that one task handles; fixed, so the merge order never depends on threads. */
#define XF_BLOCK 4096
/* Fixed accumulation lanes inside a block (element j -> lane j % XF_LANES), see softmax_rows.h (b). */
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
    int stored;          /* the sum pass keeps exp(x_j - m) in the gradient buffer (xf_rowjob_plan) */
    double x_y;          /* target logit, read before any pass may overwrite the logits (inplace) */
    /* set by the max pass */
    int status;
    int has_nan;
    double m;
    long long argmax;
    long long n_finite;
    double min_finite;
    double eps_per_class; /* eps / C_eff: smoothing spreads over classes with finite logits */
    /* set by the sum pass */
    double s_hi, s_lo;   /* s = sum over j != argmax of exp(x_j - m) */
    double S;            /* 1 + s */
    int rescued;         /* float64, s < 2^-900: s is also held as s_scaled = s * 2^600 */
    double s_scaled;
    double log_s;        /* log S = log1p(s) */
    double lse;          /* m + log S */
    /* set by finish */
    double coef;         /* gradient: coef * p_j * coef_mult - scale * q_j */
    double coef_mult;    /* power of two kept apart so coef stays finite (logits or upstream near DBL_MAX) */
    int grad_scaled;     /* float64 rows with subnormal p_j and |coef| > 1: see xf_exp_shifted_pow2 */
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
    job->stored = 0;
    job->x_y = 0.0;
    job->status = XF_ROW_OK;
    job->has_nan = 0;
    job->m = 0.0;
    job->argmax = 0;
    job->n_finite = 0;
    job->min_finite = XF_INF;
    job->eps_per_class = 0.0;
    job->rescued = 0;
    job->s_scaled = 0.0;
    job->grad_scaled = 0;
    job->s_hi = job->s_lo = 0.0;
    job->S = 1.0;
    job->log_s = 0.0;
    job->lse = 0.0;
    job->coef = 0.0;
    job->coef_mult = 1.0;
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
}

/* After the max pass: remember the target logit, and decide whether the sum pass may keep the
 * exponentials in the gradient buffer.  Only simple rows (their gradient is p_j times a constant, the
 * target entry apart) and only rows without a spread beyond 600: those may need x again after the sum
 * pass (the tiny-sum rescue, the scaled float64 gradient), and with inplace=True x is the buffer. */
XF_HD void xf_rowjob_plan(xf_rowjob *job, double x_y, int has_grad)
{
    job->x_y = x_y;
    job->stored = has_grad && job->simple && job->status == XF_ROW_OK && (job->m - job->min_finite <= 600.0);
}

XF_HD void xf_rowjob_set_sum(xf_rowjob *job, double s_hi, double s_lo)
{
    job->s_hi = s_hi;
    job->s_lo = s_lo;
    job->S = 1.0 + s_hi;
    /* log1p of the double-double s: the low part enters through the derivative 1/(1+s) */
    job->log_s = xf_log1p(s_hi) + s_lo / job->S;
    job->lse = job->m + job->log_s;
}

/* float64 rows whose non-max terms all lie ~620+ below the max: s is then a sum of subnormal
 * exponentials, each rounded to the fixed subnormal grid, so their absolute errors add up (C/2 ULP of
 * a subnormal loss).  Such rows are re-summed with every term scaled by 2^600 (xf_exp_shifted_pow2) and
 * keep that scaled sum for the loss and the target gradient, which multiply it by weights before the
 * one rounding back.  Rare and per row, so it runs serially and does not slow the common path. */
#define XF_TINY_SUM 0x1p-900
XF_HD void xf_rowjob_rescue_tiny_sum(xf_rowjob *job, const double *x, long long C)
{
    if (job->status != XF_ROW_OK || !(job->s_hi < XF_TINY_SUM) || job->s_hi == 0.0) {
        return;
    }
    double hi = 0.0, lo = 0.0;
    long long j;
    for (j = 0; j < C; j++) {
        if (j != job->argmax) {
            xf_dd_add(&hi, &lo, xf_exp_shifted_pow2(x[j], job->m), 0.0);
        }
    }
    xf_rowjob_set_sum(job, (hi + lo) * XF_POW2_UNSCALE, 0.0);
    job->rescued = 1;
    job->s_scaled = hi + lo;
}

/* w * log S for a row's argmax class (log S = s when rescued: log1p(s) = s below 2^-900). */
XF_HD double xf_weighted_log_s(const xf_rowjob *job, double w)
{
    return job->rescued ? (w * job->s_scaled) * XF_POW2_UNSCALE : w * job->log_s;
}

/* The effective (unscaled) target mass of class j, see the README's semantics:
 *   index targets:        q_j = (1 - eps) w_y [j == y] + eps/C_eff * w_j [x_j > -inf]
 *   probability targets:  q_j = w_j ((1 - eps) t_j + eps/C_eff [x_j > -inf])                      */
XF_HD double xf_row_target_q(const xf_rowjob *job, long long j, double w_j, double finite, double t_j)
{
    double smooth = job->eps_per_class * finite;
    double q = job->prob ? w_j * ((1.0 - job->eps) * t_j + smooth) : w_j * smooth;
    return (j == job->y) ? q + (1.0 - job->eps) * job->w_y : q;
}

/* Whether q_j > 0 in exact arithmetic (the computed q_j of a subnormal weight or probability may round
 * to 0, and a class with mass on a -inf logit must still make the loss +inf). */
XF_HD int xf_row_target_has_mass(const xf_rowjob *job, long long j, double w_j, double finite, double t_j)
{
    int smooth = (job->eps_per_class > 0.0 && finite > 0.0 && w_j > 0.0);
    int direct = job->prob ? (w_j > 0.0 && t_j > 0.0 && job->eps < 1.0)
                           : (j == job->y && job->w_y > 0.0 && job->eps < 1.0);
    return smooth || direct;
}

/* One class's part of the loss-terms pass (probability targets, smoothing): returns the loss term
 * loss_scale * q_j * (-log p_j) and stores q_j.  0 * inf = 0: a class the target gives no mass adds
 * nothing, even when masked (-inf); where m - x_j exceeds DBL_MAX the term is evaluated halved. */
XF_HD double xf_xent_term(const xf_rowjob *job, long long j, double x_j, double w_j, double t_j, double *q_out)
{
    double finite = (x_j > -XF_INF) ? 1.0 : 0.0;
    double q = xf_row_target_q(job, j, w_j, finite, t_j);
    double nlp = xf_neg_log_prob(x_j, job->m, job->log_s);
    double q_loss = q * job->loss_scale;  /* exact: a power of two */
    double term = xf_row_target_has_mass(job, j, w_j, finite, t_j) ? ((nlp == XF_INF) ? XF_INF : q_loss * nlp)
                                                                     : 0.0;
    if (!(nlp - nlp == 0.0) && x_j > -XF_INF) {
        term = (q_loss * xf_neg_log_prob(0.5 * x_j, 0.5 * job->m, 0.5 * job->log_s)) * 2.0;
    }
    *q_out = q;
    return (j == job->argmax) ? xf_weighted_log_s(job, q_loss) : term;
}

XF_HD void xf_lanes_to_dd(const double *acc, const double *cmp, double *hi, double *lo)
{
    int k;
    *hi = acc[0];
    *lo = cmp[0];
    for (k = 1; k < XF_LANES; k++) {
        xf_dd_add(hi, lo, acc[k], cmp[k]);
    }
}

XF_HD void xf_terms_merge(double *acc, const double *blk)
{
    xf_dd_add(&acc[0], &acc[1], blk[0], blk[1]);
    xf_dd_add(&acc[2], &acc[3], blk[2], blk[3]);
}

/* Row loss and gradient coefficient (x_y from xf_rowjob_plan).  terms: see pass 3.
 *   loss = sum_c q_c (-log p_c) + z r lse^2         (r = w_y for index targets, 1 for probabilities)
 *   d loss / d x_j = p_j (A + 2 z r lse) - q_j       (A = sum_c q_c)                                   */
XF_HD double xf_rowjob_finish(xf_rowjob *job, const double *terms)
{
    if (job->status != XF_ROW_OK) {
        job->coef = XF_NAN;
        return XF_NAN;
    }
    double ce, A;
    if (job->needs_terms) {
        ce = terms[0] + terms[1];
        A = terms[2] + terms[3];
    } else {
        double nlp = xf_neg_log_prob(job->x_y, job->m, job->log_s);
        /* a zero-weight class contributes 0 even if its logit is -inf (0 * inf = 0 by convention) */
        double w_loss = job->w_y * job->loss_scale;
        ce = (job->w_y == 0.0) ? 0.0 : ((nlp == XF_INF) ? XF_INF : w_loss * nlp);
        ce = (job->y == job->argmax) ? xf_weighted_log_s(job, w_loss) : ce;
        A = job->w_y;
    }
    double r = job->prob ? 1.0 : job->w_y;
    double loss = ce;
    double a_eff = A;
    job->coef_mult = 1.0;
    if (job->z != 0.0) {
        /* lse * lse first could overflow needlessly */
        loss = ce + ((job->z * r * job->loss_scale) * job->lse) * job->lse;
        a_eff = A + 2.0 * job->z * r * job->lse;
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
    /* p_j below the normal range only where x_j - m < -708; with |coef| <= 1 its rounding is not
     * magnified, so the scaled evaluation is needed only beyond both */
    job->grad_scaled = (job->m - job->min_finite > 700.0) && (xf_fabs(job->coef) * job->coef_mult > 1.0);
    return loss;
}

/* Target entry of the gradient on the simple path, without the p_y - 1 cancellation:
 *   y is the argmax:  -scale w_y * s / S          (s = sum of the other exponentials)
 *   otherwise:        scale w_y * (p_y - 1), where p_y <= 1/2, so the subtraction is benign. */
XF_HD double xf_target_grad(const xf_rowjob *job, double e_y)
{
    if (job->y == job->argmax) {
        return job->rescued ? -(job->coef * job->s_scaled) * (job->coef_mult * XF_POW2_UNSCALE)
                            : -(job->coef * ((job->s_hi + job->s_lo) / job->S)) * job->coef_mult;
    }
    return (job->coef * (e_y / job->S - 1.0)) * job->coef_mult;
}

/* logsumexp of a float64 row where m and log S cancel (|lse| < |m| / 2, possible only for m in
 * [-log C, 0)): there the double sum S (each term good to 0.62 ULP) and log S leave an error of a few
 * ULP of m, not of the much smaller result.  This rare path redoes the row in double-double: S from
 * double-double exponentials (terms below e^-80 are under 2^-115 of S), log S by one Newton step from
 * the double log (log S = L0 + log1p(S e^-L0 - 1)), then m + log S rounded once.  Other rows return
 * job->lse unchanged. */
XF_HD double xf_rowjob_exact_lse_f64(const xf_rowjob *job, const double *x, long long C)
{
    if (job->status != XF_ROW_OK || !(xf_fabs(job->lse) < 0.5 * xf_fabs(job->m))) {
        return job->lse;
    }
    double sh = 0.0, sl = 0.0, eh, el, d, d_err, t, t_err;
    long long j;
    for (j = 0; j < C; j++) {
        xf_two_sum(x[j], -job->m, &d, &d_err);
        if (d >= -80.0) {
            xf_dd_exp(d, d_err, &eh, &el);
            xf_dd_add(&sh, &sl, eh, el);
        }
    }
    double L0 = xf_log(sh);
    xf_dd_exp(-L0, 0.0, &eh, &el);
    xf_dd_mul(sh, sl, eh, el, &t, &t_err); /* S e^-L0 = 1 + tiny */
    double u = (t - 1.0) + t_err;            /* t - 1 is exact (Sterbenz) */
    double corr = u - 0.5 * u * u;           /* log1p(u), |u| < 2^-50 */
    double lh, ll;
    xf_two_sum(job->m, L0, &lh, &ll);
    return lh + (ll + corr);
}

/* exp(x_j - m) per storage type: exact shift and the 0.62-ULP exponential for double; for float the
 * double difference (error 2^-53 |x - m|, far below float32's grain) and the 2^-32 exponential, since
 * every use rounds to float32 or lands in a double sum of float32-accurate terms. */
XF_HD double xf_exp_minus_f64(double x, double m)
{
    return xf_exp_shifted(x, m);
}

XF_HD double xf_exp_minus_f32(float x, double m)
{
    return xf_exp_lite((double)x - m);
}

/* exp(x_j - m) as kept in a float32 output buffer between passes: scaled by 2^64 so that values down to
 * 2^-213 keep their digits (double buffers keep the exponential itself, exactly). */
#define XF_KEPT_SCALE_F32 0x1p64
#define XF_KEPT_UNSCALE_F32 0x1p-64

#endif /* XENTFAST_SOFTMAX_ROW_H */
