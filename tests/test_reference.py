"""Tests of the mpmath reference (xentfast.reference) and of the testing kit (xentfast.testing).

Everything else in the test-suite measures xentfast against the reference, so the reference is checked
here against independent closed forms, high-precision derivatives, the spec's special-value policies
and (when installed) torch.
"""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpmath import mpf

from xentfast import reference as ref
from xentfast import testing as xt

SETTINGS = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def mp(v):
    """Exact mpf of a float (the reference converts inputs the same way)."""
    return mpmath.mpf(float(v))


def close(a, b, rel=mpf("1e-55"), abs_=mpf(0)):
    """True when two mpf agree to a relative tolerance (with an optional absolute floor)."""
    with mpmath.workdps(100):
        a, b = mpmath.mpf(a), mpmath.mpf(b)
        if mpmath.isnan(a) or mpmath.isnan(b):
            return mpmath.isnan(a) and mpmath.isnan(b)
        if mpmath.isinf(a) or mpmath.isinf(b):
            return a == b
        return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def isnan(v):
    return mpmath.isnan(v)


def f64(v):
    return np.asarray(ref.rounded(v, np.float64))


# --------------------------------------------------------------------------------------------------
# Closed forms


@pytest.mark.parametrize("xy, xo", [(0.0, 0.0), (1.5, -2.25), (-3.0, 4.0), (700.0, 0.0), (0.0, 700.0),
                                    (745.0, 0.0), (0.0, -745.5), (1e5, -1e5), (1e300, -1e300),
                                    (-1e300, 1e300), (2.0**-1074, 0.0)])
def test_two_classes_closed_form(xy, xo):
    x = np.array([[xy, xo], [xo, xy]])
    y = np.array([0, 1])
    loss = ref.cross_entropy(x, y, reduction="none")
    grad = ref.cross_entropy_grad(x, y, reduction="none")
    with mpmath.workdps(120):
        delta = mp(xo) - mp(xy)
        expected = mpmath.log1p(mpmath.exp(delta))
        # d/dx_y = -(1 - p_y) = -sigmoid(x_o - x_y): computed here without the cancellation.
        g_other = 1 / (1 + mpmath.exp(-delta))
        g_target = -g_other
    tiny = mpmath.ldexp(1, -1138)
    for i in range(2):
        assert close(loss[i], expected, abs_=tiny)
    assert close(grad[0, 0], g_target, abs_=tiny) and close(grad[0, 1], g_other, abs_=tiny)
    assert close(grad[1, 1], g_target, abs_=tiny) and close(grad[1, 0], g_other, abs_=tiny)


def test_confident_gradient_is_not_flushed():
    # exp(-700) ~ 1e-304 is a normal float64: a reference that computed p_y - 1 naively would return 0.
    x = np.array([[700.0, 0.0, 0.0]])
    g = ref.cross_entropy_grad(x, np.array([0]), reduction="sum")
    with mpmath.workdps(100):
        e = mpmath.exp(-700)
        expected = -2 * e / (1 + 2 * e)
    assert close(g[0, 0], expected)
    assert ref.rounded(g[0, 0], np.float64) != 0.0


@pytest.mark.parametrize("C", [1, 2, 3, 7, 64, 65])
@pytest.mark.parametrize("value", [0.0, -3.5, 1e300, -1e300, 2.0**-1074])
def test_uniform_row(C, value):
    x = np.full((1, C), value)
    y = np.array([C - 1])
    loss, lse = ref.cross_entropy(x, y), ref.logsumexp(x)[0]
    g, sm = ref.cross_entropy_grad(x, y), ref.softmax(x)
    with mpmath.workdps(100):
        logC = mpmath.log(C)
        assert close(loss, logC, abs_=mpf("1e-60"))
        assert close(lse, mp(value) + logC)
        for j in range(C):
            assert close(g[0, j], mpf(1) / C - (j == C - 1), abs_=mpf("1e-60"))
            assert close(sm[0, j], mpf(1) / C)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_gradient_rows_sum_to_zero(seed, eps):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=10, size=(4, 9))
    x[1, 3] = -np.inf
    y = rng.integers(0, 9, 4)
    y[1] = 4
    g = ref.cross_entropy_grad(x, y, reduction="sum", label_smoothing=eps)
    with mpmath.workdps(100):
        for row in g:
            assert abs(mpmath.fsum(row)) < mpf("1e-58")


def _exact_input(x):
    out = np.empty(x.shape, dtype=object)
    out.reshape(-1)[:] = [mp(v) for v in x.ravel()]
    return out


def _central_difference(x, objective):
    """d objective / d x by a central difference with step 2**-100 at 80 digits.

    With h ~ 1e-30 the truncation error is ~h**2 ~ 1e-60 and the rounding error ~1e-80 / h ~ 1e-50,
    so agreement to ~1e-45 is a genuine check of the exact derivative, not a loose numerical one.
    """
    h = mpmath.ldexp(mpf(1), -100)
    xo = _exact_input(x)
    out = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(*x.shape):
        xp, xm = xo.copy(), xo.copy()
        xp[idx] = mpmath.fadd(xo[idx], h, exact=True)
        xm[idx] = mpmath.fsub(xo[idx], h, exact=True)
        fp, fm = objective(xp), objective(xm)
        with mpmath.workdps(80):
            out[idx] = (fp - fm) / (2 * h)
    return out


