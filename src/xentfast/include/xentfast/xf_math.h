/* xentfast/xf_math.h: exp, exp of a double-double, log and log1p in double precision.
 *
 * Why our own: the CPU kernels and the CUDA kernels include this same header, so both sides evaluate the
 * same sequence of IEEE operations and agree bit for bit, whatever libm or libdevice would have done.
 *
 * Ground rules every function below keeps:
 *   - only +, -, *, /, bit manipulation and xf_fma below, which rounds a * b + c once on every path and
 *     device.  The error analysis assumes each other operation rounds on its own, so the kernels are
 *     built with -ffp-contract=off (nvcc: --fmad=false): the compiler never fuses on its own, only
 *     where the source says xf_fma.  A contracting build would still give accurate results, but not the
 *     same bits as a non-contracting one.
 *   - no branches on data: special inputs are patched in with selects at the end, so that gcc if-converts
 *     a `#pragma omp simd` loop over any of these into straight vector code (SSE2 and AVX2 alike) and so
 *     that GPU warps never diverge.
 *   - integer work is unsigned 64-bit add/and/shift only (no signed right shift, no int<->double
 *     conversion instruction), because those are what SSE2/AVX2 offer on 64-bit lanes.
 *
 * Accuracy figures quoted below were measured against mpmath at 200 bits; one ULP is the double spacing
 * at the exact result, 2^-1074 for results below the smallest normal.
 */
#ifndef XENTFAST_XF_MATH_H
#define XENTFAST_XF_MATH_H

#include "config.h"

/* ln 2 split so that the high part has 32 significant bits: k * XF_MATH_LN2_HI is exact for |k| < 2^21,
 * which keeps the first step of every range reduction below exact without a fused multiply-add. */
#define XF_MATH_LN2_HI 0x1.62e42feep-1
#define XF_MATH_LN2_LO 0x1.a39ef35793c76p-33
#define XF_MATH_LOG2E 0x1.71547652b82fep+0
/* Adding 1.5 * 2^52 to |v| < 2^51 rounds v to the nearest integer and leaves that integer, offset by
 * 0x4338000000000000, in the low bits of the sum's encoding. */
#define XF_MATH_SHIFTER 0x1.8p52
/* the exponentials' lower clamp: exp of anything below it is +0 (exp(-745.2) is under half the smallest
 * subnormal); callers that skip evaluating such arguments (softmax_row.h, binary.h) test against it */
#define XF_EXP_CLAMP_LO -745.2

/* a * b + c rounded once, emulated with the operations above (no fma instruction): Dekker's exact
 * product, TwoSum, and Boldo and Melquiond's rounding to odd ("Emulation of FMA and correctly rounded
 * sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008): with
 * a * b = uh + ul and c + uh = th + tl exactly, RN(th + RO(tl + ul)) = RN(a * b + c).  RO, rounding to
 * odd, is the sum rounded to nearest, moved one ulp towards the exact sum when it was inexact and landed
 * on an even significand (an integer step on the encoding; TwoSum gives the sign of the error).
 * Exact, the same bits as a hardware fma, for finite operands with |a|, |b| < 2^995 (the splits do not
 * overflow), |a * b| < 2^1022 and |a * b + c| far from overflow (zero results get the instruction's sign: +0
 * from a cancellation, -0 only for a * b = -0 and c = -0), and a * b either zero, at least 2^-969 in
 * magnitude (its error term ul is then not subnormal, so the product split is exact), or below 2^-60 |c|
 * (then RN(a * b + c) = c, and the emulation's th = c, tl = uh and the final sum c + tiny give c too,
 * whatever ul's rounding).  A NaN operand gives a NaN.  The exponentials, its only callers, stay inside that:
 * in the polynomials |a| <= 1, |b| < 1.01 and |c| >= 2^-26; in the range reductions n = 0 or |n| >= 1 times
 * fl(ln 2), and x log2(e), whose x is clamped to [-745.2, 709.8], next to c = 1.5 2^52.  About 35 operations
 * instead of 1; tests/test_numerics.py checks it bit for bit against the exact rational result. */
