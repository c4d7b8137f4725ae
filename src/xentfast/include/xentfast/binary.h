/* xentfast/binary.h: the arithmetic of the binary family, shared by the CPU kernels and the CUDA twin.
 *
 *   BCE with logits   w [(1-y) softplus(x) + q y softplus(-x)]          d/dx = w [(1-y) s(x) - q y s(-x)]
 *   focal (torchvision) a_t ce u^g,  ce = BCE(q = 1), u = 1 - p_t = (1-y) s(x) + y s(-x)
 *   BCE from p        w [-y log p - (1-y) log(1-p)]  (optionally clipped or log-clamped)
 *   CE from class p   -sum_c q_c log p_c                               d/dp_j = -q_j / p_j
 *
 * (s = sigmoid.)  Everything is evaluated in double whatever the storage type, in the common subset of
 * C99 and C++17 (see config.h), from the primitives of numerics.h / xf_math.h.  The ideas, once:
 *
 * (a) One exponential per logit.  With a = |x| and e = exp(-a) <= 1, every quantity of a logit is a
 *     positive combination of e, 1 + e and l = log1p(e), split into a "big" side (never below 1/2) and a
 *     "tail" side (can be tiny):
 *         x >= 0:  softplus(x) = a + l   softplus(-x) = l     s(x) = 1/(1+e)   s(-x) = e/(1+e)
 *         x <  0:  softplus(x) = l       softplus(-x) = a + l s(x) = e/(1+e)   s(-x) = 1/(1+e)
 *     No formula subtracts: the loss is a sum of two non-negative terms and, for y in {0, 1}, the
 *     gradient is one term (its sign fixed), so there is nothing to cancel (anchors b.2: PyTorch's
 *     (1-y)x - log_sigmoid(x) and l s(x) - q y both cancel in a tail).  x = +-0 gives e = 1, s = 1/2
 *     exactly: no kink convention is involved, because no max(x, 0) or |x| is ever differentiated.
 * (b) Tails are carried scaled by 2^600.  e is computed as exp(-a + 600 ln 2) with the shift held as a
 *     double-double, so e_s = e 2^600 is normal (and accurate to exp's 0.62 ULP) for a up to ~1160;
 *     weights, pos_weight, the upstream gradient and target coefficients multiply e_s, and only the very
 *     last multiplication by 2^-600 rounds onto the subnormal grid.  Multiplying an already subnormal
 *     e by a weight > 1 would instead scale up its fixed absolute rounding error (the softmax family
 *     met the same problem, see xf_exp_shifted_pow2).
 * (c) Products put the factors that can be tiny (soft targets y, the tail values) last, after the
 *     factors that are >= 1/2 or user weights, so that an intermediate result is subnormal only when
 *     the final one is below the subnormal range anyway.
 * (d) 1 - y and 1 - alpha are carried exactly as a double-double (TwoSum): fl(1 - y) alone would cost
 *     half an ULP for every y < 1/2.
 * (e) Zero coefficients win over infinities and NaN-free values: a term whose coefficient (weight,
 *     pos_weight, target mass) is exactly 0 contributes exactly 0 even where its softplus or -log is
 *     +inf (0 * inf = 0, as in the softmax family).  A NaN logit or probability makes the element NaN.
 *
 * Names carry the xf_bin_ prefix so that nothing here can collide with additions to numerics.h.
 * Error bounds (measured against mpmath, tests/test_binary.py, tests/test_probs.py; same words as the
 * README): loss and gradient <= 2 ULP for float32 storage (the double result rounded once) and <= 4 ULP
 * for float64 storage; gradients with soft targets in units of the ulp of the sum of the magnitudes of
 * the terms that cancel.
 */
#ifndef XENTFAST_BINARY_H
#define XENTFAST_BINARY_H

#include "numerics.h"

#define XF_BIN_SCALE_K 600.0
#define XF_BIN_SCALE 0x1p600
#define XF_BIN_UNSCALE 0x1p-600

