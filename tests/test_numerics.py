"""The shared numerics header, measured directly against mpmath (through the test-only wrapper).

Every branch cutoff is checked at the cutoff and at its floating-point neighbours, never by eye.
"""
import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from xentfast._core import _scalar
from xentfast.testing import assert_ulp_close

DPS = 60
F64 = dict(allow_nan=False, width=64)


def exact(fn, *cols):
    with mpmath.workdps(DPS):
        return np.array([fn(*(mpmath.mpf(float(v)) for v in vals)) for vals in zip(*cols)], dtype=object)


def mp_log1pexp(x):
    return mpmath.log1p(mpmath.exp(x))


def mp_sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


def neighbours(*points):
    out = []
    with np.errstate(over="ignore"):  # the neighbour above DBL_MAX is inf, which is wanted
        for p in points:
            out += [np.nextafter(p, -np.inf), p, np.nextafter(p, np.inf)]
    return np.array(out)


# bounds in ULP: what the README's table promises for the header's building blocks
CASES = {
    "exp": (_scalar.exp, mpmath.exp, 1.0),
    "log": (_scalar.log, mpmath.log, 1.0),
    "log1p": (_scalar.log1p, mpmath.log1p, 1.0),
    "log1pexp": (_scalar.log1pexp, mp_log1pexp, 2.0),
    "sigmoid": (_scalar.sigmoid, mp_sigmoid, 2.0),
}

EDGES = {
    "exp": neighbours(0.0, 1.0, -1.0, 709.78, 709.8, -708.4, -745.13, -745.2, 0.5 * np.log(2), -0.5 * np.log(2)),
    "log": neighbours(1.0, np.sqrt(2) / 2, np.sqrt(2), 2.2250738585072014e-308, 5e-324 * 3, 1.7976931348623157e308),
    "log1p": neighbours(0.0, -0.5, 1e-300, -1e-300, 2.0 ** -54, 1.0, np.sqrt(2) - 1, 1e300),
    # the cutoffs of the Maechler ladder (numerics.h) and where the pieces change character
    "log1pexp": neighbours(-37.0, 18.0, 33.3, 0.0, -745.0, 709.0, 800.0, -800.0),
    "sigmoid": neighbours(0.0, 36.0, -36.0, 745.0, -745.0, 709.0, -709.0, 1e-300, -1e-300),
}


@pytest.mark.parametrize("name", list(CASES))
def test_edges(name):
    fn, ref, bound = CASES[name]
    x = EDGES[name]
    assert_ulp_close(fn(x), exact(ref, x), bound, dtype=np.float64, inputs={"x": x})


@pytest.mark.parametrize("name", ["log1pexp", "sigmoid"])
def test_cutoffs_monotone(name):
    # both functions increase; a branch switch that jumps the wrong way shows up between neighbours
    fn = CASES[name][0]
    x = EDGES[name]
    order = np.argsort(x, kind="stable")
    y = fn(x[order])
    assert np.all(np.diff(y) >= 0)


@given(st.floats(min_value=-745.5, max_value=710.0, **F64))
@example(-0.0)
@example(5e-324)
def test_exp(x):
    fn, ref, bound = CASES["exp"]
    assert_ulp_close(fn(np.array([x])), exact(ref, [x]), bound, dtype=np.float64)


# xf_exp_lite: the minimax polynomial's equioscillation level (xf_math.h), plus the one-constant reduction's
# 2^-53 |x| (below 2^-43 on its range) and the evaluation's roundings
EXP_LITE_REL = 2.3111e-10 + 2.0**-43


def _exp_lite_rel_err(x):
    got = _scalar.exp_lite(x)
    ref = exact(mpmath.exp, x)
    return np.array([abs(mpmath.mpf(float(g)) / r - 1) for g, r in zip(got, ref)], dtype=float)


def _fma_exact(a, b, c):
    """a * b + c rounded once to double (int / int true division rounds correctly); a zero result gets
    IEEE's sign: that of (a * b) + c for zero product and zero c (the product's sign is exact), else +0."""
    from fractions import Fraction
    out = [float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)]
    return np.array([(x * y) + z if x * y == 0.0 and z == 0.0 else v for x, y, z, v in zip(a, b, c, out)])


def _signed_pow2_spread(rng, n, lo, hi):
    return rng.choice([-1.0, 1.0], n) * rng.uniform(1, 2, n) * 2.0 ** rng.integers(lo, hi + 1, n)