XF_HD double xf_fma_emulated(double a, double b, double c)
{
    double sa = a * 134217729.0;                    /* 2^27 + 1: Veltkamp's split into 26-bit halves */
    double ah = sa - (sa - a);
    double al = a - ah;
    double sb = b * 134217729.0;
    double bh = sb - (sb - b);
    double bl = b - bh;
    double uh = a * b;
    double ul = (((ah * bh - uh) + ah * bl) + al * bh) + al * bl;

    double th = c + uh;
    double tv = th - c;
    double tl = (c - (th - tv)) + (uh - tv);

    double v = tl + ul;
    double vv = v - tl;
    double v_err = (tl - (v - vv)) + (ul - vv);
    unsigned long long vbits = xf_bits_from_double(v);
    /* +1 on the encoding moves away from zero, all ones (-1) towards it; nothing when v is already odd */
    unsigned long long towards_err = (0ULL - ((vbits ^ xf_bits_from_double(v_err)) >> 63)) | 1ULL;
    unsigned long long odd_step = towards_err & ((vbits & 1ULL) - 1ULL);
    double v_odd = v_err != 0.0 ? xf_double_from_bits(vbits + odd_step) : v;
    /* v = 0 means the sum is th exactly; th itself then keeps the sign of a zero result (-0 for
     * -0 * b + -0, as the instruction gives), which th + 0 would turn into +0 */
    return v_odd == 0.0 ? th : th + v_odd;
}

/* XF_FMA_NATIVE: 1 where this unit is compiled for an fma instruction (CUDA devices, the AVX2+FMA path
 * of the CPU build, aarch64), 0 elsewhere (the baseline x86-64 path).  XF_FMA_EMULATE=1 forces 0
 * (tests/test_cuda.py: the PTX of such a build must hold no fma at all, which shows that --fmad=false
 * leaves no contraction of the compiler's own).  The extension modules report it per CPU path
 * (xentfast._core._xent.fma_instruction, show_config, tests/test_build.py). */
#if defined(XF_FMA_EMULATE) && XF_FMA_EMULATE
#define XF_FMA_NATIVE 0
#elif defined(__CUDA_ARCH__) || (defined(__GNUC__) && (defined(__FMA__) || defined(__ARM_FEATURE_FMA)))
#define XF_FMA_NATIVE 1
#else
#define XF_FMA_NATIVE 0
#endif

/* a * b + c rounded once: the instruction where XF_FMA_NATIVE, the exact emulation above elsewhere.
 * Every path therefore gives the same bits; only the speed differs. */
XF_HD double xf_fma(double a, double b, double c)
{
#if XF_FMA_NATIVE && defined(__CUDA_ARCH__)
    return __fma_rn(a, b, c);
#elif XF_FMA_NATIVE
    return __builtin_fma(a, b, c);
#else
    return xf_fma_emulated(a, b, c);
#endif
}

/* a * b + c where the product and the sum are both exact (the caller shows why): the fma instruction
 * where xf_fma has it (one operation instead of two), a multiply and an add elsewhere, with no emulation,
 * since the value is the same either way. */
XF_HD double xf_mul_add_exact(double a, double b, double c)
{
#if XF_FMA_NATIVE
    return xf_fma(a, b, c);
#else
    return a * b + c;
#endif
}

/* 2^k for an integer k in [-1022, 1023] carried as (k + offset) in the low 12 bits of `kbits`.  The left
 * shift throws away everything above those 12 bits, so callers can pass the raw encoding of a shifter
 * sum plus 1023 without first extracting a signed integer. */
XF_HD double xf_pow2_from_low_bits(unsigned long long kbits)
{
    return xf_double_from_bits(kbits << 52);
}

