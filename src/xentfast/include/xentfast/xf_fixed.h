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
 *   rounding of y / ln 2): exp(-y) = 2^-n exp(r).  Then r = j/32 + r' with j = floor(32 r) <= 22 (r's top
 *   five fraction bits, so the split is exact) and 0 <= r' < 1/32: exp(r) = exp(j/32) exp(r'), exp(j/32)
 *   from a table (38 fraction limbs, truncated) and exp(r') a series of positive terms that shrink by
 *   2^-5 / k each: ~20 terms at G = 5 where r's own series took ~40 (a float64 cancelling row of 500
 *   classes 0.59 -> 0.33 ms).
 * Computing with only G = G_caller - q fraction limbs is what 2^-n leaves to be resolved, so tiny terms
 * cost little.  Error, in units of the caller's grain: r' is off by under 2 units of G (x's dropped bits,
 * n ln 2's truncation), which moves exp(r') by under 3; the series adds under G + 5 per term (each
 * step's own G + 3 units, plus the previous error times r' / k), at most 120 terms at G = 38 (5164
 * units); the table's truncation (1 unit, times exp(r') < 1.04) and the product's (G + 3) come on top of
 * twice that (exp(j/32) < 2), and the caller's shift drops 1 more: under 1.1 10^4 units in all, counted
 * as 2^15 by the caller. */
