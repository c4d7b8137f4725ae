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
 * n = round(x / ln 2), r = x - n ln 2 with ln 2 in three parts (n * LN2_A exact), then j = round(128 r)
 * and r' = r - j/128, exact (Sterbenz: r and j/128 lie within a factor 2 for j != 0), |r'| <= 2^-8 + tiny:
 *     exp(x) = 2^n exp(j/128) P(r'),   P = Taylor to r'^11 ((2^-8)^12 / 12! < 2^-124),
 * exp(j/128) from a table of double-doubles (each within 2^-106 relative).  P's terms from r'^6 on are
 * below 2^-57 of P, so they are summed in double (error under 2^-109); the rest, r'^5 / 5! down to 1, in
 * double-double.  Each inner Horner step's error is multiplied by |r'| on its way out, so only the last
 * steps and the table product count: measured under 2^-104 relative (tests/test_numerics.py asks
 * 2^-102), where the Taylor series of r to r^23 reached 2^-100.1 (lo's rounding, see below); six
 * double-double steps instead of 24: float32 cancelling rows, nearly all this step (xf_lse_step_dd),
 * 0.14 -> 0.05 ms per 500 classes. */
XF_HD void xf_dd_exp(double hi, double lo, double *eh, double *el)
{
    static const double exp_j128[91][2] = {
        {0x1.683cab7c5a6efp-1, 0x1.821d19f10764bp-56}, {0x1.6b0ff72deb89dp-1, -0x1.dabf5975c0c02p-57},
        {0x1.6de8ef213d71ep-1, 0x1.8b72d176bde7bp-57}, {0x1.70c79eba33c07p-1, -0x1.58b71227465a1p-55},
        {0x1.73ac117390acdp-1, 0x1.f8c1c6cf73277p-55}, {0x1.769652df22f7ep-1, 0x1.3445f7544e0efp-57},
        {0x1.79866ea5f432dp-1, 0x1.1339ca100a0a9p-56}, {0x1.7c7c70887763cp-1, -0x1.09aa682553231p-60},
        {0x1.7f78645eb8076p-1, 0x1.3572107f84e07p-55}, {0x1.827a561889716p-1, -0x1.6b2eab63020c1p-57},
        {0x1.858251bdb68b9p-1, -0x1.44395f562c66ep-55}, {0x1.8890636e31f54p-1, 0x1.d9c29d8d982edp-56},
        {0x1.8ba4976246834p-1, -0x1.aad7810320114p-55}, {0x1.8ebef9eac820bp-1, -0x1.797d4686c5393p-57},
        {0x1.91df97714512ep-1, -0x1.ea1cb9d163339p-55}, {0x1.95067c78379f2p-1, 0x1.f483a3e8cd60fp-55},
        {0x1.9833b59b38154p-1, 0x1.dffd920f493dbp-56}, {0x1.9b674f8f2f3d8p-1, -0x1.51bfdbb129094p-55},
        {0x1.9ea15722892c7p-1, 0x1.cd3e5225e2206p-55}, {0x1.a1e1d93d687d0p-1, 0x1.e3a6bdaece8f9p-58},
        {0x1.a528e2e1d9f0ap-1, -0x1.daf2ae0c2d3d4p-55}, {0x1.a876812c0877cp-1, -0x1.fd36226fadd44p-56},
        {0x1.abcac15271a2ap-1, 0x1.d887cd0341ab0p-56}, {0x1.af25b0a61a7b5p-1, -0x1.676a52a1a618bp-55},
        {0x1.b2875c92c4c99p-1, 0x1.9776b420ad283p-56}, {0x1.b5efd29f24c26p-1, 0x1.3d5fd7d70a5edp-56},
        {0x1.b95f206d17228p-1, 0x1.a94ad2c8fa0bfp-58}, {0x1.bcd553b9d7b62p-1, 0x1.6ad4c353465b0p-61},
        {0x1.c0527a5e384dep-1, -0x1.8bba170e59b65p-56}, {0x1.c3d6a24ed8222p-1, -0x1.e1e0a76cb0685p-55},
        {0x1.c761d99c5ba58p-1, 0x1.fe131f55e75f8p-55}, {0x1.caf42e73a4c7ep-1, -0x1.b5beee8bcee31p-55},
        {0x1.ce8daf1e0ba95p-1, -0x1.7fe9b02c25e9bp-56}, {0x1.d22e6a0197c03p-1, -0x1.32ae7bdaf1116p-55},
        {0x1.d5d66da13970fp-1, 0x1.a6cfe58cbd73bp-56}, {0x1.d985c89d041a3p-1, 0x1.8798de3138a56p-57},
        {0x1.dd3c89b26894ep-1, -0x1.589321a7ef10bp-60}, {0x1.e0fabfbc702a4p-1, -0x1.8d0e700fcfb65p-56},
        {0x1.e4c079b3f8000p-1, 0x1.473ef07d5dd3bp-55}, {0x1.e88dc6afecfc0p-1, -0x1.38e62149c16e2p-55},
        {0x1.ec62b5e5881fbp-1, -0x1.08bb6309bd394p-58}, {0x1.f03f56a88b5d8p-1, -0x1.bad3fd501a227p-55},
        {0x1.f423b86b7ee79p-1, 0x1.3d27ac39ed253p-57}, {0x1.f80feabfeefa5p-1, -0x1.b60bbd08aac55p-55},
        {0x1.fc03fd56aa225p-1, -0x1.a00d03b3359dep-59}, {0x1.0000000000000p+0, 0x0.0p+0},
        {0x1.0202015600446p+0, -0x1.3cf3671f50e32p-54}, {0x1.04080ab55de39p+0, 0x1.7ab864b3e9045p-56},
        {0x1.06122436410ddp+0, 0x1.4e5659d75e95bp-56}, {0x1.08205601127edp+0, -0x1.9c7d0bdf15160p-54},
        {0x1.0a32a84e9c1f6p+0, -0x1.fae8cf8c1a994p-54}, {0x1.0c49236829e8cp+0, -0x1.eb6980ce14da7p-55},
        {0x1.0e63cfa7ab09dp+0, 0x1.7324137d6c342p-56}, {0x1.1082b577d34edp+0, 0x1.f56c680678897p-54},
        {0x1.12a5dd543ccc5p+0, -0x1.1280f19dace1cp-55}, {0x1.14cd4fc989cd6p+0, 0x1.1557a8671b89ep-54},
        {0x1.16f9157587069p+0, 0x1.7923b72aa582dp-55}, {0x1.192937074e0cdp+0, 0x1.a24f46336ea04p-54},
        {0x1.1b5dbd3f68122p+0, 0x1.81f5c92a5200fp-55}, {0x1.1d96b0eff0e79p+0, 0x1.e8ac7a4d3206cp-55},
        {0x1.1fd41afcba45ep+0, 0x1.bb49242d10731p-54}, {0x1.2216045b6f5cdp+0, -0x1.8c4a5df1ec7e5p-58},
        {0x1.245c7613b8a9bp+0, -0x1.bd4b1c37ea8a2p-57}, {0x1.26a7793f60164p+0, 0x1.5aeb9860044d0p-55},
        {0x1.28f7170a755fdp+0, 0x1.d67b33fa73805p-54}, {0x1.2b4b58b372c79p+0, 0x1.404dd9f031676p-54},
        {0x1.2da4478b620c7p+0, 0x1.f5aa8ec61fc2dp-55}, {0x1.3001ecf601af7p+0, 0x1.7ab912c69ffebp-61},
        {0x1.32645269ea829p+0, -0x1.b3564bc0ec9cdp-58}, {0x1.34cb8170b5835p+0, 0x1.6a7062465be33p-55},
        {0x1.373783a722012p+0, 0x1.3d47396807206p-54}, {0x1.39a862bd3c106p+0, 0x1.7dd1a79cbd0fcp-54},
        {0x1.3c1e2876834aap+0, 0x1.fe918047a62b0p-54}, {0x1.3e98deaa11dccp+0, -0x1.5722108fefcffp-54},
        {0x1.41188f42c3e32p+0, 0x1.e17611afc42c5p-57}, {0x1.439d443f5f159p+0, -0x1.1c5b2e8735a43p-56},
        {0x1.462707b2bac21p+0, -0x1.25fe139c4cffdp-55}, {0x1.48b5e3c3e8186p+0, 0x1.9d9ef0eda6eabp-54},
        {0x1.4b49e2ae5ac67p+0, 0x1.1945ded6ed86dp-54}, {0x1.4de30ec211e60p+0, 0x1.3b5223eca1712p-56},
        {0x1.50817263c13cdp+0, -0x1.4582a5e2782cep-57}, {0x1.5325180cfacf7p+0, 0x1.b28b660a648dap-54},
        {0x1.55ce0a4c58c7cp+0, -0x1.3660f48a2d416p-54}, {0x1.587c53c5a7af0p+0, 0x1.3b0e93c017937p-55},
        {0x1.5b2fff3210fd9p+0, 0x1.5c7b814f80bacp-54}, {0x1.5de9176045ff5p+0, 0x1.da89923298baap-55},
        {0x1.60a7a734ab0e8p+0, 0x1.d5591f46f291bp-54}, {0x1.636bb9a983258p+0, 0x1.349cc31f7248dp-54},
        {0x1.663559cf1bc7cp+0, 0x1.68782fbafe59ep-54}, {0x1.690492cbf9433p+0, -0x1.812833f7d6e43p-55},
        {0x1.6bd96fdd034a2p+0, 0x1.fe7594e357317p-54},
    }; /* exp(j/128) for j = -45 .. 45 (|r| <= 0.3466 + rounding: |128 r| < 44.5) */
    static const double inv_fact[6][2] = {
        {1.0, 0.0}, {1.0, 0.0}, {0x1.0000000000000p-1, 0x0.0p+0}, {0x1.5555555555555p-3, 0x1.5555555555555p-57}, {0x1.5555555555555p-5, 0x1.5555555555555p-59}, {0x1.1111111111111p-7, 0x1.1111111111111p-63},
    }; /* 1/k! for k = 0 .. 5 */
    double t = hi * XF_MATH_LOG2E + XF_MATH_SHIFTER;
    double n = t - XF_MATH_SHIFTER;
    double rh, rl, ph, pl, e1, e2, e3, q, jd;
    int k;
    /* r = (hi - n A) + (lo - n B - n C); n A is exact (A has 32 bits), hi - n A exact (Sterbenz).  lo
     * (up to 2^-47 beside hi = -80) joins by TwoSum: added to the small error terms instead, its own
     * rounding would cost 2^-100 of the result */
    xf_two_prod(-n, 0x1.a39ef35793c76p-33, &ph, &pl);
    xf_two_sum(hi - n * 0x1.62e42feep-1, ph, &rh, &e1);
    xf_two_sum(rh, lo, &rh, &e3);
    e2 = (e1 + e3) + (pl - n * 0x1.cc01f97b57a08p-87);
    xf_two_sum(rh, e2, &rh, &rl);
    jd = (rh * 128.0 + XF_MATH_SHIFTER) - XF_MATH_SHIFTER;
    xf_two_sum(rh - jd * 0x1p-7, rl, &rh, &rl);
    /* r'^6/6! + ... + r'^11/11!, divided by r'^6, in double (rl's share there is under 2^-110) */
    q = 0x1.ae64567f544e4p-26;
    q = q * rh + 0x1.27e4fb7789f5cp-22;
    q = q * rh + 0x1.71de3a556c734p-19;
    q = q * rh + 0x1.a01a01a01a01ap-16;
    q = q * rh + 0x1.a01a01a01a01ap-13;
    q = q * rh + 0x1.6c16c16c16c17p-10;
    ph = q;
    pl = 0.0;
    for (k = 5; k >= 0; k--) { /* p = p * r' + 1/k! */
        xf_dd_mul(ph, pl, rh, rl, &ph, &pl);
        xf_dd_add(&ph, &pl, inv_fact[k][0], inv_fact[k][1]);
    }
    xf_dd_mul(ph, pl, exp_j128[(int)jd + 45][0], exp_j128[(int)jd + 45][1], &ph, &pl);
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

/* log p_j for float32 storage: plain double, (x_j - m) - log S.  x_j and m are floats, x_j <= m and
 * log S >= 0 (S >= 1, the max's own term), so both terms are <= 0 and the subtraction cannot cancel: the
 * double result is within 2^-52 relative (the two roundings) plus log S's own error (<= 1.5 ULP of log S,
 * at most as much relative to the result) of the exact value, and its one rounding to float gives
 * <= 0.5 + 2^-26 ULP.  x_j - m is exact in double unless the two
 * floats' exponents lie 29 or more apart; wherever it is exact this is xf_log_prob's value bit for bit
 * (its TwoSum error term is 0).  Elsewhere the two may round to neighbouring floats where the exact value
 * lies within ~2^-52 (relative) of a float rounding boundary.  -inf x_j gives -inf.  The TwoSum is
 * xf_log_prob's third of the element's work, which a float result has no use for (log_softmax 4096x1000
 * float32, one thread: ~20 % faster). */
XF_HD double xf_log_prob_single(double x, double m, double log_s)
{
    return (x - m) - log_s;
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