def _assert_matches_cd(grad, cd, tol=mpf("1e-44")):
    with mpmath.workdps(80):
        scale = 1 + max(abs(v) for v in grad.ravel())
        for idx in np.ndindex(*grad.shape):
            assert abs(grad[idx] - cd[idx]) <= tol * scale, (idx, grad[idx], cd[idx])


CD_CASES = [
    dict(),
    dict(label_smoothing=0.25),
    dict(weight="w", label_smoothing=0.1, z_loss=0.01),
    dict(weight="w", reduction="mean", z_loss=0.5),
    dict(reduction="none", grad_output="g", label_smoothing=0.7, z_loss=1e-3),
    dict(target="prob", weight="w", label_smoothing=0.2, z_loss=0.05),
    dict(target="prob", reduction="none", grad_output="g"),
    dict(target="prob", reduction="mean", weight="w"),
]


@pytest.mark.parametrize("case", CD_CASES, ids=[str(i) for i in range(len(CD_CASES))])
def test_gradient_matches_high_precision_central_difference(case):
    rng = np.random.default_rng(7)
    N, C = 3, 5
    x = rng.normal(scale=4, size=(N, C))
    x[0, 2] = -np.inf  # a masked class: C_eff = 4 in that row
    x[2, :] = [-0.5, 0.25, -0.5, 0.125, 0.0]  # lse close to 0 makes the z-loss term cancel
    kw = dict(case)
    if kw.pop("target", "index") == "prob":
        t = rng.random((N, C))
        t[0, 2] = 0.0
        t /= t.sum(axis=1, keepdims=True)
    else:
        t = np.array([1, 4, 2])
    if kw.get("weight") == "w":
        kw["weight"] = rng.uniform(0.1, 2.0, C)
    g_out = None
    if kw.pop("grad_output", None) == "g":
        g_out = rng.normal(size=N)
    red = kw.get("reduction", "mean")
    grad = ref.cross_entropy_grad(x, t, grad_output=g_out, **kw)

    def objective(xx):
        loss = ref.cross_entropy(xx, t, dps=80, **kw)
        if red == "none":
            with mpmath.workdps(80):
                gg = g_out if g_out is not None else np.ones(N)
                return mpmath.fsum(mp(a) * b for a, b in zip(gg, loss))
        return loss

    finite = np.isfinite(x)
    # Differentiate only with respect to the finite logits (the masked ones stay -inf).
    cd = _central_difference(np.where(finite, x, 0.0),
                             lambda xx: objective(np.where(finite, xx, mpf("-inf"))))
    _assert_matches_cd(grad, np.where(finite, cd, mpf(0)))
    assert grad[0, 2] == 0  # masked class


def test_soft_target_gradient_cancellation():
    # t = softmax(x) rounded to float64: the gradient p - t is ~1e-17, 17 digits below its terms.
    rng = np.random.default_rng(4)
    x = rng.normal(scale=2.0, size=(3, 6))
    t = ref.rounded(ref.softmax(x), np.float64)
    lo = ref.cross_entropy_grad(x, t, reduction="sum")
    hi = ref.cross_entropy_grad(x, t, reduction="sum", dps=100)
    with mpmath.workdps(100):
        for idx in np.ndindex(*x.shape):
            assert 0 < abs(lo[idx]) < 1e-15
            assert close(lo[idx], hi[idx], rel=mpf("1e-58")), idx


def test_z_loss_closed_form():
    x = np.array([[0.5, -1.0, 2.0]])
    y = np.array([2])
    z = 0.125
    loss = ref.cross_entropy(x, y, z_loss=z, reduction="sum")
    g = ref.cross_entropy_grad(x, y, z_loss=z, reduction="sum")
    with mpmath.workdps(100):
        xs = [mp(v) for v in x[0]]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
        assert close(loss, lse - xs[2] + mp(z) * lse**2)
        for j in range(3):
            p = mpmath.exp(xs[j] - lse)
            assert close(g[0, j], p * (1 + 2 * mp(z) * lse) - (j == 2))


def test_logsumexp_cancellation_near_zero():
    # m + log(s) cancels: the result is the float64 rounding error of -log(2), about 2.3e-17.
    v = -math.log(2.0)
    out = ref.logsumexp(np.array([v, v]))
    with mpmath.workdps(100):
        expected = mp(v) + mpmath.log(2)
    assert close(out, expected)
    # ... and the same cancellation inside the z-loss gradient.
    g = ref.cross_entropy_grad(np.array([[v, v]]), np.array([0]), z_loss=1.0, reduction="sum")
    with mpmath.workdps(100):
        assert close(g[0, 1], mpf(1) / 2 * (1 + 2 * expected))


def test_softmax_family_against_direct_formulas():
    rng = np.random.default_rng(3)
    x = rng.normal(scale=30, size=(4, 6)).astype(np.float32)
    x[1, 0] = -np.inf
    lse, ls, sm = ref.logsumexp(x), ref.log_softmax(x), ref.softmax(x)
    with mpmath.workdps(100):
        for i in range(4):
            xs = [mp(v) for v in x[i]]
            e = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
            assert close(lse[i], e)
            for j in range(6):
                if xs[j] == mpmath.ninf:
                    assert ls[i, j] == mpmath.ninf and sm[i, j] == 0
                else:
                    assert close(ls[i, j], xs[j] - e) and close(sm[i, j], mpmath.exp(xs[j] - e))
    # axis handling: the class axis may be anywhere
    lse0 = ref.logsumexp(x.T, axis=0)
    assert all(lse0[i] == lse[i] for i in range(4))
    assert ref.log_softmax(x.T, axis=0)[3, 2] == ls[2, 3]