/* exp(hi + lo) with |lo| far below |hi|'s ulp scale; xf_exp and xf_exp_dd are thin wrappers.
 *
 * Method: exp(x) = 2^n * exp(r), n = nearest integer to x / ln 2, r = x - n ln2 in about [-0.347, 0.347].
 *   - Clamp to [-745.2, 709.8] first.  Beyond these the result is 0 or +inf anyway (exp(-745.2) is below
 *     half of 2^-1074, exp(709.8) is above DBL_MAX), and the clamp keeps n in [-1075, 1024] so the two
 *     scale factors below stay normal.  The comparisons are false for NaN, so NaN flows through to r.
 *     When hi was clamped (including +-inf) lo is dropped, as it may be inf or NaN itself.
 *   - n comes from x * log2(e) + 1.5 * 2^52 rounded once (xf_fma): any integer next to x / ln 2 serves.
 *   - r is kept as r + dr: x - n * XF_MATH_LN2_HI is exact (the product has at most 43 bits, the
 *     difference is exact by Sterbenz; one instruction where there is an fma), the remaining
 *     lo - n * XF_MATH_LN2_LO is tiny, and their rounded sum loses at most half an ulp of r, which dr
 *     recovers (Fast2Sum).  lo - n * XF_MATH_LN2_LO stays a product and a difference, rounded twice:
 *     callers that pass lo = fl(k * XF_MATH_LN2_LO) for exp(k ln 2) (the binary family's 2^600 scale,
 *     binary.h) get exactly 0 there, hence exactly 2^k, which a once-rounded fma would not give.
 *   - exp(r + dr) = (1 + r) + (r^2 P(r) + dr + r dr), with 1 + r also split exactly.  The only rounding
 *     that is not a small fraction of an ulp is then the final addition, which keeps normal results
 *     near 0.6 ULP instead of the ~1 ULP of the plain Horner form.  P(r) = 1/2 + r Q(r), Q of degree 8
 *     (exp to r^11): the minimax of the relative error of exp on |r| <= 0.34675 with the r^2 coefficient
 *     held at 1/2 (Remez on |r|^3 e^-r (Q - (e^r - 1 - r - r^2/2) / r^3)), 5.4e-18 = 2^-57.4, 5.5e-18
 *     with the coefficients rounded to double, under 0.05 ULP.  The Taylor series it replaces needed
 *     exp to r^13, two more multiply-adds, for the same level (5.3e-18 with rounded coefficients).
 *   - 2^n is applied as 2^n1 * 2^(n - n1), n1 = round(n / 2): both factors are normal for every
 *     n in [-1075, 1024], so results near DBL_MAX are not lost to an overflowing 2^1024, and a subnormal
 *     result is produced by the last multiplication (gradual underflow, no flush).  That result is
 *     rounded twice, to 53 bits and then to the subnormal grid, hence up to 0.75 subnormal ULP there.
 * NaN propagates through r; the scale factors may be garbage for it but NaN times anything is NaN. */
/* The in-range part of xf_exp_kernel_hilo: exp(xc + lo) = 2^n * y for |xc| within the clamp, returning
 * y (in about [0.7, 1.42]) and the shifter sum t, whose low encoding bits hold n (see XF_MATH_SHIFTER).
 * *y_lo gets the final addition's rounding error, unscaled. */