/* ---- error-free products and exponent juggling ------------------------------------------------------ */

/* a * b = *p + *e exactly (Dekker's product with Veltkamp's split; no fma, so the same bits on every
 * ISA).  Valid for |a|, |b| < 2^995 and a product far from under/overflow. */
XF_HD void xf_bin_two_prod(double a, double b, double *p, double *e)
{
    const double split = 134217729.0; /* 2^27 + 1 */
    double ca = split * a;
    double ahi = ca - (ca - a);
    double alo = a - ahi;
    double cb = split * b;
    double bhi = cb - (cb - b);
    double blo = b - bhi;
    double prod = a * b;
    *p = prod;
    *e = ((ahi * bhi - prod) + ahi * blo + alo * bhi) + alo * blo;
}

/* 2^n for an integer-valued double n in [-1022, 1023]; the 2^52 shifter turns n into bits without an
 * int conversion (xf_math.h's convention, so the loops still vectorize). */
XF_HD double xf_bin_pow2(double n)
{
    return xf_pow2_from_low_bits(xf_bits_from_double(n + (1023.0 + 0x1p52)));
}

/* v * 2^n for |v| in [2^-60, 2^60] and an integer-valued n of any size: three normal factors, applied
 * in the direction of n, so only the product that lands in the subnormal range (if any) rounds. */
XF_HD double xf_bin_scaleb(double v, double n)
{
    double n1 = n < -1000.0 ? -1000.0 : (n > 1000.0 ? 1000.0 : n);
    double r = n - n1;
    double n2 = r < -1000.0 ? -1000.0 : (r > 1000.0 ? 1000.0 : r);
    double n3 = r - n2;
    n3 = n3 < -1000.0 ? -1000.0 : (n3 > 1000.0 ? 1000.0 : n3);
    return ((v * xf_bin_pow2(n1)) * xf_bin_pow2(n2)) * xf_bin_pow2(n3);
}

