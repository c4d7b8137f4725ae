/* xentfast/xf_fixed.h: multi-word fixed-point arithmetic, for the one result no double-double can reach:
 * logsumexp where max x and log S cancel completely (see xf_lse_cancelling in softmax_row.h).
 *
 * A number is an array a[0..G] of 32-bit limbs, value = sum_k a[k] 2^(32 (k - G)): a[G] is the integer
 * part, a[0] the lowest of G fraction limbs, so the grain is 2^-32G ("one unit" below).  Only
 * non-negative values, only what the sum of exponentials needs.  Integer arithmetic throughout (32 x 32
 * -> 64-bit products), so the results are the same bits on every CPU path and on the GPU.
 */
#ifndef XENTFAST_XF_FIXED_H
#define XENTFAST_XF_FIXED_H

#include "config.h"
#include "numerics.h"

/* Most fraction limbs any level uses (1216 bits: the float64 subnormal grain 2^-1074, the sum's
 * error growth and a margin), and the array length that holds them plus the integer limb. */
#define XF_FIX_MAXG 38
#define XF_FIX_N (XF_FIX_MAXG + 1)

XF_HD void xf_fix_zero(unsigned int *a, int G)
{
    int k;
    for (k = 0; k <= G; k++) {
        a[k] = 0u;
    }
}

XF_HD int xf_fix_is_zero(const unsigned int *a, int G)
{
    int k;
    for (k = 0; k <= G; k++) {
        if (a[k] != 0u) {
            return 0;
        }
    }
    return 1;
}

/* a = |x| for a finite double with |x| < 2^32; bits below the grain are dropped (error < 1 unit).
 * Every double is m 2^e with an integer m < 2^53, so this only places m's bits. */
XF_HD void xf_fix_from_double(unsigned int *a, int G, double x)
{
    unsigned long long b = xf_bits_from_double(x) & 0x7fffffffffffffffULL;
    int be = (int)(b >> 52);
    unsigned long long mant = b & 0x000fffffffffffffULL;
    int sh, q, r;
    xf_fix_zero(a, G);
    if (be == 0) {
        be = 1; /* subnormal: no hidden bit, same scale as the smallest normal binade */
    } else {
        mant |= 0x0010000000000000ULL;
    }
    sh = be - 1075 + 32 * G; /* bit position of mant's lowest bit, bit 0 being the grain */
    if (sh < 0) {
        if (sh <= -64) {
            return;
        }
        mant >>= -sh;
        sh = 0;
    }
    q = sh / 32;
    r = sh % 32;
    if (q <= G) {
        a[q] = (unsigned int)((mant << r) & 0xffffffffULL);
    }
    if (q + 1 <= G) {
        a[q + 1] = (unsigned int)(((r == 0) ? (mant >> 32) : (mant >> (32 - r))) & 0xffffffffULL);
    }
    if (q + 2 <= G && r != 0) {
        a[q + 2] = (unsigned int)(mant >> (64 - r));
    }
}

/* a = n ln 2 for 0 <= n < 2^20, from ln 2 to 41 limbs: one limb below the grain enters the carry, so
 * the error is under 1 unit (the constant's own truncation, n 2^-32(G+1), is far below that). */
XF_HD void xf_fix_n_ln2(unsigned int *a, int G, unsigned int n)
{
    static const unsigned int ln2[41] = {
        0xb17217f7u, 0xd1cf79abu, 0xc9e3b398u, 0x03f2f6afu, 0x40f34326u, 0x7298b62du, 0x8a0d175bu,
        0x8baafa2bu, 0xe7b87620u, 0x6debac98u, 0x559552fbu, 0x4afa1b10u, 0xed2eae35u, 0xc1382144u,
        0x27573b29u, 0x1169b825u, 0x3e96ca16u, 0x224ae8c5u, 0x1acbda11u, 0x317c387eu, 0xb9ea9bc3u,
        0xb136603bu, 0x256fa0ecu, 0x7657f74bu, 0x72ce87b1u, 0x9d6548cau, 0xf5dfa6bdu, 0x38303248u,
        0x655fa187u, 0x2f20e3a2u, 0xda2d97c5u, 0x0f3fd5c6u, 0x07f4ca11u, 0xfb5bfb90u, 0x610d30f8u,
        0x8fe551a2u, 0xee569d6du, 0xfc1efa15u, 0x7d2e23deu, 0x1400b396u, 0x17460775u,
    }; /* ln 2 = sum_i ln2[i] 2^(-32 (i + 1)), truncated */
    unsigned long long carry = ((unsigned long long)n * ln2[G]) >> 32;
    int k;
    for (k = 0; k < G; k++) {
        unsigned long long t = (unsigned long long)n * ln2[G - 1 - k] + carry;
        a[k] = (unsigned int)(t & 0xffffffffULL);
        carry = t >> 32;
    }
    a[G] = (unsigned int)carry;
}

