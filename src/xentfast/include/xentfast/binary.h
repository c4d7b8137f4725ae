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
 *     weights, pos_weight, the upstream gradient and target coefficients multiply e_s, and the 2^-600
 *     is applied once at the end.  Multiplying an already subnormal e by a weight > 1 would instead
 *     scale up its fixed absolute rounding error (the softmax family met the same problem, see
 *     xf_exp_shifted_pow2).
 * (c) Weighted products are formed on normalised mantissas with the exponents summed (xf_bin_xp,
 *     xf_bin_term): a subnormal weight, pos_weight or soft target, a product w q |x| beyond DBL_MAX
 *     whose final value is not, or a tiny p under a tiny weight cost no more than the mantissa
 *     roundings plus one final rounding (the adversarial tests found each of these).
 * (d) 1 - y and 1 - alpha are carried exactly as a double-double (TwoSum): fl(1 - y) alone would cost
 *     half an ULP for every y < 1/2.  The focal loss also keeps exp and log unrounded (double-double):
 *     see xf_exp_kernel_hilo and the focal section.
 * No branch on data: where cases differ (the focal loss's log u and gradient), every case is evaluated
 * and one is selected, so the CPU element loops vectorize (binary_blocks.h) and GPU warps do not
 * diverge; a select returns the selected case's bits, so this is the same arithmetic as a branch.
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

/* a * b = *p + *e exactly (Dekker's product with Veltkamp's split: exact, so the same bits on every ISA; an
 * fma-based product would be exact too, but xf_fma's emulation costs more on the baseline path).  Valid for
 * |a|, |b| < 2^995 and a product far from under/overflow. */
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

/* Extended-exponent numbers: m 2^e with the mantissa m in [1, 2) (sign carried by m) and an integer-valued
 * double e.  Products of a few factors are formed as the product of the mantissas (no under/overflow
 * possible) and the sum of the exponents, applied once at the end by xf_bin_xp_value: a subnormal weight,
 * a subnormal soft target or a tail value scaled by 2^600 then costs no more than the roundings of the
 * mantissa products plus the final one.  0, +-inf and NaN are carried in m with e = 0. */
typedef struct {
    double m;
    double e;
} xf_bin_xp;

XF_HD xf_bin_xp xf_bin_xp_make(double v)
{
    xf_bin_xp r;
    double k;
    double m = xf_bin_frexp(v, &k);
    int fin = (v - v == 0.0) & (v != 0.0);
    r.m = fin ? (v < 0.0 ? -m : m) : v;
    r.e = fin ? k : 0.0;
    return r;
}

XF_HD xf_bin_xp xf_bin_xp_mul(xf_bin_xp a, xf_bin_xp b)
{
    a.m = a.m * b.m;
    a.e = a.e + b.e;
    return a;
}

XF_HD double xf_bin_xp_value(xf_bin_xp a)
{
    return (a.m - a.m == 0.0) ? xf_bin_scaleb(a.m, a.e) : a.m;
}

/* k1 k2 k3 v (mh + ml) 2^e0 / dv: coefficients (weights, pos_weight, the upstream factor), a value and a
 * target mass carried as a double-double (ml = 0 for a plain mass), every factor normalised (see
 * xf_bin_xp), and a divisor dv in [1, 2] (1 + e, or 1) applied to the mantissa product, so that v / dv
 * costs one rounding, not two.  Exactly 0 when a coefficient or the mass is 0, even where v = +-inf
 * (0 * inf = 0, (e)). */
XF_HD double xf_bin_term_div(double k1, double k2, double k3, double v, double mh, double ml, double e0,
                             double dv)
{
    xf_bin_xp p = xf_bin_xp_mul(xf_bin_xp_mul(xf_bin_xp_make(k1), xf_bin_xp_make(k2)),
                                xf_bin_xp_mul(xf_bin_xp_make(k3), xf_bin_xp_make(v)));
    xf_bin_xp mm = xf_bin_xp_make(mh);
    /* ml relative to mh's binade: ml 2^-e(mh) = (ml / mh) m(mh); no low part next to an infinite product */
    double low = ((ml != 0.0) & (mh != 0.0) & (p.m - p.m == 0.0)) ? p.m * ((ml / mh) * mm.m) : 0.0;
    xf_bin_xp r;
    r.m = (p.m * mm.m + low) / dv;
    r.e = (p.e + mm.e) + e0;
    double out = xf_bin_xp_value(r);
    return ((k1 == 0.0) | (k2 == 0.0) | (k3 == 0.0) | ((mh == 0.0) & (ml == 0.0))) ? 0.0 : out;
}

XF_HD double xf_bin_term(double k1, double k2, double k3, double v, double mh, double ml, double e0)
{
    return xf_bin_term_div(k1, k2, k3, v, mh, ml, e0, 1.0);
}

/* k1 k2 y / p for finite k1, k2, y and p >= 0, normalised the same way: p = 0 gives +-inf (the caller
 * decides beforehand whether the term exists), k1, k2 or y = 0 gives 0. */
XF_HD double xf_bin_mul_div(double k1, double k2, double y, double p)
{
    xf_bin_xp n = xf_bin_xp_mul(xf_bin_xp_mul(xf_bin_xp_make(k1), xf_bin_xp_make(k2)), xf_bin_xp_make(y));
    xf_bin_xp d = xf_bin_xp_make(p);
    xf_bin_xp r;
    r.m = n.m / d.m;
    r.e = n.e - d.e;
    double out = xf_bin_xp_value(r);
    out = (p == 0.0) ? n.m * XF_INF : out;
    return ((k1 == 0.0) | (k2 == 0.0) | (y == 0.0)) ? 0.0 : out;
}


/* log v as hi + *lo for finite v > 0 (subnormals scaled by 2^54 first, as xf_log does). */
XF_HD double xf_bin_log_hilo(double v, double *out_lo)
{
    int sub = v < 0x1p-1022;
    unsigned long long ix = xf_log_shifted_bits(sub ? v * 0x1p54 : v);
    return xf_log_kernel_hilo(xf_log_k(ix) - (sub ? 54.0 : 0.0), xf_log_f(ix), 0.0, out_lo);
}

/* exp(g (lh + ll) + (mh + ml)): the product by g is exact (two_prod), the sum renormalised, so the
 * argument reaches the exponential with an error far below its ulp.  lh is clamped to keep the split
 * finite (the result is 0 there for any g > 2^-985). */
XF_HD double xf_bin_exp_affine_hilo(double g, double lh, double ll, double mh, double ml, double *out_lo)
{
    lh = lh < -0x1p995 ? -0x1p995 : lh;
    ll = ((lh - lh == 0.0) & (ll - ll == 0.0)) ? ll : 0.0;
    double ph, pl;
    xf_bin_two_prod(g, lh, &ph, &pl);
    pl = (ph - ph == 0.0) ? pl : 0.0;
    double sh, sl;
    xf_two_sum(ph, mh, &sh, &sl);
    sl = (sh - sh == 0.0) ? sl + (pl + (g * ll + ml)) : 0.0;
    double h2, l2;
    xf_two_sum(sh, sl, &h2, &l2);
    l2 = (h2 - h2 == 0.0) ? l2 : 0.0;
    double lo;
    double r = xf_exp_kernel_hilo(h2, l2, &lo);
    *out_lo = (lo - lo == 0.0) ? lo : 0.0;
    return r;
}

XF_HD double xf_bin_exp_affine(double g, double lh, double ll, double mh, double ml)
{
    double unused;
    return xf_bin_exp_affine_hilo(g, lh, ll, mh, ml, &unused);
}

/* v = m 2^E with E = v's binary exponent clamped to [-1022, 1022], so that 2^E and 2^-E are normal
 * doubles: m in [1, 2) (in magnitude) for normal v below 2^1023 and in [2, 4) from there, exact;
 * m = v 2^1022 for subnormal v and +-inf for +-inf; NaN stays NaN.  Returns E; *m = m and *down = 2^-E
 * (to scale a double-double's low part). */
XF_HD double xf_bin_split_exp(double v, double *m, double *down)
{
    unsigned long long ve = (xf_bits_from_double(v) >> 52) & 0x7ffULL;
    ve = ve < 1ULL ? 1ULL : (ve > 2045ULL ? 2045ULL : ve);
    *down = xf_double_from_bits((2046ULL - ve) << 52);
    *m = v * *down;
    return xf_double_from_bits(0x4330000000000000ULL | ve) - (0x1p52 + 1023.0);
}

/* (ah + al)(bh + bl) as a double-double (al*bl dropped, ~2^-104 relative); falls back to the plain
 * product where the exact split could overflow (|operand| >= 2^995) or the product is not finite. */
XF_HD void xf_bin_dd_mul(double ah, double al, double bh, double bl, double *rh, double *rl)
{
    double p, e;
    xf_bin_two_prod(ah, bh, &p, &e);
    int ok = (p - p == 0.0) & (xf_fabs(ah) < 0x1p995) & (xf_fabs(bh) < 0x1p995);
    e = ok ? e + (ah * bl + al * bh) : 0.0;
    double h, l;
    xf_two_sum(p, e, &h, &l);
    *rh = ok ? h : p;
    *rl = ok ? l : 0.0;
}

/* ---- the pieces of one logit (a) --------------------------------------------------------------------- */

typedef struct {
    double a;          /* |x| */
    double e, e_lo;    /* exp(-|x|) as a double-double (may be subnormal or 0) */
    double e_s, e_s_lo;/* the same times 2^600: accurate where e is not (b) */
    double d;          /* 1 + e rounded, in [1, 2] */
    double l, l_lo;    /* log1p(e) = softplus(-|x|) as a double-double, in [0, log 2] */
    double l_s, l_s_lo;/* the same times 2^600 */
    int pos;           /* x >= 0 (true for -0); false for NaN */
    int nan;           /* x is NaN */
} xf_bin_logit;

/* The shared first step of every logit loss: one exp (shift and 2^600 scale carried as a double-double,
 * exact at a = 0 where e_s is exactly 2^600) and one log, both kept unrounded (double-double).
 * log1p(e) = log(d_h) + log1p(d_l / d_h) with 1 + e = d_h + d_l exactly (TwoSum); the second log1p is
 * c - c^2/2 to 2^-106 because |c| <= 2^-53.  Where e < 2^-60, log1p(e) = e to below 2^-61 relative and
 * the scaled exponential is the scaled softplus.
 * Beyond |x| = 1161.1 (h below the exponential's clamp at -745.2) e_s and e_s_lo are +0: the exponential
 * is given 0 there and its results replaced, the same bits, because evaluating it at the clamp underflows
 * its scaling products, each a ~100-cycle microcode assist on x86 (subnormals are never flushed): a
 * third of the logits at -inf made a float64 BCE call 3.5x slower. */
XF_HD xf_bin_logit xf_bin_logit_pieces(double x)
{
    xf_bin_logit r;
    double a = xf_fabs(x);
    double h, lo;
    xf_two_sum(-a, XF_BIN_SCALE_K * XF_MATH_LN2_HI, &h, &lo);
    lo = (h - h == 0.0) ? lo : 0.0; /* a = inf: the EFT's inf - inf */
    r.a = a;
    int zero = h < XF_EXP_CLAMP_LO;
    r.e_s = xf_exp_kernel_hilo(zero ? 0.0 : h, zero ? 0.0 : lo + XF_BIN_SCALE_K * XF_MATH_LN2_LO, &r.e_s_lo);
    r.e_s = zero ? 0.0 : r.e_s;
    r.e_s_lo = (!zero & (r.e_s_lo - r.e_s_lo == 0.0)) ? r.e_s_lo : 0.0;
    r.e = r.e_s * XF_BIN_UNSCALE;
    r.e_lo = r.e_s_lo * XF_BIN_UNSCALE;
    double dh, dl;
    xf_two_sum(1.0, r.e, &dh, &dl);
    dl += r.e_lo;
    r.d = dh;
    unsigned long long ix = xf_log_shifted_bits(dh);
    double kl;
    double kh = xf_log_kernel_hilo(xf_log_k(ix), xf_log_f(ix), 0.0, &kl);
    double c = dl / dh;
    xf_two_sum(kh, (c - 0.5 * (c * c)) + kl, &r.l, &r.l_lo);
    int tiny = r.e < 0x1p-60;
    r.l_s = tiny ? r.e_s : r.l * XF_BIN_SCALE;
    r.l_s_lo = tiny ? r.e_s_lo : r.l_lo * XF_BIN_SCALE;
    r.pos = (x >= 0.0);
    r.nan = (x != x);
    return r;
}

/* softplus(|x|) = |x| + log1p(e), the double-double sum rounded once */
XF_HD double xf_bin_softplus_big(xf_bin_logit p)
{
    double h, l;
    xf_two_sum(p.a, p.l, &h, &l);
    return (h - h == 0.0) ? h + (l + p.l_lo) : h;
}

/* ---- BCE with logits, torch semantics with pos_weight q and element weight w --------------------------
 * loss = w [(1-y) softplus(x) + q y softplus(-x)]; the side of x decides which of the two softplus values
 * is the big one (a), the tail one is multiplied in scaled form (b) and rounded once at the end.
 * Bound: <= 4 ULP float64 (measured max 2.2 loss, 2.5 gradient), float32: the double result rounded once. */
XF_HD double xf_bin_bce_logits_loss(xf_bin_logit p, double y, double w, double q, double k)
{
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double mbh = p.pos ? omy_h : y, mbl = p.pos ? omy_l : 0.0;
    double mth = p.pos ? y : omy_h, mtl = p.pos ? 0.0 : omy_l;
    double big = xf_bin_term(w, p.pos ? 1.0 : q, 1.0, xf_bin_softplus_big(p), mbh, mbl, k);
    double tail = xf_bin_term(w, p.pos ? q : 1.0, 1.0, p.l_s, mth, mtl, k - XF_BIN_SCALE_K);
    double r = big + tail;
    return p.nan ? p.a : r;
}

/* d/dx of (s * loss) = s w [(1-y) s(x) - q y s(-x)]: the upstream factor s, w and q stay separate factors
 * of the normalised product, the tail sigmoid enters scaled (b).  For y in {0, 1} one term is 0 and the
 * result is that of a chain of products (relative bound); for soft y the two terms may cancel.
 * Zeros: where both terms round to zero (the tail beyond |x| ~ 745 of a hard target, tiny factors) and
 * only one of them is nonzero exactly, the gradient is a zero of that term's sign, the product of its
 * factors' signs (a difference of two zeros is +0 whatever their signs, and a term whose scaled tail
 * underflowed, |x| > ~1160, is +0 itself); where neither is (a zero weight, factor or mass, the tail of
 * x = +-inf) +0. */
XF_HD double xf_bin_bce_logits_grad(xf_bin_logit p, double y, double w, double q, double s)
{
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double mbh = p.pos ? omy_h : y, mbl = p.pos ? omy_l : 0.0;
    double mth = p.pos ? y : omy_h, mtl = p.pos ? 0.0 : omy_l;
    double big = xf_bin_term_div(s, w, p.pos ? 1.0 : q, 1.0, mbh, mbl, 0.0, p.d);
    double tail = xf_bin_term_div(s, w, p.pos ? q : 1.0, p.e_s, mth, mtl, -XF_BIN_SCALE_K, p.d);
    double r = p.pos ? big - tail : tail - big;
    /* mbh = 0 implies mbl = 0 (Fast2Sum of 1 and -y, or y itself), the same for the tail's mass */
    const int factors = (s != 0.0) & (w != 0.0);
    const int big_exists = factors & ((p.pos ? 1.0 : q) != 0.0) & (mbh != 0.0);
    const int tail_exists = factors & ((p.pos ? q : 1.0) != 0.0) & (mth != 0.0) & (p.a != XF_INF);
    /* the sign bits of the factors, XORed, and the term's own sign in the difference */
    const unsigned long long sign_bit = 0x8000000000000000ULL;
    const unsigned long long sw = xf_bits_from_double(s) ^ xf_bits_from_double(w);
    const unsigned long long big_bits =
        sw ^ xf_bits_from_double(p.pos ? 1.0 : q) ^ xf_bits_from_double(mbh) ^ (p.pos ? 0ULL : sign_bit);
    const unsigned long long tail_bits =
        sw ^ xf_bits_from_double(p.pos ? q : 1.0) ^ xf_bits_from_double(mth) ^ (p.pos ? sign_bit : 0ULL);
    const double lone = xf_double_from_bits((big_exists ? big_bits : tail_bits) & sign_bit);
    r = ((big == 0.0) & (tail == 0.0) & (big_exists != tail_exists)) ? lone : r;
    return p.nan ? p.a : r;
}

/* An infinite upstream factor s times a gradient of two terms.  The general form multiplies s into each
 * term before subtracting them, so a soft target gives inf - inf = NaN, where torch, which subtracts
 * first, gives the infinity with the sign of the difference.  Here: the gradient under unit factors of the
 * signs of s and of the (finite) weight w, so that a tiny w cannot underflow it, then times inf: +-inf,
 * NaN where that gradient is exactly 0 with both terms present (inf * 0, as torch), NaN for a NaN input.
 * Where it is 0 with one term present (a hard target whose tail underflowed, |x| > ~745) that term's
 * signed infinity, the exact value's limit; NaN where the one term is the tail of x = +-inf, exactly 0
 * (inf * 0); 0 with none (a zero weight or mass: the zero-mass terms of the special values, README).
 * Every device calls it for the elements that xf_bin_upstream_is_inf picks, so they give the same bits. */
XF_HD double xf_bin_unit(double v)
{
    return (v > 0.0) ? 1.0 : (v < 0.0) ? -1.0 : v;
}

XF_HD int xf_bin_upstream_is_inf(double s)
{
    return xf_fabs(s) == XF_INF;
}

XF_HD double xf_bin_bce_logits_grad_inf(xf_bin_logit p, double y, double w, double q, double s)
{
    const double unit = xf_bin_bce_logits_grad(p, y, xf_bin_unit(w), q, xf_bin_unit(s));
    /* the terms of xf_bin_bce_logits_grad: the own side's (mass 1 - y for x >= 0, q y below) enters with
     * the sign + for x >= 0, the tail's (the other mass) with the opposite sign */
    const double sign = p.pos ? xf_bin_unit(s) * xf_bin_unit(w) : -(xf_bin_unit(s) * xf_bin_unit(w));
    const double omy = 1.0 - y;
    const double omy_sign = xf_bin_unit(omy), qy_sign = xf_bin_unit(q) * xf_bin_unit(y);
    const int own = (w != 0.0) & ((p.pos ? omy_sign : qy_sign) != 0.0);
    const int tail_mass = (w != 0.0) & ((p.pos ? qy_sign : omy_sign) != 0.0);
    const int tail = tail_mass & (p.a != XF_INF);
    const double lone = own ? sign * (p.pos ? omy_sign : qy_sign) : -sign * (p.pos ? qy_sign : omy_sign);
    /* x = +-inf: the tail is exactly 0 and s times it inf * 0 */
    const double fallback = ((own & tail) | (tail_mass & !tail)) ? XF_NAN : (own | tail) ? lone * XF_INF : 0.0;
    return (unit != 0.0) ? unit * XF_INF : fallback;
}

/* ---- BCE with logits for float32 storage: the ordinary element in plain double ------------------------
 * The machinery above (tails scaled by 2^600, normalised products, double-double exp and log) exists for
 * results near the edges of double's range and for the float64 bound.  A float32 result only needs its
 * double value to within a small fraction of a float32 ULP, and for an ordinary element plain double
 * arithmetic gives that:
 *   - |x| <= 550: e = exp(-|x|) >= 2^-793.5, inside the domains of the exponential ([-708, 0], to
 *     2^-32: xf_exp_lite_normal) and of log1p (e >= 2^-1000, to 2^-37.6: xf_bin_log1p_unit); 1/(1 + e),
 *     products and sums each 2^-53;
 *   - finite |x| > 550: e stands in as exp(-550) = 2^-793.5 (xf_bin_fast_exp clamps the argument), so rd
 *     is 1 and l is e, as they are to 2^-793 for the true e.  Where the target puts mass on x's own side
 *     (own = 1 - y for x >= 0, q y below, then >= 2^-209), own a >= 2^-200 outweighs the tail terms
 *     (<= 2^61 e = 2^-732) by 2^-532: the loss and the gradient keep the error above.  Where it does not
 *     (own = 0, a confident right answer), the exact loss w mass log1p(e) and gradient s w other e rd lie
 *     below 2^121 2^-793.5 = 2^-672 and so do the stand-ins: both round to float32 zeros, of the same
 *     signs (a zero bracket gives +0 either way).  The loss's double value, which a reduction adds, is
 *     then off by at most that 2^-672, no float32 ULP of any sum.  w own a may exceed FLT_MAX (as with
 *     weights of 2^60 below 550): the float32 rounding is inf, as the exact value's;
 *   - 0 <= y <= 1, w and q in [2^-60, 2^60] (q may be 0), |upstream| in [2^-60, 2^60], no loss scaling:
 *     the loss is a sum of non-negative terms (no cancellation), and every quantity is a normal double
 *     (the least, q y e / (1 + e) with y a float32 subnormal: 2^-1003.5) but the gradient's last product
 *     (upstream w) times its bracket, which may round to a subnormal or to a zero of its sign: its
 *     float32 rounding is a zero of that sign either way.
 * So the loss and a hard-target gradient carry < 2^-30 relative error before the one rounding to float32
 * (<= 0.5 + 2^-6 ULP), and a soft-target gradient < 2^-30 of |(1-y) s(x)| + |q y s(-x)| (the unit the
 * bound uses where the two terms cancel).  The multiply-adds stay inside xf_fma_emulated's exact domain
 * (each product is 0, at least 2^-210, or below 2^-60 of its addend), so the baseline path gives the
 * same bits.  The limit was |x| <= 80 (e >= 1.8e-35) until 2026-12-06, then 550: one float32 logit in a
 * hundred at +-100 (later one in fifty at +-600, padding's large logits) had made a fused call 5-10x
 * slower, every chunk holding one taking the general form (benchmarks/README.md, fifteenth and
 * seventeenth rounds).  Zeros: a zero mass gives +0 as the general path does, and a
 * gradient whose bracket is exactly 0 returns +0 whatever the upstream sign, as big - tail does there.
 * Both the CPU loops and the CUDA twin pick the form per element and per output (xf_bin_bce_fast_ok for
 * the loss, xf_bin_bce_fast_grad_ok for the gradient), so they keep giving the same bits.  The two forms
 * differ from each other by a float32 ULP where the exact value lies within ~2^-32 (relative) of a
 * float32 rounding boundary, a few elements in 10^5. */
/* every finite float32 logit; e = exp(-|x|) is computed at |x| = 550 beyond XF_BIN_FAST_EXP_MAX_ABS_X */
#define XF_BIN_FAST_MAX_ABS_X 0x1.fffffep+127
#define XF_BIN_FAST_EXP_MAX_ABS_X 550.0
#define XF_BIN_FAST_LO 0x1p-60
#define XF_BIN_FAST_HI 0x1p60

/* Whether an element's loss takes the plain-double form: its logit and, shared with the float64 form, its
 * target, weights and loss scale.  The loss's form never depends on the upstream factor, so a forward
 * call and a fused call give the same loss bits. */
XF_HD int xf_bin_bce_fast_factors_ok(double y, double w, double q, double loss_k)
{
    return (y >= 0.0) & (y <= 1.0) & (w >= XF_BIN_FAST_LO) & (w <= XF_BIN_FAST_HI) &
           ((q == 0.0) | ((q >= XF_BIN_FAST_LO) & (q <= XF_BIN_FAST_HI))) & (loss_k == 0.0);
}

XF_HD int xf_bin_bce_fast_ok(double x, double y, double w, double q, double loss_k)
{
    return (xf_fabs(x) <= XF_BIN_FAST_MAX_ABS_X) & xf_bin_bce_fast_factors_ok(y, w, q, loss_k);
}

/* Whether its gradient does too: the loss's conditions and an upstream factor s in [2^-60, 2^60]. */
XF_HD int xf_bin_bce_fast_grad_ok(int loss_fast, double s)
{
    double as = xf_fabs(s);
    return loss_fast & (as >= XF_BIN_FAST_LO) & (as <= XF_BIN_FAST_HI);
}

typedef struct {
    double a;   /* |x| */
    double e;   /* exp(-|x|) */
    double l;   /* log1p(e) = softplus(-|x|) */
    double rd;  /* 1 / (1 + e) */
    int pos;    /* x >= 0 (true for -0), as xf_bin_logit */
} xf_bin_fast_logit;

/* log1p(e) for e in [2^-1000, 1] to 2^-37.6 relative, with one division (xf_log1p has two and carries
 * double-double corrections a float32 result has no use for).
 *   1 + e <= sqrt 2: log1p(e) = 2 atanh(s), s = e / (2 + e), |s| <= 0.1716;
 *   1 + e >  sqrt 2: log(u) for u = fl(1 + e) = 2 (1 + f), f = u/2 - 1 exact in (-0.293, 0]:
 *                    ln 2 + 2 atanh(f / (2 + f)), in [0.346, 0.694] (no cancellation beyond a factor 2).
 *                    The rounding of 1 + e is left out: |log1p(e) - log(u)| <= 2^-53 / u, under 2^-52
 *                    of the result.  Carried as d / u (Fast2Sum and the sigmoid's 1/(1 + e)), it made the
 *                    forward pass divide twice per element, and a division issues once per 16 cycles for
 *                    eight doubles on the avx512 path (benchmarks/README.md, 2026-12-05, seventh round).
 * With t = 2s and w = t^2 <= 0.1178: 2 atanh(s) = t (1 + w p(w)), p of degree 3, the minimax polynomial of
 * the relative error on [0, 0.1178] (Remez, equioscillating at 4.76e-12 = 2^-37.6; the Taylor polynomial
 * of degree 6 in s^2 it replaces reached 2^-39.5 with three more multiply-adds).  The roundings of the
 * evaluation and the left-out rounding add ~2^-51.  Estrin's scheme: this chain follows the exponential
 * and a division on the element's critical path.  The multiply-adds are xf_fma, one rounding each, the
 * same bits on every path (2^-37.6 leaves the float32 bound its margin, see above: the polynomial's
 * degree, not the evaluation, sets the error). */
/* Tails (t ~ 2 e^-|x| tiny) and the subnormals: w^2 = t^4 is subnormal for |x| ~ 177-187 and w = t^2
 * for |x| ~ 354-372, each a microcode assist per vector on x86 (float32 calls 6x and 14x slower;
 * benchmarks/README.md, eighteenth round).  For |t| < 2^-30 the polynomial's term t w p(w) (p(w) < 1/11)
 * is below 2^-63 |t| and the result rounds to t whatever w is, so with `tails` (a literal) w is taken
 * at |t| = 2^-30 there: the same bits.  That costs the float32 loop 3-4 %, so the CPU's chunks whose
 * logits all lie within XF_BIN_FAST_NEAR_ABS_X run the instance without it: t^4 >= 2^-924 there, and
 * the baseline path's emulated multiply-add of w^2 p23 (whose partial products lie ~2^-54 below it, some
 * far below) stays clear of the subnormals too (measured: from |x| ~ 165 on it did not). */
#define XF_BIN_FAST_NEAR_ABS_X 160.0
/* 2 atanh(t/2) = t (1 + w p(w)) for |t| <= 0.3432 (w <= 0.1178), w = tp^2 (tp: t, or |t| clamped by the
 * caller as below) */
XF_HD double xf_bin_atanh2(double t, double tp)
{
    double w = tp * tp;
    double w2 = w * w;
    double p01 = xf_fma(w, 0x1.999a7a1a2c12cp-7, 0x1.555554fde2d86p-4);
    double p23 = xf_fma(w, 0x1.e2f2d41f1620dp-12, 0x1.2438f15e71923p-9);
    return xf_fma(t, w * xf_fma(w2, p23, p01), t);
}

XF_HD double xf_bin_log1p_unit_tails(double e, const int tails)
{
    double u = 1.0 + e;
    int big = u > 0x1.6a09e667f3bcdp+0;
    double f = big ? xf_mul_add_exact(0.5, u, -1.0) : e;
    double t = 2.0 * (f / (2.0 + f));
    const double abs_t = xf_fabs(t);
    /* a max of |t| (w only needs t's square) */
    const double tp = tails ? ((abs_t > 0x1p-30) ? abs_t : 0x1p-30) : t;
    double at = xf_bin_atanh2(t, tp);
    return big ? (XF_MATH_LN2_HI + (at + XF_MATH_LN2_LO)) : at;
}

XF_HD double xf_bin_log1p_unit(double e)
{
    return xf_bin_log1p_unit_tails(e, 1);
}

/* e = exp(-|x|), the first of the pieces; the CPU loops make a chunk's exponentials in a loop of their
 * own (binary_blocks.h) and pass each to xf_bin_fast_from_exp */
XF_HD double xf_bin_fast_exp(double x)
{
    const double neg_abs = -xf_fabs(x);
    return xf_exp_lite_normal((neg_abs < -XF_BIN_FAST_EXP_MAX_ABS_X) ? -XF_BIN_FAST_EXP_MAX_ABS_X : neg_abs);
}

/* xf_bin_fast_from_exp's pieces with rd = 1 / (1 + e) and l = xf_bin_log1p_unit(e) made before (the
 * avx2 unit makes a stage's divisions in a loop of their own, binary_blocks.h) */
XF_HD xf_bin_fast_logit xf_bin_fast_from_parts(double x, double e, double rd, double l)
{
    xf_bin_fast_logit r;
    r.a = xf_fabs(x);
    r.e = e;
    r.rd = rd;
    r.l = l;
    r.pos = (x >= 0.0);
    return r;
}

/* with `tails` (a literal) for logits beyond XF_BIN_FAST_NEAR_ABS_X (xf_bin_log1p_unit_tails) */
XF_HD xf_bin_fast_logit xf_bin_fast_from_exp_tails(double x, double e, const int tails)
{
    xf_bin_fast_logit r;
    r.a = xf_fabs(x);
    r.e = e;
    r.rd = 1.0 / (1.0 + r.e);
    r.l = xf_bin_log1p_unit_tails(r.e, tails);
    r.pos = (x >= 0.0);
    return r;
}

XF_HD xf_bin_fast_logit xf_bin_fast_from_exp(double x, double e)
{
    return xf_bin_fast_from_exp_tails(x, e, 1);
}

XF_HD xf_bin_fast_logit xf_bin_fast_pieces(double x)
{
    return xf_bin_fast_from_exp(x, xf_bin_fast_exp(x));
}

/* ---- BCE with logits for float64 storage: the ordinary element in double-double ----------------------
 * The general form's cost is its care for the edges: the 2^600 scale, the clamps and the normalised
 * products (xf_bin_xp: a frexp per factor, three powers of two per term), ~16 ns an element, twice
 * torch's time.  Where nothing can under- or overflow, this form skips all of that and carries every
 * piece as a double-double instead, so that the result rounds about once:
 *   e    exp(-a) = e + e_lo to ~2^-57 relative (xf_exp_reduced before its final rounding; u = 2^-53)
 *   rd   1 / (1 + e) = rd + rd_lo to ~2^-100: 1 + e = dh + dl exactly (Fast2Sum, dl also takes e_lo),
 *        rd = RN(1 / dh), whose residual 1 - rd dh is exact as a multiply-add, then one correction step
 *   l    log1p(e) = l + l_lo to ~2^-57: the log kernel on dh with the correction dl / dh, or, where
 *        dh < sqrt 2, on f = e itself (1 + f is then exactly 1 + e) with e_lo / dh, as xf_log1p does;
 *        l = e where e < 2^-60 (log1p(e) = e (1 - e/2 + ...); the kernel's e^2 would underflow, a
 *        microcode assist on x86)
 *   masses  1 - y exact (Fast2Sum), q y exact (a multiply-add), own + other as their double-double sum
 *   loss  w [own a + (own + other) l], every product with its exact error (a multiply-add), the sum by
 *         TwoSum: one final multiply-add rounds (<= 0.5 ULP plus ~2^-56 relative)
 *   grad  s w [(own - other e) rd] (x >= 0; its negative below), the same way: the product of s w and
 *         the bracket as a double-double rounds once (by a multiply-add where the bracket is at least
 *         2^-800, else a product and a sum: at most one more half ULP)
 * Measured (tests/test_binary.py, against mpmath): within 1 ULP for the loss and the gradient of a hard
 * target, within 1 ulp of the sum of the magnitudes of the two terms for a soft target, where the
 * general form reaches 2.2 and 2.5 ULP.  Domain: |x| <= 500 (e >= 2^-721.4), y = 0 or 2^-60 <= y <= 1,
 * w, q, |s| as the float32 form's.  Every intermediate is then a normal double (the least, s w q y e rd,
 * >= 2^-962) and every multiply-add lies inside xf_fma_emulated's exact domain (products 0 or >= 2^-920;
 * own a's error term is dropped where a < 2^-600, own a <= 2^-540 then, next to (own + other) l >=
 * 2^-62), so each path gives the same bits.  The general form stays for every other element (|x| > 2^900,
 * inf, NaN, a target outside [0, 1] or below 2^-60, extreme weights, factors or loss scales), chosen per
 * element and output as for float32, on the CPU and the GPU alike.  The two forms
 * differ in the last bits (the general form's products round several times).
 * Far logits, 900 <= |x| <= 2^900 (padding's -1e4 or -1e9): e = exp(-|x|) <= 2^-1298 is taken as 0 (so rd
 * = 1, l = 0, every low part 0).  With mass on x's own side (own >= 2^-120) the loss is RN(w own a) and the
 * gradient RN(s w own), the tail terms below 2^-1100 of them; without (own = 0, a confident right
 * answer) the exact loss w (own + other) log1p(e) <= 2^61 2^-1298 and gradient s w other e rd <= 2^180
 * 2^-1298 both round to zeros, +0 and, for the gradient, the sign of -s w other (x >= 0; + below), which
 * xf_bin_bce_fast64_grad gives its zero bracket where the tail's mass is nonzero.  |x| <= 2^900 keeps w own
 * a <= 2^1020 finite and the multiply-adds in their exact domain.
 * Middle logits, 500 < |x| < 900 (since 2026-12-06; the general form before, 3.5x slower and 40x at |x| ~
 * 700 for a confident right answer, benchmarks/README.md, eighteenth round): e counts as 0 as for a far
 * logit, which with own mass is within the bound as there (the tail below 2^-540 of own a).  Without own
 * mass the result is all tail, and it may be normal, subnormal or zero (e 2^180 >= 2^-1075 up to |x| ~
 * 870): it is formed from exp(-|x|) 2^600 (xf_bin_fast64_exp, from the exactly shifted argument) as a
 * double-double and scaled back in one rounding (xf_bin_fast64_tail), log1p(e) and 1/(1 + e) being e and
 * 1 to 2^-721.  Their loop instance runs only for chunks that hold such a logit (fast_mode 4, binary_blocks.h). */
#define XF_BIN_FAST64_MAX_ABS_X 500.0
#define XF_BIN_FAST64_FAR_MIN 900.0
#define XF_BIN_FAST64_FAR_MAX 0x1p900

/* Whether the logit x lies in the float64 form's domain: |x| <= 500, or with `far` also a far logit.  The
 * per-element rule takes both (xf_bin_bce_fast64_ok); the CPU's chunks test the near range first, and
 * their loops handle far logits only where a chunk holds one (far a literal 1 there, 0 in the others,
 * where the compiler drops that work: supporting far logits in every loop cost ordinary calls 5 %). */
XF_HD int xf_bin_fast64_x_ok(double x, const int far)
{
    const double a = xf_fabs(x);
    return (a <= XF_BIN_FAST64_MAX_ABS_X) |
           ((far == 1) & (a >= XF_BIN_FAST64_FAR_MIN) & (a <= XF_BIN_FAST64_FAR_MAX)) |
           ((far == 2) & (a <= XF_BIN_FAST64_FAR_MAX));
}

XF_HD int xf_bin_bce_fast64_rule(double x, double y, double w, double q, double loss_k, const int far)
{
    return xf_bin_bce_fast_factors_ok(y, w, q, loss_k) & xf_bin_fast64_x_ok(x, far) &
           ((y == 0.0) | (y >= XF_BIN_FAST_LO));
}

XF_HD int xf_bin_bce_fast64_ok(double x, double y, double w, double q, double loss_k)
{
    return xf_bin_bce_fast64_rule(x, y, w, q, loss_k, 2);
}

typedef struct {
    double a;           /* |x| */
    double e, e_lo;     /* exp(-|x|) */
    double rd, rd_lo;   /* 1 / (1 + e) = s(|x|) */
    double l, l_lo;     /* log1p(e) = softplus(-|x|) */
    double es, es_lo;   /* a middle logit's (500 < |x| < 900) exp(-|x|) 2^600, else 0 */
    int pos;            /* x >= 0 (true for -0) */
    int far;            /* 1: far logits possible, 2: middle ones too (xf_bin_fast64_x_ok); e = 0 marks one */
} xf_bin_fast64_logit;

/* exp(-|x|) = e + *e_lo; with far_ok (a literal, see xf_bin_fast64_x_ok) 0 for far logits and, for a
 * middle one (500 < |x| < 900), exp(-|x|) 2^600 instead (xf_bin_fast64_from_exp tells them apart) */
XF_HD double xf_bin_fast64_exp(double x, const int far_ok, double *e_lo)
{
    double t, m_lo;
    const double a = xf_fabs(x);
    const int far = (far_ok != 0) & (a >= XF_BIN_FAST64_FAR_MIN);
    const int mid = (far_ok == 2) & (a > XF_BIN_FAST64_MAX_ABS_X) & (a < XF_BIN_FAST64_FAR_MIN);
    /* 600 ln 2 - a carried exactly as h + hl (ln 2's high part has 32 bits: 600 times it is exact) */
    double h, hl;
    xf_two_sum(-a, XF_BIN_SCALE_K * XF_MATH_LN2_HI, &h, &hl);
    /* exp(arg) = 2^n (m + m_lo): both scaled by 2^n exactly (n >= -722, every result normal); a far logit's
     * argument is clamped, its result discarded */
    const double arg = far ? -XF_BIN_FAST64_MAX_ABS_X : (mid ? h : -a);
    const double arg_lo = mid ? hl + XF_BIN_SCALE_K * XF_MATH_LN2_LO : 0.0;
    double m = xf_exp_reduced(arg, arg_lo, &t, &m_lo);
    const double lo = m_lo * xf_pow2_from_low_bits(xf_bits_from_double(t) + 1023ULL);
    *e_lo = far ? 0.0 : lo;
    return far ? 0.0 : xf_exp_scale_normal(m, t);
}

XF_HD xf_bin_fast64_logit xf_bin_fast64_from_exp(double x, double e, double e_lo, const int far)
{
    xf_bin_fast64_logit r;
    r.far = far;
    double a = xf_fabs(x);
    /* a middle logit: xf_bin_fast64_exp gave the scaled tail; its e counts as 0, as a far logit's */
    const int mid = (far == 2) & (a > XF_BIN_FAST64_MAX_ABS_X) & (a < XF_BIN_FAST64_FAR_MIN);
    r.es = mid ? e : 0.0;
    r.es_lo = mid ? e_lo : 0.0;
    e = mid ? 0.0 : e;
    e_lo = mid ? 0.0 : e_lo;
    double dh = 1.0 + e;
    double dl = ((1.0 - dh) + e) + e_lo; /* Fast2Sum: 1 >= e */
    double rd = 1.0 / dh;
    double rho = xf_fma(-rd, dh, 1.0);   /* exact: the residual of a correctly rounded quotient */
    double cd = dl * rd;                 /* dl / dh, |cd| <= 2^-52 */
    unsigned long long ix = xf_log_shifted_bits(dh);
    double dk = xf_log_k(ix);
    int k0 = dk == 0.0;
    int tiny = e < 0x1p-60;
    double f = k0 ? (tiny ? 0.0 : e) : xf_log_f(ix);
    /* the k0 branch's cd (~e) is zeroed before squaring: e^2 is subnormal for |x| ~ 354-372, a microcode
     * assist per vector on x86 (3-4x slower calls) for a value the select drops */
    double cdk = k0 ? 0.0 : cd;
    double c = k0 ? e_lo * rd : cdk - 0.5 * (cdk * cdk);
    double l_lo;
    double l = xf_log_kernel_hilo(dk, f, c, &l_lo);
    r.a = a;
    r.e = e;
    r.e_lo = e_lo;
    r.rd = rd;
    r.rd_lo = rd * (rho - cd);          /* 1 / (dh + dl) = rd (1 + rho) / (1 + cd) */
    r.l = tiny ? e : l;
    r.l_lo = tiny ? e_lo : l_lo;
    r.pos = (x >= 0.0);
    return r;
}

/* the pieces of any logit of the domain, far ones included (the GPU's and the per-element selects' rule) */
XF_HD xf_bin_fast64_logit xf_bin_fast64_pieces(double x)
{
    double e_lo;
    double e = xf_bin_fast64_exp(x, 2, &e_lo);
    return xf_bin_fast64_from_exp(x, e, e_lo, 2);
}

/* own (1 - y for x >= 0, q y below), other (the other one) and, for the loss, own + other, each as a
 * double-double; own + other is exactly 1 for q = 1 (see xf_bin_bce_fast_loss) */
XF_HD void xf_bin_fast64_masses(int pos, double y, double q, double *oh, double *ol, double *th, double *tl)
{
    double omy = 1.0 - y;
    double omy_lo = (1.0 - omy) - y;    /* Fast2Sum: 0 <= y <= 1 */
    double qy = q * y;
    double qy_lo = (q == 1.0) ? 0.0 : xf_fma(q, y, -qy);
    *oh = pos ? omy : qy;
    *ol = pos ? omy_lo : qy_lo;
    *th = pos ? qy : omy;
    *tl = pos ? qy_lo : omy_lo;
}

/* (kh + kl)(mh + ml)(es + es_lo) 2^-600 for a middle logit's tail (es >= 2^-699, the factors within
 * 2^+-120 as the form's domain has them): the product as a double-double, every partial product normal
 * (>= 2^-940), then one rounding of its high part scaled back.  The result may be subnormal or a zero of
 * the product's sign: within 0.5 ULP plus ~2^-100 relative where it is normal, 0.5 ULP of the subnormal
 * grid plus far less where it is not (the high part's own rounding, 2^-53 of it, is below that grid's
 * ULP there).  es = 0 gives a zero. */
XF_HD double xf_bin_fast64_tail(double kh, double kl, double mh, double ml, double es, double es_lo)
{
    const double ph = mh * es;
    const double pl = xf_fma(mh, es, -ph) + (mh * es_lo + ml * es);
    const double gh = kh * ph;
    const double gl = xf_fma(kh, ph, -gh) + (kh * pl + kl * ph);
    return (gh + gl) * XF_BIN_UNSCALE;
}

XF_HD double xf_bin_bce_fast64_loss(xf_bin_fast64_logit f, double y, double w, double q)
{
    double oh, ol, th, tl;
    xf_bin_fast64_masses(f.pos, y, q, &oh, &ol, &th, &tl);
    double mh, ml;
    xf_two_sum(oh, th, &mh, &ml);
    ml += ol + tl;
    mh = (q == 1.0) ? 1.0 : mh;
    ml = (q == 1.0) ? 0.0 : ml;
    double p1 = oh * f.a;
    double e1 = ((f.a >= 0x1p-600) ? xf_fma(oh, f.a, -p1) : 0.0) + ol * f.a;
    double p2 = mh * f.l;
    double e2 = xf_fma(mh, f.l, -p2) + (mh * f.l_lo + ml * f.l);
    double sh, se;
    xf_two_sum(p1, p2, &sh, &se);
    double sl = se + (e1 + e2);
    const double main = xf_fma(w, sh, w * sl);
    if (f.far != 2) {
        return main;
    }
    /* a middle logit without own mass: the loss is all tail, w (own + other) log1p(e) with log1p(e) = e to
     * 2^-721, formed 2^600 larger as a double-double and scaled back in one rounding (xf_bin_fast64_tail);
     * with own mass the tail is below 2^-540 of own a, as for a far logit */
    const double es = (oh == 0.0) ? f.es : 0.0;
    const double tail = xf_bin_fast64_tail(w, 0.0, mh, ml, es, f.es_lo);
    return (es != 0.0) & (mh != 0.0) ? tail : main;
}

XF_HD double xf_bin_bce_fast64_grad(xf_bin_fast64_logit f, double y, double w, double q, double s)
{
    double oh, ol, th, tl;
    xf_bin_fast64_masses(f.pos, y, q, &oh, &ol, &th, &tl);
    /* own - other e */
    double pc = th * f.e;
    double pce = xf_fma(th, f.e, -pc);
    double xh, xe;
    xf_two_sum(oh, -pc, &xh, &xe);
    double xl = xe + ((ol - pce) - (th * f.e_lo + tl * f.e));
    /* times rd.  Without own mass, xh ~ -other e and rd_lo ~ -e: their product, under 2^-400 of the
     * bracket where e < 2^-400, is left out there, as it would be subnormal from |x| ~ 354 on (a microcode
     * assist per vector on x86: such calls ran 2.5x slower).  With own mass it stays: rd_lo is then what
     * sets the rounding of own / (1 + e) where the product own w s is a midpoint. */
    double rd_lo = ((oh == 0.0) & (f.e < 0x1p-400)) ? 0.0 : f.rd_lo;
    double bh = xh * f.rd;
    double bl = xf_fma(xh, f.rd, -bh) + (xh * rd_lo + xl * f.rd);
    /* times s w, the sign of x's side */
    double kh = s * w;
    double kl = xf_fma(s, w, -kh);
    kh = f.pos ? kh : -kh;
    kl = f.pos ? kl : -kl;
    double low = kh * bl + kl * bh;
    double r = (xf_fabs(bh) >= 0x1p-800) ? xf_fma(kh, bh, low) : kh * bh + low;
    /* an exactly zero bracket gives +0 whatever the sign of s, as the other forms do; a far logit's
     * bracket without own mass is -other e rd, below every double: a zero of that sign */
    const double zero = ((f.far != 0) & (f.e == 0.0) & (th != 0.0)) ? -kh * 0.0 : 0.0;
    const double main = ((bh == 0.0) & (bl == 0.0)) ? zero : r;
    if (f.far != 2) {
        return main;
    }
    /* a middle logit without own mass: -(s w) other e (rd = 1 to 2^-721), formed 2^600 larger and
     * scaled back in one rounding (xf_bin_fast64_tail); a zero keeps that product's sign */
    const double es = ((oh == 0.0) & (th != 0.0)) ? f.es : 0.0;
    const double tail = -xf_bin_fast64_tail(kh, kl, th, tl, es, f.es_lo);
    return (es != 0.0) ? tail : main;
}

/* The target's mass on x's own side, `own` (1 - y for x >= 0, q y below), and on the other, `other`.
 * With sp(x) = a + l for x >= 0 and l below (and sp(-x) the other way round),
 *     (1 - y) sp(x) + q y sp(-x) = own a + (own + other) l
 * one product of a and one multiply-add, every term >= 0.  own + other = fma(q, y, 1 - y) is exactly 1
 * for q = 1 (fl(1 - y) lies within 2^-54 of 1 - y, and adding y rounds back to 1, a tie going to even);
 * the select says so to the compiler, which drops the product for the unweighted instances. */
XF_HD double xf_bin_bce_fast_loss(xf_bin_fast_logit f, double y, double w, double q)
{
    double omy = 1.0 - y;
    double own = f.pos ? omy : q * y;
    double mass = (q == 1.0) ? 1.0 : xf_fma(q, y, omy);
    return w * xf_fma(own, f.a, mass * f.l);
}

/* (1 - y) s(x) - q y s(-x) with s(|x|) = rd and s(-|x|) = tail = e rd is +-(own rd - other tail), + for
 * x >= 0: one product and one multiply-add. */
XF_HD double xf_bin_bce_fast_grad(xf_bin_fast_logit f, double y, double w, double q, double s)
{
    double omy = 1.0 - y;
    double own = f.pos ? omy : q * y;
    double other = f.pos ? q * y : omy;
    double b = xf_fma(own, f.rd, -(other * (f.e * f.rd)));
    double bracket = f.pos ? b : -b;
    return (bracket == 0.0) ? 0.0 : (s * w) * bracket;
}

/* ---- sigmoid focal loss (torchvision semantics) -------------------------------------------------------
 * alpha_t = alpha y + (1 - alpha)(1 - y) (1 when alpha < 0), ce = BCE(x, y), u = 1 - p_t, g = gamma:
 *     loss  = alpha_t ce u^g
 *     d/dx  = alpha_t u^g [ (1-y) s(x) - y s(-x) + g ce W (1 - 2y) ],   W = s(x) s(-x) / u.
 * Write d = 1 + e and N = u d = c_b + c_t e, where c_b is the target mass on x's own side (1-y for
 * x >= 0, y for x < 0) and c_t the other one.  Then s(x) s(-x) = e/d^2, W = e/(d N), and with
 * B = u^g / d = exp(g log u - log1p(e)):
 *     d/dx  = alpha_t B [ sign(x) (c_b - c_t e) + g ce (e/N) (1 - 2y) ]
 * a bracket without any division by d, and one exponential for the whole power-and-quotient.
 * log u = log N - log1p(e) is a double-double: for y in {0, 1}, N is 1 (log N = 0) or, on the
 * confident side, e itself (log N = -a exactly); for soft y, N (scaled by 2^600) is formed exactly as
 * a double-double and its log taken unrounded.  g log u enters the exponential exactly (two_prod): a
 * rounded g log u would cost |g log u| 2^-53 of relative error, hundreds of ULPs where u is tiny.
 * Confident side (c_b = 0): the bracket is -+(e + g log1p(e)), all tail, evaluated scaled (b); with e
 * tiny the plain formula would underflow long before the loss does.
 * The gradient's factors (alpha_t, ce, e/N, the bracket, B, their products) stay double-doubles and
 * round once, at the end; the loss is one exponential of a double-double argument.
 * Bound: <= 2 ULP float32, <= 4 ULP float64 (measured maxima in the README). */
typedef struct {
    double alpha_t, alpha_t_lo; /* alpha_t, double-double */
    double lah, lal;   /* log alpha_t, double-double */
    double luh, lul;   /* log u, double-double */
    double lch, lcl;   /* log ce, double-double */
    double ce, ce_lo;  /* ce, double-double */
    double R, R_lo;    /* e / N, double-double */
    double cbh, cbl, cth, ctl; /* c_b, c_t */
    int conf;          /* c_b = 0: y in {0,1} and x on the correct side */
} xf_bin_focal_parts;

XF_HD xf_bin_focal_parts xf_bin_focal_prepare(xf_bin_logit p, double y, double alpha, double gamma)
{
    xf_bin_focal_parts f;
    double omy_h, omy_l, oma_h, oma_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    xf_two_sum(1.0, -alpha, &oma_h, &oma_l);

    /* alpha_t = alpha y + (1 - alpha)(1 - y), both products >= 0, summed unrounded */
    double a1h, a1l, a2h, a2l, ath, atl;
    xf_bin_dd_mul(alpha, 0.0, y, 0.0, &a1h, &a1l);
    xf_bin_dd_mul(oma_h, oma_l, omy_h, omy_l, &a2h, &a2l);
    xf_two_sum(a1h, a2h, &ath, &atl);
    atl += a1l + a2l;
    f.alpha_t = alpha < 0.0 ? 1.0 : ath + atl;
    f.alpha_t_lo = alpha < 0.0 ? 0.0 : atl - (f.alpha_t - ath);
    f.lah = ((alpha < 0.0) | (ath == 0.0)) ? 0.0 : xf_bin_log_hilo(ath, &f.lal);
    f.lal = ((alpha < 0.0) | (ath == 0.0)) ? 0.0 : f.lal + atl / ath;

    f.cbh = p.pos ? omy_h : y;
    f.cbl = p.pos ? omy_l : 0.0;
    f.cth = p.pos ? y : omy_h;
    f.ctl = p.pos ? 0.0 : omy_l;
    f.conf = (f.cbh == 0.0) & (f.cbl == 0.0);
    int binary = f.conf | ((f.cth == 0.0) & (f.ctl == 0.0));

    /* ce = c_b (a + l) + c_t l as a double-double, rounded once */
    double bh, bl, t1h, t1l, t2h, t2l, ch, cl;
    xf_two_sum(p.a, p.l, &bh, &bl);
    bl = (bh - bh == 0.0) ? bl + p.l_lo : 0.0;
    xf_bin_dd_mul(f.cbh, f.cbl, bh, bl, &t1h, &t1l);
    xf_bin_dd_mul(f.cth, f.ctl, p.l, p.l_lo, &t2h, &t2l);
    t1h = f.conf ? 0.0 : t1h; /* 0 * inf = 0 (e) */
    t1l = f.conf ? 0.0 : t1l;
    xf_two_sum(t1h, t2h, &ch, &cl);
    cl = (ch - ch == 0.0) ? cl + (t1l + t2l) : 0.0;
    f.ce = ch + cl;
    f.ce_lo = (f.ce - f.ce == 0.0) ? cl - (f.ce - ch) : 0.0;
    /* log ce as a double-double; on the confident side from the scaled tail (ce = log1p(e) may be
     * subnormal or 0 unscaled) */
    double cs_h = f.conf ? p.l_s : ch, cs_l = f.conf ? p.l_s_lo : cl;
    int ce_ok = (cs_h > 0.0) & (cs_h - cs_h == 0.0);
    double lgh, lgl;
    lgh = xf_bin_log_hilo(ce_ok ? cs_h : 1.0, &lgl);
    lgl += ce_ok ? cs_l / cs_h : 0.0;
    double sh1, sl1;
    xf_two_sum(lgh, f.conf ? -XF_BIN_SCALE_K * XF_MATH_LN2_HI : 0.0, &sh1, &sl1);
    f.lch = sh1;
    f.lcl = sl1 + (lgl - (f.conf ? XF_BIN_SCALE_K * XF_MATH_LN2_LO : 0.0));

    /* log u = log N - l; the three cases are all evaluated and one is selected (no branch on data: the
     * element loops vectorize, warps do not diverge) */
    /* c_b = 0 (confident side): N = e, log u = -a - l */
    double cuh, cul;
    xf_two_sum(-p.a, -p.l, &cuh, &cul);
    cul = (cuh - cuh == 0.0) ? cul - p.l_lo : 0.0;
    /* c_t = 0: N = 1, log u = -l */
    double buh = -p.l, bul = -p.l_lo;
    /* soft y: N 2^600 = c_b 2^600 + c_t e_s exactly as a double-double */
    double mh, ml, nh, nl;
    xf_bin_dd_mul(f.cth, f.ctl, p.e_s, p.e_s_lo, &mh, &ml);
    xf_two_sum(f.cbh * XF_BIN_SCALE, mh, &nh, &nl);
    nl += f.cbl * XF_BIN_SCALE + ml;
    double lh, ll;
    lh = xf_bin_log_hilo(nh, &ll);
    ll += nl / nh;
    /* - 600 ln 2 - l */
    double s1, e1, s2, e2;
    xf_two_sum(lh, -XF_BIN_SCALE_K * XF_MATH_LN2_HI, &s1, &e1);
    xf_two_sum(s1, -p.l, &s2, &e2);
    double suh = s2;
    double sul = e2 + (e1 + (ll - XF_BIN_SCALE_K * XF_MATH_LN2_LO - p.l_lo));
    double luh = f.conf ? cuh : (binary ? buh : suh);
    double lul = f.conf ? cul : (binary ? bul : sul);
    /* e_s / N_s to 2^-104: the quotient's remainder is exact (a multiply-add) */
    double rq = p.e_s / nh;
    double rq_lo = (xf_fma(-rq, nh, p.e_s) + (p.e_s_lo - rq * nl)) / nh;
    f.R = f.conf ? 1.0 : (binary ? p.e : rq);
    f.R_lo = f.conf ? 0.0 : (binary ? p.e_lo : rq_lo);
    f.luh = luh;
    f.lul = lul;
    return f;
}

/* loss = exp(g log u + log ce + log alpha_t): one exponential of a double-double argument, so u^g may
 * underflow (soft y ~ 1e-125 at x = -1e300: u^g ~ 1e-464) while ce is huge and the loss ~1e-289 is not,
 * and the only rounding at the loss's scale is the exponential's own. */
XF_HD double xf_bin_focal_loss(xf_bin_logit p, xf_bin_focal_parts f, double gamma, double k)
{
    double mh, ml, sh, sl;
    xf_two_sum(f.lch, f.lah, &mh, &ml);
    ml += f.lcl + f.lal;
    /* + k ln 2 (the loss scaled by 2^k, see xf_bin_args.loss_k; k ln2_hi is exact for |k| < 2^21) */
    xf_two_sum(mh, k * XF_MATH_LN2_HI, &sh, &sl);
    mh = sh;
    ml = ml + (sl + k * XF_MATH_LN2_LO);
    double g = (gamma == 0.0) ? 0.0 : gamma; /* u^0 = 1 even at u = 0 (log u = -inf) */
    double r = xf_bin_exp_affine(g, gamma == 0.0 ? 0.0 : f.luh, gamma == 0.0 ? 0.0 : f.lul, mh, ml);
    double ce = f.ce;
    /* ce = +inf (x = +-inf off the confident side): u > 0 there, the loss is +inf */
    r = (ce == XF_INF) ? XF_INF : r;
    r = ((f.alpha_t == 0.0) | (f.conf ? (p.l_s == 0.0) : (ce == 0.0))) ? 0.0 : r;
    return p.nan ? p.a : r;
}

XF_HD double xf_bin_focal_grad(xf_bin_logit p, xf_bin_focal_parts f, double y, double gamma,
                               double s)
{
    /* both cases evaluated, one selected (see xf_bin_focal_prepare) */
    /* c_b = 0: bracket = -+(e + g l), scaled */
    double gh, gl, ch, cl;
    xf_bin_dd_mul(gamma, 0.0, p.l_s, p.l_s_lo, &gh, &gl);
    xf_two_sum(p.e_s, gh, &ch, &cl);
    cl = (ch - ch == 0.0) ? cl + (gl + p.e_s_lo) : 0.0;
    ch = p.pos ? -ch : ch; /* y = 1 with x >= 0 pulls x up */
    cl = p.pos ? -cl : cl;
    /* otherwise */
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    /* 1 - 2y as a double-double */
    double o2h, o2l;
    xf_two_sum(omy_h, -y, &o2h, &o2l);
    o2l += omy_l;
    /* T2 = g ce (e/N) (1 - 2y) */
    double g1h, g1l, g2h, g2l, t2h, t2l;
    xf_bin_dd_mul(gamma, 0.0, f.ce, f.ce_lo, &g1h, &g1l);
    xf_bin_dd_mul(g1h, g1l, f.R, f.R_lo, &g2h, &g2l);
    xf_bin_dd_mul(g2h, g2l, o2h, o2l, &t2h, &t2l);
    int t2zero = (gamma == 0.0) | (f.ce == 0.0) | (f.R == 0.0) | ((o2h == 0.0) & (o2l == 0.0));
    t2h = t2zero ? 0.0 : t2h;
    t2l = t2zero ? 0.0 : t2l;
    /* T1 = sign(x) (c_b - c_t e) */
    double mh, ml, dh, dl;
    xf_bin_dd_mul(f.cth, f.ctl, p.e, p.e_lo, &mh, &ml);
    xf_two_sum(f.cbh, -mh, &dh, &dl);
    dl += f.cbl - ml;
    double t1h = p.pos ? dh : -dh, t1l = p.pos ? dl : -dl;
    double sh, sl;
    xf_two_sum(t1h, t2h, &sh, &sl);
    sl = (sh - sh == 0.0) ? sl + (t1l + t2l) : 0.0;
    /* s alpha_t bracket B with B = u^g / (1 + e) = exp(g log u - l), as double-doubles rounded once at
     * the end (each rounded factor cost up to half an ULP; six of them reached 4.73 ULP at gamma = 20).
     * s, alpha_t and the bracket enter as m 2^E with m in [1, 2) (xf_bin_split_exp): their powers of two
     * (and the confident side's 2^-600) go into the exponential's argument, so no product over- or
     * underflows on the way and the exponential is near the result's own scale, subnormal only where
     * the result is.  (B alone underflows at u^g < 2^-1022 while a large s can make the gradient a
     * normal number: x = 36, y = 1, gamma = 20, grad_output 1e30 was 17000 ULP off.)  A further 2^64,
     * taken off by the last product, keeps the exponential normal where the result is barely
     * subnormal. */
    double bh, bl;
    bh = f.conf ? ch : sh;
    bl = f.conf ? cl : sl;
    double b0 = bh;
    bh = b0 + bl;
    bl = (bh - bh == 0.0) ? bl - (bh - b0) : 0.0; /* Fast2Sum: the low part may exceed half an ulp */
    bh = (bh == 0.0) ? b0 : bh;                    /* -0 + 0 would lose the sign of a zero */
    double ms, ma, mb, down, kh, kl, qh, ql, rh, rl;
    double es = xf_bin_split_exp(s, &ms, &down);
    double ea = xf_bin_split_exp(f.alpha_t, &ma, &down);
    double mal = f.alpha_t_lo * down;
    double eb = xf_bin_split_exp(bh, &mb, &down);
    double mbl = bl * down;
    xf_bin_dd_mul(ms, 0.0, ma, mal, &kh, &kl);
    xf_bin_dd_mul(kh, kl, mb, mbl, &qh, &ql);  /* in [1, 8) unless a factor is 0, inf, NaN or subnormal */
    double eq = es + ea + eb;
    /* an infinite s: only the sign of its product matters, and B unscaled is as likely to be nonzero */
    double shift = (s - s == 0.0) ? eq - (f.conf ? XF_BIN_SCALE_K : 0.0) : 0.0;
    double lift = (gamma * f.luh - p.l + shift * XF_MATH_LN2_HI < 0.0) ? 64.0 : 0.0;
    double ah, al;
    xf_two_sum(-p.l, (shift + lift) * XF_MATH_LN2_HI, &ah, &al);
    al += (shift + lift) * XF_MATH_LN2_LO - p.l_lo;
    double Bh, Bl;
    Bh = xf_bin_exp_affine_hilo(gamma, f.luh, f.lul, ah, al, &Bl);
    xf_bin_dd_mul(qh, ql, Bh, Bl, &rh, &rl);
    rh = (rh == 0.0) ? ((ms * ma) * mb) * Bh : rh; /* a zero's sign (TwoSum's -0 + 0 is +0) */
    double r = rh * (lift != 0.0 ? 0x1p-64 : 1.0);
    r = ((s == 0.0) | (f.alpha_t == 0.0)) ? 0.0 * r : r;
    /* an infinite s: +-inf wherever the exact gradient is nonzero, although B or the confident side's
     * bracket may underflow (x = 700 or 1200, y = 1); NaN (inf * 0) where it is exactly 0: alpha_t = 0,
     * a zero bracket (on the confident side only at x = +-inf), or u = 0 (there too, gamma > 0) */
    int zero_grad = (f.alpha_t == 0.0) | (f.conf ? (p.a == XF_INF) : (mb == 0.0))
                    | ((gamma != 0.0) & (f.luh == -XF_INF));
    double b_sign = f.conf ? (p.pos ? -1.0 : 1.0) : xf_bin_unit(mb);
    double r_inf = zero_grad ? XF_NAN : xf_bin_unit(s) * b_sign * XF_INF;
    r = xf_bin_upstream_is_inf(s) ? r_inf : r;
    return p.nan ? p.a : r;
}

/* ---- sigmoid focal loss for float32 storage: the ordinary element in plain double -----------------------
 * As for BCE (the float32 form above): a float32 result needs its double value to a small fraction of a
 * float32 ULP, and for an ordinary element plain double arithmetic on BCE's float32 pieces (e = exp(-|x|)
 * to 2^-32, l = log1p(e) to 2^-37.6, rd = 1/(1 + e)) gives that, with the general form's formulas:
 *     N = c_b + c_t e,  u = N rd,  log u = log N - l  (log N = -|x| exactly on the confident side, c_b = 0)
 *     U = u^g = exp(g log u),  ce = c_b |x| + l,  loss = alpha_t ce U
 *     d/dx = alpha_t U rd [sign(x) (c_b - c_t e) + g ce (e/N) (1 - 2y)]
 * Domain: every finite float32 x, 0 <= y <= 1, g <= 20 (the documented bound's range), no loss scale, for
 * the gradient |s| in [2^-60, 2^60].  Beyond |x| = 550 exp(-550) stands in for e, as for BCE: on the
 * confident side (c_b = 0) log N = -|x| and e/N = 1/c_t do not depend on e, and the exact loss (<= e) and
 * gradient (<= 2^65 e) as well as the stand-in's lie below 2^-720, float32 zeros of the same signs (the
 * bracket's two terms share their sign there); with c_b > 0 (>= 2^-149) every term e enters is below
 * 2^-512 of the one beside it.  Errors, relative,
 * before the one rounding to float32: alpha_t, ce, N, rd, e/N, 1 - 2y and the products 2^-50 or less each
 * beside e's 2^-32 (N and the bracket's c_t e carry it, relative to N: the bound's unit for the bracket is
 * alpha_t U rd (N + g ce (e/N) |1 - 2y|)); log u to 2^-32 absolute (e's error in log N, l's 2^-37.6 times
 * l <= ln 2), so U to g 2^-32 + 2^-32 (the exponential) <= 2^-27.5 for g <= 20: the loss and the gradient
 * within 2^-27.3 relative (of that unit for a soft target's bracket), <= 0.5 + 2^-3.3 ULP after rounding.
 * Every intermediate is a normal double (the least, c_t e with y a float32 subnormal, 2^-943) but where
 * the results are negligible: U is taken as 0 where the loss and the gradient lie far below float32's
 * range, so that neither U nor their products pass through subnormals (microcode assists on x86: the
 * confident side ran 2-4x slower from |x| ~ 240 on, benchmarks/README.md, eighteenth round), and its
 * exponential's argument is clamped at -700.  Negligible: on the confident side g log u - |x| < -600
 * (loss <= e U, gradient <= 2^65 e U, both below 2^-800), else g log u < -690 (U < 2^-995; ce <= 2^129,
 * the bracket below 2^155 with c_b >= 2^-149: below 2^-700).  Elsewhere U >= 2^-995, and on the confident
 * side e U >= 2^-866.  The outputs are float32 zeros of the same signs either way (U = 0 times the
 * bracket keeps its sign); a reduction's double sum loses terms below 2^-700.  No multiply-add of its own: the
 * exponentials' and log1p's stay in their exact domains (binary.h, xf_math.h), so every path gives the same
 * bits.  The CPU loops and the CUDA twin pick the form per element and output as for BCE. */
#define XF_BIN_FOCAL_FAST_MAX_GAMMA 20.0
/* every finite float32 logit, exp(-550) standing in beyond 550 (above); until 2026-12-06 550 itself */
#define XF_BIN_FOCAL_FAST_MAX_ABS_X 0x1.fffffep+127

XF_HD int xf_bin_focal_fast_ok(double x, double y, double gamma, double loss_k)
{
    return (xf_fabs(x) <= XF_BIN_FOCAL_FAST_MAX_ABS_X) & (y >= 0.0) & (y <= 1.0) &
           (gamma <= XF_BIN_FOCAL_FAST_MAX_GAMMA) & (loss_k == 0.0);
}

typedef struct {
    double alpha_t; /* alpha y + (1 - alpha)(1 - y), or 1 */
    double cb, ct;  /* the target masses on x's own side and on the other */
    double ce;      /* BCE(x, y) */
    double U;       /* u^g */
    double R;       /* e / N */
} xf_bin_focal_fast_parts;

XF_HD xf_bin_focal_fast_parts xf_bin_focal_fast_prepare(xf_bin_fast_logit f, double y, double alpha,
                                                        double gamma)
{
    xf_bin_focal_fast_parts r;
    double omy = 1.0 - y;
    r.alpha_t = (alpha < 0.0) ? 1.0 : alpha * y + (1.0 - alpha) * omy;
    r.cb = f.pos ? omy : y;
    r.ct = f.pos ? y : omy;
    double n = r.cb + r.ct * f.e;
    r.ce = r.cb * f.a + f.l;
    double log_n = (r.cb == 0.0) ? -f.a : xf_log(n);
    const double arg = gamma * (log_n - f.l); /* g = 0: exp(0) = 1 */
    const int negligible = (r.cb == 0.0) ? (arg - f.a < -600.0) : (arg < -690.0);
    /* the same bits as xf_exp_lite from -700 up (xf_exp_lite_normal); below, U is discarded */
    const double u_g = xf_exp_lite_normal((arg < -700.0) ? -700.0 : arg);
    r.U = negligible ? 0.0 : u_g;
    r.R = f.e / n;
    return r;
}

XF_HD double xf_bin_focal_fast_loss(xf_bin_focal_fast_parts r)
{
    return (r.alpha_t * r.ce) * r.U;
}

XF_HD double xf_bin_focal_fast_grad(xf_bin_fast_logit f, xf_bin_focal_fast_parts r, double y, double gamma,
                                    double s)
{
    double own = r.cb - r.ct * f.e;
    double bracket = (f.pos ? own : -own) + (gamma * r.ce) * (r.R * (1.0 - 2.0 * y));
    return ((s * r.alpha_t) * (r.U * f.rd)) * bracket;
}

/* ---- probabilities ------------------------------------------------------------------------------------
 * The log-probabilities of BCE from p, in one place for all three modes:
 *   exact         log p, log(1-p) = log1p(-p)                         (log 0 = -inf)
 *   eps clip      p clipped to [eps, 1-eps] as real numbers: log eps where p < eps, log1p(-eps) where
 *                 1 - p < eps (1 - p is exact there: p >= 1/2, Sterbenz); a clipped log has derivative 0
 *   log clamp     max(log p, c), max(log(1-p), c): torch's BCELoss with c = -100; derivative 0 where the
 *                 log is below c.  Which side of c an exact log lies on is decided on p itself, against the
 *                 doubles clamp_lo = the least double >= e^c (log p < c iff p < clamp_lo) and clamp_hi = the
 *                 greatest double <= 1 - e^c (log(1-p) < c iff p > clamp_hi), which the caller computes
 *                 exactly; the rounded log can sit on the other side of c within an ulp of it
 * Per element: *lp, *l1p are the logs; *dp, *d1p are 1 where the log still depends on p, 0 where clipped. */
typedef struct {
    int clip;          /* eps mode */
    double eps;
    double log_eps;    /* log(eps) */
    double log1m_eps;  /* log1p(-eps) */
    int clamp;         /* log clamp mode */
    double c;          /* the clamp, <= 0 */
    double clamp_lo;   /* least double >= e^c */
    double clamp_hi;   /* greatest double <= 1 - e^c */
} xf_bin_prob_mode;

/* eps mode's clips, as real numbers: p < eps, and 1 - p < eps (1 - p exact there: p >= 1/2, Sterbenz) */
XF_HD int xf_bin_prob_lo_clip(double pr, const xf_bin_prob_mode *m)
{
    return m->clip & (pr < m->eps);
}

XF_HD int xf_bin_prob_hi_clip(double pr, const xf_bin_prob_mode *m)
{
    return m->clip & (pr >= 0.5) & ((1.0 - pr) < m->eps);
}

XF_HD void xf_bin_prob_logs(double pr, const xf_bin_prob_mode *m, double *lp, double *l1p, int *dp, int *d1p)
{
    double a = xf_log(pr);
    double b = xf_log1p(-pr);
    int lo_clip = xf_bin_prob_lo_clip(pr, m);
    int hi_clip = xf_bin_prob_hi_clip(pr, m);
    a = lo_clip ? m->log_eps : (hi_clip ? m->log1m_eps : a);
    b = hi_clip ? m->log_eps : (lo_clip ? m->log1m_eps : b);
    int ca = m->clamp & (pr < m->clamp_lo);
    int cb = m->clamp & (pr > m->clamp_hi);
    /* an unclamped exact log is >= c, so a rounded one below c is closer to c (max(log, c) either way) */
    *lp = (ca | (m->clamp & (a < m->c))) ? m->c : a;
    *l1p = (cb | (m->clamp & (b < m->c))) ? m->c : b;
    *dp = !(lo_clip | hi_clip | ca);
    *d1p = !(lo_clip | hi_clip | cb);
}

/* w [y (-log p) + (1-y)(-log(1-p))] 2^k: two non-negative terms, normalised products (c), 0 * inf = 0 (e).
 * (Every loss function takes k, the exponent of a power-of-two scale applied exactly: the reductions ask
 * for 2^600 when their terms are so small that rounding each onto the subnormal grid would add up.) */
XF_HD double xf_bin_bce_prob_loss(double pr, double y, double w, const xf_bin_prob_mode *m, double k)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double omy_h, omy_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    double r = xf_bin_term(w, 1.0, 1.0, -lp, y, 0.0, k) + xf_bin_term(w, 1.0, 1.0, -l1p, omy_h, omy_l, k);
    return (pr != pr) ? pr : r;
}

