"""Losses from probabilities: binary_cross_entropy (exact, Keras eps clipping, torch's log clamp) and
cross_entropy_from_probs, against the mpmath reference, torch, and the Keras founding case.

Bounds as the rest of the package: per element / row <= 2 ULP (float32), <= 4 ULP (float64), soft-target
BCE gradients in ulps of w((1-y)/(1-p) + y/p); reductions <= 4 ULP, their gradients one more ULP.
"""
import random

import mpmath
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import xentfast as xf
from xentfast import reference as ref
from xentfast.testing import (assert_ulp_close, binary_targets, class_weights, element_weights, index_targets,
                              prob_targets, unit_probabilities, upstream_scalars)

DTYPES = [np.float32, np.float64]
BOUND = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}
ids = lambda d: np.dtype(d).name  # noqa: E731
MODES = st.sampled_from([dict(), dict(), dict(eps=1e-7), dict(eps=0.1), dict(eps=0.0), dict(log_clamp=-100.0),
                         dict(log_clamp=-5.0)])


@st.composite
def bce_prob_cases(draw, dtype, max_side=10):
    from hypothesis.extra import numpy as hnp
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=max_side))
    p = draw(unit_probabilities(shape, dtype))
    if draw(st.integers(0, 4)) == 0 and p.size:
        p.reshape(-1)[draw(st.integers(0, p.size - 1))] = np.nan
    t = draw(binary_targets(shape, dtype))
    w = draw(element_weights(shape, dtype))
    return p, t, w, draw(MODES)


# ---- binary_cross_entropy ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_bce_probs_elements_within_bound(dtype, data):
    p, t, w, mode = data.draw(bce_prob_cases(dtype))
    note(f"mode={mode}")
    bound = BOUND[np.dtype(dtype)]
    loss, grad = xf.binary_cross_entropy_with_grad(p, t, w, reduction="none", **mode)
    assert loss.dtype == dtype and grad.dtype == dtype
    inputs = {"p": p, "target": t} if w is None else {"p": p, "target": t, "weight": w}
    assert_ulp_close(loss, ref.binary_cross_entropy(p, t, w, reduction="none", **mode), bound, inputs=inputs,
                     err_msg=f"loss {mode}")
    exact, scale = ref.binary_cross_entropy_grad(p, t, w, reduction="none", return_scale=True, **mode)
    assert_ulp_close(grad, exact, bound, scale=scale, inputs=inputs, err_msg=f"gradient {mode}")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_bce_probs_reductions_within_bound(dtype, reduction, data):
    p, t, w, mode = data.draw(bce_prob_cases(dtype, max_side=6))
    g = data.draw(upstream_scalars(large=True))
    loss, grad = xf.binary_cross_entropy_with_grad(p, t, w, reduction=reduction, grad_output=g, **mode)
    assert_ulp_close(np.asarray(loss), ref.binary_cross_entropy(p, t, w, reduction=reduction, **mode), 4.0,
                     dtype=dtype, inputs={"p": p, "target": t})
    exact, scale = ref.binary_cross_entropy_grad(p, t, w, reduction=reduction, grad_output=g, return_scale=True,
                                                 **mode)
    assert_ulp_close(grad, exact, BOUND[np.dtype(dtype)] + 1, scale=scale, inputs={"p": p, "target": t})


def _upstream_arrays(n):
    """Per-element (or per-row) grad_output arrays: ordinary, huge and subnormal factors side by side, and
    NaN ones among ordinary factors."""
    mixed = np.resize(np.array([1e30, -3e-320, 1.1e-310, 0.0, -(2.0**70), 0.37]), n)
    return st.sampled_from([np.linspace(-2, 3, n), np.full(n, 0.25), mixed, np.resize([0.37, np.nan, -1.5], n)])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_bce_probs_grad_output_per_element(dtype, data):
    p, t, w, mode = data.draw(bce_prob_cases(dtype, max_side=6))
    g = data.draw(_upstream_arrays(p.size)).reshape(p.shape).astype(dtype)
    grad = xf.binary_cross_entropy_backward(g, p, t, w, reduction="none", **mode)
    exact, scale = ref.binary_cross_entropy_grad(p, t, w, reduction="none", grad_output=g, return_scale=True,
                                                 **mode)
    assert_ulp_close(grad, exact, BOUND[np.dtype(dtype)] + 1, scale=scale, inputs={"p": p, "target": t},
                     err_msg=f"{mode}")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_ce_probs_grad_output_per_row(dtype, data):
    p, t, w, eps = data.draw(ce_prob_cases(dtype))
    g = data.draw(_upstream_arrays(p.shape[0])).astype(dtype)
    grad = xf.cross_entropy_from_probs_backward(g, p, t, w, reduction="none", eps=eps)
    exact = ref.cross_entropy_from_probs_grad(p, t, w, reduction="none", eps=eps, grad_output=g)
    assert_ulp_close(grad, exact, BOUND[np.dtype(dtype)] + 1, inputs={"p": p, "target": t}, err_msg=f"eps={eps}")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bce_probs_modes_at_the_edges(dtype):
    p = np.array([0.0, 0.0, 1.0, 1.0, 1e-30, 0.5], dtype=dtype)
    y = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=dtype)
    loss, g = xf.binary_cross_entropy_with_grad(p, y, reduction="none")
    assert list(loss[:4]) == [np.inf, 0.0, np.inf, 0.0]
    assert g[0] == -np.inf and g[1] == 1 and g[2] == np.inf and g[3] == -1   # -log 0 = inf, gradient to match
    # torch's BCELoss: the log is clamped at -100, its derivative is 0 there
    loss, g = xf.binary_cross_entropy_with_grad(p, y, reduction="none", log_clamp=-100.0)
    assert loss[0] == 100 and loss[2] == 100 and g[0] == 0 and g[2] == 0
    assert_ulp_close(loss[4:5], np.array([ref.binary_cross_entropy(p[4:5], y[4:5], reduction="none",
                                                                   log_clamp=-100.0)[0]], dtype=object), 1)
    # Keras: p clipped to [eps, 1 - eps] (exact bounds), derivative 0 where clipped
    loss, g = xf.binary_cross_entropy_with_grad(p, y, reduction="none", eps=1e-7)
    assert loss[0] == dtype(-np.log(1e-7)) and loss[2] == dtype(-np.log(1e-7))
    assert loss[1] == dtype(-np.log1p(-1e-7)) and g[0] == 0 and g[2] == 0
    assert g[5] == -2.0