XF_HD double xf_exp_reduced(double xc, double lo, double *t_out, double *y_lo)
{
    double t = xf_fma(xc, XF_MATH_LOG2E, XF_MATH_SHIFTER);
    double nd = t - XF_MATH_SHIFTER;
    double rhi = xf_mul_add_exact(-nd, XF_MATH_LN2_HI, xc);
    double rlo = lo - nd * XF_MATH_LN2_LO;
    double r = rhi + rlo;
    double dr = (rhi - r) + rlo;

    double p = 0x1.ad1fda2d9c327p-26;          /* ~1/11! ... ~1/3!: minimax, see above */
    p = xf_fma(p, r, 0x1.289fb22b1776cp-22);
    p = xf_fma(p, r, 0x1.71df55b42ab1bp-19);
    p = xf_fma(p, r, 0x1.a019ab08c59fep-16);
    p = xf_fma(p, r, 0x1.a01a011bd183cp-13);
    p = xf_fma(p, r, 0x1.6c16c17ccdbbcp-10);
    p = xf_fma(p, r, 0x1.11111111289b1p-7);
    p = xf_fma(p, r, 0x1.55555555531e9p-5);
    p = xf_fma(p, r, 0x1.5555555555501p-3);
    p = xf_fma(p, r, 0.5);
    p = p * (r * r);

    double s = 1.0 + r;
    double e = (1.0 - s) + r;
    double corr = e + ((dr + r * dr) + p);
    double y = s + corr;
    *t_out = t;
    *y_lo = (s - y) + corr;
    return y;
}

/* y * 2^n applied as 2^n1 * 2^(n - n1), n1 = round(n / 2), for the t of a clamped argument (see
 * xf_exp_kernel_hilo); both factors are normal for every n in [-1075, 1024]. */
XF_HD double xf_exp_scale_split(double y, double t)
{
    double nd = t - XF_MATH_SHIFTER;
    unsigned long long tb = xf_bits_from_double(t);
    unsigned long long t1b = xf_bits_from_double(nd * 0.5 + XF_MATH_SHIFTER);
    double sc1 = xf_pow2_from_low_bits(t1b + 1023ULL);
    double sc2 = xf_pow2_from_low_bits(tb - t1b + 1023ULL);
    return y * sc1 * sc2;
}

/* y * 2^n for y in about [0.7, 1.42] (xf_exp_reduced, xf_exp_lite_reduced) where the product is a normal
 * number (n >= -1021): n added to y's exponent field, which is that exact product, as is every product
 * of xf_exp_scale_split there, so the two forms give the same bits wherever this one applies.  t's
 * encoding is 0x4338000000000000 + n, whose low 12 bits are n's (the constant's are zero), and a 52-bit
 * left shift keeps only those: t << 52 is n << 52 modulo 2^64, negative n included.  An integer shift
 * and add instead of building 2^n and multiplying: one floating-point operation fewer per exponential. */
XF_HD double xf_exp_scale_normal(double y, double t)
{
    return xf_double_from_bits(xf_bits_from_double(y) + (xf_bits_from_double(t) << 52));
}

XF_HD double xf_exp_kernel_hilo(double hi, double lo, double *out_lo)
{
    double xc = hi > 709.8 ? 709.8 : hi;
    xc = xc < XF_EXP_CLAMP_LO ? XF_EXP_CLAMP_LO : xc;
    lo = xc == hi ? lo : 0.0;
    double t, y_lo;
    double y = xf_exp_reduced(xc, lo, &t, &y_lo);
    /* the final addition's rounding error, for callers that need the result as a double-double (focal
     * loss); everyone else passes a dummy and the compiler drops it */
    *out_lo = xf_exp_scale_split(y_lo, t);
    return xf_exp_scale_split(y, t);
}

/* xf_exp_dd(hi, lo) for finite hi in [-708, 0]: no clamp, the scale as one exponent-field addition, the
 * same bits (xf_exp_scale_normal).  The softmax sum pass uses it on rows whose whole spread lies in that range,
 * which is every row of ordinary logits. */
XF_HD double xf_exp_dd_normal(double hi, double lo)
{
    double t, y_lo;
    double y = xf_exp_reduced(hi, lo, &t, &y_lo);
    return xf_exp_scale_normal(y, t);
}

XF_HD double xf_exp_kernel(double hi, double lo)
{
    double unused;
    return xf_exp_kernel_hilo(hi, lo, &unused);
}

/* exp(x), full range with gradual underflow; exp(-inf) = +0, exp(+inf) = +inf, exp(NaN) = NaN.
 * Method and cutoffs: see xf_exp_kernel.
 * Accuracy: measured max error 0.75 ULP over 1106344 samples against mpmath (the maximum is on
 * subnormal results; 0.62 ULP on normal results). */