/* d/dp of (s * loss) = s w [(1-y)/(1-p) - y/p] on the unclipped pieces.  1/(1 - p) is formed from the exact
 * 1 - p = h + l (TwoSum) with one correction step; y/p goes through xf_bin_mul_div (y, p and w may all be
 * subnormal).  p = 0 with y > 0 gives -inf, p = 1 with y < 1 gives +inf: the derivative of -log 0. */
XF_HD double xf_bin_bce_prob_grad(double pr, double y, double w, double s, const xf_bin_prob_mode *m)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double omy_h, omy_l, omp_h, omp_l;
    xf_two_sum(1.0, -y, &omy_h, &omy_l);
    xf_two_sum(1.0, -pr, &omp_h, &omp_l);
    double inv = 1.0 / omp_h;
    inv = (omp_h != 0.0) ? inv - inv * (omp_l / omp_h) : inv; /* 1/(h + l) = (1/h)(1 - l/h + ...) */
    double q1 = d1p ? xf_bin_term(s, w, 1.0, inv, omy_h, omy_l, 0.0) : 0.0;
    double q0 = (dp & (y != 0.0)) ? xf_bin_mul_div(s, w, y, pr) : 0.0;
    double r = q1 - q0;
    return (pr != pr) ? pr : r;
}

/* The same under an infinite upstream factor (see xf_bin_bce_logits_grad_inf), torch's (p - y)/(p(1 - p))
 * times it.  With both terms in (neither log clipped nor clamped, 0 < y < 1, w != 0) their difference has
 * exactly the sign of p - y, so that sign decides (NaN at p = y, inf * 0, as torch; the rounded terms
 * would give +-inf there about one time in seven).  With one term it is that term's infinity; with none
 * (a zero weight, a probability clipped or clamped where the other term has no target mass) 0. */