def test_independent_of_global_precision():
    x = np.array([[0.1, 0.2, 0.7], [700.0, 0.0, -np.inf]])
    y = np.array([2, 0])
    runs = []
    for dps in (15, 100):
        with mpmath.workdps(dps):
            runs.append((ref.cross_entropy(x, y, reduction="none", label_smoothing=0.1, z_loss=0.01),
                         ref.cross_entropy_grad(x, y, label_smoothing=0.1, z_loss=0.01),
                         ref.logsumexp(x), ref.softmax(x)))
    for a, b in zip(*runs):
        assert all(u == v for u, v in zip(a.ravel(), b.ravel()))


def test_precision_and_global_context():
    x = np.array([[0.1, 0.2, 0.7]])
    before = mpmath.mp.prec
    a = ref.cross_entropy(x, np.array([0]))
    b = ref.cross_entropy(x, np.array([0]), dps=100)
    assert mpmath.mp.prec == before
    assert close(a, b, rel=mpf("1e-59"))
    assert isinstance(a, mpmath.mpf)
    assert isinstance(ref.cross_entropy(x, np.array([0]), reduction="sum"), mpmath.mpf)
    none = ref.cross_entropy(x, np.array([0]), reduction="none")
    assert none.dtype == object and none.shape == (1,)
    assert isinstance(ref.cross_entropy(x[0], np.array(0), reduction="none"), mpmath.mpf)


# --------------------------------------------------------------------------------------------------
# Special-value policies


def test_ignored_rows_are_zero_and_not_counted():
    x = np.array([[1.0, 2.0, 3.0], [np.nan, np.inf, -np.inf], [0.0, 0.0, 0.0]])
    y = np.array([0, -100, 1])
    w = np.array([2.0, 3.0, 5.0])
    none = ref.cross_entropy(x, y, w, reduction="none")
    assert none[1] == 0
    mean = ref.cross_entropy(x, y, w)
    with mpmath.workdps(80):
        assert close(mean, (none[0] + none[2]) / (2 + 3))
    g = ref.cross_entropy_grad(x, y, w, grad_output=np.nan, reduction="sum")
    assert all(v == 0 for v in g[1])
    g = ref.cross_entropy_grad(x, y, w, reduction="none", grad_output=np.array([1.0, np.nan, 1.0]))
    assert all(v == 0 for v in g[1])


def test_ignore_index_can_be_a_class():
    x = np.array([[1.0, 2.0], [3.0, -1.0]])
    none = ref.cross_entropy(x, np.array([1, 0]), ignore_index=1, reduction="none")
    assert none[0] == 0 and none[1] > 0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_posinf_rows(bad):
    x = np.array([[1.0, bad, -np.inf], [0.5, 0.25, 0.0]])
    y = np.array([0, 1])
    none = ref.cross_entropy(x, y, reduction="none")
    assert isnan(none[0]) and not isnan(none[1])
    assert isnan(ref.cross_entropy(x, y))
    g = ref.cross_entropy_grad(x, y, reduction="none")
    assert all(isnan(v) for v in g[0]) and not any(isnan(v) for v in g[1])
    t = np.full((2, 3), 1 / 3)
    assert isnan(ref.cross_entropy(x, t, reduction="none")[0])
    assert all(isnan(v) for v in ref.log_softmax(x)[0]) and all(isnan(v) for v in ref.softmax(x)[0])
    lse = ref.logsumexp(x)[0]
    assert isnan(lse) if bad != np.inf else lse == mpmath.inf


def test_nan_beats_posinf_in_logsumexp():
    assert isnan(ref.logsumexp(np.array([np.inf, np.nan])))


def test_all_neginf_rows():
    x = np.array([[-np.inf, -np.inf], [0.0, 1.0]])
    y = np.array([1, 0])
    none = ref.cross_entropy(x, y, reduction="none")
    assert isnan(none[0]) and not isnan(none[1])
    assert all(isnan(v) for v in ref.cross_entropy_grad(x, y, reduction="none")[0])
    assert ref.logsumexp(x)[0] == mpmath.ninf
    assert all(isnan(v) for v in ref.log_softmax(x)[0])
    assert all(isnan(v) for v in ref.softmax(x)[0])


def test_neginf_target_logit_gives_posinf_loss():
    x = np.array([[-np.inf, 1.0, 2.0, -np.inf]])
    y = np.array([0])
    assert ref.cross_entropy(x, y, reduction="none")[0] == mpmath.inf
    assert ref.cross_entropy(x, y) == mpmath.inf
    g = ref.cross_entropy_grad(x, y, reduction="sum")
    # masked non-target class: exactly 0; the target keeps the exact -q_y (p_y = 0); others p_j
    assert g[0, 3] == 0
    assert g[0, 0] == -1
    with mpmath.workdps(80):
        assert close(g[0, 1] + g[0, 2], 1)
    # with full smoothing the target carries no (1 - eps) mass: 0 * inf = 0, the loss is finite
    loss = ref.cross_entropy(x, y, label_smoothing=1.0, reduction="sum")
    with mpmath.workdps(100):
        lse = mpmath.log(mpmath.exp(1) + mpmath.exp(2))
        assert close(loss, lse - (mpf(1) + 2) / 2)