XF_HD double xf_exp(double x)
{
    return xf_exp_kernel(x, 0.0);
}

/* exp(x) to 2^-32 relative, for results that are rounded to float32 afterwards (1/256 of a float32 ULP):
 * a one-constant range reduction (below), then p(r) = 1 + c1 r + ... + c7 r^7,
 * the minimax polynomial of the relative error |p(r) / e^r - 1| on |r| <= ln2/2 with c0 = 1 (Remez,
 * equioscillating at 2.311e-10 = 2^-32.01; one degree below the Taylor polynomial of the same error,
 * 0.347^9/9! = 2.7e-10).  About half the operations of xf_exp.  Same special values and gradual
 * underflow as xf_exp (the scale steps are shared).
 * The polynomial is evaluated by Horner's scheme: 7 multiply-adds (xf_fma), two operations and four
 * live registers fewer than Estrin's (pairs, then r^2 and r^4), whose shorter chain (3 dependent
 * multiply-adds) paid while an element's whole evaluation was one long chain (BCE).  The hot callers
 * now make their exponentials in flat loops of their own (the softmax sum pass, BCE's chunks in
 * binary_blocks.h), where independent elements overlap their chains and the count of operations and
 * spilled registers is what limits (benchmarks/README.md, 2026-12-02); the rest (recomputed gradients,
 * per-element GPU threads) evaluate few exponentials per row or hide the chain behind other work.  The reduction's error (below 2^-43, see there) and the
 * roundings of the evaluation (near 2^-52) stay far below the approximation error; tests/test_numerics.py
 * measures the whole function against mpmath. */
#define XF_EXP_LITE_LN2 0x1.62e42fefa39efp-1
#define XF_EXP_LITE_C7 0x1.6c765cf9d9be1p-13
#define XF_EXP_LITE_C6 0x1.6d74ba9382160p-10
#define XF_EXP_LITE_C5 0x1.113d1193c984fp-7
#define XF_EXP_LITE_C4 0x1.5554ad7083de4p-5
#define XF_EXP_LITE_C3 0x1.55552b0d18cf0p-3
#define XF_EXP_LITE_C2 0x1.00000028345f3p-1
#define XF_EXP_LITE_C1 0x1.000000142e536p+0
XF_HD double xf_exp_lite_reduced(double xc, double *t_out)
{
    double t = xf_fma(xc, XF_MATH_LOG2E, XF_MATH_SHIFTER);
    double nd = t - XF_MATH_SHIFTER;
    /* one constant, one rounding (xf_fma): r = x - n fl(ln2) is off by |n| |fl(ln2) - ln2| <= 1075 2^-54
     * plus half an ulp of r, below 2^-43 for |x| <= 745, which is exp's relative error: far below the
     * polynomial's 2^-32 (the two-constant reduction and Fast2Sum of xf_exp cost five more operations) */
    double r = xf_fma(-nd, XF_EXP_LITE_LN2, xc);
    double p = xf_fma(r, XF_EXP_LITE_C7, XF_EXP_LITE_C6);
    p = xf_fma(r, p, XF_EXP_LITE_C5);
    p = xf_fma(r, p, XF_EXP_LITE_C4);
    p = xf_fma(r, p, XF_EXP_LITE_C3);
    p = xf_fma(r, p, XF_EXP_LITE_C2);
    p = xf_fma(r, p, XF_EXP_LITE_C1);
    *t_out = t;
    return xf_fma(r, p, 1.0);
}

XF_HD double xf_exp_lite(double x)
{
    double xc = x > 709.8 ? 709.8 : x;
    xc = xc < XF_EXP_CLAMP_LO ? XF_EXP_CLAMP_LO : xc;
    double t;
    double y = xf_exp_lite_reduced(xc, &t);
    return xf_exp_scale_split(y, t);
}