XF_HD double xf_bin_bce_prob_grad_inf(double pr, double y, double w, double s, const xf_bin_prob_mode *m)
{
    const double unit = xf_bin_bce_prob_grad(pr, y, xf_bin_unit(w), xf_bin_unit(s), m);
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    const int both = (w != 0.0) & dp & d1p & (y > 0.0) & (y < 1.0);
    const double sign = xf_bin_unit(s) * xf_bin_unit(w) * xf_bin_unit(pr - y);
    return (pr != pr) ? pr : both ? sign * XF_INF : (unit != 0.0) ? unit * XF_INF : unit;
}

/* ---- BCE from probabilities for float32 storage: the ordinary element in plain double ------------------
 * As for BCE with logits (above), a float32 result needs its double value only to a small fraction of a
 * float32 ULP, and the general form's double-double logs, its two divisions per output and its normalised
 * products (made for float64's bound and for the edges of double's range) cost a float32 call ~17 ns per
 * element against ~2 for BCE with logits.  For a float32 p with 0 < p < 1, untouched by the clip or the
 * clamp, 0 <= y <= 1, w in [2^-60, 2^60] and no loss scaling:
 *   - log p = k ln 2 + 2 atanh(s1), s1 = f1 / (2 + f1), from p = 2^k (1 + f1), 1 + f1 in [sqrt 2 / 2,
 *     sqrt 2) (xf_log's reduction; f1 exact).  log(1 - p) the same way from 1 - p, which is exact for
 *     p >= 2^-30 (a float32 has 24 bits); where its k is 0 (p <= 0.2929) f2 = -p itself, so a p below
 *     2^-30 loses nothing either.  |s| <= 0.1716, the domain of xf_bin_atanh2 (to 2^-37.6 relative); k ln 2
 *     and 2 atanh(s) do not cancel (|2 atanh(s)| <= ln 2 / 2);
 *   - one division per element for both quotients and the gradient: inv = 1 / ((2 + f1)(2 + f2) p (1-p)),
 *     then s1 = f1 (2 + f2) (p (1 - p) inv), s2 likewise, and 1 / (p (1 - p)) = (2 + f1)(2 + f2) inv.  A
 *     forward call forms the same inv, so its losses have the fused call's bits;
 *   - loss = w [y (-log p) + (1 - y)(-log(1 - p))], two terms >= 0, no cancellation;
 *   - d/dp = s w (p - y) / (p (1 - p)) = s w [(1 - y)/(1 - p) - y/p]: p - y rounds once (exactly where
 *     the two nearly cancel, Sterbenz), so a soft target's gradient is relative to its own size, tighter
 *     than the bound's unit.  p = y gives +0, the exact value (the general form's two rounded terms may
 *     leave a residue of either sign there, within its bound).
 * Every quantity is a normal double (the least: p (1 - p) >= 2^-149, w p and the polynomial's powers of s2
 * ~ 2^-600 for p = 2^-149; the largest 2^120 / (p (1 - p)) <= 2^293), the multiply-adds stay in
 * xf_fma_emulated's exact domain (products 0 or >= 2^-600), so every path gives the same bits.  Errors:
 * the logs 2^-37.5 relative, the roundings around them ~2^-50; the loss < 2^-37 relative before its one
 * rounding to float32, the gradient < 2^-49 (<= 0.5 + 2^-13 ULP either).  The general form's bound holds
 * with room; the two forms differ by a float32 ULP where the exact value lies within ~2^-37 of a float32
 * rounding boundary.  Clip and clamp: eps mode takes p with eps <= p and eps <= 1 - p (the general form's
 * own test, so no log is clipped); the log clamp c takes p >= 2 clamp_lo and 1 - p >= 2 (1 - clamp_hi),
 * where both exact logs lie at least ln 2 above c and neither form clamps.  The CPU loops and the CUDA
 * twin pick the form per element and output (xf_bin_bce_prob_fast_ok, then xf_bin_bce_fast_grad_ok for
 * the upstream factor), as for BCE with logits. */