def test_masked_classes_have_zero_gradient_and_smoothing_uses_c_eff():
    x = np.array([[0.0, 0.0, -np.inf, -np.inf]])
    y = np.array([0])
    eps = 0.3
    loss = ref.cross_entropy(x, y, label_smoothing=eps, reduction="sum")
    with mpmath.workdps(100):
        # C_eff = 2: q = [0.7 + 0.15, 0.15, 0, 0], each -log p = log 2
        assert close(loss, mpmath.log(2))
    g = ref.cross_entropy_grad(x, y, label_smoothing=eps, reduction="sum")
    with mpmath.workdps(100):
        assert close(g[0, 0], mpf("0.5") - (1 - mp(eps)) - mp(eps) / 2)
        assert close(g[0, 1], mpf("0.5") - mp(eps) / 2)
    assert g[0, 2] == 0 and g[0, 3] == 0
    # probability targets: the smoothing mass also goes to the finite classes only
    t = np.array([[0.25, 0.75, 0.0, 0.0]])
    w = np.array([2.0, 1.0, 7.0, 7.0])
    loss = ref.cross_entropy(x, t, w, label_smoothing=eps, reduction="sum")
    with mpmath.workdps(100):
        q0 = 2 * ((1 - mp(eps)) * mpf("0.25") + mp(eps) / 2)
        q1 = 1 * ((1 - mp(eps)) * mpf("0.75") + mp(eps) / 2)
        assert close(loss, (q0 + q1) * mpmath.log(2))
    # no -inf: identical to torch's eps / C
    x2 = np.array([[0.5, -0.5, 1.0]])
    loss2 = ref.cross_entropy(x2, np.array([1]), label_smoothing=eps, reduction="sum")
    with mpmath.workdps(100):
        xs = [mp(v) for v in x2[0]]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
        nlp = [lse - v for v in xs]
        assert close(loss2, (1 - mp(eps)) * nlp[1] + mp(eps) / 3 * mpmath.fsum(nlp))


def test_zero_q_on_masked_class_contributes_nothing():
    x = np.array([[-np.inf, 0.0, 1.0]])
    t = np.array([[0.0, 0.5, 0.5]])
    loss = ref.cross_entropy(x, t, reduction="sum")
    assert mpmath.isfinite(loss)


def test_nan_in_probability_target_propagates():
    x = np.array([[0.0, 1.0], [1.0, 0.0]])
    t = np.array([[np.nan, 1.0], [0.5, 0.5]])
    none = ref.cross_entropy(x, t, reduction="none")
    assert isnan(none[0]) and not isnan(none[1])
    g = ref.cross_entropy_grad(x, t, reduction="none")
    assert all(isnan(v) for v in g[0])


@pytest.mark.parametrize("empty_mean, expected", [("nan", "nan"), ("zero", 0)])
def test_empty_mean(empty_mean, expected):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    cases = [
        (x, np.array([-100, -100]), None),  # all rows ignored
        (x, np.array([0, 0]), np.array([0.0, 1.0])),  # zero weights
        (np.empty((0, 2)), np.empty(0, dtype=np.int64), None),  # no rows (index targets)
        (np.empty((0, 2)), np.empty((0, 2)), None),  # no rows (probability targets)
    ]
    for xx, t, w in cases:
        out = ref.cross_entropy(xx, t, w, empty_mean=empty_mean)
        assert isnan(out) if expected == "nan" else out == 0
        assert ref.cross_entropy(xx, t, w, reduction="sum") == 0
        g = ref.cross_entropy_grad(xx, t, w, empty_mean=empty_mean)
        assert g.shape == xx.shape and all(v == 0 for v in g.ravel())


def test_mean_denominators():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(5, 4))
    w = np.array([0.5, 2.0, 1.0, 3.0])
    y = np.array([0, 1, -100, 3, 1])
    none = ref.cross_entropy(x, y, w, reduction="none")
    mean = ref.cross_entropy(x, y, w)
    with mpmath.workdps(80):
        assert close(mean, mpmath.fsum(none) / (0.5 + 2 + 3 + 2))
        for i, yi in enumerate(y):
            if yi >= 0:
                xs = [mp(v) for v in x[i]]
                lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
                assert close(none[i], mp(w[yi]) * (lse - xs[yi]))
    t = rng.random((5, 4))
    none = ref.cross_entropy(x, t, w, reduction="none")
    with mpmath.workdps(80):
        assert close(ref.cross_entropy(x, t, w), mpmath.fsum(none) / 5)
    # the gradient of the mean is the gradient of the sum over the same denominator
    gs = ref.cross_entropy_grad(x, y, w, reduction="sum")
    gm = ref.cross_entropy_grad(x, y, w, grad_output=3.0)
    with mpmath.workdps(80):
        for idx in np.ndindex(*x.shape):
            assert close(gm[idx], gs[idx] * 3 / 7.5, abs_=mpf("1e-70"))