# ---- binary_cross_entropy: the fast forms of ordinary elements (binary.h; float32 plain double, float64
# double-double) ------------------------------------------------------------------------------------------


def _around(v, dtype):
    """the value of the dtype nearest v and its two neighbours"""
    c = dtype(v)
    return [float(np.nextafter(c, dtype(0.0))), float(c), float(np.nextafter(c, dtype(1.0)))]


def _fast_probabilities(dtype):
    """every limit of the form and of its logs' reductions: p near 1 - 1/sqrt 2 and 1/sqrt 2 (a log's binade
    changes), the dtype's least subnormal and normal and its last value below 1, and each mode's limits: eps
    and 1 - eps, and for log_clamp c the probabilities e^c and 2 e^c (the form from 2 e^c on); float32 also
    2^-30 (1 - p exact from there), float64 the form's least p, 2^-400"""
    info = np.finfo(dtype)
    edges = [float(info.smallest_subnormal), float(info.smallest_normal), 1e-30, 1e-7, 0.5, 0.9,
             float(np.nextafter(dtype(1.0), dtype(0.0))), 1.0 - float(info.eps) / 2]
    for v in (1.0 - 2.0**-0.5, 2.0**-0.5, 1e-7, 1.0 - 1e-7, 2.0 * np.exp(-5.0), 1.0 - 2.0 * np.exp(-5.0), np.exp(-5.0),
              2.0 * np.exp(-100.0), np.exp(-100.0), 2.0**-30 if dtype == np.float32 else 2.0**-400):
        edges += _around(v, dtype)
    return np.array(sorted(set(edges)), dtype)


def _edge_targets(dtype):
    """0, 1, 1/2, a tiny target (float32: a subnormal; float64: 2^-60 and the double below it, the float64
    form's limit) and the last value below 1"""
    tiny = [2.0**-140] if dtype == np.float32 else [2.0**-60, float(np.nextafter(2.0**-60, 0.0))]
    return [0.0, 1.0, 0.5] + tiny + [float(np.nextafter(dtype(1.0), dtype(0.0)))]


def _in_fast_domain(p, dtype, mode):
    """the probabilities the fast form takes (binary.h), with margin where a clamp's limit is a rounded
    value: p >= 2^-400 (float64), eps <= p <= 1 - eps, both logs ln 2 above a clamp"""
    p = p.astype(np.float64)
    ok = (p > 0) & (p < 1) & (p >= (0.0 if dtype == np.float32 else 2.0**-400))
    if "eps" in mode:
        ok &= (p >= mode["eps"]) & (1.0 - p >= mode["eps"])
    if "log_clamp" in mode:
        ok &= (p > 2.0 * np.exp(mode["log_clamp"]) * (1 + 1e-12)) & (1.0 - p > 2.0 * np.exp(mode["log_clamp"]) * (1 + 1e-12))
    return ok


_FAST_MODES = [dict(), dict(eps=1e-7), dict(log_clamp=-5.0), dict(log_clamp=-100.0)]
_FAST_WG = [(1.0, 1.0), (2.0**-60, -(2.0**60)), (2.0**60, 2.0**-60), (2.0**-61, 1.0), (1.0, 2.0**61), (3.0, 0.0)]
_mode_id = lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "exact"  # noqa: E731


@pytest.mark.parametrize("mode", _FAST_MODES, ids=_mode_id)
@pytest.mark.parametrize("w, g", _FAST_WG)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bce_probs_fast_form_edges_within_bound(dtype, mode, w, g):
    """Probabilities at each limit of the fast forms and of the logs' reductions, beside each edge target
    and p itself (a zero gradient, +0 in the fast forms), under weights and upstream factors at and beyond
    2^+-60: the loss and the gradient within the contract, a zero gradient with the exact value's sign, and
    the loss with the bits of the forward call (both forms share it)."""
    targets = _edge_targets(dtype) + [None]
    probs = _fast_probabilities(dtype)
    p = np.repeat(probs, len(targets))
    y = np.tile(np.array([0.0 if v is None else v for v in targets], dtype), probs.size)
    y[len(targets) - 1::len(targets)] = probs
    kw = dict(weight=np.full(p.size, w), **mode)
    up = np.full(p.size, g)
    loss, grad = xf.binary_cross_entropy_with_grad(p, y, reduction="none", grad_output=up, **kw)
    inputs = {"p": p, "target": y}
    bound = BOUND[np.dtype(dtype)]
    assert_ulp_close(loss, ref.binary_cross_entropy(p, y, reduction="none", **kw), bound, inputs=inputs)
    exact, scale = ref.binary_cross_entropy_grad(p, y, reduction="none", grad_output=up, return_scale=True, **kw)
    assert_ulp_close(grad, exact, bound, scale=scale, inputs=inputs)
    for got, want in zip(grad, exact):
        if got == 0 and want != 0:
            assert np.signbit(got) == (want < 0), (got, want)
    if 2.0**-60 <= w <= 2.0**60 and 2.0**-60 <= abs(g) <= 2.0**60:
        # the fast forms' p - y is exactly 0 (the general form's two rounded terms may leave a residue
        # within the bound: float32 0.29289326 under w = 2^-61 gave -4.8e-35); float64 from 2^-400 on
        same_p = (y == p) & _in_fast_domain(p, dtype, mode)
        assert np.all(grad[same_p] == 0) and not np.any(np.signbit(grad[same_p]))
    assert loss.tobytes() == xf.binary_cross_entropy(p, y, reduction="none", **kw).tobytes()


# (loss, gradient) bounds inside the fast forms' domains, binary.h: float32 < 2^-37 and < 2^-49 relative
# before the one rounding; float64 within ~2^-55 (its logs' double-doubles) and ~2^-100
_ABOUT_ONCE = {np.dtype(np.float32): (0.5 + 2.0**-13, 0.5 + 2.0**-13), np.dtype(np.float64): (0.75, 0.5 + 2.0**-20)}