XF_HD int xf_bin_bce_prob_fast_mode_ok(double pr, const xf_bin_prob_mode *m)
{
    const int clipped = xf_bin_prob_lo_clip(pr, m) | xf_bin_prob_hi_clip(pr, m);
    const int clamped = m->clamp & ((pr < 2.0 * m->clamp_lo) | ((1.0 - pr) < 2.0 * (1.0 - m->clamp_hi)));
    return !(clipped | clamped);
}

XF_HD int xf_bin_bce_prob_fast_ok(double pr, double y, double w, const xf_bin_prob_mode *m, double loss_k)
{
    return (pr > 0.0) & (pr < 1.0) & xf_bin_bce_prob_fast_mode_ok(pr, m) &
           xf_bin_bce_fast_factors_ok(y, w, 1.0, loss_k);
}

typedef struct {
    double nlp, nl1p; /* -log p, -log(1 - p) */
    double rp;        /* 1 / (p (1 - p)) */
} xf_bin_prob_fast;

XF_HD xf_bin_prob_fast xf_bin_prob_fast_pieces(double pr)
{
    xf_bin_prob_fast r;
    const double omp = 1.0 - pr;
    const unsigned long long i1 = xf_log_shifted_bits(pr), i2 = xf_log_shifted_bits(omp);
    const double k1 = xf_log_k(i1), f1 = xf_log_f(i1);
    const double k2 = xf_log_k(i2);
    const double f2 = (k2 == 0.0) ? -pr : xf_log_f(i2);
    const double a1 = 2.0 + f1, a2 = 2.0 + f2;
    const double d = a1 * a2, pq = pr * omp;
    const double inv = 1.0 / (d * pq);
    const double r12 = pq * inv; /* 1 / ((2 + f1)(2 + f2)) */
    const double t1 = (2.0 * f1) * (a2 * r12), t2 = (2.0 * f2) * (a1 * r12);
    r.nlp = -(k1 * XF_MATH_LN2_HI + (xf_bin_atanh2(t1, t1) + k1 * XF_MATH_LN2_LO));
    r.nl1p = -(k2 * XF_MATH_LN2_HI + (xf_bin_atanh2(t2, t2) + k2 * XF_MATH_LN2_LO));
    r.rp = d * inv;
    return r;
}