/* xf_exp_lite(x) for finite x in [-708, 0], the same bits without the clamp and with the scale as one
 * exponent-field addition (see xf_exp_dd_normal): about 40 % fewer operations. */
XF_HD double xf_exp_lite_normal(double x)
{
    double t;
    double y = xf_exp_lite_reduced(x, &t);
    return xf_exp_scale_normal(y, t);
}

#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
/* xf_exp_lite_normal of eight lanes, for the CPU's AVX-512 kernels, the same operations in the same order
 * but the scale: vscalefpd multiplies y by 2^nd exactly where the product is a normal number, which is
 * where xf_exp_scale_normal applies, so the bits are the same.  It is one instruction where the
 * exponent-field addition is two (a shift and an add), and gcc does not vectorize scalbn or ldexp:
 * written here with intrinsics, one operation fewer of about fifteen per eight exponentials on the two
 * ports that execute 512-bit arithmetic (float32 forward 5-8 % faster: benchmarks/README.md,
 * 2026-12-05, eighth round).  tests/test_dispatch.py compares this path with the others bit for bit. */
static inline __attribute__((always_inline)) __m512d xf_exp_lite_normal_pd512(__m512d x)
{
    const __m512d shifter = _mm512_set1_pd(XF_MATH_SHIFTER);
    __m512d t = _mm512_fmadd_pd(x, _mm512_set1_pd(XF_MATH_LOG2E), shifter);
    __m512d nd = _mm512_sub_pd(t, shifter);
    /* -(nd ln2) + x rounded once: xf_fma(-nd, ln2, x) */
    __m512d r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(XF_EXP_LITE_LN2), x);
    __m512d p = _mm512_fmadd_pd(r, _mm512_set1_pd(XF_EXP_LITE_C7), _mm512_set1_pd(XF_EXP_LITE_C6));
    p = _mm512_fmadd_pd(r, p, _mm512_set1_pd(XF_EXP_LITE_C5));
    p = _mm512_fmadd_pd(r, p, _mm512_set1_pd(XF_EXP_LITE_C4));
    p = _mm512_fmadd_pd(r, p, _mm512_set1_pd(XF_EXP_LITE_C3));
    p = _mm512_fmadd_pd(r, p, _mm512_set1_pd(XF_EXP_LITE_C2));
    p = _mm512_fmadd_pd(r, p, _mm512_set1_pd(XF_EXP_LITE_C1));
    __m512d y = _mm512_fmadd_pd(r, p, _mm512_set1_pd(1.0));
    return _mm512_scalef_pd(y, nd);
}
#endif

/* exp(hi + lo) for a double-double argument, |lo| <= ulp(hi)/2 (lo = 0 allowed).  lo enters the reduced
 * argument after the exact part of the reduction, where it is no longer swamped by hi, so the result is
 * as accurate as exp of the exact sum.  Special values follow hi; lo is ignored when hi is +-inf, NaN or
 * outside the clamp range.  Cutoffs: see xf_exp_kernel.
 * Accuracy: measured max error 0.76 ULP over 1250000 samples against mpmath (the maximum is on
 * subnormal results; 0.62 ULP on normal results). */
XF_HD double xf_exp_dd(double hi, double lo)
{
    return xf_exp_kernel(hi, lo);
}

/* Range reduction for log: xn = 2^k * m with m in [sqrt(2)/2, sqrt(2)), for positive normal finite xn.
 * Adding 0x95f62 << 32 to the encoding moves inputs whose mantissa is >= sqrt(2) into the next binade;
 * afterwards the exponent field holds k + 1023 and the mantissa field, re-biased by sqrt(2)/2's high
 * word, gives m.  k becomes a double through the 2^52 magic constant instead of a conversion
 * instruction, which SSE2/AVX2 lack for 64-bit integers.  Centring m on 1 keeps |f| = |m - 1| <= 0.2929
 * and makes f exact. */
XF_HD unsigned long long xf_log_shifted_bits(double xn)
{
    return xf_bits_from_double(xn) + 0x00095f6200000000ULL;
}