/* |v| = m 2^k with m in [1, 2) for finite v != 0 (subnormals normalised first); returns m, sets *k. */
XF_HD double xf_bin_frexp(double v, double *k)
{
    int sub = xf_fabs(v) < 0x1p-1022;
    double vn = sub ? v * 0x1p64 : v;
    unsigned long long b = xf_bits_from_double(vn) & 0x7fffffffffffffffULL;
    *k = xf_double_from_bits(0x4330000000000000ULL | (b >> 52)) - (0x1p52 + 1023.0) - (sub ? 64.0 : 0.0);
    return xf_double_from_bits((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
}

/* k * y / p for k, p finite and nonzero and y finite, without spurious overflow or underflow of the
 * intermediates: y and p are normalised to [1, 2) and their exponents are applied once at the end.
 * Two roundings (product, quotient) plus the final one if the result is subnormal.
 * y = 0 gives 0 (the caller's zero convention decides beforehand). */
XF_HD double xf_bin_mul_div(double k, double y, double p)
{
    double ky, kp;
    double my = xf_bin_frexp(y, &ky);
    double mp = xf_bin_frexp(p, &kp);
    double r = xf_bin_scaleb((k * my) / mp, ky - kp);
    return y == 0.0 ? 0.0 * k : r;
}

/* ---- the pieces of one logit (a) --------------------------------------------------------------------- */

typedef struct {
    double a;    /* |x| */
    double e;    /* exp(-|x|) (may be subnormal or 0) */
    double e_s;  /* exp(-|x|) 2^600, accurate where e is not (b) */
    double d;    /* 1 + e, in [1, 2] */
    double l;    /* log1p(e) = softplus(-|x|), in [0, log 2] */
    double l_s;  /* l 2^600 */
    int pos;     /* x >= 0 (true for -0); false for NaN */
    int nan;     /* x is NaN */
} xf_bin_logit;

/* The shared first step of every logit loss: one exp (shift and 2^600 scale carried as a double-double,
 * exact at a = 0 where e_s is exactly 2^600) and one log1p.  log1p(e) = e to below 2^-61 relative when
 * e < 2^-60, so there the scaled exponential is the scaled softplus too. */
XF_HD xf_bin_logit xf_bin_logit_pieces(double x)
{
    xf_bin_logit r;
    double a = xf_fabs(x);
    double h, lo;
    xf_two_sum(-a, XF_BIN_SCALE_K * XF_MATH_LN2_HI, &h, &lo);
    lo = (h - h == 0.0) ? lo : 0.0; /* a = inf: the EFT's inf - inf */
    r.a = a;
    r.e_s = xf_exp_dd(h, lo + XF_BIN_SCALE_K * XF_MATH_LN2_LO);
    r.e = r.e_s * XF_BIN_UNSCALE;
    r.d = 1.0 + r.e;
    r.l = xf_log1p(r.e);
    r.l_s = (r.e < 0x1p-60) ? r.e_s : r.l * XF_BIN_SCALE;
    r.pos = (x >= 0.0);
    r.nan = (x != x);
    return r;
}

/* k v (mh + ml): a coefficient k (weights, upstream factor), a value v and a target mass m carried as a
 * double-double (ml = 0 for plain masses); the mass goes last (c).  Exactly 0 when k or m is 0 (e). */
XF_HD double xf_bin_term(double k, double v, double mh, double ml)
{
    double kv = k * v;
    double r = kv * mh + (ml != 0.0 ? kv * ml : 0.0);
    return (k == 0.0 || (mh == 0.0 && ml == 0.0)) ? 0.0 : r;
}

/* the same with a quotient: (k / d) (mh + ml), d in [1, 2] */
XF_HD double xf_bin_term_div(double k, double num, double d, double mh, double ml)
{
    double kv = (k * num) / d;
    double r = kv * mh + (ml != 0.0 ? kv * ml : 0.0);
    return (k == 0.0 || (mh == 0.0 && ml == 0.0)) ? 0.0 : r;
}

/* ---- BCE with logits, torch semantics with pos_weight q and element weight w --------------------------
 * loss = w [(1-y) softplus(x) + q y softplus(-x)]; the side of x decides which of the two softplus values
 * is the big one (a), the tail one is multiplied in scaled form (b) and rounded once at the end.
 * Bound: <= 4 ULP float64 (measured max ~2), the double result of float32 inputs within a few 2^-53. */
XF_HD double xf_bin_bce_logits_loss(const xf_bin_logit *p, double y, double w, double q)
{
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double wq = w * q;
    double kb = p->pos ? w : wq, mbh = p->pos ? omy_h : y, mbl = p->pos ? omy_l : 0.0;
    double kt = p->pos ? wq : w, mth = p->pos ? y : omy_h, mtl = p->pos ? 0.0 : omy_l;
    double big = xf_bin_term(kb, p->a + p->l, mbh, mbl);
    double tail = xf_bin_term(kt, p->l_s, mth, mtl) * XF_BIN_UNSCALE;
    double r = big + tail;
    return p->nan ? p->a : r;
}

/* d/dx of (s * loss) = s w [(1-y) s(x) - q y s(-x)]: the upstream factor s is folded into the coefficient
 * before the tail value is touched (b).  For y in {0, 1} one term is 0 and the result is that of a chain
 * of products (relative bound); for soft y the two terms may cancel. */
XF_HD double xf_bin_bce_logits_grad(const xf_bin_logit *p, double y, double w, double q, double s)
{
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double sw = s * w;
    double swq = sw * q;
    double kb = p->pos ? sw : swq, mbh = p->pos ? omy_h : y, mbl = p->pos ? omy_l : 0.0;
    double kt = p->pos ? swq : sw, mth = p->pos ? y : omy_h, mtl = p->pos ? 0.0 : omy_l;
    double big = xf_bin_term_div(kb, 1.0, p->d, mbh, mbl);
    double tail = xf_bin_term_div(kt, p->e_s, p->d, mth, mtl) * XF_BIN_UNSCALE;
    double r = p->pos ? big - tail : tail - big;
    return p->nan ? p->a : r;
}

/* ---- sigmoid focal loss (torchvision semantics) -------------------------------------------------------
 * With alpha_t = alpha y + (1 - alpha)(1 - y) (1 when alpha < 0), ce = BCE(x, y) and u = 1 - p_t:
 *     loss     = alpha_t ce u^g
 *     d/dx     = alpha_t u^g [ (1-y) s(x) - y s(-x)  +  g ce W (1 - 2y) ],   W = s(x) s(-x) / u
 * (W = s(x) for y = 1 and s(-x) for y = 0 exactly, no division then).  u = ((1-y) + y e)/(1+e) for
 * x >= 0 and ((1-y) e + y)/(1+e) for x < 0: positive terms only.
 * u^g is exp(g log u) with log u = log(N) - l (N the numerator above) carried as a double-double and
 * multiplied by g exactly (two_prod): a rounded g log u would cost |g log u| * 2^-53 of relative error,
 * hundreds of ULPs where u is tiny (the confident-correct side, where the plain formula also underflows
 * long before the loss does).  When y is 0 or 1 on the confident side, N = e and log N = -a exactly.
 * Bounds as BCE; see the README for the measured maxima. */
typedef struct {
    double alpha_t;  /* alpha_t */
    double U;        /* u^g */
    double u;        /* u */
    double ce_big;   /* ce, big part (unscaled) */
    double ce_tail_s;/* ce, tail part scaled by 2^600 */
    int conf;        /* y in {0,1} and x on the correct side: ce and the gradient are pure tail */
} xf_bin_focal_parts;

XF_HD xf_bin_focal_parts xf_bin_focal_prepare(const xf_bin_logit *p, double y, double alpha, double gamma)
{
    xf_bin_focal_parts f;
    double omy_h, omy_l, oma_h, oma_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    xf_two_sum(1.0, -alpha, &oma_h, &oma_l);
    /* alpha_t: both products are >= 0; (1 - alpha)(1 - y) keeps both double-double parts */
    double at = alpha * y + ((oma_h * omy_h + oma_h * omy_l) + oma_l * omy_h);
    f.alpha_t = alpha < 0.0 ? 1.0 : at;

    /* ce = (1-y) softplus(x) + y softplus(-x), split as in xf_bin_bce_logits_loss */
    double mbh = p->pos ? omy_h : y, mbl = p->pos ? omy_l : 0.0;
    double mth = p->pos ? y : omy_h, mtl = p->pos ? 0.0 : omy_l;
    f.ce_big = xf_bin_term(1.0, p->a + p->l, mbh, mbl);
    f.ce_tail_s = xf_bin_term(1.0, p->l_s, mth, mtl);
    f.conf = (mbh == 0.0 && mbl == 0.0);

    /* u = (c_big + c_tail e) / d with c_big the mass on the big-sigmoid side */
    double num = (mbh + mbl) + (mth + mtl) * p->e;
    f.u = num / p->d;
    /* log u = log(num) - l: log(num) = -a exactly when c_big = 0 (then c_tail = 1) */
    double log_num = f.conf ? -p->a : xf_log(num);
    double lh, ll;
    xf_two_sum(log_num, -p->l, &lh, &ll);
    ll = (lh - lh == 0.0) ? ll : 0.0;
    /* clamp keeps the split of two_prod finite; exp of anything below -2^995 * g is 0 for g > 2^-985 */
    lh = lh < -0x1p995 ? -0x1p995 : lh;
    double ph, pl;
    xf_bin_two_prod(gamma, lh, &ph, &pl);
    double sh, sl;
    xf_two_sum(ph, pl + gamma * ll, &sh, &sl);
    sl = (sh - sh == 0.0) ? sl : 0.0;
    double U = xf_exp_dd(sh, sl);
    /* u^0 = 1 even at u = 0; NaN stays NaN */
    f.U = gamma == 0.0 ? 1.0 : U;
    return f;
}

XF_HD double xf_bin_focal_loss(const xf_bin_logit *p, const xf_bin_focal_parts *f)
{
    /* (value * alpha_t) * U: alpha_t <= 1 and U <= 1 only shrink, so an intermediate that turns
     * subnormal is never scaled up again (c) */
    double big = (f->ce_big * f->alpha_t) * f->U;
    double tail = ((f->ce_tail_s * f->alpha_t) * f->U) * XF_BIN_UNSCALE;
    big = (f->ce_big == 0.0 || f->alpha_t == 0.0) ? 0.0 : big;
    tail = (f->ce_tail_s == 0.0 || f->alpha_t == 0.0) ? 0.0 : tail;
    double r = big + tail;
    return p->nan ? p->a : r;
}

XF_HD double xf_bin_focal_grad(const xf_bin_logit *p, const xf_bin_focal_parts *f, double y, double gamma,
                               double s)
{
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double sig_big = 1.0 / p->d;          /* the sigmoid on the big side */
    double sig_tail_s = p->e_s / p->d;    /* the other one, scaled */
    double sig_tail = sig_tail_s * XF_BIN_UNSCALE;
    double mbh = p->pos ? omy_h : y, mbl = p->pos ? omy_l : 0.0;
    double mth = p->pos ? y : omy_h, mtl = p->pos ? 0.0 : omy_l;
    /* 1 - 2y, exact for y in [1/4, 1] and every y that is a multiple of 2^-1073; else one rounding */
    double omty = (omy_h - y) + omy_l;
    double k = s * f->alpha_t;
    double r;
    if (f->conf) {
        /* y in {0, 1}, x on the correct side: g-term = -/+ s_tail, ce = l (tail), W = s_big; everything
         * is a tail quantity, evaluated scaled and rounded once */
        double inner = sig_tail_s + (gamma == 0.0 ? 0.0 : (gamma * p->l_s) * sig_big);
        double v = ((k * inner) * f->U) * XF_BIN_UNSCALE;
        /* sign: the big side is x's own side; y = 1 with x >= 0 pulls x up (negative gradient) */
        r = p->pos ? -v : v;
    } else {
        double g1 = xf_bin_term(1.0, sig_big, mbh, mbl) - xf_bin_term(1.0, sig_tail, mth, mtl);
        g1 = p->pos ? g1 : -g1;
        double W = (y == 1.0) ? (p->pos ? sig_big : sig_tail)
                 : (y == 0.0) ? (p->pos ? sig_tail : sig_big)
                 : (sig_big * sig_tail) / f->u;
        double ce = f->ce_big + f->ce_tail_s * XF_BIN_UNSCALE;
        /* W = 0 (x = +-inf) beats ce = inf: s(-x) softplus(x) -> 0 */
        double g2 = (gamma == 0.0 || ce == 0.0 || W == 0.0) ? 0.0 : ((gamma * ce) * W) * omty;
        r = (k * (g1 + g2)) * f->U;
    }
    r = (k == 0.0) ? 0.0 * r : r;
    return p->nan ? p->a : r;
}

/* ---- probabilities ------------------------------------------------------------------------------------
 * The log-probabilities of BCE from p, in one place for all three modes:
 *   exact         log p, log(1-p) = log1p(-p)                         (log 0 = -inf)
 *   eps clip      p clipped to [eps, 1-eps] as real numbers: log eps where p < eps, log1p(-eps) where
 *                 1 - p < eps (1 - p is exact there: p >= 1/2, Sterbenz); a clipped log has derivative 0
 *   log clamp     max(log p, c), max(log(1-p), c): torch's BCELoss with c = -100; derivative 0 where the
 *                 log is below c
 * Per element: *lp, *l1p are the logs; *dp, *d1p are 1 where the log still depends on p, 0 where clipped. */
typedef struct {
    int clip;          /* eps mode */
    double eps;
    double log_eps;    /* log(eps) */
    double log1m_eps;  /* log1p(-eps) */
    int clamp;         /* log clamp mode */
    double c;          /* the clamp, <= 0 */
} xf_bin_prob_mode;

XF_HD void xf_bin_prob_logs(double pr, const xf_bin_prob_mode *m, double *lp, double *l1p, int *dp, int *d1p)
{
    double a = xf_log(pr);
    double b = xf_log1p(-pr);
    int lo_clip = m->clip && pr < m->eps;
    int hi_clip = m->clip && pr >= 0.5 && (1.0 - pr) < m->eps;
    a = lo_clip ? m->log_eps : (hi_clip ? m->log1m_eps : a);
    b = hi_clip ? m->log_eps : (lo_clip ? m->log1m_eps : b);
    int ca = m->clamp && a < m->c;
    int cb = m->clamp && b < m->c;
    *lp = ca ? m->c : a;
    *l1p = cb ? m->c : b;
    *dp = !(lo_clip || hi_clip || ca);
    *d1p = !(lo_clip || hi_clip || cb);
}

/* w [y (-log p) + (1-y)(-log(1-p))]: two non-negative terms, mass last (c), 0 * inf = 0 (e). */
XF_HD double xf_bin_bce_prob_loss(double pr, double y, double w, const xf_bin_prob_mode *m)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double r = xf_bin_term(w, -lp, y, 0.0) + xf_bin_term(w, -l1p, omy_h, omy_l);
    return (pr != pr) ? pr : r;
}

/* d/dp of (s * loss) = s w [(1-y)/(1-p) - y/p] on the unclipped pieces.  1 - p is carried as h + l
 * (TwoSum) and divided with one correction step, y/p goes through xf_bin_mul_div (y and p may both be
 * subnormal).  p = 0 with y > 0 gives -inf, p = 1 with y < 1 gives +inf: the derivative of -log 0. */
XF_HD double xf_bin_bce_prob_grad(double pr, double y, double w, double s, const xf_bin_prob_mode *m)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double omy_h, omy_l, omp_h, omp_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    xf_two_sum(1.0, -pr, &omp_h, &omp_l);
    double k = s * w;
    /* k (1-y) / (1-p): quotient of the high parts, then the first-order correction for both low parts */
    double qh = (k * omy_h) / omp_h;
    double q1 = qh + qh * ((omy_h != 0.0 ? omy_l / omy_h : 0.0) - (omp_h != 0.0 ? omp_l / omp_h : 0.0));
    q1 = (omp_h == 0.0) ? qh : q1; /* p = 1: +-inf */
    q1 = ((omy_h == 0.0 && omy_l == 0.0) || k == 0.0 || !d1p) ? 0.0 : q1;
    double q0 = (pr == 0.0) ? k * XF_INF : xf_bin_mul_div(k, y, pr);
    q0 = (y == 0.0 || k == 0.0 || !dp) ? 0.0 : q0;
    double r = q1 - q0;
    return (pr != pr) ? pr : r;
}

/* One class term of CE from probabilities: q (-log p_c) with the categorical clip of Keras (p clipped to
 * [eps, 1-eps]: log eps below, log1p(-eps) above) or none; 0 when q = 0. */
XF_HD double xf_bin_neg_log_prob_term(double pr, double q, const xf_bin_prob_mode *m, int *live)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    *live = dp;
    double r = q * (-lp);
    r = (q == 0.0 && pr == pr) ? 0.0 : r;
    return r;
}

/* d/dp_c of s q (-log p_c) = -s q / p_c (0 where clipped or q = 0, -inf at p_c = 0 < q). */
XF_HD double xf_bin_neg_log_prob_grad(double pr, double q, double s, const xf_bin_prob_mode *m)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double r = (pr == 0.0) ? -s * XF_INF : -xf_bin_mul_div(s, q, pr);
    r = (q == 0.0 || s == 0.0 || !dp) ? 0.0 : r;
    return (pr != pr) ? pr : r;
}

#endif /* XENTFAST_BINARY_H */