XF_HD double xf_bin_bce_prob_fast_loss(xf_bin_prob_fast f, double y, double w)
{
    return w * (y * f.nlp + (1.0 - y) * f.nl1p);
}

XF_HD double xf_bin_bce_prob_fast_grad(xf_bin_prob_fast f, double pr, double y, double w, double s)
{
    const double d = pr - y;
    return (d == 0.0) ? 0.0 : ((s * w) * d) * f.rp;
}

/* ---- BCE from probabilities for float64 storage: double-double without the edge machinery ---------------
 * The float64 bound (4 ULP) needs more than plain double, but the general form's normalised products and
 * its two divisions per output exist for the edges of double's range only.  For 2^-400 <= p < 1 untouched
 * by the clip or the clamp (as the float32 form decides it), y = 0 or 2^-60 <= y <= 1, w in [2^-60, 2^60]
 * and no loss scaling, nothing under- or overflows, so:
 *   - -log p and -log(1 - p) = -log1p(-p) as double-doubles, the kernels' unrounded results
 *     (xf_bin_log_hilo, xf_log1p_hilo: within ~2^-55.5 relative; 1 - p's rounding is inside log1p's);
 *   - loss = w [y A + (1 - y) B]: 1 - y exact (Fast2Sum), each product with its error (a multiply-add),
 *     the two non-negative terms summed by TwoSum, w applied by one multiply-add: one rounding of a value
 *     within ~2^-55 relative, <= 0.5 + 0.2 ULP;
 *   - d/dp = s w (p - y) / (p (1 - p)): p - y and 1 - p exact (TwoSum), p (1 - p) as a double-double, the
 *     quotient from one division and its exact residual (a multiply-add) as a double-double to ~2^-100, s w
 *     with its error: one rounding, <= 0.5 ULP plus ~2^-50 (a soft target's gradient relative to its own
 *     size).  p = y gives +0.
 * The least magnitudes: p (1 - p)'s low part p (1 - p - fl(1 - p)) ~ p^2 >= 2^-800, the residuals and
 * low parts >= 2^-660, the log terms >= 2^-460, so every intermediate is normal and the multiply-adds stay
 * in xf_fma_emulated's exact domain (every path gives the same bits); the gradient's largest value is
 * 2^120 / (p (1 - p)) <= 2^573.  The CPU loops and the CUDA twin pick the form per element and output. */
