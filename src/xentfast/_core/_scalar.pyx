# Test-only wrappers: the scalar functions of xentfast/numerics.h, applied elementwise, so the tests can
# measure the header itself against mpmath (including every branch cutoff and its neighbours).
import numpy as np

cdef extern from "xentfast/numerics.h" nogil:
    double xf_exp(double x)
    double xf_exp_dd(double hi, double lo)
    double xf_exp_lite(double x)
    double xf_exp_lite_normal(double x)
    double xf_log(double x)
    double xf_log1p(double x)
    double xf_log1pexp(double x)
    double xf_sigmoid(double x)
    double xf_exp_shifted(double x, double m)
    double xf_neg_log_prob(double x, double m, double log_s)
    void xf_dd_exp(double hi, double lo, double *eh, double *el)
    double xf_fma_emulated(double a, double b, double c)

cdef extern from "xentfast/binary.h" nogil:
    double xf_bin_log1p_unit(double e)

cdef extern from "xentfast/softmax_row.h" nogil:
    double xf_lse_cancelling(const float *xf, const double *xd, long long C, int is_f32, double d_max)
    int xf_target_has_mass_from(int prob, double eps, double eps_per_class, int is_y, double w_y, double w_j,
                                double finite, double t_j)
    double xf_target_mass_min(double eps, double eps_per_class, double w_j, double finite, double t_j)

cdef extern from "xentfast/xf_fixed.h" nogil:
    enum: XF_FIX_MAXG
    int xf_fix_exp_neg(unsigned int *e, int G_caller, double y)

# The x86 status flag "denormal operand" (MXCSR bit 1, sticky; SSE and AVX arithmetic set it alike): a
# kernel that consumes a subnormal intermediate sets it, and each such operation is a microcode assist of
# ~100-150 cycles on x86.  The tests clear it, call a kernel on one thread (the calling one), and read it.
cdef extern from *:
    """
    #if defined(__x86_64__) || defined(__i386__)
    #include <xmmintrin.h>
    static int xf_test_has_mxcsr(void) { return 1; }
    static void xf_test_clear_fp_flags(void) { _mm_setcsr(_mm_getcsr() & ~0x3Fu); }
    static int xf_test_denormal_flag(void) { return (int)((_mm_getcsr() >> 1) & 1u); }
    #else
    static int xf_test_has_mxcsr(void) { return 0; }
    static void xf_test_clear_fp_flags(void) { }
    static int xf_test_denormal_flag(void) { return 0; }
    #endif
    """
    int xf_test_has_mxcsr()
    void xf_test_clear_fp_flags()
    int xf_test_denormal_flag()


def consumes_subnormals(fn, *args, **kwargs):
    """Whether fn(*args, **kwargs), run on this thread, fed a subnormal to a floating-point operation (the
    x86 denormal-operand flag); None where the CPU has no such flag."""
    if not xf_test_has_mxcsr():
        return None
    xf_test_clear_fp_flags()
    fn(*args, **kwargs)
    return bool(xf_test_denormal_flag())


ctypedef double (*unary_fn)(double) noexcept nogil
ctypedef double (*binary_fn)(double, double) noexcept nogil
ctypedef double (*ternary_fn)(double, double, double) noexcept nogil


cdef _apply1(unary_fn f, x):
    cdef const double[::1] xv = np.ascontiguousarray(x, dtype=np.float64).ravel()
    out = np.empty(xv.shape[0], dtype=np.float64)
    cdef double[::1] ov = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(xv.shape[0]):
            ov[i] = f(xv[i])
    return out.reshape(np.shape(x))


cdef _apply2(binary_fn f, a, b):
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    cdef const double[::1] av = np.ascontiguousarray(a).ravel()
    cdef const double[::1] bv = np.ascontiguousarray(b).ravel()
    out = np.empty(av.shape[0], dtype=np.float64)
    cdef double[::1] ov = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(av.shape[0]):
            ov[i] = f(av[i], bv[i])
    return out.reshape(a.shape)


cdef _apply3(ternary_fn f, a, b, c):
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, b, c)))
    cdef const double[::1] av = np.ascontiguousarray(a).ravel()
    cdef const double[::1] bv = np.ascontiguousarray(b).ravel()
    cdef const double[::1] cv = np.ascontiguousarray(c).ravel()
    out = np.empty(av.shape[0], dtype=np.float64)
    cdef double[::1] ov = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(av.shape[0]):
            ov[i] = f(av[i], bv[i], cv[i])
    return out.reshape(a.shape)