/* a -= b, for a >= b */
XF_HD void xf_fix_sub(unsigned int *a, const unsigned int *b, int G)
{
    unsigned long long borrow = 0;
    int k;
    for (k = 0; k <= G; k++) {
        unsigned long long t = (unsigned long long)a[k] - b[k] - borrow;
        a[k] = (unsigned int)(t & 0xffffffffULL);
        borrow = (t >> 63) & 1ULL;
    }
}

/* a += b */
XF_HD void xf_fix_add(unsigned int *a, const unsigned int *b, int G)
{
    unsigned long long carry = 0;
    int k;
    for (k = 0; k <= G; k++) {
        unsigned long long t = (unsigned long long)a[k] + b[k] + carry;
        a[k] = (unsigned int)(t & 0xffffffffULL);
        carry = t >> 32;
    }
}

/* The high 64 bits of the 128-bit product a b. */
XF_HD unsigned long long xf_mul_hi_u64(unsigned long long a, unsigned long long b)
{
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
#else
    unsigned long long al = a & 0xffffffffULL, ah = a >> 32, bl = b & 0xffffffffULL, bh = b >> 32;
    unsigned long long mid = (al * bl >> 32) + (ah * bl & 0xffffffffULL) + (al * bh & 0xffffffffULL);
    return ah * bh + (ah * bl >> 32) + (al * bh >> 32) + (mid >> 32);
#endif
}

/* a = a * b / d (d < 2^31), the step of the Taylor series; the product < 2^32.  Only the product's
 * columns from G - 1 up are formed (the rest, under G units in all, only ever fed the dropped limbs),
 * and only a's limbs up to its highest non-zero one (the terms shrink, so the work does too); the
 * truncation and the division then cost under G + 3 units.
 * The limbs' quotients are the exact floor(cur / d), taken for d <= 2^16 as the high half of cur m with
 * m = floor((2^64 - 1) / d) + 1: m exceeds 2^64 / d by at most 1, so cur m / 2^64 exceeds cur / d by under
 * cur / 2^64, and cur < d 2^32 <= 2^64 / d keeps that below the 1 / d that separates cur / d from the next
 * integer (d = 1, whose m would be 2^64, copies).  One division per call instead of one per limb: a
 * float64 cancelling row of 500 classes 0.85 -> 0.62 ms, the same bits. */
XF_HD void xf_fix_mul_div(unsigned int *a, const unsigned int *b, int G, unsigned int d)
{
    unsigned int prod[2 * XF_FIX_N];
    int i, j, top = G;
    unsigned long long rem = 0;
    while (top > 0 && a[top] == 0u) {
        top--;
    }
    for (i = 0; i < 2 * G + 2; i++) {
        prod[i] = 0u;
    }
    for (i = 0; i <= top; i++) {
        unsigned long long carry = 0;
        j = (G - 1 - i > 0) ? G - 1 - i : 0;
        for (; j <= G; j++) {
            unsigned long long t = (unsigned long long)a[i] * b[j] + prod[i + j] + carry;
            prod[i + j] = (unsigned int)(t & 0xffffffffULL);
            carry = t >> 32;
        }
        prod[i + G + 1] = (unsigned int)carry;
    }
    if (d == 1u) {
        for (i = G; i >= 0; i--) {
            a[i] = prod[i + G];
        }
        return;
    }
    if (d <= 65536u) {
        /* d >= 2: m < 2^64 */
        const unsigned long long m = 0xffffffffffffffffULL / d + 1u;
        for (i = G; i >= 0; i--) {
            unsigned long long cur = (rem << 32) | prod[i + G];
            unsigned long long q = xf_mul_hi_u64(cur, m);
            a[i] = (unsigned int)q;
            rem = cur - q * d;
        }
        return;
    }
    for (i = G; i >= 0; i--) {
        unsigned long long cur = (rem << 32) | prod[i + G];
        a[i] = (unsigned int)(cur / d);
        rem = cur % d;
    }
}