@pytest.mark.parametrize("mode", _FAST_MODES[:3], ids=["exact", "eps", "clamp"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bce_probs_fast_form_rounds_about_once(dtype, mode, weighted):
    """Inside its domain each fast form rounds about once: float32 within 0.5 + 2^-13 ULP, float64's loss
    within 0.75 ULP (measured 0.58) and its gradient 0.5 + 2^-20, where the general form reaches 1.75 and 1.86
    (float64), over every binade of p the form takes up to 1 - eps/2, hard, soft and tiny targets, weights
    and upstream factors over 2^+-50.  The contract's 2 and 4 ULP would let a form lose 1.5 or 3.5 ULP and
    still pass."""
    rng = np.random.default_rng(11)
    n = 4000
    least = 2.0**-149 if dtype == np.float32 else 2.0**-400
    one_below = np.nextafter(dtype(1.0), dtype(0.0))
    p = np.exp2(rng.uniform(np.log2(least), 0.0, n))
    p[::3] = 1.0 - np.exp2(-rng.uniform(0.5, 24.0 if dtype == np.float32 else 53.0, p[::3].size))
    p = np.clip(p.astype(dtype), dtype(least), one_below)
    p = p[_in_fast_domain(p, dtype, mode)]      # (eps and the clamp leave the rest to the general form)
    n = p.size
    y = rng.random(n).astype(dtype)
    y[::2] = np.round(y[::2])
    y[1::10] = dtype(3e-42) if dtype == np.float32 else 2.0**-60 * 1.5
    y[7::10] = np.where(p[7::10] >= (0.0 if dtype == np.float32 else 2.0**-60), p[7::10], y[7::10])
    w = np.exp2(rng.uniform(-50, 50, n)) if weighted else None
    up = rng.standard_normal(n) * np.exp2(rng.uniform(-50, 50, n)) if weighted else None
    loss, grad = xf.binary_cross_entropy_with_grad(p, y, w, reduction="none", grad_output=up, **mode)
    bound_loss, bound_grad = _ABOUT_ONCE[np.dtype(dtype)]
    assert_ulp_close(loss, ref.binary_cross_entropy(p, y, w, reduction="none", **mode), bound_loss,
                     inputs={"p": p, "target": y})
    exact, scale = ref.binary_cross_entropy_grad(p, y, w, reduction="none", grad_output=up, return_scale=True,
                                                 **mode)
    assert_ulp_close(grad, exact, bound_grad, scale=scale, inputs={"p": p, "target": y})


@pytest.mark.parametrize("n_odd", [1, 8], ids=["redone", "selected"])
@pytest.mark.parametrize("mode", _FAST_MODES[:3], ids=["exact", "eps", "clamp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bce_probs_chunk_decision_follows_the_per_element_rule(dtype, mode, n_odd):
    """The CPU runs a 64-element chunk in the fast form when every element qualifies, redoes a few odd ones
    (here p = 0) in the general form and selects per element beyond six; the CUDA twin decides per
    element.  So every edge probability, beside every edge target, gets the same double loss and gradient
    alone in its chunk as beside one odd element or eight: the forms' double losses differ in their low
    bits, which float32 outputs would hide."""
    from xentfast._core import _binary
    from xentfast.api_binary import _Elementwise, _prob_modes

    targets = _edge_targets(dtype)
    probs = np.repeat(_fast_probabilities(dtype), len(targets))
    n = 128 * probs.size
    alone = np.full(n, 0.25, dtype)
    alone[5::128] = probs
    mixed = alone.copy()
    for k in range(n_odd):
        mixed[6 + k::128] = 0.0                   # outside the fast forms' domains
    t = np.full(n, 0.3, dtype)
    t[5::128] = np.tile(np.array(targets, dtype), probs.size // len(targets))
    w = np.resize(np.array([1.0, 2.0**-61, 7.0]), n)
    keep = np.zeros(n, dtype=bool)
    keep[5::128] = True
    eps, clamp = _prob_modes(mode.get("eps"), mode.get("log_clamp"))
    for weight in (None, w):
        ops = [_Elementwise(_binary.OP_BCE_PROB, a, t, weight=weight, reduction="sum", what="probabilities",
                            eps=eps, log_clamp=clamp) for a in (alone, mixed)]
        losses = [op.run(summed=False)[keep] for op in ops]
        assert losses[0].tobytes() == losses[1].tobytes(), (mode, weight is not None)
        grads = [xf.binary_cross_entropy_with_grad(a, t, weight, reduction="none", **mode)[1][keep]
                 for a in (alone, mixed)]
        assert grads[0].tobytes() == grads[1].tobytes(), (mode, weight is not None)


# ---- cross_entropy_from_probs ------------------------------------------------------------------------


@st.composite
def ce_prob_cases(draw, dtype):
    rows = draw(st.integers(1, 6))
    C = draw(st.sampled_from([1, 2, 3, 5, 8]))
    p = draw(unit_probabilities((rows, C), dtype))
    if draw(st.booleans()):
        # some rows normalised; the sum in float64, where 1e-300 keeps an all-zero row at 0 (in float32 the
        # floor rounds to 0 and 0/0 made that row NaN by accident)
        p = (p / np.maximum(p.sum(axis=1, keepdims=True, dtype=np.float64), 1e-300)).astype(dtype)
    if draw(st.integers(0, 5)) == 0:
        p[draw(st.integers(0, rows - 1)), draw(st.integers(0, C - 1))] = np.nan
    if draw(st.booleans()):
        t = draw(prob_targets((rows, C), dtype))
    else:
        t = draw(index_targets(C, rows, ignore_index=-100, argmax_of=p))
    w = draw(st.one_of(st.none(), class_weights(C, dtype)))
    eps = draw(st.sampled_from([None, None, 1e-7, 0.1]))
    return p, t, w, eps


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_ce_probs_rows_within_bound(dtype, data):
    p, t, w, eps = data.draw(ce_prob_cases(dtype))
    bound = BOUND[np.dtype(dtype)]
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, t, w, reduction="none", eps=eps)
    inputs = {"p": p, "target": t}
    assert_ulp_close(loss, ref.cross_entropy_from_probs(p, t, w, reduction="none", eps=eps), bound, inputs=inputs,
                     err_msg=f"eps={eps}")
    assert_ulp_close(grad, ref.cross_entropy_from_probs_grad(p, t, w, reduction="none", eps=eps), bound,
                     inputs=inputs, err_msg=f"eps={eps}")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@given(data=st.data())
def test_ce_probs_reductions_within_bound(dtype, reduction, data):
    p, t, w, eps = data.draw(ce_prob_cases(dtype))
    empty_mean = data.draw(st.sampled_from(["nan", "zero"]))
    g = data.draw(upstream_scalars(large=True))
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, t, w, reduction=reduction, eps=eps, grad_output=g,
                                                       empty_mean=empty_mean)
    assert_ulp_close(np.asarray(loss), ref.cross_entropy_from_probs(p, t, w, reduction=reduction, eps=eps,
                                                                    empty_mean=empty_mean),
                     4.0, dtype=dtype, inputs={"p": p, "target": t})
    assert_ulp_close(grad, ref.cross_entropy_from_probs_grad(p, t, w, reduction=reduction, eps=eps, grad_output=g,
                                                             empty_mean=empty_mean),
                     BOUND[np.dtype(dtype)] + 1, inputs={"p": p, "target": t})


def test_ce_probs_float32_gradient_when_the_mean_factor_rounds_to_zero():
    # grad_output 5e-324 over 2 rows rounds to 0 in double: every entry was lost, the infinite one of
    # 1/p at p = 0 included (-0 for -inf); float32 buffers now take the power-of-two lift there too
    p, t = np.array([[0.5], [0.0]], dtype=np.float32), np.array([0, 0])
    _, grad = xf.cross_entropy_from_probs_with_grad(p, t, reduction="mean", grad_output=5e-324)
    assert grad[1, 0] == -np.inf and grad[0, 0] == 0


def test_ce_probs_mean_with_nothing_to_average_has_a_zero_gradient():
    # even over a NaN row (the reference said NaN for a while: 0 times its NaN derivative)
    p, t, w = np.array([[np.nan], [0.5]]), np.array([0, 0]), np.array([0.0])
    _, grad = xf.cross_entropy_from_probs_with_grad(p, t, w, reduction="mean")
    assert (grad == 0).all()
    assert all(v == 0 for v in ref.cross_entropy_from_probs_grad(p, t, w, reduction="mean").ravel())


@pytest.mark.parametrize("factor", [np.nan, np.inf], ids=["nan", "inf"])
def test_a_non_finite_upstream_factor_leaves_entries_without_a_term_at_zero(factor):
    # README, special values: 0 where no term is left whatever grad_output is; elsewhere it multiplies
    # (NaN for NaN, the sign of the unit-factor gradient for inf).  CE from probabilities: classes without
    # target mass, a clipped target probability, ignored rows.
    p = np.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.5, 1e-9, 0.5], [0.2, 0.3, 0.5]])
    t = np.array([1, 2, 1, -100])
    no_term = np.ones(p.shape, bool)
    no_term[0, 1] = no_term[1, 2] = False
    for g, reduction in [(factor, "sum"), (np.full(4, factor), "none")]:
        got = xf.cross_entropy_from_probs_backward(g, p, t, reduction=reduction, eps=1e-7)
        want = np.where(no_term, 0.0, factor if factor != factor else -np.inf)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, np.array(ref.cross_entropy_from_probs_grad(
            p, t, reduction=reduction, eps=1e-7, grad_output=g), dtype=np.float64))
    # BCE from probabilities: a zero weight; p clipped (eps: both terms' logs are constant there) or its
    # only term's log clamped (log_clamp: log 1e-9 = -20.7 below -10, the other term without mass)
    p = np.array([0.3, 1e-9, 1 - 1e-9, 0.3, 0.3])
    w = np.array([0.0, 1.0, 1.0, 1.0, 1.0])
    for mode, y in ((dict(eps=1e-7), [1.0, 0.3, 0.8, 0.0, 0.6]), (dict(log_clamp=-10.0), [1.0, 1.0, 0.0, 0.0, 0.6])):
        y = np.array(y)
        got = xf.binary_cross_entropy_backward(factor, p, y, w, reduction="sum", **mode)
        assert (got[:3] == 0).all(), (mode, got)
        assert (np.isnan(got[3:]) if factor != factor else got[3:] == [np.inf, -np.inf]).all(), (mode, got)
        np.testing.assert_array_equal(got, np.array(ref.binary_cross_entropy_grad(
            p, y, w, reduction="sum", grad_output=factor, **mode), dtype=np.float64))