XF_HD int xf_fix_exp_neg(unsigned int *e, int G_caller, double y)
{
    static const unsigned int exp_j32[23][XF_FIX_MAXG] = {
        {
            0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
            0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
            0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
            0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
            0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
            0x00000000u, 0x00000000u, 0x00000000u,
        },
        {
            0x08205601u, 0x127ec98eu, 0x0bd083abu, 0xa80c97a6u, 0xaa501785u, 0x2446806bu, 0x13fdf317u,
            0xf61860ecu, 0xb8ee41e5u, 0xf3d34399u, 0x56fcd31cu, 0x6db4bddau, 0xc01ff520u, 0xb1919ebcu,
            0x2b43604bu, 0xf4bc0986u, 0x923bc2f0u, 0x26617796u, 0x3b4c222bu, 0x1aa15e7au, 0x75d07e41u,
            0x21019f0bu, 0x5fce75bau, 0x06ba86d3u, 0xd2afa9e2u, 0xa10c9428u, 0xba46cebfu, 0x3c107df4u,
            0x45cd49e9u, 0x4ed37bb0u, 0xa369ddd1u, 0xe97e462au, 0x58df2dadu, 0x8488606cu, 0xf3f49412u,
            0x4d11dacfu, 0xa4b3115du, 0x86d538c5u,
        },
        {
            0x1082b577u, 0xd34ed7d5u, 0xb1a019e2u, 0x25c9a951u, 0xba295575u, 0x87c246f8u, 0xc497d80du,
            0xde7f9e47u, 0xa5e9dc38u, 0x4baf5430u, 0xade65eeau, 0x82195eeau, 0x89436861u, 0x8a85086du,
            0x29a799edu, 0x87d8eee2u, 0xf4775a43u, 0x86c7d351u, 0xf06014e7u, 0x87199b24u, 0x0555e89eu,
            0x24e732d5u, 0xf20f4630u, 0xac07bc35u, 0x7f280f7eu, 0xe67e14c2u, 0xd2f37471u, 0x697fc757u,
            0xbc1fa981u, 0xa47aa45du, 0x0d1c2f7du, 0x1ebf15c5u, 0xb53b3ec3u, 0xa5009808u, 0x6c803f5au,
            0xf5d7d816u, 0x67456358u, 0x149ff5a8u,
        },
        {
            0x19293707u, 0x4e0cd689u, 0x3d18cdbau, 0x80eabc29u, 0xe7b47b51u, 0xd4d864e8u, 0x084c3a11u,
            0xea07b0edu, 0xefb4ead8u, 0x5c3bfa2eu, 0x4f7a44bfu, 0x94ef2124u, 0xe7cf55c3u, 0x47c90b9au,
            0xe9cbf48cu, 0xea987271u, 0xe92f2041u, 0xb5322ac1u, 0xfd46bd94u, 0x7fd2e011u, 0x516a6578u,
            0xdd41586bu, 0x31d141c5u, 0x5705d0f0u, 0x05e95931u, 0x8261bdd5u, 0x74bd26b3u, 0xcf44df24u,
            0x4f7e26cau, 0x849e4d1bu, 0x9730f8a7u, 0x8fa9b205u, 0xc676f4cau, 0x0e4b10d8u, 0x4dee880au,
            0x6ba47c09u, 0x50728cdbu, 0x0743f7a1u,
        },
        {
            0x2216045bu, 0x6f5ccf9cu, 0xed688384u, 0xe06b8d42u, 0x78bf0c84u, 0xa957057du, 0x776b61e5u,
            0x02312cd9u, 0x78770074u, 0x7515eb76u, 0x9de32288u, 0x59c3c304u, 0x2f00e5d3u, 0xde7c4732u,
            0x14b09fc6u, 0x256b5cc2u, 0xe75c80d8u, 0x2b64f9bau, 0x7ae47b6fu, 0xf11cacc5u, 0xd4df3a42u,
            0xa6b11619u, 0xc1f94eb8u, 0x87a7c9e9u, 0x50f707e4u, 0xff1a9cd1u, 0x376e113au, 0x9255d1d9u,
            0xce4bcb9fu, 0xf2838850u, 0xd7220521u, 0xf946fdecu, 0xc9fb7ddcu, 0xd07b0188u, 0xd6dbc1a1u,
            0x7f0373c3u, 0x80659ff2u, 0x1178e052u,
        },
        {
            0x2b4b58b3u, 0x72c79501u, 0x3767c0c5u, 0x9d7d934au, 0x6542ec44u, 0x61ea8a1du, 0xa474d7d9u,
            0x37972ef0u, 0xbda32c2eu, 0x1b745669u, 0xf5c5138eu, 0xbb7631a2u, 0x71f1b05bu, 0x09056f02u,
            0xea35253eu, 0x0caafc7fu, 0xfbcf1915u, 0xb889f169u, 0x7d4e2194u, 0x610594f9u, 0x694cdb77u,
            0x33d79213u, 0x17a4396fu, 0x0795e124u, 0x90d95692u, 0x39cf7798u, 0x0eb7b6a1u, 0x3503faaeu,
            0xe526fafbu, 0xdd587f2au, 0x8d5e1bbdu, 0x04ff1a0du, 0x0b63f297u, 0x9a86b24cu, 0x0066f1c8u,
            0x8f773f37u, 0x3c15b6ecu, 0x89107717u,
        },
        {
            0x34cb8170u, 0xb58352d4u, 0xe0c48cb7u, 0xc6649345u, 0x08e6b0a7u, 0x13048f18u, 0x461b695bu,
            0xe2e8d011u, 0x8e77200du, 0x60439f08u, 0x20dcaf6cu, 0x3efe2008u, 0x695116a6u, 0x49e348a5u,
            0x950b9e97u, 0x0fba68deu, 0x14dfc6d1u, 0xadcb30bbu, 0x97ca96e6u, 0xa7840598u, 0x60b88867u,
            0xaca92a82u, 0xa99bf688u, 0xf8793b62u, 0xa3f2a881u, 0xa3af7913u, 0x87d041eau, 0x758d595cu,
            0x8113b8deu, 0xb64399dbu, 0x14083290u, 0xa1da73a0u, 0xc6de2c4cu, 0xff5401abu, 0x4361f5ebu,
            0xa8e288a0u, 0x5af1eb0au, 0x1ce58203u,
        },
        {
            0x3e98deaau, 0x11dcbaa3u, 0x77bdc040u, 0xc05156d7u, 0x57760760u, 0x2144b394u, 0x479e48e9u,
            0x79df08c2u, 0x7b739bd5u, 0x34c03aa2u, 0x484e79ecu, 0x1d16d7bfu, 0x6ed57befu, 0xba92ea14u,
            0xd9f992cbu, 0x8336538fu, 0x49403757u, 0x4f3b0955u, 0xe81269c3u, 0xb8cb72f4u, 0xc0de8465u,
            0x68b79648u, 0x90c92805u, 0x93b0db48u, 0x33e6cc89u, 0x99508a20u, 0xa7bf70d2u, 0x4d9997dfu,
            0x7d646e53u, 0x520f9b14u, 0x2cf46c40u, 0x7c612cdeu, 0x6719e96eu, 0xaedcbc3cu, 0xd23cb03eu,
            0x3a4b9384u, 0xf78702d0u, 0xb2508219u,
        },
        {
            0x48b5e3c3u, 0xe8186676u, 0x7bc3b69bu, 0xaabe534eu, 0xc4388716u, 0x4bbe2b0au, 0x993e8cf1u,
            0x5a620bebu, 0xaf42e676u, 0x4e4dcdd2u, 0xea54de5eu, 0x35c4e753u, 0xd8b58040u, 0x4697c3bbu,
            0x339c5d65u, 0x4ee46c7eu, 0x42f37a3eu, 0x223b2cf8u, 0xdacb81bfu, 0xcd62df63u, 0x43288a00u,
            0x629b53feu, 0x076ef60au, 0x7ca5e954u, 0x2dbf7d31u, 0xaa420e53u, 0xf0d26714u, 0x91a1b4aeu,
            0x1c40de6au, 0x758c6d30u, 0xfcdc9047u, 0xe5c9d03fu, 0x1bdf9873u, 0x96367295u, 0xdd575671u,
            0xcab8ebdcu, 0xe6080559u, 0xa13e5d8fu,
        },
        {
            0x5325180cu, 0xfacf76cau, 0x2d982992u, 0x369fb64eu, 0xc646587du, 0x37f41422u, 0x6f50910fu,
            0xee39ea7eu, 0x8f104972u, 0xf6003fa6u, 0xd8c03ab5u, 0x2075422fu, 0x7c7bac50u, 0xa9db71cdu,
            0x24a5efb1u, 0x92f9da57u, 0x081390bau, 0xfd3ed751u, 0x766450a8u, 0xb3d5ea5au, 0xb0927993u,
            0x7005662cu, 0x1945467du, 0x3b2906ceu, 0xc9ca71aeu, 0x4cd064cbu, 0xf8d9b037u, 0xe488be18u,
            0x79cde96au, 0x71f47785u, 0x3ee2349fu, 0x979c7a5au, 0xe59dec05u, 0x0b5918c1u, 0xf8e540b2u,
            0xe8ce165fu, 0x99cf366au, 0xb5d7636au,
        },
        {
            0x5de91760u, 0x45ff53b5u, 0x13246531u, 0x754403c2u, 0x9db2c2f0u, 0x0cf3270bu, 0xe2032d5fu,
            0x422f830au, 0x6abeea8au, 0x026f5222u, 0xeeed016cu, 0x06418499u, 0xa7ee5c66u, 0x622fe6e3u,
            0xe2f87458u, 0x434546dbu, 0x0c012b56u, 0xf3529eb7u, 0x35cb2927u, 0x8743e146u, 0xab2d517du,
            0x1e19b1e6u, 0x53a171f4u, 0x85062695u, 0x3d5ebc80u, 0x5d1f0529u, 0x42feedfbu, 0x4ced0e65u,
            0xcebd5ee5u, 0xca0c6016u, 0x5fadd98fu, 0xb90af71du, 0xfc5303ccu, 0x6b93b4deu, 0x22652545u,
            0x14405e33u, 0x1892a0fcu, 0xe972e69fu,
        },
        {
            0x690492cbu, 0xf9432cfdu, 0xaf981052u, 0x37a74b30u, 0xb936a627u, 0x3bc12eedu, 0xb2cbd9aau,
            0xc7537b11u, 0xac71155eu, 0xa99b5e1eu, 0xb4301c9cu, 0xce450da6u, 0x14b0d671u, 0x59f31562u,
            0x7167e5bbu, 0x82f3baf3u, 0xfbef4d64u, 0x072b6e65u, 0x866e1f43u, 0x159dfe3cu, 0x0f840ed6u,
            0x51cb73bbu, 0xcc5a382fu, 0x62fcf0eau, 0x196bf3b3u, 0xa199447au, 0x128ffeb1u, 0x5aa12569u,
            0x0501a730u, 0x900d4037u, 0xa0894574u, 0x816b6b92u, 0x057492e6u, 0xa57dcf7au, 0x42d95a1bu,
            0xfe850d8bu, 0x2ed1fab7u, 0x29e4e98au,
        },
        {
            0x747a513du, 0xbef6a623u, 0x478b659bu, 0x092405c5u, 0x78fa421fu, 0x34b8db7du, 0xb86d76f0u,
            0x73a87a83u, 0xcc39d681u, 0xfb6bd4b2u, 0xf85abcc3u, 0x51bcd711u, 0x40ffaefcu, 0x0010b896u,
            0xb0201b30u, 0x527d4009u, 0xf8a10d8eu, 0xaf92a915u, 0x2b6e725du, 0xafd6f499u, 0x7481c6f5u,
            0xeaa67c8eu, 0xba336abeu, 0x9fde392eu, 0x0f63459au, 0xbdd78509u, 0xe396b042u, 0xd69e913eu,
            0xb37febedu, 0xe1d9e575u, 0x32568a6du, 0xc9e99ee0u, 0x9f29f5aeu, 0xeeecdd2fu, 0xd5def486u,
            0x016a2ef1u, 0xdbe1229eu, 0xf53431e7u,
        },
        {
            0x804d3034u, 0x7b545cbau, 0xcb9bb718u, 0x894bd9d4u, 0xcb5480a7u, 0xc268e809u, 0x219538cbu,
            0x53c419ccu, 0x9c585304u, 0x690255e3u, 0x45f4b7ebu, 0x9e4d68d1u, 0x25e4cbcbu, 0x0e230cb4u,
            0x4150262au, 0x338125ebu, 0xeb06ea13u, 0x1a1a489cu, 0x7d6d7ac8u, 0x59ca7148u, 0xc6bfafddu,
            0x950b4c50u, 0x2a16fb04u, 0xe7e07ad3u, 0x5aa4c76bu, 0xbc042428u, 0xcca6892cu, 0x03916787u,
            0x61153063u, 0xeb034edfu, 0x28d555e9u, 0xcf86f00eu, 0xba90b12du, 0x1c5dfc75u, 0x7b3f02c9u,
            0xe61f94efu, 0x135bf45du, 0xf9417fefu,
        },
        {
            0x8c802477u, 0xb000fdc2u, 0x4db40ed8u, 0x53110befu, 0x137e20cfu, 0x0aa4fdf2u, 0x760ec30au,
            0xed6184b8u, 0xad1d96ebu, 0x92c60014u, 0xe582ad08u, 0x07021ad3u, 0xb940f349u, 0x0fbca085u,
            0x3fc2c508u, 0x86f86706u, 0xc707934bu, 0x535e9e9au, 0x00b3df96u, 0x396d016eu, 0xa98a2d48u,
            0xb69acf75u, 0x5806759au, 0x4e65bf55u, 0x755bdf6fu, 0x4ae51961u, 0x44c0b0b0u, 0x70547876u,
            0x857c479du, 0x21015513u, 0x2e76341fu, 0x7ef8ddd1u, 0x065eb86cu, 0xf12d273eu, 0x258f25c2u,
            0x83f312aau, 0x51fcb396u, 0xbdcaabf7u,
        },
        {
            0x99163ad4u, 0xb1dcc137u, 0x18f70534u, 0xe8a0292eu, 0xa8221fb3u, 0x532d5373u, 0xcdff3a35u,
            0x52ba17fcu, 0x8d78130cu, 0x424979c3u, 0x26478aedu, 0x36767363u, 0x3f5b2627u, 0xe221e9d5u,
            0x140c9f9au, 0xb2cc429au, 0xe02ad08fu, 0xaefa7a45u, 0xe5dc7063u, 0xf8ab43b3u, 0xe9348747u,
            0xed04bf1bu, 0x780090b2u, 0x2c870682u, 0x71702756u, 0x6b7527abu, 0xd8428abcu, 0xf3879abfu,
            0x4ee91ba4u, 0x2841c106u, 0xa312f045u, 0x1b6c2f89u, 0xfb05f523u, 0xc1ced0a0u, 0xb212e610u,
            0x46509ad1u, 0xb4c66dcau, 0xc2abfac9u,
        },
        {
            0xa61298e1u, 0xe069bc97u, 0x2dfefab6u, 0xdf33f9b1u, 0xf651f16cu, 0x130b4759u, 0xc44bfc90u,
            0x6367f2ccu, 0x2ef57279u, 0xa9122e21u, 0x3e6edbf7u, 0x97159917u, 0x49ed598cu, 0xf661f23bu,
            0x5c337500u, 0x2b625e93u, 0xf40073aeu, 0xfde3db38u, 0x7cf93343u, 0x301d26f0u, 0x0db4f799u,
            0x33f2185bu, 0xd289d11du, 0x44fc7f4du, 0xa9564d60u, 0x110affd9u, 0x89d4a081u, 0xe0e7d2e6u,
            0x7093702bu, 0x425fbe4fu, 0x487f6b7du, 0x51ece743u, 0x90f3ee22u, 0x938221f1u, 0x37f7969fu,
            0x68a133f8u, 0xfcc575c6u, 0xca0de9f9u,
        },
        {
            0xb3787dc8u, 0x0f95ea2eu, 0xcce1d706u, 0x2a8356bfu, 0xec2b8d9bu, 0xce09fd4du, 0xc54e3089u,
            0xdbeb7e14u, 0x736b2368u, 0x27229db1u, 0x10f94f98u, 0x08f67de2u, 0x34109263u, 0x19fb11f6u,
            0x5faac69cu, 0xade6930du, 0x5c2d6db0u, 0x3bd07343u, 0xd84c8f4eu, 0xecc545eau, 0xd70bd5dfu,
            0x82a9c7b2u, 0x392e2000u, 0x23535103u, 0xa496a42eu, 0x1fbe7338u, 0x919e8377u, 0x4989d816u,
            0x38430aa9u, 0x28fc65e9u, 0x8d99eee9u, 0xee9f2e98u, 0x17e10c3fu, 0x33401db8u, 0xbb78e7c2u,
            0xd81abb6bu, 0xf576bb19u, 0x8a43ea03u,
        },
        {
            0xc14b4312u, 0x56446443u, 0x2aa513bau, 0x422005ebu, 0x74c2ffc3u, 0xe7e9ea8fu, 0x25454f5fu,
            0xc9691912u, 0x051407b3u, 0x7175e987u, 0xcce3dee1u, 0xc7a692f1u, 0x140b1e74u, 0xbc476263u,
            0x875b4c13u, 0x747816f6u, 0xd8b05b0fu, 0x3a6c846fu, 0x4a15dd6eu, 0x64ca5ea7u, 0x98336956u,
            0x69e69756u, 0xf5bbfcb0u, 0xd9482774u, 0x591929b2u, 0x62d2ebf1u, 0x16e51b6cu, 0xcef8cd35u,
            0xbc611d8fu, 0x5ada9800u, 0xdde519dbu, 0xfbd6b93fu, 0x70fab9deu, 0x43471cf0u, 0x6ac3efbfu,
            0xcabee439u, 0xb76ddf0fu, 0x51db3f2bu,
        },
        {
            0xcf8e5d84u, 0x758a8b7eu, 0xcd8e944du, 0xd9989764u, 0xb079a776u, 0xdecf1994u, 0xfe5ea39bu,
            0x9a63a5bau, 0x0d36432eu, 0xa25ca035u, 0x37fa2cd0u, 0x53c90c3bu, 0xab11cb34u, 0x0149ae49u,
            0x5464fa41u, 0xb6cb0accu, 0x3ffd85e9u, 0xe35dcc47u, 0xadc535edu, 0xfc1857fau, 0x43976f3du,
            0xe97fcc83u, 0x7468fcc8u, 0x4b0eb92fu, 0xd6e8f14eu, 0x3efb659cu, 0x51232aa1u, 0x324867aeu,
            0x34dafd78u, 0x6a563b66u, 0x11d9b22cu, 0x302479c1u, 0x674dd67fu, 0x1638cddau, 0xa7fbafd0u,
            0x5266211du, 0xc7b9853eu, 0x5655d4beu,
        },
        {
            0xde455df8u, 0x0e3c05cau, 0x897b072fu, 0x6daa5bc5u, 0x942e1ee8u, 0x0a070fe1u, 0x4280cff8u,
            0x5855265au, 0xa359ba5bu, 0x9fc3dff9u, 0xb06c7666u, 0x4e5cc3f9u, 0xd0165fbeu, 0x5ec14536u,
            0xcd45e84eu, 0xc590d44au, 0xac683f5bu, 0xf32de485u, 0xc9adb1ffu, 0x425071e6u, 0x0c7e38e1u,
            0xc62f94acu, 0x4b250475u, 0x6ce9925eu, 0x2103b07bu, 0xc552ae55u, 0x50c8b529u, 0xcdafcd9du,
            0x466c3071u, 0xad665102u, 0xfdb06c93u, 0x93016c33u, 0xa4cf5310u, 0x28717082u, 0xa48f0203u,
            0xec01fbbbu, 0x5aafc11bu, 0x3b100f62u,
        },
        {
            0xed73f240u, 0xdc141f87u, 0x57b1c4dfu, 0xfda4cc8au, 0xb8077eb0u, 0x6c809843u, 0xb12c18b9u,
            0xc06e40afu, 0x32ad41c6u, 0x156dca39u, 0x9635204eu, 0x38b37ce8u, 0x48c88260u, 0x538d1eacu,
            0x5068c617u, 0xb3af0e8au, 0x1733033eu, 0xde844e74u, 0x5fe0bf01u, 0x398ced58u, 0xc6643c58u,
            0x326c7fe5u, 0x1c17d50bu, 0x64ada555u, 0xa71200a7u, 0x981949d2u, 0x1ce40c99u, 0xf264ea4cu,
            0xaadf0b5fu, 0xef26ade8u, 0x1fe62927u, 0x34b4995cu, 0x5f99535au, 0xe78d9d7cu, 0xfcad141du,
            0x8bf1f433u, 0xbe1720f3u, 0x72300abau,
        },
        {
            0xfd1de618u, 0x2f8c89d2u, 0xc3b6d08cu, 0x65972242u, 0x24e114f5u, 0x5b04c763u, 0xa54143bau,
            0x8e9369fbu, 0x6d9a6bbbu, 0xc3cb9cccu, 0x39acb191u, 0x818fbdc7u, 0xe7f6c665u, 0x3b6deb40u,
            0xd526d239u, 0x1d1cff01u, 0x978f63b3u, 0x17a3123cu, 0x03af813au, 0x64107c9cu, 0x8ebe6d92u,
            0x9ad66664u, 0x4f784107u, 0x7403d222u, 0xd58d28adu, 0xab8c776cu, 0x0c265c70u, 0x4e271604u,
            0x89e1ebcau, 0x406cacd6u, 0x7c9378feu, 0x95e76052u, 0x7acc31d2u, 0xf38c6bddu, 0x66cc9d0fu,
            0xcf510cb9u, 0xbd11a5d5u, 0x080c0e64u,
        },
    }; /* exp(j/32) - 1 = sum_i exp_j32[j][i] 2^(-32 (i + 1)), truncated, j = 0 .. 22 */
    unsigned int r[XF_FIX_N], t[XF_FIX_N];
    double nd = (double)(long long)(y * XF_MATH_LOG2E + 0.001) + 1.0;
    unsigned int n = (unsigned int)nd, j;
    int q = (int)(n / 32u), G = G_caller - q, k;
    if (G < 1) {
        return -1;
    }
    xf_fix_n_ln2(r, G, n);
    xf_fix_from_double(t, G, y);
    xf_fix_sub(r, t, G);
    j = r[G - 1] >> 27;
    r[G - 1] &= 0x07ffffffu;
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
    /* e *= exp(j/32), its top G fraction limbs */
    for (k = 0; k < G; k++) {
        t[k] = exp_j32[j][G - 1 - k];
    }
    t[G] = 1u;
    xf_fix_mul_div(e, t, G, 1u);
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