#define XF_BIN_PROB_FAST64_MIN_P 0x1p-400

XF_HD int xf_bin_bce_prob_fast64_ok(double pr, double y, double w, const xf_bin_prob_mode *m, double loss_k)
{
    return (pr >= XF_BIN_PROB_FAST64_MIN_P) & (pr < 1.0) & xf_bin_bce_prob_fast_mode_ok(pr, m) &
           ((y == 0.0) | (y >= XF_BIN_FAST_LO)) & xf_bin_bce_fast_factors_ok(y, w, 1.0, loss_k);
}

typedef struct {
    double ah, al; /* -log p */
    double bh, bl; /* -log(1 - p) */
} xf_bin_prob_fast64;

XF_HD xf_bin_prob_fast64 xf_bin_prob_fast64_pieces(double pr)
{
    xf_bin_prob_fast64 r;
    double lo;
    r.ah = -xf_bin_log_hilo(pr, &lo);
    r.al = -lo;
    r.bh = -xf_log1p_hilo(-pr, &lo);
    r.bl = -lo;
    return r;
}

XF_HD double xf_bin_bce_prob_fast64_loss(xf_bin_prob_fast64 f, double y, double w)
{
    const double omy = 1.0 - y;
    const double omy_lo = (1.0 - omy) - y; /* Fast2Sum: 0 <= y <= 1 */
    const double p1 = y * f.ah;
    const double e1 = xf_fma(y, f.ah, -p1) + y * f.al;
    const double p2 = omy * f.bh;
    const double e2 = xf_fma(omy, f.bh, -p2) + (omy * f.bl + omy_lo * f.bh);
    double sh, se;
    xf_two_sum(p1, p2, &sh, &se);
    return xf_fma(w, sh, w * (se + (e1 + e2)));
}