def test_ce_probs_special_values():
    p = np.array([[0.0, 1.0, 0.0], [0.5, np.nan, 0.5], [0.2, 0.3, 0.5]])
    loss, g = xf.cross_entropy_from_probs_with_grad(p, np.array([0, 2, -100]), reduction="none")
    assert loss[0] == np.inf and g[0, 0] == -np.inf and g[0, 1] == 0 and g[0, 2] == 0
    assert np.isnan(loss[1]) and np.isnan(g[1]).all()          # a NaN row is NaN, as in the softmax family
    assert loss[2] == 0 and (g[2] == 0).all()                   # ignored
    # a class without target mass contributes 0 even at p = 0
    t = np.array([[0.0, 1.0, 0.0]])
    assert xf.cross_entropy_from_probs(p[:1], t, reduction="none")[0] == 0


# ---- the Keras founding case: one formula, one answer ---------------------------------------------------


def _philox4x32_10(counter, key):
    m = 0xFFFFFFFF
    c, k = list(counter), list(key)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & m, p1 & m, ((p0 >> 32) ^ c[3] ^ k[1]) & m, p0 & m]
        k = [(k[0] + 0x9E3779B9) & m, (k[1] + 0xBB67AE85) & m]
    return c


def tf_random_uniform_after_set_seed_0(maxvals):
    """The float32 logits of `tf.random.set_seed(0); tf.random.uniform([4], 0, maxval)` (eager), called once
    per maxval in order: TF seeds each eager op with random.Random(global seed).randint(0, 2**31 - 1)
    (context._internal_operation_seed), runs Philox4x32-10 with key (global seed, 0) and counter
    (0, 0, op seed, 0), keeps 23 random mantissa bits of [1, 2) minus 1, and scales by maxval in float32."""
    rng = random.Random(0)
    out = []
    for maxval in maxvals:
        op_seed = rng.randint(0, 2**31 - 1) % (2**31 - 1)
        bits = _philox4x32_10([0, 0, op_seed, 0], [0, 0])
        u = np.array([(b & 0x7FFFFF) | (127 << 23) for b in bits], dtype=np.uint32).view(np.float32) - np.float32(1)
        out.append((u * np.float32(maxval)).astype(np.float32))
    return out