XF_HD double xf_log_k(unsigned long long ix)
{
    return xf_double_from_bits(0x4330000000000000ULL | (ix >> 52)) - (0x1p52 + 1023.0);
}

XF_HD double xf_log_f(unsigned long long ix)
{
    return xf_double_from_bits((ix & 0x000fffffffffffffULL) + 0x3fe6a09e00000000ULL) - 1.0;
}

/* k ln2 + log(1 + f) + c, for the k and f of the reduction above and a correction c much smaller than
 * the result.
 * Method: log(1 + f) = 2 atanh(s), s = f / (2 + f), written as f - f^2/2 + s (f^2/2 + R(s^2)), with R
 * the classic 7-term minimax odd series (fdlibm's Lg1..Lg7, error below 2^-58.45 on this range).
 * Rounding budget: the three large terms k ln2_hi, f and f^2/2 are summed without error (f^2/2 split by hand:
 * cheaper than xf_fma's emulation on the baseline path), everything else is at most a quarter of the result
 * and is added first as one small correction, so only the very last addition rounds at the result's own
 * scale. Without that split the f^2/2 rounding alone costs up to 0.3 ULP near |f| = 0.4. */
XF_HD double xf_log_kernel_hilo(double dk, double f, double c, double *out_lo)
{
    /* f^2/2 = hh + hl with hh exact: fh keeps 26 significant bits of f, so fh * fh needs at most 52. */
    double fh = xf_double_from_bits(xf_bits_from_double(f) & 0xfffffffff8000000ULL);
    double fl = f - fh;
    double hh = 0.5 * (fh * fh);
    double hl = 0.5 * (fl * (f + fh));
    double hfsq = hh + hl;

    double s = f / (2.0 + f);
    double z = s * s;
    double w = z * z;
    double t1 = w * (0x1.999999997fa04p-2 + w * (0x1.c71c51d8e78afp-3 + w * 0x1.39a09d078c69fp-3));
    double t2 = z * (0x1.5555555555593p-1 + w * (0x1.2492494229359p-2
                + w * (0x1.7466496cb03dep-3 + w * 0x1.2f112df3e5244p-3)));
    double R = t2 + t1;
    double small = (s * (hfsq + R) - hl) + (dk * XF_MATH_LN2_LO + c);

    /* k ln2_hi + f - hh carried exactly as v2 + e2 + e1 (two Fast2Sums: |f| >= f^2/2, and
     * |k ln2_hi| >= 0.69 > |f - hh| unless k = 0), so that only the final addition rounds at the
     * result's scale. */
    double v1 = f - hh;
    double e1 = (f - v1) - hh;
    double a = dk * XF_MATH_LN2_HI;
    double v2 = a + v1;
    double e2 = v1 - (v2 - a);
    double cc = e2 + (e1 + small);
    double hi = v2 + cc;
    /* hi is the rounded result; *out_lo its error (TwoSum), for double-double callers (focal loss) */
    double b_virtual = hi - v2;
    *out_lo = (v2 - (hi - b_virtual)) + (cc - b_virtual);
    return hi;
}

XF_HD double xf_log_kernel(double dk, double f, double c)
{
    double unused;
    return xf_log_kernel_hilo(dk, f, c, &unused);
}

/* log(x) for every double: log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, log(NaN) = NaN.
 * Subnormal inputs are scaled by 2^54 first (selected, not branched) so the kernel only sees normal
 * numbers; the cutoff is the smallest normal, 2^-1022, because only below it does the exponent field
 * stop describing the magnitude.  Method: see xf_log_kernel.
 * Accuracy: measured max error 0.63 ULP over 1030015 samples against mpmath. */
XF_HD double xf_log(double x)
{
    int sub = x < 0x1p-1022;
    unsigned long long ix = xf_log_shifted_bits(sub ? x * 0x1p54 : x);
    double r = xf_log_kernel(xf_log_k(ix) - (sub ? 54.0 : 0.0), xf_log_f(ix), 0.0);
    r = x == XF_INF ? x : r;
    r = x == 0.0 ? -XF_INF : r;
    r = x < 0.0 ? XF_NAN : r;
    r = x != x ? x : r;
    return r;
}