/* exp(-y) 2^(32 q) for a double 0 <= y <= 32 G_caller ln 2 + 1, to G = G_caller - q fraction limbs,
 * where q = n / 32 for the n of the reduction below; returns n (the caller shifts by 2^-n, see
 * xf_fix_add_shifted), or -1 where G < 1: the term is then under 2 units of the caller's grain.
 *   y = n ln 2 - r with n = floor(y / ln 2 + 0.001) + 1, so 0 < r < 1.002 ln 2 (the 0.001 covers the
 *   rounding of y / ln 2): exp(-y) = 2^-n exp(r), and exp(r) is a series of positive terms.
 * Computing exp(r) with only G = G_caller - q fraction limbs is what 2^-n leaves to be resolved, so
 * tiny terms cost little.  Error, in units of the caller's grain: r is off by under 2 units of G (x's
 * dropped bits, n ln 2's truncation), which moves exp(r) by under 4; the series adds under G + 5 per term
 * (each step's own G + 3 units, plus the previous error times r / k), at most 230 terms at G = 38; the
 * caller's shift drops 1 more.  Under 10^4 units in all, counted as 2^15 by the caller. */
XF_HD int xf_fix_exp_neg(unsigned int *e, int G_caller, double y)
{
    unsigned int r[XF_FIX_N], t[XF_FIX_N];
    double nd = (double)(long long)(y * XF_MATH_LOG2E + 0.001) + 1.0;
    unsigned int n = (unsigned int)nd;
    int q = (int)(n / 32u), G = G_caller - q, k;
    if (G < 1) {
        return -1;
    }
    xf_fix_n_ln2(r, G, n);
    xf_fix_from_double(t, G, y);
    xf_fix_sub(r, t, G);
    xf_fix_zero(e, G);
    xf_fix_zero(t, G);
    e[G] = 1u;
    t[G] = 1u;
    for (k = 1; k < 400; k++) {
        xf_fix_mul_div(t, r, G, (unsigned int)k);
        if (xf_fix_is_zero(t, G)) {
            break;
        }
        xf_fix_add(e, t, G);
    }
    return (int)n;
}

/* acc (G fraction limbs) += e 2^-b, where e has G - q fraction limbs (xf_fix_exp_neg): the limbs line up
 * after the q whole-limb shift, so only b < 32 bits move; the bits shifted out are dropped (< 1 unit). */
XF_HD void xf_fix_add_shifted(unsigned int *acc, int G, const unsigned int *e, int Ge, int b)
{
    unsigned long long carry = 0;
    int k;
    for (k = 0; k <= G; k++) {
        unsigned long long v = 0;
        if (k <= Ge) {
            unsigned long long hi = (k + 1 <= Ge) ? (unsigned long long)e[k + 1] : 0ULL;
            v = (((hi << 32) | e[k]) >> b) & 0xffffffffULL;
        }
        unsigned long long t = (unsigned long long)acc[k] + v + carry;
        acc[k] = (unsigned int)(t & 0xffffffffULL);
        carry = t >> 32;
    }
}

/* 2^e for an integer e in [-1022, 1023] */
XF_HD double xf_fix_pow2(int e)
{
    return xf_double_from_bits((unsigned long long)(e + 1023) << 52);
}

/* |v - 1| as a double-double scaled by 2^600 (exact scaling, keeps values down to 2^-1216 normal), and
 * the sign of v - 1 (+1 or -1).  The top 128 bits are added in double-double: relative error ~2^-104. */
XF_HD int xf_fix_minus_one_dd(const unsigned int *v, int G, double *hi, double *lo)
{
    unsigned int a[XF_FIX_N];
    int k, top, sign = 1, i;
    for (k = 0; k <= G; k++) {
        a[k] = v[k];
    }
    if (a[G] >= 1u) {
        a[G] -= 1u;
    } else {
        /* 1 - v: the two's complement of the fraction (v < 1) */
        unsigned long long borrow = 0;
        for (k = 0; k < G; k++) {
            unsigned long long t = 0ULL - a[k] - borrow;
            a[k] = (unsigned int)(t & 0xffffffffULL);
            borrow = (t >> 63) & 1ULL;
        }
        a[G] = (unsigned int)(1ULL - borrow);
        sign = -1;
    }
    *hi = 0.0;
    *lo = 0.0;
    top = G;
    while (top > 0 && a[top] == 0u) {
        top--;
    }
    for (i = 0; i < 4 && top - i >= 0; i++) {
        k = top - i;
        xf_dd_add(hi, lo, (double)a[k] * xf_fix_pow2(32 * (k - G) + 600), 0.0);
    }
    return sign;
}

#endif /* XENTFAST_XF_FIXED_H */