def fma_emulated(a, b, c):
    """a * b + c rounded once by the baseline path's emulation (the exponentials' xf_fma)."""
    return _apply3(xf_fma_emulated, a, b, c)


def exp(x):
    return _apply1(xf_exp, x)


def exp_lite(x):
    """exp to 2^-32 relative, for results rounded to float32 (the float32 kernels' exponential)."""
    return _apply1(xf_exp_lite, x)


def exp_lite_normal(x):
    """exp_lite for x in [-708, 0] without the clamp: the same bits there."""
    return _apply1(xf_exp_lite_normal, x)


def bin_log1p_unit(e):
    """log1p(e) for e in [2^-1000, 1] to 2^-37.6 relative (float32 BCE's plain-double form)."""
    return _apply1(xf_bin_log1p_unit, e)


def target_mass_tests(double eps, double eps_per_class, double w_j, double finite, double t_j):
    """(xf_target_has_mass_from for a probability target, xf_target_mass_min > 0): the short-row groups'
    double form of the mass test must agree with the int one everywhere."""
    return (bool(xf_target_has_mass_from(1, eps, eps_per_class, 0, 0.0, w_j, finite, t_j)),
            bool(xf_target_mass_min(eps, eps_per_class, w_j, finite, t_j) > 0.0))


def exp_dd(hi, lo):
    return _apply2(xf_exp_dd, hi, lo)


def log(x):
    return _apply1(xf_log, x)


def log1p(x):
    return _apply1(xf_log1p, x)


def log1pexp(x):
    return _apply1(xf_log1pexp, x)


def sigmoid(x):
    return _apply1(xf_sigmoid, x)


def exp_shifted(x, m):
    """exp(x - m) with the shift carried exactly (the float64 kernels' per-element exponential)."""
    return _apply2(xf_exp_shifted, x, m)


def neg_log_prob(x, m, log_s):
    """(m - x) + log_s, the kernels' -log p for a class other than the argmax."""
    x, m, log_s = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (x, m, log_s)))
    return np.array([xf_neg_log_prob(a, b, c) for a, b, c in zip(x.ravel(), m.ravel(), log_s.ravel())]
                    ).reshape(x.shape)


def dd_exp(double hi, double lo=0.0):
    """exp(hi + lo) as a double-double (hi, lo): the exact-logsumexp path's exponential."""
    cdef double eh, el
    xf_dd_exp(hi, lo, &eh, &el)
    return eh, el


def fix_exp_neg(double y, int G):
    """exp(-y) from the fixed-point exponential of the cancelling-row path at G fraction limbs, as
    (integer, exponent) with exp(-y) ~ integer * 2**exponent; (0, 0) where the term is dropped (under two
    units of 2**(-32 G))."""
    cdef unsigned int e[XF_FIX_MAXG + 1]
    cdef int n, k, Ge
    if not (1 <= G <= XF_FIX_MAXG):
        raise ValueError("G must be in [1, XF_FIX_MAXG]")
    n = xf_fix_exp_neg(e, G, y)
    if n < 0:
        return 0, 0
    # e holds exp(r) = exp(-y) 2^n with G - n // 32 fraction limbs (the caller shifts it by 2^-n)
    Ge = G - n // 32
    value = 0
    for k in range(Ge, -1, -1):
        value = (value << 32) | e[k]
    return value, -32 * Ge - n


def lse_cancelling(x, double d_max=float("inf")):
    """The exact logsumexp of one row (float32 or float64, as given) by the cancelling-row path, with the
    caller's bound d_max on |sum(exp(x)) - 1| (inf: none)."""
    cdef const float[::1] xf
    cdef const double[::1] xd
    x = np.ascontiguousarray(x)
    if x.dtype == np.float32:
        xf = x
        return xf_lse_cancelling(&xf[0], NULL, xf.shape[0], 1, d_max)
    xd = np.ascontiguousarray(x, dtype=np.float64)
    return xf_lse_cancelling(NULL, &xd[0], xd.shape[0], 0, d_max)