/* log(1 + x): log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(+inf) = +inf, NaN -> NaN, -0 -> -0.
 * Identity: with u = fl(1 + x) and d = (1 + x) - u, log(1 + x) = log(u) + log(1 + d/u) = log(u) + d/u to
 * far below an ulp.  For -1 < x < 2^53, u - 1 is exact and so is x - (u - 1) = d (Sterbenz in both
 * steps); above 2^53 d may come out wrong but d/u < 2^-52 is then negligible against log(u) > 36.
 * d/u is handed to the log kernel as its small correction, so it is added before the large terms.
 * When u reduces with k = 0 (x in about [-0.29, 0.41]) the kernel gets f = x itself instead: 1 + x is
 * then exactly 1 + f, and the rounding of d/u, which would be comparable to the result's ulp when x is
 * small, is avoided altogether.
 * For |x| < 2^-54 the answer is x itself: x^2/2 is below 2^-55 |x|, under a quarter ulp; the select
 * exists to keep the sign of -0, which the kernel's sums would turn into +0.
 * Accuracy: measured max error 0.63 ULP over 1022022 samples against mpmath.
 * xf_log1p_hilo also returns the kernel's unrounded remainder: hi + lo is within ~2^-57 of log1p(x),
 * the minimax series' 2^-58.45 and the roundings inside the correction term (a quarter of the result
 * at most), for callers that carry the result as a double-double (the z-loss's logsumexp). */
XF_HD double xf_log1p_hilo(double x, double *out_lo)
{
    double u = 1.0 + x;
    double d = x - (u - 1.0);
    unsigned long long ix = xf_log_shifted_bits(u);
    double dk = xf_log_k(ix);
    int k0 = dk == 0.0;
    int tiny = xf_fabs(x) < 0x1p-54;
    /* a tiny x's kernel result is replaced below, so the kernel is given 0 instead: its powers of x
     * (x^4 from |x| ~ 2^-256 on) would be subnormal, each a microcode assist on x86 (a softmax row's
     * log S with all other classes ~185 below the max cost ~0.3 ns per class more).  The selects on
     * `tiny` are masks, not conditionals: with conditionals gcc threads the paths, drops the zero (its
     * result is replaced) and evaluates the kernel on x after all, once vectorized */
    const unsigned long long keep = (unsigned long long)tiny - 1ULL; /* all ones unless tiny */
    const double f0 = xf_double_from_bits(xf_bits_from_double(x) & keep);
    double lo;
    double r = xf_log_kernel_hilo(dk, k0 ? f0 : xf_log_f(ix), k0 ? 0.0 : d / u, &lo);
    r = xf_double_from_bits((xf_bits_from_double(r) & keep) | (xf_bits_from_double(x) & ~keep));
    /* log1p(x) = x - x^2/2 + ...: the next term is below 2^-108 x; x^2/2 itself, below 2^-500 x from
     * |x| = 2^-500 on, is left out there (subnormal from 2^-511) */
    double xs = (xf_fabs(x) < 0x1p-500) ? 0.0 : x;
    lo = xf_double_from_bits((xf_bits_from_double(lo) & keep) | (xf_bits_from_double(-0.5 * (xs * xs)) & ~keep));
    int special = (x == XF_INF) | (x <= -1.0) | (x != x);
    r = x == XF_INF ? x : r;
    r = x == -1.0 ? -XF_INF : r;
    r = x < -1.0 ? XF_NAN : r;
    r = x != x ? x : r;
    *out_lo = special ? 0.0 : lo;
    return r;
}

XF_HD double xf_log1p(double x)
{
    double unused;
    return xf_log1p_hilo(x, &unused);
}

#endif /* XENTFAST_XF_MATH_H */