def test_fma_emulation_is_the_correctly_rounded_fma_where_the_exponentials_use_it():
    # the domain of xf_math.h's polynomials: |a|, |b| <= 1 with any exponent down to far below 2^-969
    # (tiny r), |c| >= 2^-26; the baseline path's bits equal the fma instruction's only if this holds
    rng = np.random.default_rng(20261201)
    n = 20000
    a = _signed_pow2_spread(rng, n, -40, -1)
    b = _signed_pow2_spread(rng, n, -1100, -2)
    b[: n // 2] = _signed_pow2_spread(rng, n // 2, -60, -2)      # half of them at ordinary sizes of r
    c = _signed_pow2_spread(rng, n, -26, -1)
    # and the zeros of the range reductions: n = +-0 times a constant plus a +-0 or tiny argument, and
    # exact cancellations (x = n fl(ln2) for n a power of two)
    z = np.array([0.0, -0.0])
    za, zb, zc = (v.ravel() for v in np.meshgrid(z, [0.5, -0.5, 0.0, -0.0], [0.0, -0.0, 1e-300, -1e-320]))
    ln2 = float.fromhex("0x1.62e42fefa39efp-1")
    pw = 2.0 ** np.arange(-3, 11)
    a = np.concatenate([a, za, -pw, pw])
    b = np.concatenate([b, zb, np.full(2 * pw.size, ln2)])
    c = np.concatenate([c, zc, pw * ln2, -pw * ln2])
    got = _scalar.fma_emulated(a, b, c)
    want = _fma_exact(a, b, c)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    assert np.signbit(want).any() and (want == 0).sum() > 2 * pw.size  # the zeros are there, of both signs


def test_fma_emulation_rounds_near_midpoints_correctly():
    # a * b = 2^e (1 - u^2) with u = m 2^-40, and c with ulp(c) = 2^(e+1): a * b + c lies just inside a
    # midpoint between two doubles, where the double-double th + (tl + ul) rounded to nearest twice
    # falls on the tie and rounds to even, right or wrong; only the round-to-odd step gets them all
    rng = np.random.default_rng(7)
    n = 4000
    u = rng.integers(1, 2**12, n) * 2.0**-40
    e = rng.integers(-80, -30, n)
    sign_ab, sign_c = rng.choice([-1.0, 1.0], (2, n))
    a = 1.0 + u
    b = sign_ab * (1.0 - u) * 2.0**e
    c = sign_c * np.ldexp(rng.uniform(1, 2, n), e + 53)
    want = _fma_exact(a, b, c)
    assert np.array_equal(_scalar.fma_emulated(a, b, c), want)
    # the test has teeth: the plain double-double sum, rounded to nearest twice, misses some of them
    uh = a * b
    ah, bh = [v * 134217729.0 - (v * 134217729.0 - v) for v in (a, b)]
    ul = (((ah * bh - uh) + ah * (b - bh)) + (a - ah) * bh) + (a - ah) * (b - bh)
    th = c + uh
    tv = th - c
    tl = (c - (th - tv)) + (uh - tv)
    assert np.count_nonzero(th + (tl + ul) != want) > n // 10


def test_exp_lite_meets_its_bound_at_the_extrema_of_the_reduced_argument():
    # the error of p(r) / e^r peaks at the ends of |r| <= ln2/2 and at interior extrema: sample r densely
    # in every binade the kernels use, so that each extremum of the equioscillation is hit closely
    r = np.linspace(-0.5 * np.log(2), 0.5 * np.log(2), 4001)
    x = np.concatenate([r + k * np.log(2) for k in (-1000, -300, -20, -1, 0, 1, 20, 300, 1000)])
    x = x[(x > -708.0) & (x < 709.0)]
    err = _exp_lite_rel_err(x)
    assert err.max() <= EXP_LITE_REL, err.max()
    # and the bound is not slack by orders of magnitude: the polynomial really is one degree lower
    assert err.max() >= 0.5 * EXP_LITE_REL


@given(st.floats(min_value=-708.0, max_value=709.0, **F64))
@example(0.0)
@example(-0.0)
def test_exp_lite(x):
    assert _exp_lite_rel_err(np.array([x]))[0] <= EXP_LITE_REL


@given(st.floats(min_value=-745.5, max_value=710.0, **F64))
@example(-745.2)
@example(-708.5)
@example(709.8)
def test_exp_lite_range_edges_follow_exp(x):
    # subnormal results, overflow and zero come from the scale steps it shares with xf_exp
    got, ref = _scalar.exp_lite(np.array([x]))[0], _scalar.exp(np.array([x]))[0]
    if ref == 0.0 or np.isinf(ref):
        assert got == ref
    elif ref < 2.0**-1022:
        # the final scaling rounds once (half a subnormal ULP), xf_exp is within 0.75 of one
        assert abs(got - ref) <= 2 * 2.0**-1074 + ref * EXP_LITE_REL
    else:
        assert abs(got / ref - 1) <= EXP_LITE_REL + 2.0**-52


@given(st.floats(min_value=-708.0, max_value=0.0, **F64))
def test_exp_lite_normal_is_exp_lite_bit_for_bit(x):
    assert _scalar.exp_lite_normal(np.array([x])).tobytes() == _scalar.exp_lite(np.array([x])).tobytes()


# xf_bin_log1p_unit (binary.h): the minimax polynomial's equioscillation level in w = (2s)^2 plus the
# evaluation's roundings (~2^-51)
BIN_LOG1P_UNIT_REL = 4.7609e-12 + 2.0**-50


def _bin_log1p_unit_rel_err(e):
    got = _scalar.bin_log1p_unit(e)
    ref = exact(mpmath.log1p, e)
    return np.array([abs(mpmath.mpf(float(g)) / r - 1) for g, r in zip(got, ref)], dtype=float)


def test_bin_log1p_unit_meets_its_bound_on_both_branches():
    # the polynomial's error peaks at interior extrema of w in [0, 0.1178] and at its end, which both
    # branches reach (e = sqrt 2 - 1 from either side); sample each densely, and the branch cutoff's
    # floating-point neighbours
    cut = np.sqrt(2.0) - 1.0
    e = np.concatenate([np.linspace(2.0**-20, 1.0, 6001), np.exp2(np.linspace(-1000, -20, 500)),
                        cut + np.arange(-8, 9) * np.spacing(cut), [1.0, np.nextafter(1.0, 0.0)]])
    err = _bin_log1p_unit_rel_err(e)
    assert err.max() <= BIN_LOG1P_UNIT_REL, err.max()
    # and the bound is the polynomial's, not slack: a degree lower reaches 2^-30.2, a degree higher 2^-44.9
    assert err.max() >= 0.8 * BIN_LOG1P_UNIT_REL


@given(st.floats(min_value=2.0**-1000, max_value=1.0, **F64))
@example(1.0)
@example(2.0**-1000)
def test_bin_log1p_unit(e):
    assert _bin_log1p_unit_rel_err(np.array([e]))[0] <= BIN_LOG1P_UNIT_REL


@given(st.floats(min_value=0.0, max_value=1.7976931348623157e308, exclude_min=True, **F64))
def test_log(x):
    fn, ref, bound = CASES["log"]
    assert_ulp_close(fn(np.array([x])), exact(ref, [x]), bound, dtype=np.float64)


@given(st.one_of(st.floats(min_value=-1.0, max_value=1e300, exclude_min=True, **F64),
                 st.floats(min_value=-1e-6, max_value=1e-6, **F64)))
def test_log1p(x):
    fn, ref, bound = CASES["log1p"]
    assert_ulp_close(fn(np.array([x])), exact(ref, [x]), bound, dtype=np.float64)


@given(st.floats(min_value=-800.0, max_value=800.0, **F64))
def test_log1pexp(x):
    fn, ref, bound = CASES["log1pexp"]
    assert_ulp_close(fn(np.array([x])), exact(ref, [x]), bound, dtype=np.float64)


@given(st.floats(min_value=-800.0, max_value=800.0, **F64))
def test_sigmoid(x):
    fn, ref, bound = CASES["sigmoid"]
    assert_ulp_close(fn(np.array([x])), exact(ref, [x]), bound, dtype=np.float64)


@given(st.floats(min_value=-1e300, max_value=1e300, **F64), st.floats(min_value=-1e300, max_value=1e300, **F64))
@example(-700.0, 1e-300)
@example(1e-20, 740.0)
def test_exp_shifted_carries_the_shift(x, m):
    # exp(x - m) with x - m not representable: the kernels' float64 path must still be within 1 ULP
    if x > m:
        x, m = m, x
    with mpmath.workdps(DPS):
        want = mpmath.exp(mpmath.mpf(x) - mpmath.mpf(m))
    assert_ulp_close(_scalar.exp_shifted(x, m), np.array(want, dtype=object), 1.0, dtype=np.float64,
                     inputs={"x": np.array(x), "m": np.array(m)})


def test_special_values():
    inf, nan = np.inf, np.nan
    assert np.array_equal(_scalar.exp(np.array([-inf, inf, -1e4, 1e4])), [0.0, inf, 0.0, inf])
    assert np.isnan(_scalar.exp(np.array([nan]))).all()
    assert np.array_equal(_scalar.log(np.array([0.0, -0.0, inf])), [-inf, -inf, inf])
    assert np.isnan(_scalar.log(np.array([-1.0, -inf, nan]))).all()
    assert np.array_equal(_scalar.log1p(np.array([-1.0, inf, 0.0])), [-inf, inf, 0.0])
    assert np.signbit(_scalar.log1p(np.array([-0.0])))[0]
    assert np.isnan(_scalar.log1p(np.array([-1.5, nan]))).all()
    assert np.array_equal(_scalar.log1pexp(np.array([-inf, inf])), [0.0, inf])
    assert np.array_equal(_scalar.sigmoid(np.array([-inf, inf, 0.0, -0.0])), [0.0, 1.0, 0.5, 0.5])
    assert _scalar.exp_shifted(-inf, 3.0) == 0.0


@given(st.floats(min_value=-80.0, max_value=12.0, **F64), st.floats(-0.5, 0.5))
@example(0.0, 0.0)
@example(-80.0, 0.5)
@example(-80.0, -0.5)
@example(-0.5 * np.log(2), 0.0)
@example(45.5 / 128, 0.0)
@example(-44.5 / 128, 0.0)
def test_dd_exp_is_double_double_accurate(x, lo_ulps):
    # the exact-logsumexp path counts 2^-100 relative per exponential (xf_lse_step_dd), far beyond a
    # double's 2^-53; the table form measures under 2^-104 (2^-102 asked, for the analysis's margin).  The
    # low part, up to half an ulp of x (a double-double argument), must not cost its own rounding.
    lo = lo_ulps * float(np.spacing(x))
    eh, el = _scalar.dd_exp(x, lo)
    with mpmath.workdps(DPS):
        exact = mpmath.exp(mpmath.mpf(x) + mpmath.mpf(lo))
        rel = abs((mpmath.mpf(eh) + mpmath.mpf(el)) - exact) / exact
    assert rel < mpmath.mpf(2) ** -102, (x, lo, float(rel))


@pytest.mark.parametrize("G", [1, 5, 15, 38])
@given(st.data())
@example(data=None)
def test_fixed_point_exponential_within_its_error_bound(G, data):
    # the cancelling-row path's stopping rule counts each exponential of its G-limb steps as within
    # 2^15 units of 2^(-32 G) (xf_fix_exp_neg's analysis says under 1.1e4): exp(-y) = 2^-n exp(j/32) exp(r')
    # with a table of exp(j/32), so a wrong table entry or a wrong split of r shows here
    ymax = 32 * G * np.log(2.0) + 1.0
    if data is None:
        ys = [0.0, ymax, np.log(2.0), 22.5 / 32, 23 / 32 - 1e-15, 1.0 / 32, 5e-324]
    else:
        ys = [data.draw(st.floats(0.0, ymax)), data.draw(st.floats(0.0, 1.0))]
    for y in ys:
        value, exponent = _scalar.fix_exp_neg(float(y), G)
        with mpmath.workprec(32 * G + 200):
            exact = mpmath.exp(-mpmath.mpf(float(y)))
            units = abs(mpmath.mpf(value) * mpmath.mpf(2) ** exponent - exact) * mpmath.mpf(2) ** (32 * G)
        assert units < 1.1e4, (G, y, float(units))


def test_probability_targets_mass_test_as_a_double_agrees_with_the_int_one():
    # The short-row groups test a probability target's mass as a double (xf_target_mass_min > 0) so that
    # their loop stays in full-width vectors; it must answer as xf_target_has_mass_from does for every
    # validated input: eps in [0, 1], weights finite >= 0, any target (negative, NaN, inf, subnormal),
    # finite or masked logit.
    tiny = 5e-324
    answers = set()
    for eps in (0.0, tiny, 0.1, 1.0 - 2.0**-53, 1.0):
        for epc in (0.0, tiny, 1e-300, eps / 7, 0.05):
            for w in (0.0, tiny, 1e-300, 0.5, 1.0, 3.0):
                for fin in (0.0, 1.0):
                    for t in (0.0, -0.0, tiny, -tiny, 0.25, 1.0, -0.5, 2.0, np.nan, np.inf, -np.inf):
                        as_int, as_double = _scalar.target_mass_tests(eps, epc, w, fin, t)
                        assert as_int == as_double, (eps, epc, w, fin, t)
                        answers.add(as_int)
    assert answers == {False, True}