def test_keras_case_reproduced():
    # the StackOverflow answer in shared/seeds/003: y = [1, 0, 0, 0], logits uniform in [0, 1), [0, 10),
    # [0, 100); TF printed 1.50469065, 3.47569656, 68.0106506 from logits and 16.1180954 from clipped
    # probabilities (graph mode with the Softmax op hidden)
    x1, x10, x100 = tf_random_uniform_after_set_seed_0([1, 10, 100])
    y = np.array([0])
    from_logits = [xf.cross_entropy(x[None], y) for x in (x1, x10, x100)]
    assert from_logits[0] == np.float32(1.50469065)
    assert from_logits[2] == np.float32(68.0106506)
    # TF's 3.47569656 is 1 ULP below the exact value; xentfast returns the correctly rounded one
    assert_ulp_close(np.asarray(from_logits[1]), ref.cross_entropy(x10[None], y), 0.5)
    assert abs(int(np.float32(3.47569656).view(np.int32)) - int(from_logits[1].view(np.int32))) == 1
    assert_ulp_close(np.asarray(from_logits[2]), ref.cross_entropy(x100[None], y), 0.5)

    p = xf.softmax(x100[None])             # float32 probabilities; p_y = 2.9e-30 is still representable
    keras_clip = xf.cross_entropy_from_probs(p, y, eps=1e-7)
    assert keras_clip == np.float32(16.1180954) == np.float32(-np.log(1e-7))
    # one formula: from the same probabilities without clipping, the logits' answer (p_y rounded to float32
    # costs 2^-24 relative in p, 6e-8 absolute in the loss: below one float32 ULP of 68)
    exact_from_p = xf.cross_entropy_from_probs(p, y)
    assert abs(int(exact_from_p.view(np.int32)) - int(from_logits[2].view(np.int32))) <= 1
    # and the gradient of the clipped loss is 0: training from clipped probabilities stalls here
    assert (xf.cross_entropy_from_probs_backward(1.0, p, y, eps=1e-7) == 0).all()