/* (f unused: the float32 form's signature, which the CPU loops share) */
XF_HD double xf_bin_bce_prob_fast64_grad(xf_bin_prob_fast64 f, double pr, double y, double w, double s)
{
    (void)f;
    double nh, nl, oh, ol;
    xf_two_sum(pr, -y, &nh, &nl);
    xf_two_sum(1.0, -pr, &oh, &ol);
    const double dh = pr * oh;
    const double dl = xf_fma(pr, oh, -dh) + pr * ol;
    const double inv = 1.0 / dh;
    const double qh = nh * inv;
    /* (nh + nl) - qh (dh + dl), the first product's part exact */
    const double res = xf_fma(-qh, dh, nh) + (nl - qh * dl);
    const double ql = res * inv;
    const double kh = s * w;
    const double kl = xf_fma(s, w, -kh);
    const double g = xf_fma(kh, qh, kh * ql + kl * qh);
    return (nh == 0.0) ? 0.0 : g; /* (nh = 0 only where p = y exactly: TwoSum) */
}

/* One class term of CE from probabilities: w q (-log p_c) with the categorical clip of Keras (p clipped to
 * [eps, 1-eps]: log eps below, log1p(-eps) above) or none; 0 when w or q is 0. */
XF_HD double xf_bin_neg_log_prob_term(double pr, double w, double q, const xf_bin_prob_mode *m, double k)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double r = xf_bin_term(w, 1.0, 1.0, -lp, q, 0.0, k);
    return (pr != pr) ? pr : r;
}