def test_return_scale():
    x = np.array([[2.0, 0.0], [0.0, 1.0]])
    y = np.array([0, -100])
    g, s = ref.cross_entropy_grad(x, y, reduction="mean", grad_output=-2.0, return_scale=True)
    with mpmath.workdps(100):
        p0 = 1 / (1 + mpmath.exp(-2))
        assert close(s[0, 0], 2 * (p0 + 1)) and close(s[0, 1], 2 * (1 - p0))
        assert close(g[0, 0], -2 * (p0 - 1))
    assert s[1, 0] == 0 and s[1, 1] == 0


def test_axis_and_shapes():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 4))  # classes on axis 1
    y = rng.integers(0, 3, (2, 4))
    a = ref.cross_entropy(x, y, axis=1, reduction="none")
    b = ref.cross_entropy(np.moveaxis(x, 1, -1), y, reduction="none")
    assert a.shape == (2, 4) and all(a[i] == b[i] for i in np.ndindex(2, 4))
    g = ref.cross_entropy_grad(x, y, axis=1)
    gb = ref.cross_entropy_grad(np.moveaxis(x, 1, -1), y)
    assert g.shape == x.shape and all(g[i] == np.moveaxis(gb, -1, 1)[i] for i in np.ndindex(*x.shape))


def test_validation_errors():
    x = np.zeros((3, 4))
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.zeros((3, 3)))
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.array([0, 4, 1]))
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.array([0, 1, 1]), weight=np.ones(3))
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.array([0, 1, 1]), reduction="avg")
    with pytest.raises(ValueError):
        ref.cross_entropy(x, np.array([0, 1, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError):
        ref.cross_entropy_grad(x, np.array([0, 1, 1]), grad_output=np.ones(3))


# --------------------------------------------------------------------------------------------------
# rounded / ulp / ulp_error


def test_ulp_known_values():
    assert xt.ulp(1.0, np.float64) == mpf(2) ** -52
    assert xt.ulp(1.0, np.float32) == mpf(2) ** -23
    assert xt.ulp(0.0, np.float64) == mpmath.ldexp(1, -1074)
    assert xt.ulp(0.0, np.float32) == mpmath.ldexp(1, -149)
    assert xt.ulp(1.5, np.float64) == mpf(2) ** -52
    assert xt.ulp(np.nextafter(2.0, 0.0), np.float64) == mpf(2) ** -52
    assert xt.ulp(-4.0, np.float64) == mpf(2) ** -50
    assert xt.ulp(5e-324, np.float64) == mpmath.ldexp(1, -1074)
    assert xt.ulp(2.0**-1022, np.float64) == mpmath.ldexp(1, -1074)
    assert xt.ulp(2.0**-1023, np.float64) == mpmath.ldexp(1, -1074)
    assert xt.ulp(2.0**-127, np.float32) == mpmath.ldexp(1, -149)
    assert xt.ulp(2.0**-126, np.float32) == mpmath.ldexp(1, -149)
    assert xt.ulp(2.0**-125, np.float32) == mpmath.ldexp(1, -148)
    assert xt.ulp(mpmath.ldexp(1, -5000), np.float64) == mpmath.ldexp(1, -1074)
    assert xt.ulp(mpmath.inf, np.float64) == mpmath.inf
    u = xt.ulp(np.array([1.0, 2.0**-1030]), np.float64)
    assert u.dtype == object and u[0] == mpf(2) ** -52 and u[1] == mpmath.ldexp(1, -1074)


def test_rounded_float32_ties_and_no_double_rounding():
    one = mpf(1)
    with mpmath.workprec(200):
        half_up = one + mpmath.ldexp(1, -24)  # halfway between 1 and 1 + 2**-23: ties to even -> 1
        assert ref.rounded(half_up, np.float32) == np.float32(1.0)
        odd_tie = one + 3 * mpmath.ldexp(1, -24)  # halfway between 1+2**-23 (odd) and 1+2**-22 (even)
        assert ref.rounded(odd_tie, np.float32) == np.float32(1 + 2.0**-22)
        # Via float64 this would first round to the tie 1 + 2**-24 and then to 1.0 (double rounding).
        above = one + mpmath.ldexp(1, -24) + mpmath.ldexp(1, -60)
        assert ref.rounded(above, np.float32) == np.float32(1 + 2.0**-23)
        below = one + mpmath.ldexp(1, -24) - mpmath.ldexp(1, -60)
        assert ref.rounded(below, np.float32) == np.float32(1.0)
        assert ref.rounded(half_up, np.float64) == 1 + 2.0**-24
    r = ref.rounded(half_up, np.float32)
    assert isinstance(r, np.float32)


def test_rounded_subnormals_overflow_and_specials():
    L = mpmath.ldexp
    assert ref.rounded(L(1, -1075), np.float64) == 0.0  # tie with 0: even
    assert ref.rounded(L(3, -1076), np.float64) == 5e-324
    assert ref.rounded(L(3, -1075), np.float64) == 2 * 5e-324  # 1.5 * 2**-1074: tie -> even (2)
    assert ref.rounded(L(1, -100000), np.float64) == 0.0
    neg = ref.rounded(-L(1, -2000), np.float64)
    assert neg == 0.0 and np.signbit(neg)
    assert ref.rounded(L(3, -150), np.float32) == np.float32(2.0**-148)  # 1.5 * 2**-149 -> 2 * 2**-149
    assert ref.rounded(L(1, -150), np.float32) == np.float32(0.0)
    f32max = mpf(float(np.finfo(np.float32).max))
    with mpmath.workprec(200):
        assert ref.rounded(f32max + L(1, 103), np.float32) == np.float32(np.inf)  # tie -> 2**128 -> inf
        assert ref.rounded(f32max + L(1, 102), np.float32) == np.finfo(np.float32).max
        assert ref.rounded(-L(1, 1024), np.float64) == -np.inf
        assert ref.rounded(L(1, 10**9), np.float64) == np.inf
    assert np.isnan(ref.rounded(mpmath.nan, np.float32))
    assert ref.rounded(mpmath.ninf, np.float64) == -np.inf
    arr = np.array([mpf(1) / 3, mpf(2) / 3], dtype=object)
    out = ref.rounded(arr, np.float32)
    assert out.dtype == np.float32 and out[0] == np.float32(1 / 3) and out[1] == np.float32(2 / 3)


def test_ulp_error_rules():
    f64 = np.float64
    assert xt.ulp_error(np.array([1.0 + 2.0**-52]), np.array([mpf(1)], dtype=object), f64)[0] == 1.0
    with mpmath.workprec(200):
        third = mpf(1) / 3
    e = xt.ulp_error(np.array([1 / 3]), third, f64)[0]
    assert 0 < e <= 0.5
    # a flushed subnormal is a large error
    assert xt.ulp_error(np.array([0.0]), mpmath.ldexp(3, -1074), f64)[0] == 3.0
    assert xt.ulp_error(np.array([0.0], dtype=np.float32), mpmath.ldexp(1, -140), np.float32)[0] == 512.0
    nan, inf = mpmath.nan, mpmath.inf
    cases = [
        (np.nan, nan, 0.0), (1.0, nan, np.inf), (np.inf, inf, 0.0), (-np.inf, inf, np.inf),
        (1e308, inf, np.inf), (np.nan, mpf(1), np.inf), (np.inf, mpf(1), np.inf),
        (np.inf, mpmath.ldexp(1, 1100), 0.0), (-np.inf, mpmath.ldexp(1, 1100), np.inf),
        (-np.inf, -mpmath.ldexp(1, 1024), 0.0), (-0.0, mpf(0), 0.0),
        (1.0, mpmath.ldexp(1, -10**6), np.inf),  # 2**1074 ulps: beyond float64
    ]
    for a, ex, want in cases:
        assert xt.ulp_error(np.array([a]), ex, f64)[0] == want, (a, ex)
    # float32 overflow threshold
    assert xt.ulp_error(np.array([np.inf], dtype=np.float32), mpmath.ldexp(1, 128), np.float32)[0] == 0
    # beyond the largest finite number by less than the context's 53 bits can resolve: still beyond it
    # (the float64 loss of logits [DBL_MAX, -DBL_MAX, 0 x 8] with every target 0.1, DBL_MAX (1 + 2^-54))
    dbl_max = mpf(np.finfo(f64).max)
    with mpmath.workprec(200):
        beyond = [dbl_max + mpmath.ldexp(1, 970) - mpmath.ldexp(1, 917), dbl_max + mpmath.ldexp(1, 900)]
        beyond_negated = [-v for v in beyond]
    for above, below in zip(beyond, beyond_negated):
        assert xt.ulp_error(np.array([np.inf]), above, f64)[0] == 0
        assert xt.ulp_error(np.array([-np.inf]), below, f64)[0] == 0
        assert xt.ulp_error(np.array([-np.inf]), above, f64)[0] == np.inf
    # within the range: the infinity counts as 2^1024 (2^128), one ulp past the largest finite number
    assert xt.ulp_error(np.array([np.inf]), dbl_max, f64)[0] == 1.0
    assert xt.ulp_error(np.array([-np.inf]), -dbl_max, f64)[0] == 1.0
    assert xt.ulp_error(np.array([np.inf]), dbl_max - mpmath.ldexp(3, 971), f64)[0] == 4.0
    assert xt.ulp_error(np.array([np.inf]), dbl_max / 2, f64)[0] == 2.0**53 + 1
    assert xt.ulp_error(np.array([-np.inf]), dbl_max, f64)[0] == np.inf
    flt_max = mpf(float(np.finfo(np.float32).max))
    assert xt.ulp_error(np.array([np.inf], dtype=np.float32), flt_max, np.float32)[0] == 1.0
    # scale: errors measured in ulp(scale)
    e = xt.ulp_error(np.array([2.0**-60]), mpf(0), f64, scale=mpf(1))[0]
    assert e == 2.0**-8
    err, idx = xt.max_ulp_error(np.array([[1.0, 1.0 + 2.0**-51]]), np.array([[mpf(1), mpf(1)]], dtype=object))
    assert err == 2.0 and idx == (0, 1)


def test_assert_ulp_close_message_shows_input_row():
    x = np.array([[0.5, 1.0, -2.0], [3.0, -0.125, 0.0078125], [1.0, 2.0, 3.0]], dtype=np.float32)
    y = np.array([0, 2, 1])
    exact = ref.cross_entropy(x, y, reduction="none")
    actual = ref.rounded(exact, np.float32)
    xt.assert_ulp_close(actual, exact, 0.5, inputs={"logits": x})
    bad = actual.copy()
    bad[1] = np.nextafter(np.nextafter(bad[1], np.float32(np.inf)), np.float32(np.inf))
    with pytest.raises(AssertionError) as info:
        xt.assert_ulp_close(bad, exact, 1, inputs={"logits": x, "target": y}, err_msg="my context")
    msg = str(info.value)
    assert "1 of 3" in msg and "(1,)" in msg
    assert "logits[1] = [ 3." in msg and "-0.125" in msg and "0.0078125]" in msg
    assert "target[1] = 2" in msg
    assert float(bad[1]).hex() in msg
    assert mpmath.nstr(exact[1], 25) in msg
    assert "my context" in msg
    # gradients: the logits have the output's rank, so the whole row of the worst element is shown
    g = ref.cross_entropy_grad(x, y, reduction="none")
    gr = ref.rounded(g, np.float32)
    gr[2, 1] = -gr[2, 1]
    with pytest.raises(AssertionError) as info:
        xt.assert_ulp_close(gr, g, 1, inputs={"logits": x, "weight": np.ones(3, np.float32)})
    msg = str(info.value)
    assert "(2, 1)" in msg and "logits[2] = [1., 2., 3.]" in msg and "weight = [1., 1., 1.]" in msg


# --------------------------------------------------------------------------------------------------
# torch agreement


def _torch_case(torch, x, t, w, ignore_index, reduction, eps, g, axis_torch_ok=True):
    F = torch.nn.functional
    xt_ = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(t)
    wt = None if w is None else torch.tensor(w, dtype=torch.float64)
    loss = F.cross_entropy(xt_, tt, weight=wt, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=eps)
    gt = torch.tensor(g, dtype=torch.float64)
    (loss * gt).sum().backward()
    return loss.detach().numpy(), xt_.grad.numpy()


def _assert_close_rel(actual, expected, rtol=1e-12):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(np.max(np.abs(expected), initial=0.0), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("target_kind", ["index", "prob"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("eps", [0.0, 0.15])
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_matches_torch(reduction, use_weight, eps, ignore_index, target_kind):
    torch = pytest.importorskip("torch")
    seed = hash((reduction, use_weight, eps, ignore_index, target_kind)) % 2**32
    rng = np.random.default_rng(seed)
    N, C = 7, 5
    x = rng.normal(scale=3.0, size=(N, C))
    if target_kind == "index":
        t = rng.integers(0, C, N)
        t[[1, 4]] = ignore_index if ignore_index < 0 else t[[1, 4]]
        t[5] = ignore_index  # at least one ignored row in every case
    else:
        t = rng.random((N, C))
        t /= t.sum(axis=1, keepdims=True)
    w = rng.uniform(0.2, 2.0, C) if use_weight else None
    g = rng.normal(size=N) if reduction == "none" else np.float64(1.7)
    # torch rejects ignore_index with probability targets; the reference ignores it there (so it
    # still gets the non-default value, which must have no effect).
    torch_ii = ignore_index if target_kind == "index" else -100
    tl, tg = _torch_case(torch, x, t, w, torch_ii, reduction, eps, g)
    rl = ref.cross_entropy(x, t, w, ignore_index, reduction, eps)
    rg = ref.cross_entropy_grad(x, t, w, ignore_index, reduction, eps, grad_output=g)
    _assert_close_rel(f64(rl), tl)
    _assert_close_rel(f64(rg), tg)


@pytest.mark.parametrize("target_kind", ["index", "prob"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_matches_torch_class_axis_1(reduction, target_kind):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(17)
    x = rng.normal(scale=2.0, size=(4, 5, 3))
    if target_kind == "index":
        t = rng.integers(0, 5, (4, 3))
        t[0, 1] = -100
    else:
        t = rng.random((4, 5, 3))
        t /= t.sum(axis=1, keepdims=True)
    w = rng.uniform(0.5, 1.5, 5)
    g = rng.normal(size=(4, 3)) if reduction == "none" else np.float64(0.5)
    tl, tg = _torch_case(torch, x, t, w, -100, reduction, 0.1, g)
    rl = ref.cross_entropy(x, t, w, -100, reduction, 0.1, axis=1)
    rg = ref.cross_entropy_grad(x, t, w, -100, reduction, 0.1, axis=1, grad_output=g)
    _assert_close_rel(f64(rl), tl)
    _assert_close_rel(f64(rg), tg)


def test_softmax_family_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.normal(scale=5.0, size=(6, 9))
    xt_ = torch.tensor(x)
    _assert_close_rel(f64(ref.logsumexp(x)), torch.logsumexp(xt_, -1).numpy())
    _assert_close_rel(f64(ref.log_softmax(x)), torch.log_softmax(xt_, -1).numpy())
    _assert_close_rel(f64(ref.softmax(x)), torch.softmax(xt_, -1).numpy())


# --------------------------------------------------------------------------------------------------
# Strategies


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_strategy_shapes(dtype):
    @SETTINGS
    @given(xt.logits(dtype))
    def check(x):
        assert x.dtype == dtype and x.ndim == 2 and x.flags.c_contiguous
        assert 1 <= x.shape[0] <= 12 and 1 <= x.shape[1] <= 40
        assert not np.isnan(x).any() and not np.isposinf(x).any()

    check()

    @SETTINGS
    @given(xt.logits(dtype, shape=(2, 3, 4), allow_nan=True, allow_posinf=True, allow_neginf=False))
    def check_shape(x):
        assert x.shape == (2, 3, 4) and x.dtype == dtype and not np.isneginf(x).any()

    check_shape()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_strategy_is_adversarial(dtype):
    big = 1e300 if dtype == np.float64 else 3e38
    tiny = np.finfo(dtype).tiny

    def gap(x):
        out = []
        for row in x:
            f = np.sort(row[np.isfinite(row)].astype(np.float64))
            if f.size >= 2:
                with np.errstate(over="ignore"):
                    out.append(f[-1] - f[-2])
        return max(out, default=0.0)

    features = {
        "neginf mask": lambda x: (np.isneginf(x).any(axis=1) & np.isfinite(x).any(axis=1)).any(),
        "all -inf row": lambda x: np.isneginf(x).all(axis=1).any(),
        "huge": lambda x: (np.abs(x[np.isfinite(x)]) >= big * 0.99).any(),
        "subnormal": lambda x: ((x != 0) & (np.abs(x) < tiny)).any(),
        "negative zero": lambda x: ((x == 0) & np.signbit(x)).any(),
        "confident": lambda x: gap(x) >= 20,
        "one class": lambda x: x.shape[1] == 1,
        "power of two classes": lambda x: x.shape[1] in (16, 32, 64),
        "ties": lambda x: x.shape[1] >= 2 and any(np.sum(r == r.max()) >= 2 for r in x
                                                   if np.isfinite(r.max())),
    }
    seen = set()

    # Generation only (no shrinking): this is a census of what the strategy produces.
    @settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(xt.logits(dtype, max_classes=64))
    def census(x):
        seen.update(name for name, has in features.items() if has(x))

    census()
    assert seen == set(features), set(features) - seen

    nan_seen = []

    @settings(max_examples=100, deadline=None, database=None, phases=[Phase.generate])
    @given(xt.logits(dtype, allow_nan=True, allow_posinf=True))
    def census_nan(x):
        nan_seen.append((np.isnan(x).any(), np.isposinf(x).any()))

    census_nan()
    assert any(a for a, _ in nan_seen) and any(b for _, b in nan_seen)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_target_and_weight_strategies(dtype):
    @SETTINGS
    @given(st.data())
    def check(data):
        x = data.draw(xt.logits(dtype, max_rows=5, max_classes=7))
        n, C = x.shape
        t = data.draw(xt.index_targets(C, (n,), argmax_of=x))
        assert t.shape == (n,) and t.dtype == np.int64
        assert np.all((t == -100) | ((t >= 0) & (t < C)))
        p = data.draw(xt.prob_targets(x.shape, dtype))
        assert p.shape == x.shape and p.dtype == dtype and np.all(p >= 0)
        w = data.draw(xt.class_weights(C, dtype))
        assert w.shape == (C,) and w.dtype == dtype and np.all(np.isfinite(w)) and np.all(w >= 0)

    check()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_xent_cases_feed_the_reference(dtype):
    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(xt.softmax_xent_cases(dtype, max_rows=4, max_classes=9))
    def check(case):
        x, t, w, eps, ii, z = case
        assert case.logits is x and x.dtype == dtype
        assert w is None or w.shape == (x.shape[1],)
        assert 0 <= eps <= 1
        assert t.shape == x.shape or t.shape == x.shape[:1]
        ref.cross_entropy(x, t, w, ii, "none", eps, z_loss=z)
        ref.cross_entropy_grad(x, t, w, ii, "mean", eps, z_loss=z)

    check()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_are_stable_under_more_precision(dtype):
    """The adaptive precision really delivers dps digits: dps=60 agrees with dps=90 on adversarial
    cases (confident rows, huge logits, soft targets whose gradient cancels, z-loss near lse=0)."""
    floor = mpmath.ldexp(mpf(1), -1074) * mpf("1e-57")

    def agree(a, b, n):
        with mpmath.workdps(120):
            if isnan(a) or isnan(b):
                return isnan(a) and isnan(b)
            if not mpmath.isfinite(a) or not mpmath.isfinite(b):
                return a == b
            return abs(a - b) <= mpf("1e-57") * abs(b) + (n + 1) * floor

    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(xt.softmax_xent_cases(dtype, max_rows=4, max_classes=9), st.sampled_from(["none", "mean", "sum"]))
    def check(case, reduction):
        x, t, w, eps, ii, z = case
        n = x.shape[0]
        kw = dict(weight=w, ignore_index=ii, reduction=reduction, label_smoothing=eps, z_loss=z)
        for fn in (ref.cross_entropy, ref.cross_entropy_grad):
            lo, hi = fn(x, t, dps=60, **kw), fn(x, t, dps=90, **kw)
            lo, hi = np.asarray(lo, dtype=object).ravel(), np.asarray(hi, dtype=object).ravel()
            for a, b in zip(lo, hi):
                assert agree(a, b, n), (fn.__name__, a, b)
        for fn in (ref.logsumexp, ref.log_softmax, ref.softmax):
            lo, hi = np.asarray(fn(x), dtype=object).ravel(), np.asarray(fn(x, dps=90), dtype=object).ravel()
            for a, b in zip(lo, hi):
                assert agree(a, b, n), (fn.__name__, a, b)

    check()