# ---- torch semantics on ordinary inputs ----------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", ["none", "C", "full"])
@pytest.mark.parametrize("targets", ["hard", "soft"])
def test_bce_probs_agrees_with_torch(reduction, weighted, targets):
    torch = _torch()
    rng = np.random.default_rng(len(reduction) * 7 + len(weighted) * 3 + len(targets))
    p = rng.uniform(0.01, 0.99, (7, 5))
    t = rng.random((7, 5))
    if targets == "hard":
        t = np.round(t)
    w = {"none": None, "C": rng.random(5) + 0.1, "full": rng.random((7, 5))}[weighted]
    pt = torch.tensor(p, requires_grad=True)
    want = torch.nn.functional.binary_cross_entropy(pt, torch.tensor(t), weight=None if w is None else torch.tensor(w),
                                                    reduction=reduction)
    want.sum().backward()
    for mode in (dict(), dict(log_clamp=-100.0)):
        loss, grad = xf.binary_cross_entropy_with_grad(p, t, w, reduction=reduction, **mode)
        np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(grad, pt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_torch_log_clamp_forward_matches_and_gradient_is_the_derivative():
    torch = _torch()
    p = np.array([0.0, 1e-50, 1.0, 1 - 1e-16, 0.3])
    y = np.array([1.0, 1.0, 0.0, 0.0, 1.0])
    pt = torch.tensor(p, requires_grad=True)
    want = torch.nn.functional.binary_cross_entropy(pt, torch.tensor(y), reduction="none")
    want.sum().backward()
    loss, grad = xf.binary_cross_entropy_with_grad(p, y, reduction="none", log_clamp=-100.0)
    np.testing.assert_array_equal(loss, want.detach().numpy())
    # torch's backward, (p - y)/max(p(1-p), 1e-12), is not the derivative of its clamped forward
    assert grad[1] == 0 and pt.grad.numpy()[1] != 0
    np.testing.assert_allclose(grad[4], pt.grad.numpy()[4], rtol=1e-15)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("layout", ["2d", "ncd"])
def test_ce_probs_agrees_with_nll_loss_of_log(reduction, weighted, layout):
    torch = _torch()
    rng = np.random.default_rng(len(reduction) + 10 * weighted + 100 * len(layout))
    C = 6
    shape = (9, C) if layout == "2d" else (4, C, 3)
    logits = rng.standard_normal(shape) * 2
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    batch = tuple(s for i, s in enumerate(shape) if i != 1)
    y = rng.integers(0, C, size=batch)
    y.reshape(-1)[::4] = -100
    w = rng.random(C) + 0.1 if weighted else None
    pt = torch.tensor(p, requires_grad=True)
    want = torch.nn.functional.nll_loss(torch.log(pt), torch.tensor(y), weight=None if w is None else torch.tensor(w),
                                        reduction=reduction)
    want.sum().backward()
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, y, w, reduction=reduction, axis=1)
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(grad, pt.grad.numpy(), rtol=1e-12, atol=1e-15)
    # probability targets: torch's cross_entropy formula applied to log p
    t = rng.random(shape)
    t /= t.sum(axis=1, keepdims=True)
    ww = torch.ones(C, dtype=torch.float64) if w is None else torch.tensor(w)
    per = -(ww.reshape((1, C) + (1,) * (len(shape) - 2)) * torch.tensor(t) * torch.log(torch.tensor(p))).sum(1)
    want_p = {"none": per, "mean": per.mean(), "sum": per.sum()}[reduction]
    np.testing.assert_allclose(xf.cross_entropy_from_probs(p, t, w, reduction=reduction, axis=1),
                               want_p.numpy(), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ce_probs_reads_a_negative_zero_probability_as_zero_where_torch_takes_its_sign(dtype):
    # the README's difference: p = -0.0 is a probability of 0 (loss +inf, gradient -inf, the one-sided
    # derivative), where torch's nll_loss(log p) backward divides by the -0.0 itself and gives +inf
    torch = _torch()
    p = np.array([[-0.0, 0.5, 0.5], [0.0, 0.5, 0.5], [0.25, -0.0, 0.75]], dtype=dtype)
    y = np.array([0, 0, 0])
    for targets in (y, np.eye(3, dtype=dtype)[y]):
        loss, grad = xf.cross_entropy_from_probs_with_grad(p, targets, reduction="none")
        assert (loss[:2] == np.inf).all() and np.isfinite(loss[2]), loss
        assert grad[0, 0] == grad[1, 0] == -np.inf, grad
        # a -0.0 without target mass has no term: gradient 0, as at +0.0
        assert grad[2, 1] == 0 and (grad[:2, 1:] == 0).all(), grad
        assert loss.dtype == grad.dtype == dtype
    pt = torch.tensor(p, requires_grad=True)
    torch.nn.functional.nll_loss(torch.log(pt), torch.tensor(y), reduction="sum").backward()
    assert pt.grad[0, 0] == np.inf and pt.grad[1, 0] == -np.inf


# ---- determinism, fused vs separate ----------------------------------------------------------------------

THREADS = [1, 2, 3, 8]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thread_count_does_not_change_bits(dtype):
    rng = np.random.default_rng(9)
    p = rng.random((3000, 70)).astype(dtype)       # 210000 elements: 8 threads really start
    p[::7, ::3] = 0.0
    t = rng.random((3000, 70)).astype(dtype)
    y = rng.integers(0, 70, 3000)
    y[::11] = -100
    w = rng.random(70) + 0.2
    calls = [
        lambda nt, red: xf.binary_cross_entropy_with_grad(p, t, w, reduction=red, eps=1e-7, n_threads=nt),
        lambda nt, red: xf.binary_cross_entropy_with_grad(p, t, reduction=red, log_clamp=-100.0, n_threads=nt),
        lambda nt, red: xf.cross_entropy_from_probs_with_grad(p, y, w, reduction=red, n_threads=nt),
        lambda nt, red: xf.cross_entropy_from_probs_with_grad(p, t, w, reduction=red, eps=0.01, n_threads=nt),
    ]
    for f in calls:
        for red in ("none", "mean"):
            base = f(1, red)
            for nt in THREADS[1:]:
                loss, grad = f(nt, red)
                assert np.array_equal(loss, base[0], equal_nan=True)
                assert np.array_equal(grad, base[1], equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_fused_equals_separate(dtype):
    rng = np.random.default_rng(10)
    p = rng.random((64, 33)).astype(dtype)
    p[3, 4] = 0.0
    t = rng.random((64, 33)).astype(dtype)
    y = rng.integers(0, 33, 64)
    for red in ("none", "mean", "sum"):
        go = np.ones(p.shape, dtype) if red == "none" else 1.0
        loss, grad = xf.binary_cross_entropy_with_grad(p, t, reduction=red)
        assert np.array_equal(loss, xf.binary_cross_entropy(p, t, reduction=red), equal_nan=True)
        assert np.array_equal(grad, xf.binary_cross_entropy_backward(go, p, t, reduction=red), equal_nan=True)
        go = np.ones(64, dtype) if red == "none" else 1.0
        loss, grad = xf.cross_entropy_from_probs_with_grad(p, y, reduction=red)
        assert np.array_equal(loss, xf.cross_entropy_from_probs(p, y, reduction=red), equal_nan=True)
        assert np.array_equal(grad, xf.cross_entropy_from_probs_backward(go, p, y, reduction=red), equal_nan=True)
    pi = p.copy()
    _, g = xf.cross_entropy_from_probs_with_grad(pi, y, inplace=True)
    assert g is pi and np.array_equal(pi, xf.cross_entropy_from_probs_backward(1.0, p, y))


# ---- bad input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("C", [15, 65, 300])
def test_rows_of_subnormal_masses_within_bound(C):
    """Each term w_c t_c (-log p_c) is rounded before the row's sum; where every term lies below the normal
    range that rounding is on the subnormal grid, up to C/2 of the row loss's ULP (10.2 at 300 classes of
    mass 4.45e-311).  Such rows are summed again 2^1200 larger (binary.h, xf_bin_ce_tiny_mass)."""
    bound = BOUND[np.dtype(np.float64)]
    p = np.full((4, C), 1.0 / C)
    p[1] = np.linspace(1.0, 2.0, C)
    p[1] /= p[1].sum()
    t = np.full((4, C), 4.45e-311)
    t[2] = 3e-320
    t[3] = 0.0                                   # padding rows (no mass) stay 0
    for kw in (dict(), dict(weight=np.linspace(0.25, 4.0, C)), dict(weight=np.full(C, 1e-5))):
        loss, _ = xf.cross_entropy_from_probs_with_grad(p, t, reduction="none", **kw)
        exact = ref.cross_entropy_from_probs(p, t, reduction="none", **kw)
        assert_ulp_close(loss, exact, bound, err_msg=f"C={C}, {kw}")
        assert loss[3] == 0.0
        assert xf.cross_entropy_from_probs(p, t, reduction="none", **kw).tobytes() == loss.tobytes()
        for reduction in ("sum", "mean"):
            assert_ulp_close(xf.cross_entropy_from_probs(p, t, reduction=reduction, **kw),
                             ref.cross_entropy_from_probs(p, t, reduction=reduction, **kw), bound,
                             err_msg=f"C={C}, {kw}, {reduction}")


P = np.full((3, 4), 0.25)
T = np.full((3, 4), 0.5)


def raises(exc, *words):
    import re
    return pytest.raises(exc, match=".*".join(re.escape(w) for w in words))


class TestBadInput:
    @pytest.mark.parametrize("bad", [1.5, -0.25, -np.inf])
    def test_probability_out_of_range(self, bad):
        p = P.copy()
        p[1, 2] = bad
        with raises(ValueError, "input", "probabilities must be in [0, 1]", "at index [1, 2]"):
            xf.binary_cross_entropy(p, T)
        with raises(ValueError, "input", "probabilities", "[1, 2]"):
            xf.cross_entropy_from_probs(p, np.array([0, 1, 2]))

    @pytest.mark.parametrize("dtype", DTYPES, ids=ids)
    @pytest.mark.parametrize("n", [1, 7, 9, 65535, 65537, 200003])
    def test_range_pass_finds_every_value_outside(self, dtype, n):
        """The probability and target checks start with one vectorized parallel pass (_binary.unit_targets;
        its float64 loop counts the values outside [0, 1] in double): a single value just outside, a
        negative subnormal, an infinity or a NaN (which the pass rejects and the NumPy test lets through) at
        the first, a block-boundary and the last position is found, on one thread and on two, and -0.0 and
        1.0 pass."""
        from xentfast._core import _binary

        tiny = float(np.finfo(dtype).smallest_subnormal)
        for bad in (float(np.nextafter(dtype(1.0), dtype(2.0))), -tiny, np.inf, -np.inf, np.nan):
            for where in sorted({0, min(65536, n - 1), n - 1}):
                a = np.full(n, 0.5, dtype)
                a[-1] = 1.0
                a[0] = -0.0
                a[where] = bad
                want = bool(((a >= 0) & (a <= 1)).all())
                assert want is False
                for n_threads in (1, 2):
                    assert _binary.unit_targets(a, n_threads) is False, (bad, where, n_threads)
                if np.isnan(bad):
                    continue    # NaN propagates (the NumPy test after the pass)
                with raises(ValueError, "probabilities must be in [0, 1]", f"at index [{where}]"):
                    xf.binary_cross_entropy(a, np.zeros(n, dtype), reduction="none", n_threads=2)
        ok = np.full(n, 0.5, dtype)
        ok[0], ok[-1] = -0.0, 1.0
        assert _binary.unit_targets(ok, 1) is True and _binary.unit_targets(ok, 2) is True

    def test_integer_probabilities(self):
        with raises(TypeError, "input", "probabilities", "int64"):
            xf.binary_cross_entropy(np.zeros((3, 4), dtype=np.int64), T)

    @pytest.mark.parametrize("eps", [-0.1, 0.6, np.nan])
    def test_eps(self, eps):
        with raises(ValueError, "eps"):
            xf.binary_cross_entropy(P, T, eps=eps)
        with raises(ValueError, "eps"):
            xf.cross_entropy_from_probs(P, np.array([0, 1, 2]), eps=eps)

    @pytest.mark.parametrize("c", [1.0, np.nan, -np.inf])
    def test_log_clamp(self, c):
        with raises(ValueError, "log_clamp", "-100"):
            xf.binary_cross_entropy(P, T, log_clamp=c)

    def test_eps_and_log_clamp(self):
        with raises(ValueError, "eps and log_clamp"):
            xf.binary_cross_entropy(P, T, eps=1e-7, log_clamp=-100.0)

    def test_target_range_and_shape(self):
        t = T.copy()
        t[0, 3] = 2.0
        with raises(ValueError, "target", "[0, 1]", "found 2.0 at index [0, 3]"):
            xf.binary_cross_entropy(P, t)
        with raises(ValueError, "target", "(3, 4)"):
            xf.binary_cross_entropy(P, T[:2])

    def test_ce_probs_target_and_weight(self):
        with raises(ValueError, "target", "[0, 4)", "found 7 at index [1]"):
            xf.cross_entropy_from_probs(P, np.array([0, 7, 1]))
        with raises(ValueError, "weight", "(4,)"):
            xf.cross_entropy_from_probs(P, np.array([0, 1, 1]), weight=np.ones(3))
        with raises(ValueError, "input", "0-d"):
            xf.cross_entropy_from_probs(np.float64(0.5), np.int64(0))

    def test_weight(self):
        with raises(ValueError, "weight", "finite and >= 0", "at index [1]"):
            xf.binary_cross_entropy(P, T, weight=np.array([1.0, -1.0, 1.0, 1.0]))

    def test_nan_policy(self):
        p = P.copy()
        p[2, 0] = np.nan
        with raises(ValueError, "input", "NaN", "[2, 0]"):
            xf.binary_cross_entropy(p, T, nan_policy="raise")
        with raises(ValueError, "input", "NaN probability in row [2] at class 0"):
            xf.cross_entropy_from_probs(p, np.array([0, 1, 2]), nan_policy="raise")
        # an ignored row's loss and gradient are 0 whatever it holds: its NaN is no reason to raise
        loss = xf.cross_entropy_from_probs(p, np.array([0, 1, -100]), nan_policy="raise")
        assert loss == xf.cross_entropy_from_probs(P, np.array([0, 1, -100]))


# ---- failures found by the adversarial search, pinned --------------------------------------------------


@pytest.mark.parametrize("p, t, w, reduction", [
    ([1e-30, 0.0], [1.0, 0.0], 5e-324, "none"),        # subnormal weight over a tiny p: all bits kept
    ([0.875], [0.75], 2.22507386e-313, "none"),
    ([0.0], [1.0], 5e-324, "mean"),                     # inf times a subnormal weight is still inf
], ids=["subnormal-weight-tiny-p", "subnormal-weight", "inf-loss-subnormal-weight"])
def test_pinned_bce_prob_cases(p, t, w, reduction):
    p, t = np.array(p), np.array(t)
    kw = dict(weight=np.array(w), reduction=reduction)
    loss, grad = xf.binary_cross_entropy_with_grad(p, t, grad_output=None if reduction == "none" else 0.5, **kw)
    assert_ulp_close(np.asarray(loss), ref.binary_cross_entropy(p, t, **kw), 4.0, dtype=np.float64)
    exact, scale = ref.binary_cross_entropy_grad(p, t, return_scale=True,
                                                 grad_output=None if reduction == "none" else 0.5, **kw)
    assert_ulp_close(grad, exact, 4.0 if reduction == "none" else 5.0, scale=scale)


def test_pinned_ce_probs_mean_over_subnormal_weights():
    # grad_output / sum(w_y) overflows, every w_y / sum(w_y) <= 1: the gradient is -3 / p_y, finite
    p = np.array([[1.0, 0.0]])
    y = np.array([0])
    w = np.array([2.22507386e-311, 2.22507386e-311])
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, y, w, grad_output=3.0)
    assert loss == 0.0 and grad[0, 0] == -3.0 and grad[0, 1] == 0.0
    assert_ulp_close(grad, ref.cross_entropy_from_probs_grad(p, y, w, grad_output=3.0), 5.0)


@pytest.mark.parametrize("w0, p0", [(1e-310, 1e-310), (5e-324, 5e-324), (1e-310, 0.25), (2e-308, 1e-309)])
def test_pinned_ce_probs_mean_gradient_of_a_subnormal_weight(w0, p0):
    # sum(w_y) is ordinary (3): -w_y / (sum(w_y) p_y) was taken from the fold w_y / sum(w_y), a subnormal
    # rounded once before 1 / p_y magnified it (1e-310 / 3 under p = 1e-310: 230 ULP off -1/3)
    p = np.array([[p0, 1.0 - p0], [0.5, 0.5], [0.5, 0.5]])
    y = np.array([0, 1, 1])
    w = np.array([w0, 1.5])
    for grad_output in (None, 0.5):
        kw = dict(weight=w, grad_output=grad_output)
        _, grad = xf.cross_entropy_from_probs_with_grad(p, y, **kw)
        assert_ulp_close(grad, ref.cross_entropy_from_probs_grad(p, y, **kw), 5.0)


@pytest.mark.parametrize("case", ["bce-sum-subnormal-terms", "ce-mean-subnormal-denominator"])
def test_pinned_reductions_of_subnormal_terms(case):
    # each term rounded onto the subnormal grid: ten of them summed (4.0015 ULP), or one divided by a
    # subnormal denominator (6.2 ULP) -- the reduction now reruns with the terms scaled by 2^600
    if case == "bce-sum-subnormal-terms":
        p, t, w = np.zeros((2, 5)), np.zeros((2, 5)), np.array(2.22507386e-313)
        got = xf.binary_cross_entropy(p, t, w, reduction="sum", eps=1e-7)
        want = ref.binary_cross_entropy(p, t, w, reduction="sum", eps=1e-7)
    else:
        p, y, w = np.array([[0.0]]), np.array([0]), np.array([2.22507386e-311])
        got = xf.cross_entropy_from_probs(p, y, w, eps=1e-7)
        want = ref.cross_entropy_from_probs(p, y, w, eps=1e-7)
    assert_ulp_close(np.asarray(got), want, 1.0, dtype=np.float64)


def test_the_reference_clips_at_a_tiny_eps_exactly():
    # at the reference's working precision 1 - 1e-300 rounds to 1, and the clipped log(1 - p) was log 0
    p = np.array([1.0, 1e-310, 0.999, 0.5])
    y = np.full(4, 0.3)
    exact = ref.binary_cross_entropy(p, y, eps=1e-300, reduction="none")
    assert all(np.isfinite(float(v)) for v in exact)
    assert_ulp_close(xf.binary_cross_entropy(p, y, eps=1e-300, reduction="none"), exact, BOUND[np.dtype(np.float64)])


@pytest.mark.parametrize("c", [-100.0, -0.5, -1e-17, -36.8, -744.0, -1e-80, -1e-300, -5e-324])
def test_log_clamp_decides_on_the_exact_log(c):
    # the two doubles on either side of e^c (log p against c) and of 1 - e^c (log(1 - p) against c): the
    # rounded log can land on the wrong side of c within an ulp of it, where the derivative jumps from
    # 1/p to 0 (p = e^-100 less an ulp: -2.7e43 where it is 0).  The reference decides it exactly too:
    # for c = -1e-300 its log1p(-p) at p = -c, rounded, had equalled c and left the term live
    from xentfast.api_binary import _clamp_thresholds
    lo, hi = _clamp_thresholds(c)
    p = np.array([np.nextafter(lo, 0), lo, np.nextafter(lo, 1), np.nextafter(hi, 0), hi, np.nextafter(hi, 1)])
    p = np.clip(p, 0.0, 1.0)
    for y in (np.ones(6), np.zeros(6), np.full(6, 0.25)):
        loss, grad = xf.binary_cross_entropy_with_grad(p, y, reduction="none", log_clamp=c)
        assert_ulp_close(loss, ref.binary_cross_entropy(p, y, reduction="none", log_clamp=c), 4.0)
        exact, scale = ref.binary_cross_entropy_grad(p, y, reduction="none", log_clamp=c, return_scale=True)
        assert_ulp_close(grad, exact, 4.0, scale=scale, inputs={"p": p, "y": y})
    with mpmath.workprec(300):   # the thresholds themselves, against the exact logs
        assert mpmath.log(lo) >= c and (lo == 5e-324 or mpmath.log(np.nextafter(lo, 0)) < c)
    with mpmath.workprec(1200):  # log(1 - p) < c iff p > 1 - e^c, which lies c^2/2 below -c (~2^-1075 of it)
        one_minus = -mpmath.expm1(c)
        assert mpmath.mpf(hi) <= one_minus < mpmath.mpf(np.nextafter(hi, 1))


def test_the_subnormal_factor_lift_stays_exact_where_it_cannot_apply():
    # a tiny weight that would lose bits under 2^-k keeps the rounded g / n (exact here: n = 1), and
    # cross_entropy_from_probs with a weight above 2^969 on a subnormal probability is not lifted (the
    # lifted entry, 2^-1022 * 1e300 / 5e-324, would overflow)
    _, g = xf.binary_cross_entropy_with_grad(np.array([5e-324]), np.array([1.0]), weight=np.array([1e-301]),
                                             grad_output=5e-324)
    assert g[0] == -1e-301
    _, g = xf.cross_entropy_from_probs_with_grad(np.array([[5e-324, 1.0]]), np.array([0]),
                                                 weight=np.array([1e300, 1.0]), reduction="sum",
                                                 grad_output=5e-324)
    assert g[0, 0] == -1e300 and g[0, 1] == 0
    # weights that cannot take 2^-k: the float64 gradient takes it after the kernel (1.7e7 ULP before)
    p3, w3 = np.full(3, 5e-324), np.full(3, 3.3e-300)
    _, g = xf.binary_cross_entropy_with_grad(p3, np.ones(3), weight=w3, grad_output=5e-324)
    assert_ulp_close(g, ref.binary_cross_entropy_grad(p3, np.ones(3), weight=w3, grad_output=5e-324), 5.0)
    # g / n below half the smallest subnormal and no lift (float32): p = 0 < y keeps its -inf, not 0
    for dtype in (np.float64, np.float32):
        _, g = xf.binary_cross_entropy_with_grad(np.array([np.nan, 0.0], dtype), np.ones(2, dtype),
                                                 np.array(5e-324), grad_output=5e-324)
        assert np.isnan(g[0]) and g[1] == -np.inf
    # probability targets may exceed 1: the mass, not the weight, bounds the lifted entry
    _, g = xf.cross_entropy_from_probs_with_grad(np.array([[5e-324, 1.0]]), np.array([[2.0**1000, 0.0]]),
                                                 reduction="sum", grad_output=5e-324)
    exact = ref.cross_entropy_from_probs_grad(np.array([[5e-324, 1.0]]), np.array([[2.0**1000, 0.0]]),
                                              reduction="sum", grad_output=5e-324)
    assert_ulp_close(g, exact, 5.0)