/* d/dp_c of s w q (-log p_c) = -s w q / p_c (0 where clipped or w q = 0, -inf at p_c = 0 < q). */
XF_HD double xf_bin_neg_log_prob_grad(double pr, double w, double q, double s, const xf_bin_prob_mode *m)
{
    double lp, l1p;
    int dp, d1p;
    xf_bin_prob_logs(pr, m, &lp, &l1p, &dp, &d1p);
    double r = dp ? -xf_bin_mul_div(s, w, q, pr) : 0.0;
    return (pr != pr) ? pr : r;
}

/* CE from probabilities, rows whose loss is tiny.  Each term w_c t_c (-log p_c) is rounded onto the
 * double grid, so where every term lies below the normal range they were rounded on the subnormal grid
 * before the row's sum, half a step each: up to C/2 of the row loss's ULP (300 classes of mass 4.45e-311
 * on uniform probabilities: 10.2 ULP).  A row whose sum comes out below 2^-969 while some class has a mass
 * w_c t_c below 2^-969 (xf_bin_ce_tiny_mass; a larger one makes a normal term, since -log p_c >= 2^-53
 * where p_c < 1, and 0 at p_c = 1: rows of such terms, confident rows among them, have at most one that
 * is not normal) is summed again, in the same order, from its terms formed 2^1200 larger (the power of
 * two the terms already take, xf_bin_term's e0: exact until their one rounding, then as normal numbers)
 * and scaled back once.  The scaled sum is kept only where it is finite (terms of both signs that
 * cancel, negative target probabilities, can overflow there).  float64 rows only: a float32 row loss
 * rounds to float32, whose grain lies 2^925 above these errors.  As the softmax family (softmax_row.h). */
#define XF_BIN_TINY_LOSS 0x1p-969
#define XF_BIN_TINY_LIFT 1200.0

/* whether a class's mass w t is nonzero and below 2^-969 (the product may round to 0) */
XF_HD int xf_bin_ce_tiny_mass(double w, double t)
{
    return (w != 0.0) & (t != 0.0) & (xf_fabs(w * t) < XF_BIN_TINY_LOSS);
}

/* the row loss from the scaled sum (acc, err), or the first sum where that one is not finite */
XF_HD double xf_bin_ce_tiny_loss(double acc, double err, double first)
{
    double r = ((acc + err) * 0x1p-600) * 0x1p-600;
    return (r - r == 0.0) ? r : first;
}

#endif /* XENTFAST_BINARY_H */
