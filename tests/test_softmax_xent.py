"""The accuracy contract of the softmax family, measured against the mpmath reference on adversarial inputs.

Bounds (README table): per-row loss, log_softmax, logsumexp, softmax and index-target gradients
<= 2 ULP (float32) / <= 4 ULP (float64); soft-target / smoothing / z-loss gradients the same in units of
ulp(|p_j A| + |q_j|); mean and sum <= 4 ULP.  Gradients are compared with the exact derivative, never
with finite differences (the founding Paddle bug hid behind a loose finite-difference tolerance).
"""
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

import xentfast as xf
from xentfast import reference as ref
from xentfast._core import _xent
from xentfast.testing import XentCase, assert_ulp_close, logits, softmax_xent_cases, upstream_scalars

BOUND = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}
REDUCED_BOUND = 4.0
DTYPES = [np.float32, np.float64]


def _kwargs(case):
    return dict(weight=case.weight, ignore_index=case.ignore_index, label_smoothing=case.label_smoothing,
                z_loss=case.z_loss)


def _is_simple(case):
    """Index target, no smoothing, no z-loss: the gradient bound is relative, entry by entry."""
    return case.target.dtype.kind in "iu" and case.label_smoothing == 0 and case.z_loss == 0


def _check_rows(case, dtype):
    kw = _kwargs(case)
    x, t = case.logits, case.target
    bound = BOUND[np.dtype(dtype)]
    inputs = {"logits": x, "target": t}
    loss, grad = xf.cross_entropy_with_grad(x, t, reduction="none", **kw)
    exact_loss = ref.cross_entropy(x, t, reduction="none", **kw)
    assert_ulp_close(loss, exact_loss, bound, inputs=inputs, err_msg=f"per-row loss, options {kw}")
    exact_grad, scale = ref.cross_entropy_grad(x, t, reduction="none", return_scale=True, **kw)
    assert_ulp_close(grad, exact_grad, bound, scale=None if _is_simple(case) else scale, inputs=inputs,
                     err_msg=f"gradient, options {kw}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_row_loss_and_gradient_within_bound(dtype, data):
    _check_rows(data.draw(softmax_xent_cases(dtype)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@settings(max_examples=25)
@given(data=st.data())
def test_rows_of_several_chunks_within_bound(dtype, data):
    """Rows of 65-200 classes: the loss-terms pass makes whole 64-class chunks in a vectorized loop and
    redoes a chunk holding a rare element one element at a time (softmax_rows.h); the rows above stay
    within one chunk."""
    _check_rows(data.draw(softmax_xent_cases(dtype, min_classes=65, max_classes=200, max_rows=3)), dtype)


# Rows past the short-row groups (256 classes) and past one block (XF_BLOCK = 4096 classes: the row is
# cut into blocks whose maxima and sums are merged, and many-block rows run as per-block tasks)
LONG_ROW_CLASSES = [(257, 300), (4095, 4100), (8191, 8200)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("classes", LONG_ROW_CLASSES, ids=lambda c: f"C{c[0]}-{c[1]}")
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_long_rows_within_bound(dtype, classes, data):
    _check_rows(data.draw(softmax_xent_cases(dtype, min_classes=classes[0], max_classes=classes[1], max_rows=2)),
                dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("classes", LONG_ROW_CLASSES, ids=lambda c: f"C{c[0]}-{c[1]}")
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_long_rows_of_the_softmax_family_within_bound(dtype, classes, data):
    x = data.draw(logits(dtype, min_classes=classes[0], max_classes=classes[1], max_rows=2, allow_nan=True,
                         allow_posinf=True))
    bound = BOUND[np.dtype(dtype)]
    assert_ulp_close(xf.log_softmax(x), ref.log_softmax(x), bound, inputs={"x": x}, err_msg="log_softmax")
    assert_ulp_close(xf.softmax(x), ref.softmax(x), bound, inputs={"x": x}, err_msg="softmax")
    assert_ulp_close(xf.logsumexp(x), ref.logsumexp(x), bound, inputs={"x": x}, err_msg="logsumexp")


@pytest.mark.parametrize("C", [2, 300, 5000], ids=["short-row-group", "row", "blocks"])
def test_float32_kept_exponentials_under_a_huge_factor(C):
    # the sum pass once kept float32 exp(x_j - m) 2^64 in the buffer, on float32's subnormal grid below
    # e^-131.7; a factor past 2^62 magnified that to 1e7 ULP (+7.2e-36 came out 0).  The exponentials are
    # kept as doubles now (softmax_rows.h xf_stored_entry), and these rows stay pinned
    x = np.zeros((3, C), np.float32)
    x[0, 1:], x[1, 1:], x[2, 1:] = -150.0, -140.0, -np.linspace(100.0, 160.0, C - 1)
    y = np.array([0, 0, 0])
    w = np.ones(C, np.float32)
    w[0] = 1e30
    grad = xf.cross_entropy_with_grad(x, y, weight=w, reduction="none")[1]
    assert_ulp_close(grad, ref.cross_entropy_grad(x, y, weight=w, reduction="none"), BOUND[np.dtype(np.float32)])
    g = np.full(3, 1e25, np.float32)
    grad = xf.cross_entropy_backward(g, x, y, reduction="none")
    assert_ulp_close(grad, ref.cross_entropy_grad(x, y, reduction="none", grad_output=g.astype(np.float64)),
                     BOUND[np.dtype(np.float32)] + 1)


# Where each float32 index-target row's gradient is formed: 8 rows side by side, the row kernel (its
# exponentials kept in the thread's scratch row), long rows streamed out during the next row, a row split
# into per-block tasks (fewer rows than threads), and the logits' own buffer (inplace).
ROUNDED_ONCE_LAYOUTS = {
    "short-row-group": dict(rows=64, classes=10),
    "group-200": dict(rows=16, classes=200),
    "row": dict(rows=8, classes=1000),
    "row-inplace": dict(rows=8, classes=1000, inplace=True),
    "streamed": dict(rows=4, classes=5000, n_threads=2),
    "streamed-inplace": dict(rows=4, classes=5000, n_threads=2, inplace=True),
    # one row on two threads, long enough for the (row, block) split of a fused float32 call (_use_phased)
    "phased": dict(rows=1, classes=70000, n_threads=2),
}


def _float32_layout(layouts, layout, seed):
    """(x, y, keyword arguments) of a layout: float32 logits 4 N(0, 1) and index targets."""
    spec = dict(layouts[layout])
    rows, classes = spec.pop("rows"), spec.pop("classes")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, classes)) * 4.0).astype(np.float32)
    return x, rng.integers(0, classes, rows), spec


@pytest.mark.parametrize("layout", list(ROUNDED_ONCE_LAYOUTS))
def test_float32_gradient_is_rounded_once(cpu_path_back, layout):
    # Every float32 gradient entry but the target's is (e_j * coef_per_S) * coef_mult in double, rounded
    # once to float: e_j within ~2^-32 relative (the float32 exponential), coef / S within half a double
    # ULP, so the entry is within 0.5 + ~0.005 float ULP of the exact p_j.  Until 2026-12-04 e_j was kept as
    # a float between the passes, a second rounding: up to ~1 ULP, a quarter of the entries one ULP off.
    # Same on every CPU path (the paths must agree bit for bit anyway, tests/test_dispatch.py).
    x, y, spec = _float32_layout(ROUNDED_ONCE_LAYOUTS, layout, 5)
    exact = ref.cross_entropy_grad(x, y, reduction="sum")
    for path in cpu_path_back.available_cpu_paths():
        cpu_path_back.set_cpu_path(path)
        xin = x.copy()
        grad = xf.cross_entropy_with_grad(xin, y, reduction="sum", **spec)[1]
        assert_ulp_close(grad, exact, 0.51, inputs={"logits": x}, err_msg=f"{layout}, {path} path")


# Where a float32 softmax row is formed: 8 rows side by side, the gradient's row kernel, long rows
# written during the next row's sum pass (into new pages, ordinary stores; into mapped ones, streaming)
SOFTMAX_LAYOUTS = {
    "short-row-group": dict(rows=64, classes=10),
    "group-150": dict(rows=16, classes=150),
    "row": dict(rows=8, classes=1000),
    "streamed": dict(rows=6, classes=5000, n_threads=2),
    "streamed-long": dict(rows=3, classes=33000, n_threads=2),
    # one row on two threads, long enough for the (row, block) split of float32 softmax (49152 entries
    # per thread, _softmax_family_phased), of log_softmax, and of the gradient they are compared with
    "phased": dict(rows=1, classes=100000, n_threads=2),
}


@pytest.mark.parametrize("layout", list(SOFTMAX_LAYOUTS))
def test_float32_softmax_is_the_gradient_of_a_row_without_a_target(cpu_path_back, layout):
    # softmax runs as the cross-entropy gradient of a row without a target under a factor of 1
    # (_xent.pyx _softmax_family_row): p_j = e_j * (1 / S) in double, rounded once, so within 0.5 + ~0.005
    # float ULP of the exact p_j, and bit for bit the gradient entries of reduction="sum" off the target.
    # Until 2026-12-05 softmax kept e_j as a float (scaled by 2^64) between its passes: two roundings, up
    # to ~1 ULP.  Every CPU path, both kinds of stores.
    x, y, spec = _float32_layout(SOFTMAX_LAYOUTS, layout, 6)
    off_target = np.ones(x.shape, dtype=bool)
    off_target[np.arange(x.shape[0]), y] = False
    exact = ref.softmax(x)
    for path in cpu_path_back.available_cpu_paths():
        cpu_path_back.set_cpu_path(path)
        for stores in ("streaming", "ordinary"):
            cpu_path_back.set_output_stores(stores)
            p = xf.softmax(x, **spec)
            assert_ulp_close(p, exact, 0.51, inputs={"logits": x}, err_msg=f"{layout}, {path} path")
            grad = xf.cross_entropy_with_grad(x, y, reduction="sum", **spec)[1]
            assert p[off_target].tobytes() == grad[off_target].tobytes(), (layout, path, stores)


LOG_SOFTMAX_LAYOUTS = dict(SOFTMAX_LAYOUTS, **{"group-200": dict(rows=16, classes=200)})


@pytest.mark.parametrize("layout", list(LOG_SOFTMAX_LAYOUTS))
def test_float32_log_softmax_is_rounded_once_and_is_the_negated_row_loss(cpu_path_back, layout):
    # float32 log_softmax is (x_j - m) - log S in plain double (numerics.h xf_log_prob_single): both terms
    # <= 0, so within 0.5 + ~2^-26 float ULP of the exact value.  Wherever x_j - m is exact in double (the
    # exponents of x_j and m < 29 apart; asserted below for the targets) it has the bits of the loss's
    # TwoSum form, so log_softmax at the target is minus the reduction="none" loss, bit for bit.  Groups
    # (up to 256 classes on the avx512 path, 128 on avx2) and the row path; rows with -inf entries take
    # their general forms.
    x, y, spec = _float32_layout(LOG_SOFTMAX_LAYOUTS, layout, 7)
    x[1::3, 1::2] = -np.inf
    y[1::3] = 0
    exact = ref.log_softmax(x)
    rows = np.arange(x.shape[0])
    m = x.max(axis=1)
    assert all(Fraction(float(a)) - Fraction(float(b)) == Fraction(float(np.float64(a) - np.float64(b)))
               for a, b in zip(x[rows, y], m))
    for path in cpu_path_back.available_cpu_paths():
        cpu_path_back.set_cpu_path(path)
        logp = xf.log_softmax(x, **spec)
        assert_ulp_close(logp, exact, 0.51, inputs={"logits": x}, err_msg=f"{layout}, {path} path")
        loss = xf.cross_entropy(x, y, reduction="none", **spec)
        assert logp[rows, y].tobytes() == (-loss).tobytes(), (layout, path)


def test_streamed_rows_whose_coefficient_carries_a_power_of_two():
    # a long float64 row's gradient goes out pending (softmax_rows.h xf_pending_values), which leaves out
    # the coefficient's power of two where it is 1; here weight times upstream factor overflows a double,
    # so the coefficient carries 2^1000 apart (xf_rowjob_finish) and the product must stay in
    rng = np.random.default_rng(8)
    C = 2 * 2048 + 5
    x = rng.standard_normal((4, C)) * 3.0
    y = np.array([0, 7, C - 1, 2048])
    w = np.ones(C)
    w[y] = 1e300
    g = np.array([1e10, 50.0, -1e9, 2.0])
    got = xf.cross_entropy_backward(g, x, y, weight=w, reduction="none", n_threads=2)
    exact = ref.cross_entropy_grad(x, y, weight=w, reduction="none", grad_output=g)
    # rows 0 and 2: entries past DBL_MAX where p_j is large, most of them finite beyond 1e300
    assert (np.isfinite(got[[0, 2]]) & (np.abs(got[[0, 2]]) > 1e300)).mean() > 0.5
    assert_ulp_close(got, exact, BOUND[np.dtype(np.float64)], inputs={"logits": x})


def _case(x, t, dtype, weight=None, eps=0.0, z=0.0):
    return XentCase(np.array(x, dtype=dtype), np.array(t), weight, eps, -100, z)


# every failure the search above found once, pinned (the fix named in each id)
FIXED_FAILURES = [
    pytest.param(_case([[-np.inf, 0.0]], np.array([[1.0, 0.0]], np.float32), np.float32),
                 id="inf-term-in-compensated-sum"),
    pytest.param(_case([[1.7976931348623157e308] * 2], [0], np.float64, z=1.0), id="z-loss-coef-overflow"),
    pytest.param(_case([[1.3407807929942597e154]], [0], np.float64, z=1e-4), id="z-loss-lse-squared-overflow"),
    pytest.param(_case([[712.0, 2.0] + [0.0] * 13], [0], np.float64), id="subnormal-only-sum"),
    pytest.param(_case([[712.0, 2.0] + [0.0] * 13], [0], np.float64, weight=np.full(15, 7.0)),
                 id="subnormal-sum-times-weight"),
    pytest.param(_case([[710.75, 1.75, 0.0]], [0], np.float64, z=0.01), id="subnormal-p-times-coef"),
    pytest.param(_case([[0.0, 1e300]], [0], np.float64, z=1e-4), id="scaled-grad-near-the-max"),
    pytest.param(_case([[2.1661481985318866e131, 0.0]], [0], np.float64, z=1e-4), id="scaled-grad-target"),
    pytest.param(_case([[1.7976931348623157e308, 0.0]], [0], np.float64, weight=np.array([0.5, 0.5]), z=1.0),
                 id="upstream-times-coef-overflow"),
    pytest.param(_case([[1.7976931348623157e308, 0.0]], [0], np.float64, weight=np.array([2.0, 2.0]), z=1.0),
                 id="z-loss-coef-overflow-weighted"),
    pytest.param(_case([[1e300, -1.7976931348623157e308]], [0], np.float64, eps=0.1), id="smoothing-term-overflow"),
    pytest.param(_case([[0.0, -1.7976931348623157e308]], [1], np.float64, weight=np.array([2.0, 2.0])),
                 id="weighted-row-loss-overflow-in-mean"),
    pytest.param(_case([[0.0, -np.inf]], np.array([[1.0, 5e-324]]), np.float64, eps=0.5),
                 id="subnormal-mass-on-masked-class"),
    pytest.param(_case([[-np.inf]], [0], np.float32, weight=np.zeros(1, np.float32)),
                 id="nan-row-in-an-empty-mean"),
    pytest.param(_case([[1e300, -1.7976931348623157e308]], [1], np.float64, weight=np.array([1.0, 0.5])),
                 id="weighted-target-loss-overflow-halved"),
    pytest.param(_case([[0.0, 0.0]] * 9, np.array([[1.0, 0.0]] * 9), np.float64, weight=np.array([1e-313, 1e-313])),
                 id="tiny-losses-rescaled-for-the-mean"),
    pytest.param(_case([[0.0, 0.0]], [1], np.float64, weight=np.array([1.0, 2.22507386e-313]), z=1e-4),
                 id="folded-weight-of-an-untargeted-class-overflows"),
    pytest.param(_case([[0.0, 18.0, 0.0]] + [[0.0, 0.0, 0.0]] * 8, [1, 0, 0, 0, 0, 0, 0, 0, 2], np.float64,
                       weight=np.array([0.0, 2.22507386e-313, 1.0]), z=1e-4),
                 id="z-loss-coef-of-a-subnormal-weight"),
    pytest.param(_case([[0.0, 0.0]] * 9, [0, 1, 0, 1, 0, 0, 1, 0, 1], np.float64,
                       weight=np.array([2.22507386e-313, 1e-3]), z=1e-4),
                 id="mean-gradient-of-a-subnormal-weight-magnified"),
    pytest.param(_case([[1.7976931348623157e308] * 2], [0], np.float64, weight=np.array([0.0, 1.0]),
                       eps=1.1830521861667747e-271, z=1.0),
                 id="zero-target-weight-with-z-loss-coef-overflow"),
    # a tiny weight times a tiny smoothing mass underflowed to 0 while the mean over those weights made it
    # a normal part of the gradient (xf_target_grad_q_from): 9 ULP
    pytest.param(_case([[593.0] + [0.0] * 27], [27], np.float64, weight=np.full(28, 2.96936834e-159),
                       eps=1.1830521861667747e-271),
                 id="smoothing-mass-of-a-tiny-weight-underflowed"),
    # the README's example of that limit, before it was fixed (0 for +-3.3e-231)
    pytest.param(_case([[0.0, -1000.0, -1000.0]], [0], np.float64, weight=np.full(3, 1e-100), eps=1e-230),
                 id="smoothing-mass-under-a-mean-over-weights-1e-100"),
]


@pytest.mark.parametrize("case", FIXED_FAILURES)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow these inputs are built for is no warning
def test_fixed_failures_stay_fixed(case):
    _check_rows(case, case.logits.dtype)
    # and under the upstream factors that magnify: a mean over small weights, a large per-row grad_output
    kw = _kwargs(case)
    x, t = case.logits, case.target
    bound = BOUND[x.dtype] + 1
    grad = xf.cross_entropy_backward(1.0, x, t, **kw)
    exact, scale = ref.cross_entropy_grad(x, t, return_scale=True, **kw)
    assert_ulp_close(grad, exact, bound, scale=None if _is_simple(case) else scale)
    assert_ulp_close(np.asarray(xf.cross_entropy(x, t, **kw)), ref.cross_entropy(x, t, **kw), REDUCED_BOUND,
                     dtype=x.dtype)
    g = np.full(x.shape[0], -2.0, dtype=x.dtype)
    grad = xf.cross_entropy_backward(g, x, t, reduction="none", **kw)
    exact, scale = ref.cross_entropy_grad(x, t, reduction="none", grad_output=g, return_scale=True, **kw)
    assert_ulp_close(grad, exact, bound, scale=None if _is_simple(case) else scale)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_reduced_loss_and_gradient_within_bound(dtype, reduction, data):
    case = data.draw(softmax_xent_cases(dtype))
    kw = _kwargs(case)
    x, t = case.logits, case.target
    g = float(np.asarray(data.draw(upstream_scalars()), dtype))
    loss, grad = xf.cross_entropy_with_grad(x, t, reduction=reduction, grad_output=np.asarray(g, dtype), **kw)
    assert_ulp_close(np.asarray(loss), ref.cross_entropy(x, t, reduction=reduction, **kw), REDUCED_BOUND,
                     dtype=dtype, inputs={"logits": x, "target": t}, err_msg=f"{reduction}, options {kw}")
    exact_grad, scale = ref.cross_entropy_grad(x, t, reduction=reduction, grad_output=g, return_scale=True, **kw)
    # the upstream factor g / denominator is one more rounding in every entry
    assert_ulp_close(grad, exact_grad, BOUND[np.dtype(dtype)] + 1, scale=None if _is_simple(case) else scale,
                     inputs={"logits": x, "target": t}, err_msg=f"gradient of {reduction}, options {kw}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_mean_over_subnormal_class_weights_has_a_finite_gradient(dtype, label_smoothing):
    # sum(w_y) is subnormal, so grad_output / sum(w_y) overflows, yet each w_y / sum(w_y) <= 1
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 4)).astype(dtype)
    y = np.array([0, 1, 2, 3, 0])
    w = np.array([1e-310, 3e-310, 2e-311, 5e-310])
    kw = dict(weight=w, label_smoothing=label_smoothing)
    g = 0.5
    loss, grad = xf.cross_entropy_with_grad(x, y, grad_output=np.asarray(g), **kw)
    assert loss == xf.cross_entropy(x, y, **kw)
    assert_ulp_close(np.asarray(loss), ref.cross_entropy(x, y, **kw), REDUCED_BOUND, dtype=dtype)
    exact, scale = ref.cross_entropy_grad(x, y, grad_output=g, return_scale=True, **kw)
    for computed in (grad, xf.cross_entropy_backward(np.asarray(g), x, y, **kw)):
        assert_ulp_close(computed, exact, BOUND[np.dtype(dtype)] + 1, scale=scale if label_smoothing else None)


@pytest.mark.parametrize("target, smoothing", [
    (np.array([[0.5 - 1e-250, 1e-250, 3e-250, 0.5]]), 0.0),   # probabilities
    (np.array([3]), 1e-250),                                  # an index target's smoothing mass
], ids=["probability", "smoothing"])
@pytest.mark.parametrize("reduction, grad_output", [("sum", 1e150), ("mean", 1e290), ("none", [-1e200])])
def test_target_mass_of_a_tiny_weight_under_a_large_factor(target, smoothing, reduction, grad_output):
    # the mass q_j = w_j a_j underflows (3e-159 times a probability or smoothing share near 1e-250) where
    # the upstream factor brings scale * q_j back to a normal number beside p_j's term (exp(-575) ~
    # 1e-250): it was dropped, which flipped the sign of the probability row's entries
    # (xf_target_grad_q_from's second form)
    x = np.array([[0.0, -575.0, -576.0, 1.0]])
    kw = dict(weight=np.full(4, 2.97e-159), label_smoothing=smoothing)
    g = np.asarray(grad_output, dtype=np.float64)
    exact, scale = ref.cross_entropy_grad(x, target, reduction=reduction, grad_output=g, return_scale=True, **kw)
    # the entries that matter are normal numbers, not zeros from an underflowing product
    assert np.all(np.abs(exact[0, 1:3]) > 1e-300)
    for computed in (xf.cross_entropy_with_grad(x, target, reduction=reduction, grad_output=g, **kw)[1],
                     xf.cross_entropy_backward(g, x, target, reduction=reduction, **kw)):
        assert_ulp_close(computed, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale)


@pytest.mark.parametrize("weight, target, logits, smoothing", [
    ([5e-324, 1.0], 0, [0.0, 0.0], 0.1),              # found by Hypothesis: exact +-5.06e321, so +-inf
    ([1.0, 1e-320], 1, [116.07, -65.64], 1e-5),       # exact +-6.1e235 (README, known limits)
    ([1e-320, 1.0, 1.0], 0, [0.0, 3.0, -2.0], 0.5),
])
def test_smoothing_under_a_subnormal_target_weight_gives_no_nan(cpu_path_back, weight, target, logits, smoothing):
    """mean with smoothing: 1/sum(w_y) folded into the weights leaves an upstream factor so large that both
    terms of an entry, p_j coef and scale q_j, overflow where the entry does not, or overflows to one
    sign; inf - inf had given NaN (xf_general_grad_entry).  Checked on every CPU path."""
    y = np.array([target])
    kw = dict(weight=np.array(weight), label_smoothing=smoothing)
    for dtype in DTYPES:
        x = np.array([logits], dtype=dtype)
        exact, scale = ref.cross_entropy_grad(x, y, return_scale=True, **kw)
        bound = BOUND[np.dtype(dtype)] + 1
        for path in cpu_path_back.available_cpu_paths():
            cpu_path_back.set_cpu_path(path)
            loss, grad = xf.cross_entropy_with_grad(x, y, **kw)
            assert not np.isnan(grad).any()
            assert_ulp_close(grad, exact, bound, scale=scale)
            assert_ulp_close(np.asarray(loss), ref.cross_entropy(x, y, **kw), REDUCED_BOUND, dtype=dtype)
            assert_ulp_close(xf.cross_entropy_backward(np.asarray(1.0, dtype), x, y, **kw), exact, bound, scale=scale)


def test_an_exact_zero_loss_under_a_huge_weight_stays_zero():
    # a rescaled rerun of all-zero losses would multiply the weight 2^424 by 2^600: inf * 0 = NaN
    assert xf.cross_entropy(np.array([[1.0]]), np.array([0]), np.array([2.0**424]), reduction="sum") == 0


def _tiny_loss_rows(C):
    """float64 rows whose loss terms each lie below the normal range (softmax_row.h, "rows whose loss is
    tiny"): before, each term rounded on the subnormal grid ahead of the row's sum, up to C/2 ULP of the row
    loss (the first two were found by Hypothesis: 8.5 and 4.8 ULP; 10.1 at 300 classes)."""
    x_eq = np.zeros((1, C))
    x_top = np.zeros((1, C))
    x_top[0, 0] = 5.0
    # a normal mass on an argmax whose -log p is log S ~ C e^-740 (a rescued sum), beside subnormal masses
    x_far = np.full((1, C), -740.0)
    x_far[0, 0] = 0.0
    t_far = np.full((1, C), 1e-320)
    t_far[0, 0] = 1.0
    # the same with the argmax's mass subnormal too, and a far logit (-log p ~ 1e5)
    t_all = np.full((1, C), 3e-318)
    x_wide = x_far.copy()
    x_wide[0, 1] = -1e5
    return [
        ("masses 4.45e-311, equal logits", x_eq, np.full((1, C), 4.45e-311), {}),
        ("smoothing 1.0 under weights 5e-324", x_top, np.array([C // 2]),
         dict(weight=np.full(C, 5e-324), label_smoothing=1.0)),
        ("smoothing 0.5 under weights 1e-310 with a z-loss", x_top, np.array([1]),
         dict(weight=np.full(C, 1e-310), label_smoothing=0.5, z_loss=1e-3)),
        ("normal argmax mass, rescued sum", x_far, t_far, {}),
        ("subnormal masses, a logit 1e5 below", x_wide, t_all, dict(weight=np.linspace(0.5, 2.0, C))),
    ]


@pytest.mark.parametrize("C", [15, 65, 300, 70000])
def test_tiny_row_losses_are_summed_scaled(C):
    bound = BOUND[np.dtype(np.float64)]
    for what, x, t, kw in _tiny_loss_rows(C):
        exact = ref.cross_entropy(x, t, reduction="none", **kw)
        assert 0 < exact[0] < 2.0**-969, what  # a row the scaled sum is for
        first = None
        for n_threads in (1, 2):  # 70000 classes on two threads: the (row, block) split (_use_phased)
            loss, _ = xf.cross_entropy_with_grad(x, t, reduction="none", n_threads=n_threads, **kw)
            assert_ulp_close(loss, exact, bound, err_msg=f"{what}, C={C}, {n_threads} threads")
            first = loss if first is None else first
            assert loss.tobytes() == first.tobytes()
            assert xf.cross_entropy(x, t, reduction="none", n_threads=n_threads, **kw).tobytes() == loss.tobytes()
        total = ref.cross_entropy(np.vstack([x, x]), np.concatenate([t, t]), reduction="sum", **kw)
        got = xf.cross_entropy(np.vstack([x, x]), np.concatenate([t, t]), reduction="sum", **kw)
        assert_ulp_close(got, total, bound, err_msg=f"{what}, C={C}, sum")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("probabilities", [False, True])
def test_subnormal_class_weights_under_a_large_upstream_factor(reduction, probabilities):
    # the kernel's products with a subnormal weight (or a weighted mean's folded weight w / sum(w_y),
    # 7e-310 for w = 2.2e-309 beside 1 and 0.5) round on the subnormal grid before grad_output 1e30
    # magnifies them: 7e14 ULP (sum, w = 5e-324), 20 ULP (the mean).  The weights now take a power of
    # two from the factor first.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3))
    t = rng.dirichlet(np.ones(3), 6) if probabilities else np.array([0, 1, 2, 0, 1, 2])
    for w in ([5e-324, 5e-324, 5e-324], [2.2e-309, 1.0, 0.5], [2.2e-309, 3e-320, 1e-310], [5e-324, 1.0, 1.0]):
        for label_smoothing in (0.0, 0.1):
            for g in (1e30, -(2.0**70)):
                kw = dict(weight=np.array(w), label_smoothing=label_smoothing, reduction=reduction)
                grad = xf.cross_entropy_backward(np.asarray(g), x, t, **kw)
                exact, scale = ref.cross_entropy_grad(x, t, grad_output=g, return_scale=True, **kw)
                assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale,
                                 err_msg=f"weight={w} label_smoothing={label_smoothing} grad_output={g}")


@pytest.mark.parametrize("other_weight", [2.0, 3.0, 7.0])
@pytest.mark.parametrize("grad_output", [1.0, 0.75, 1.5])
def test_a_weighted_means_folded_subnormal_weight_keeps_its_bits(other_weight, grad_output):
    # a weighted mean with subnormal weights takes w / sum(w_y) as the gradient's weights: 5e-324 / 2
    # rounded to 0 (and 3e-320 / 7 onto the subnormal grid) under factors below 2, which moved nothing
    # into the weights, and the z-loss's 2 z lse magnified the loss: an entry of 4.9e-128 came out 0
    # (4.8e15 ULP) at lse 1e200
    for w0 in (5e-324, 3e-320):
        for far in (45001.0, 1e10, 1e200):
            x = np.zeros((3, 3))
            x[0, 2] = far
            x[2] = [1.0, -2.0, 0.5]
            y = np.array([0, 1, 0])
            kw = dict(weight=np.array([w0, other_weight, 0.0]), z_loss=1e-4, reduction="mean")
            grad = xf.cross_entropy_backward(np.asarray(grad_output), x, y, **kw)
            exact, scale = ref.cross_entropy_grad(x, y, grad_output=grad_output, return_scale=True, **kw)
            assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale,
                             err_msg=f"weight {w0} beside {other_weight}, x = {far}, grad_output {grad_output}")


@pytest.mark.parametrize("probabilities", [False, True])
def test_subnormal_class_weights_under_large_per_row_factors(probabilities):
    # reduction='none' with a grad_output array: the weights take the power of two that the least finite
    # nonzero factor allows (weights [3e-320, 1, 1] with a z-loss under factors 1e300: 5.5e11 ULP before);
    # zero, NaN and infinite factors do not limit it, and fused, backward and in-place calls agree
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3))
    t = rng.dirichlet(np.ones(3), 4) if probabilities else np.array([0, 1, 2, 1])
    for w in ([3e-320, 1.0, 1.0], [5e-324, 5e-324, 2e-310]):
        for g in ([1e300, 1e300, -1e300, 1e300], [1e30, 0.0, -(2.0**70), 1e30], [1e300, np.nan, 1e300, 1e300]):
            kw = dict(weight=np.array(w), z_loss=0.0 if probabilities else 0.01, reduction="none")
            g = np.array(g)
            grad = xf.cross_entropy_backward(g, x, t, **kw)
            exact, scale = ref.cross_entropy_grad(x, t, grad_output=g, return_scale=True, **kw)
            assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale,
                             err_msg=f"weight={w} grad_output={g}")
            loss, fused = xf.cross_entropy_with_grad(x, t, grad_output=g, **kw)
            xi = x.copy()
            loss_i, inplace = xf.cross_entropy_with_grad(xi, t, grad_output=g, inplace=True, **kw)
            assert np.array_equal(fused, grad, equal_nan=True) and np.array_equal(inplace, grad, equal_nan=True)
            assert np.array_equal(loss, xf.cross_entropy(x, t, **kw)) and np.array_equal(loss_i, loss)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("label_smoothing", [0.1, 1e-3, 1.0])
@pytest.mark.parametrize("rows", [1, 5])
def test_smoothed_mean_over_subnormal_class_weights(dtype, label_smoothing, rows):
    # the mean scales row losses by 2^1000 (the denominator is subnormal); smoothing's mass eps/C w_c was
    # then formed directly, rounded on the subnormal grid before that scale: 190-360 ULP off (4 allowed)
    x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(dtype)
    x[0] = [0.0, 1.0, 0.0, 1.0]
    y = np.arange(rows) % 4
    kw = dict(weight=np.full(4, 1e-310), label_smoothing=label_smoothing)
    assert_ulp_close(np.asarray(xf.cross_entropy(x, y, **kw)), ref.cross_entropy(x, y, **kw), REDUCED_BOUND,
                     dtype=dtype)


@pytest.mark.parametrize("w", [[1e-310, 1e-5, 3.0], [5e-324, 1e-300, 1e-300], [1e-310, 1.0, 1.0]])
@pytest.mark.parametrize("g", [0.25, 1e-10])
def test_smoothed_mean_gradient_beside_a_subnormal_target_weight(w, g):
    # w_c / sum(w_y) overflows for the ordinary classes (the denominator is subnormal) although every
    # entry eps/C w_c (...) / sum(w_y) is finite: the fold came out inf and the gradient inf and NaN
    x = np.array([[0.0, 1.0, 2.0], [0.5, 0.1, 0.3]])
    y = np.array([0, 0])
    kw = dict(weight=np.array(w), label_smoothing=0.1, grad_output=g)
    _, grad = xf.cross_entropy_with_grad(x, y, **kw)
    exact, scale = ref.cross_entropy_grad(x, y, return_scale=True, **kw)
    assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale)


def test_smoothed_mean_fold_beyond_the_double_range_does_not_raise():
    # w_max / sum(w_y) = 1e300 / 1e-320: the fold's 2^s no longer fits a double (math.ldexp raised
    # OverflowError); the gradient then overflows as it did before the fold was scaled (README, known
    # limits), and the loss is the forward call's
    x = np.array([[0.0, 1.0, 2.0], [0.5, 0.1, 0.3]])
    y = np.array([0, 0])
    kw = dict(weight=np.array([1e-320, 1e300, 1.0]), label_smoothing=0.1)
    loss, grad = xf.cross_entropy_with_grad(x, y, **kw)
    assert loss == xf.cross_entropy(x, y, **kw) and grad.shape == x.shape


@pytest.mark.parametrize("targets", ["index", "probabilities"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("z_loss", [0.0, 0.01])
def test_reductions_of_subnormal_weighted_losses(targets, reduction, z_loss):
    # every row loss on the subnormal grid (subnormal class weights): the reduction takes them again
    # scaled by 2^600, and z r is scaled before it is rounded; before, means were off by 10^4+ ULP
    rng = np.random.default_rng(5)
    for _ in range(12):
        N = int(rng.integers(2, 12))
        x = rng.standard_normal((N, 3)) * int(rng.integers(0, 3))
        t = np.tile([1.0, 0.0, 0.0], (N, 1)) if targets == "probabilities" else rng.integers(0, 3, N)
        w = np.array([rng.uniform(1e-315, 1e-312), rng.uniform(1e-315, 1e-312), 1e-320])
        kw = dict(weight=w, reduction=reduction, z_loss=z_loss)
        loss, grad = xf.cross_entropy_with_grad(x, t, **kw)
        assert_ulp_close(np.asarray(loss), ref.cross_entropy(x, t, **kw), REDUCED_BOUND, dtype=np.float64,
                         inputs={"logits": x, "target": t, "weight": w})
        exact, scale = ref.cross_entropy_grad(x, t, return_scale=True, **kw)
        simple = targets == "index" and z_loss == 0
        assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=None if simple else scale)


@pytest.mark.parametrize("x, t, w", [
    ([[700.0, 0.0]], [0], [1e-250, 1.0]),          # each row loss ~1e-304 times a tiny weight
    ([[700.0, 0.0]], [0], [1e-200, 1.0]),
    ([[700.0, 0.0], [0.0, 710.0]], [0, 1], [1e-300, 1e-290]),
])
def test_mean_of_tiny_losses_under_tiny_weights(x, t, w):
    # the mean cancels the weights, so it is a normal number; the rows are tiny because the weights are,
    # and the tiny-terms rerun's 2^600 must come on top of the mean's own 2^-k (it replaced it: 0, 20 % off)
    x, t, w = np.array(x), np.array(t), np.array(w)
    assert_ulp_close(np.asarray(xf.cross_entropy(x, t, weight=w)), ref.cross_entropy(x, t, weight=w),
                     REDUCED_BOUND, dtype=np.float64)
    p = np.array([[1 - 2.0**-53, 2.0**-53]])
    assert_ulp_close(np.asarray(xf.cross_entropy_from_probs(p, [0], weight=[1e-310, 1.0])),
                     ref.cross_entropy_from_probs(p, np.array([0]), weight=np.array([1e-310, 1.0])),
                     REDUCED_BOUND, dtype=np.float64)


@pytest.mark.parametrize("x", [[0.0, -760.0, -800.0], [-760.0, 0.0, -1100.0], [0.0, -746.0, -746.0],
                               [0.0, -1119.0, -np.inf], [0.0, -760.0, -1130.0], [0.0, -777.25, -1120.1],
                               [0.0, -1121.0, -1190.0], [0.0, -1124.0, -760.0]])
@pytest.mark.parametrize("w", [1e300, 2.0**60])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_huge_weight_lifts_a_loss_whose_exponentials_all_underflow(x, w, smoothing):
    # every other logit 745+ below the max: s = sum exp(x_j - m) is 0 in double, and w_y log1p(s) was 0
    # although w_y s is ~1e-30 (w_y = 1e300, gap 760); such rows are summed again 2^600 larger, also with
    # a term past 1124 (subnormal even scaled) beside one that settles the sum.  The gradient entries of
    # logits more than ~1100 below the max are a known limit (README): only the others are checked
    x = np.array([x])
    y = np.array([int(np.argmax(x))])
    kw = dict(weight=np.array([w, w, 1.0]), label_smoothing=smoothing, reduction="none")
    loss, grad = xf.cross_entropy_with_grad(x, y, **kw)
    assert_ulp_close(loss, ref.cross_entropy(x, y, **kw), BOUND[np.dtype(np.float64)], dtype=np.float64)
    exact, scale = ref.cross_entropy_grad(x, y, return_scale=True, **kw)
    near = x[0] >= x.max() - 1100.0
    exact = np.asarray(exact, dtype=object)[:, near]
    scale = np.asarray(scale, dtype=object)[:, near] if np.ndim(scale) == 2 else scale
    assert_ulp_close(grad[:, near], exact, BOUND[np.dtype(np.float64)], scale=scale if smoothing else None)


@pytest.mark.parametrize("w", [[1e-160, 1.0, 1.0], [1e-300, 1.0, 1.0]])
def test_smoothed_mean_under_a_tiny_target_weight(w):
    # smoothing's w_c terms make the row large while the denominator w_y is tiny: the mean (~1e159,
    # ~1e299) is finite, but hi / den overflowed before the 2^k that brings it back
    x, t, w = np.zeros((1, 3)), np.array([0]), np.array(w)
    assert_ulp_close(np.asarray(xf.cross_entropy(x, t, weight=w, label_smoothing=0.5)),
                     ref.cross_entropy(x, t, weight=w, label_smoothing=0.5), REDUCED_BOUND, dtype=np.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_grad_output_per_row(dtype, data):
    case = data.draw(softmax_xent_cases(dtype))
    kw = _kwargs(case)
    x, t = case.logits, case.target
    g = data.draw(st.sampled_from([np.linspace(-2, 3, x.shape[0]), np.full(x.shape[0], 0.25),
                                   np.resize([0.37, np.nan, -1.5], x.shape[0])])).astype(dtype)
    grad = xf.cross_entropy_backward(g, x, t, reduction="none", **kw)
    exact_grad, scale = ref.cross_entropy_grad(x, t, reduction="none", grad_output=g, return_scale=True, **kw)
    assert_ulp_close(grad, exact_grad, BOUND[np.dtype(dtype)] + 1, scale=None if _is_simple(case) else scale,
                     inputs={"logits": x, "target": t, "grad_output": g})


def test_subnormal_target_mass_times_weight_and_grad_output():
    # found by the search above: (1 - eps) t_j of a subnormal t_j rounded on the subnormal grid, and the
    # weight and grad_output magnified that error to 6 ULP; xf_target_grad_q_from rounds there once
    x = np.array([[0.0, 0.0], [0.0, -np.inf]])
    t = np.array([[1.0, 0.0], [1.0, float.fromhex("0x0.0000a7c5ac472p-1022")]])
    kw = dict(weight=np.array([5.0, 5.0]), label_smoothing=0.1, reduction="none")
    g = np.array([-2.0, 3.0])
    grad = xf.cross_entropy_backward(g, x, t, **kw)
    exact_grad, scale = ref.cross_entropy_grad(x, t, grad_output=g, return_scale=True, **kw)
    assert_ulp_close(grad, exact_grad, BOUND[np.dtype(np.float64)] + 1, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(x=st.data())
def test_softmax_family_within_bound(dtype, x):
    x = x.draw(logits(dtype, allow_nan=True, allow_posinf=True))
    bound = BOUND[np.dtype(dtype)]
    note(f"logits={x!r}")
    assert_ulp_close(xf.log_softmax(x), ref.log_softmax(x), bound, inputs={"x": x}, err_msg="log_softmax")
    assert_ulp_close(xf.softmax(x), ref.softmax(x), bound, inputs={"x": x}, err_msg="softmax")
    assert_ulp_close(xf.logsumexp(x), ref.logsumexp(x), bound, inputs={"x": x}, err_msg="logsumexp")


# ---- the documented numerics, one pinned example each ------------------------------------------------


def test_confident_correct_loss_is_not_zero():
    # log(1 + tiny) = 0 in every peer; log1p of the other classes' sum keeps it
    x = np.array([[30.0, 0.0]], dtype=np.float32)
    loss = xf.cross_entropy(x, np.array([0]), reduction="none")
    assert loss[0] > 0
    assert_ulp_close(loss, ref.cross_entropy(x, np.array([0]), reduction="none"), 0.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_target_gradient_has_no_cancellation(dtype):
    # p_y - 1 rounds to 0 in float32 at a gap of 20; -(sum of the others)/S does not
    x = np.array([[20.0, 0.0], [45.0, 0.0]], dtype=dtype)
    y = np.array([0, 0])
    grad = xf.cross_entropy_backward(np.ones(2, dtype), x, y, reduction="none")
    assert (grad[:, 0] < 0).all()
    assert_ulp_close(grad, ref.cross_entropy_grad(x, y, reduction="none"), BOUND[np.dtype(dtype)])


@pytest.mark.parametrize("output", ["softmax", "grad-none", "grad-mean"])
def test_float64_probability_term_rounds_coef_over_s_once(output):
    # A class tied with the max has e_j = exp(0) = 1 exactly, so its softmax and gradient entries are
    # coef / S with S = 2 + (the other terms).  Those lie in [e^-40, e^-12]: their own errors (<= 0.62 ULP
    # each) move the exact 1/S by under 0.001 ULP, but 2 + their sum does not fit in a double.  Formed from
    # the double-double sum and rounded once, coef / S is within half an ULP (+ that 0.001; coef is 1 or
    # the mean's exact 1/256); rounding S first and dividing after measured 1.95 ULP here.
    rng = np.random.default_rng(11)
    x = rng.uniform(-40.0, -12.0, size=(256, 48))
    x[:, :2] = 0.0
    x += rng.normal(scale=5.0, size=(256, 1))
    y = rng.integers(2, 48, size=256)
    if output == "softmax":
        got, exact = xf.softmax(x), ref.softmax(x)
    else:
        reduction = output.split("-")[1]
        got = xf.cross_entropy_with_grad(x, y, reduction=reduction)[1]
        exact = ref.cross_entropy_grad(x, y, reduction=reduction)
    assert_ulp_close(got[:, 1], exact[:, 1], 0.501, inputs={"logits": x})


def test_small_probabilities_float64_keep_their_digits():
    # x_j - m is not representable here; without the carried remainder p_j is off by ~|x_j - m| * eps / 2
    x = np.array([[0.1, 700.3, 650.0 + 1e-9, -6.0]], dtype=np.float64)
    assert_ulp_close(xf.softmax(x), ref.softmax(x), 4.0, inputs={"x": x})
    assert_ulp_close(xf.cross_entropy_backward(np.ones(1), x, np.array([1]), reduction="none"),
                     ref.cross_entropy_grad(x, np.array([1]), reduction="none"), 4.0, inputs={"x": x})


@pytest.mark.parametrize("x, target, weight, eps", [
    # q_0 = eps/2 * 1e-200 = 5e-401 underflows, q_0 (-log p_0) = 5e-101 does not: the loss came out 0
    ([[-1e300, 0.0]], [1], [1e-200, 1.0], 1e-200),
    # the case Hypothesis found, sharpened: q_0 = 5.9e-382 underflows, the loss is 17 subnormal ULPs
    ([[0.0, 0.0], [-1.43057731e59, 0.0]], [0, 1], [1e-110, 0.0], 1.1830521861667747e-271),
    # found by Hypothesis: q_13 = 1.11e-308 / 16 is subnormal and -log p_13 = 1e300; scaled by 2^1200
    # before the product, the term overflowed
    ([[0.0] * 7 + [1e300] + [0.0] * 8], [7], [0.0] * 13 + [1.11253693e-308, 0.0, 0.0], 1.0),
    # probability targets: a tiny probability times a tiny weight, a huge -log p
    ([[-1e250, 0.0]], [[1e-200, 1.0]], [1e-150, 1.0], 0.0),
    # the argmax class carries a subnormal mass, rounded on the subnormal grid before, and log S = log 1e5
    # magnified that to 6.9 ULP (0.08 now)
    (np.zeros((1, 100_000)), [0], [1e-310] + [0.0] * 99_999, 0.7),
])
def test_loss_terms_with_an_underflowing_mass_keep_their_value(x, target, weight, eps):
    """A smoothing or probability mass q_j times a tiny weight underflows long before q_j (-log p_j)
    does; the term is then formed scaled by 2^1200 (softmax_row.h, xf_xent_term)."""
    x = np.array(x)
    t = np.array(target)
    kw = dict(weight=np.array(weight), label_smoothing=eps)
    loss = xf.cross_entropy(x, t, reduction="none", **kw)
    exact = ref.cross_entropy(x, t, reduction="none", **kw)
    assert all(v > 0 for v in exact)
    assert_ulp_close(loss, exact, 4.0, inputs={"logits": x, "target": t})
    assert_ulp_close(np.asarray(xf.cross_entropy(x, t, reduction="sum", **kw)),
                     ref.cross_entropy(x, t, reduction="sum", **kw), 4.0)
    if x.size <= 16:
        _check_rows(XentCase(x, t, kw["weight"], eps, -100, 0.0), np.float64)


def test_z_loss_of_the_smallest_weight_keeps_its_value():
    """Found by Hypothesis: z r = 1e-4 * 5e-324 underflows to 0, while z r lse^2 = 5e272 and the
    gradient's 2 z r lse = 1e-27 do not (the loss and gradient came out 0)."""
    x = np.array([[1e300]])
    t = np.array([0])
    _check_rows(XentCase(x, t, np.array([5e-324]), 0.0, -100, 1e-4), np.float64)


def _rows_with_lse(rng, lse, c):
    """Rows of c logits whose logsumexp is lse[i] (to the rounding of the shifted logits)."""
    base = rng.standard_normal((len(lse), c))
    return base - np.log(np.exp(base).sum(axis=1, keepdims=True)) + np.asarray(lse)[:, None]


def _target_mass(t, w, eps, finite):
    """A = sum_c q_c of probability targets, in float64 (close enough to aim lse at -A / (2 z))."""
    n = finite.sum(axis=1, keepdims=True)
    return (w * ((1 - eps) * t + eps / n * finite)).sum(axis=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("targets", ["index", "weighted index", "probabilities", "smoothed weighted probabilities"])
def test_z_loss_gradient_where_A_and_2zr_lse_cancel(dtype, targets):
    """The gradient p_j (A + 2 z r lse) - q_j, for rows whose lse lies near -A / (2 z r): the sum is a
    small difference of large terms.  Found by Hypothesis (10 ULP, 0.765 - 0.678); aimed closer, lse's
    rounding and the target masses' made float64 gradients 10^8 ULP off and float32 ones 10^5."""
    rng = np.random.default_rng(3)
    n, c, z = 40, 9, 0.5
    # lse - (-A / (2 z r)) from 1e-11 to 0.3, both signs: the sum cancels by up to 2^-36
    gap = np.geomspace(1e-11, 0.3, n) * np.where(np.arange(n) % 2, 1.0, -1.0)
    w = rng.uniform(0.5, 2.0, c) if "weighted" in targets else None
    eps = 0.1 if "smoothed" in targets else 0.0
    if "index" in targets:
        t = rng.integers(0, c, n)
        x = _rows_with_lse(rng, -1.0 / (2 * z) + gap, c)  # A = r = w_y
    else:
        t = rng.dirichlet(np.ones(c), n)
        t[:, :3] = 0.0
        finite = np.ones((n, c), bool)
        finite[:, 1] = False  # a masked class without target mass
        A = _target_mass(t, w if w is not None else np.ones(c), eps, finite)
        x = _rows_with_lse(rng, -A / (2 * z) + gap, c)
        x[:, 1] = -np.inf
        t = t.astype(dtype)  # the kernels take the logits' dtype; the reference must see the same masses
    x = x.astype(dtype)
    _check_rows(XentCase(x, t, w, eps, -100, z), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_z_loss_where_max_and_log_s_cancel(dtype):
    """Targets without mass leave the loss z lse^2 and the gradient 2 z lse p_j; for a row of
    log-probabilities lse = m + log S is a rounding error of m, and came out 10^10 ULP off (float64) and
    10^6 (float32): the z-loss took the fast path's lse, not the exact one that logsumexp returns."""
    rng = np.random.default_rng(4)
    n, c = 24, 7
    lse = np.geomspace(1e-18, 1e-3, n) * np.where(np.arange(n) % 2, 1.0, -1.0)
    x = _rows_with_lse(rng, lse, c).astype(dtype)
    t = np.zeros((n, c), dtype)
    t[::3, 2] = 1e-30  # and a mass far below the z-term
    _check_rows(XentCase(x, t, None, 0.0, -100, 1.0), dtype)


def test_z_loss_gradient_beyond_the_cancellation_it_resolves():
    """The documented limit: with lse at -A / (2 z r) to the last bit, A + 2 z r lse is known to within
    ~(C + 18) 2^-99 |z r| absolutely (level 2 of the z-loss's logsumexp); each entry p_j times that."""
    rng = np.random.default_rng(5)
    n, c, z = 16, 9, 0.5
    x = _rows_with_lse(rng, np.full(n, -1.0), c)
    y = rng.integers(0, c, n)
    grad = xf.cross_entropy_with_grad(x, y, reduction="none", z_loss=z)[1]
    exact = ref.cross_entropy_grad(x, y, reduction="none", z_loss=z)
    p = np.exp(x - np.log(np.exp(x).sum(axis=1, keepdims=True)))
    ulp = np.spacing(np.abs(np.array(exact, dtype=np.float64)))
    allowed = 4 * ulp + p * (c + 18) * 2.0**-99 * (2 * z)
    err = np.abs(grad - np.array([[float(v) for v in row] for row in exact]))
    assert (err <= allowed).all(), (err / allowed).max()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_negative_and_nan_target_probabilities_are_in_the_loss(dtype):
    """torch's semantics: the loss is sum_c -t_c log p_c for any t.  A negative t_c was left out of the
    loss (3.611 for the row below, exact 2.908) though not out of the gradient; a NaN t_c gave a finite
    loss and a NaN gradient."""
    x = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0.5, -np.inf, 2.0]], dtype=dtype)
    t = np.array([[1.5, -0.5, 0.0], [0.5, np.nan, 0.5], [0.5, -0.25, 0.75]], dtype=dtype)
    loss, grad = xf.cross_entropy_with_grad(x, t, reduction="none")
    assert np.isnan(loss[1]) and np.isnan(grad[1]).all()
    assert loss[2] == -np.inf  # -0.25 * (-log p = +inf), as torch
    rows = [0]
    assert_ulp_close(loss[rows], ref.cross_entropy(x[rows], t[rows], reduction="none"), BOUND[np.dtype(dtype)])
    exact, scale = ref.cross_entropy_grad(x[rows], t[rows], reduction="none", return_scale=True)
    assert_ulp_close(grad[rows], exact, BOUND[np.dtype(dtype)], scale=scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("targets", ["smoothed index", "probabilities"])
def test_loss_terms_of_long_rows_with_rare_elements(dtype, targets):
    """Rows of several 64-class chunks (the loss-terms pass evaluates whole chunks vectorized and redoes
    a chunk that holds a rare element element by element): a subnormal target mass, logits spread past
    DBL_MAX, masked classes, the argmax and the target in different chunks, and a short last chunk."""
    rng = np.random.default_rng(9)
    n, c = 6, 200
    x = rng.standard_normal((n, c)) * 3
    x[0, 70] = 40.0
    x[1, rng.random(c) < 0.2] = -np.inf
    if np.dtype(dtype) == np.float64:
        x[2, [5, 150]] = [1.5e308, -1.5e308]
    x[3, 199] = 30.0
    x = x.astype(dtype)
    eps = 0.1
    if targets == "probabilities":
        t = rng.dirichlet(np.ones(c), n)
        t[4, 130] = 1e-310 if np.dtype(dtype) == np.float64 else 1e-40
        t[5, 64:128] = 0.0
        t = t.astype(dtype)
        eps = 0.0
    else:
        t = np.array([3, 190, 0, 199, 64, 127])
    w = rng.uniform(0.5, 2.0, c)
    w[17] = 1e-300
    _check_rows(XentCase(x, t, w, eps, -100, 0.0), dtype)
    _check_rows(XentCase(x, t, None, eps, -100, 0.0), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_classes_contribute_exactly_zero(dtype):
    x = np.array([[1.0, -np.inf, 2.0, -np.inf]], dtype=dtype)
    loss, grad = xf.cross_entropy_with_grad(x, np.array([2]), reduction="none")
    unmasked = xf.cross_entropy(np.array([[1.0, 2.0]], dtype=dtype), np.array([1]), reduction="none")
    assert loss[0] == unmasked[0]
    assert grad[0, 1] == 0 and grad[0, 3] == 0
    assert xf.softmax(x)[0, 1] == 0 and xf.log_softmax(x)[0, 1] == -np.inf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 300], ids=["one-class-groups", "short-rows", "long-rows"])
def test_a_probability_of_exactly_one_has_log_zero_of_torchs_sign(dtype, C):
    """log p = 0 exactly (one class, the others masked or below the exponential's range) is +0.0, as torch's
    (x - max) - logsumexp gives, on the short-row groups and the row path; the loss there is +0.0 too."""
    x = np.full((16, C), -np.inf, dtype=dtype)
    x[:, 0] = np.arange(16) - 8.0
    if C > 1:
        x[8:, 1:] = x[8:, :1] - 800.0  # finite, exp(-800) == 0: S = 1 exactly
    logp = xf.log_softmax(x)
    assert (logp[:, 0] == 0).all() and not np.signbit(logp[:, 0]).any()
    loss = xf.cross_entropy(x, np.zeros(16, dtype=np.int64), reduction="none")
    assert (loss == 0).all() and not np.signbit(loss).any()
    torch = pytest.importorskip("torch")
    want = torch.log_softmax(torch.from_numpy(x), 1).numpy()
    assert np.array_equal(logp, want) and np.array_equal(np.signbit(logp), np.signbit(want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_neg_inf_target_logit_gives_inf_loss_finite_gradient(dtype):
    x = np.array([[1.0, -np.inf, 2.0]], dtype=dtype)
    loss, grad = xf.cross_entropy_with_grad(x, np.array([1]), reduction="none")
    assert loss[0] == np.inf
    assert np.isfinite(grad).all() and grad[0, 1] == -1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", [[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [-np.inf, -np.inf, -np.inf]],
                         ids=["nan", "posinf", "all-neginf"])
def test_rows_without_a_softmax_are_nan(dtype, row):
    x = np.array([row, [0.0, 1.0, 2.0]], dtype=dtype)
    loss, grad = xf.cross_entropy_with_grad(x, np.array([0, 2]), reduction="none")
    assert np.isnan(loss[0]) and np.isnan(grad[0]).all()
    assert np.isfinite(loss[1]) and np.isfinite(grad[1]).all()
    assert np.isnan(xf.log_softmax(x)[0]).all() and np.isnan(xf.softmax(x)[0]).all()


def _cancelling_row(c, steps, dtype, goal=0.0, overshoot=False, head=None):
    """A row whose sum of exponentials comes as close to 1 + goal as the dtype allows: c - 1 equal logits
    dtype(-log c) (or `head`), then up to `steps` more, each the logit (rounded down) of what the sum
    still lacks, so that every one cancels about another mantissa of the residual (lse = log T,
    T = sum exp x_j).  The last one is rounded up instead with `overshoot` (a positive result).  Stops
    early once the residual is below goal / 2^20, or not positive."""
    dtype = np.dtype(dtype).type
    xs = [dtype(-np.log(c))] * (c - 1) if head is None else [dtype(v) for v in head]
    with mpmath.workprec(4000):
        target = 1 + mpmath.mpf(goal)
        for k in range(steps + 1):
            resid = target - mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in xs)
            if resid <= 0 or (goal and resid < abs(goal) * mpmath.mpf(2) ** -20):
                break
            t = dtype(float(mpmath.log(resid)))
            up = overshoot and (k == steps)
            if (mpmath.exp(mpmath.mpf(float(t))) > resid) != up:
                t = np.nextafter(t, dtype(np.inf if up else -np.inf))
            xs.append(t)
    return np.array([xs], dtype=dtype)


# lse = m + log S with m close to -log S: the result is far below |m|, down to the subnormals (each logit
# of _cancelling_row cancels ~a mantissa more); the bound stays relative, in ULP of the result.
CANCELLING_ROWS = (
    [pytest.param(np.float64, lambda c=c: np.full((1, c), -np.log(c)), id=f"f64-{c}-equal-logits")
     for c in (2, 3, 13, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 1023, 1024, 1025)]
    + [pytest.param(np.float32, lambda c=c: np.full((1, c), -np.log(c), np.float32), id=f"f32-{c}-equal-logits")
       for c in (2, 3, 13, 16, 17, 255, 256, 257, 1023, 1024, 1025)]
    + [pytest.param(dt, lambda dt=dt, g=g: _cancelling_row(13, 4, dt, goal=g), id=f"{np.dtype(dt).name}-lse-{g:g}")
       for dt in DTYPES for g in (1e-10, -1e-17, 1e-17, 1e-30)]
    + [pytest.param(np.float64, lambda s=s, up=up: _cancelling_row(13, s, np.float64, overshoot=up),
                    id=f"f64-13-chain-{s}{'-up' if up else ''}")
       for s, up in [(1, False), (1, True), (2, False), (3, True), (5, False), (8, False), (12, True),
                     (19, False), (20, False), (20, True), (21, False), (25, False)]]
    + [pytest.param(np.float32, lambda s=s, up=up: _cancelling_row(13, s, np.float32, overshoot=up),
                    id=f"f32-13-chain-{s}{'-up' if up else ''}")
       for s, up in [(1, False), (1, True), (2, False), (3, True), (4, False), (5, False), (6, False),
                     (6, True), (7, False)]]
    + [pytest.param(np.float64, lambda: _cancelling_row(1000, 3, np.float64), id="f64-1000-chain-3"),
       pytest.param(np.float64, lambda: _cancelling_row(2, 2, np.float64), id="f64-2-chain-2"),
       pytest.param(np.float32, lambda: _cancelling_row(1000, 3, np.float32), id="f32-1000-chain-3")]
)


@pytest.mark.parametrize("dtype, make", CANCELLING_ROWS)
def test_logsumexp_where_max_and_log_s_cancel_pinned(dtype, make):
    x = make().astype(dtype)
    assert np.abs(ref.logsumexp(x)[0]) < np.abs(np.max(x))  # the row does cancel
    assert_ulp_close(xf.logsumexp(x), ref.logsumexp(x), BOUND[np.dtype(dtype)], inputs={"x": x})


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
@example(data=None)
def test_logsumexp_where_max_and_log_s_cancel(dtype, data):
    # searched rows near the cancellation: c logits around -log c, optionally followed by logits that
    # cancel the residual further (_cancelling_row); the bound is relative, in ULP of the result
    x = np.array([[-np.log(2.0)] * 2 + [-np.inf] * 2, [-np.log(3.0)] * 3 + [-np.inf],
                  [-1.0986123, -1.0986123, -1.0986124, -50.0]], dtype=dtype)
    if data is not None:
        c = data.draw(st.integers(2, 40))
        spread = data.draw(st.sampled_from([0.0, 1e-12, 1e-6, 1e-3, 0.3]))
        noise = data.draw(st.lists(st.floats(-1, 1), min_size=c, max_size=c))
        x = np.array([-np.log(c) + spread * np.array(noise)], dtype=dtype)
        tail = data.draw(st.integers(0, 3))
        if tail:
            x = _cancelling_row(c, tail, dtype, overshoot=data.draw(st.booleans()), head=x[0, :-1])
            x = x[:, data.draw(st.permutations(range(x.shape[1])))]
    assert_ulp_close(xf.logsumexp(x), ref.logsumexp(x), BOUND[np.dtype(dtype)], inputs={"x": x})


@pytest.mark.parametrize("make", [p.values[1] for p in CANCELLING_ROWS if p.values[0] is np.float64]
                         + [lambda: np.log(np.random.default_rng(9).dirichlet(np.ones(c), 4)) for c in (2, 50, 500)])
def test_cancelling_rows_skip_the_double_double_step_only_where_it_fails(make):
    # float64 rows pass a bound d_max on |D| = |sum exp(x) - 1| from the fast lse, below which step 1 is
    # skipped (softmax_row.h xf_lse_cancelling); the GPU passes none.  With the tightest true bound, |D|
    # itself, the result must be the bits of the unskipped path
    from xentfast._core import _scalar
    for row in make().astype(np.float64):
        with mpmath.workdps(400):
            d = abs(mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in row) - 1)
        d_max = float(d) * (1 + 2.0 ** -50)
        assert _scalar.lse_cancelling(row, d_max) == _scalar.lse_cancelling(row), (row, float(d))


def test_logsumexp_limits():
    x = np.array([[-np.inf, -np.inf], [1.0, np.inf], [np.nan, 1.0], [np.inf, np.nan]])
    out = xf.logsumexp(x)
    assert out[0] == -np.inf and out[1] == np.inf and np.isnan(out[2]) and np.isnan(out[3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_ignored_rows_are_zero_whatever_they_hold(dtype):
    x = np.array([[np.nan, 1.0], [np.inf, -np.inf], [0.5, 0.25]], dtype=dtype)
    loss, grad = xf.cross_entropy_with_grad(x, np.array([-100, -100, 1]), reduction="none")
    assert loss[0] == 0 and loss[1] == 0 and not np.signbit(loss[0])
    assert (grad[:2] == 0).all() and np.isfinite(grad).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_ignored_mean_policy(dtype):
    x = np.ones((3, 4), dtype=dtype)
    y = np.full(3, -100)
    assert np.isnan(xf.cross_entropy(x, y))
    assert xf.cross_entropy(x, y, empty_mean="zero") == 0
    for policy in ("nan", "zero"):
        _, grad = xf.cross_entropy_with_grad(x, y, empty_mean=policy)
        assert (grad == 0).all()


def test_label_smoothing_spreads_over_finite_classes():
    # torch gives +inf here (eps/C mass on a -inf class); xentfast smooths over the C_eff finite classes
    x = np.array([[1.0, -np.inf, 2.0, 0.5]])
    loss = xf.cross_entropy(x, np.array([2]), label_smoothing=0.3, reduction="none")
    same_without_mask = xf.cross_entropy(x[:, [0, 2, 3]], np.array([1]), label_smoothing=0.3, reduction="none")
    assert np.isfinite(loss[0])
    assert loss[0] == same_without_mask[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_masked_or_nan_class_in_any_block_of_a_long_row(dtype):
    # The max pass counts finite entries (smoothing spreads over them) and NaNs only in blocks whose
    # min is -inf or that hold a NaN; row b puts its masked classes, or its NaN, in block b alone.
    rng = np.random.default_rng(3)
    C = 2 * 4096 + 808
    x = rng.normal(scale=3.0, size=(4, C)).astype(dtype)
    y = np.array([5, 4100, 8500, 7])
    for b in range(3):
        x[b, [b * 4096 + 17, b * 4096 + 700]] = -np.inf
    _check_rows(XentCase(x, y, None, 0.1, -100, 0.0), dtype)
    for b in range(3):
        x[b, b * 4096 + 300] = np.nan
    loss, grad = xf.cross_entropy_with_grad(x, y, reduction="none", label_smoothing=0.1)
    assert np.isnan(loss[:3]).all() and np.isnan(grad[:3]).all()
    assert np.isfinite(loss[3]) and np.isfinite(grad[3]).all()


def test_z_loss_matches_its_definition():
    x = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
    y = np.array([2, 0])
    z = 1e-2
    base = xf.cross_entropy(x, y, reduction="none")
    lse = xf.logsumexp(x)
    assert np.allclose(xf.cross_entropy(x, y, reduction="none", z_loss=z), base + z * lse**2, rtol=1e-15)


# ---- layout, out=, inplace ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_class_axis_and_layout_do_not_change_bits(dtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 7, 4)) * 5).astype(dtype)        # torch layout (N, C, d)
    y = rng.integers(0, 7, size=(3, 4))
    loss, grad = xf.cross_entropy_with_grad(x, y, axis=1, reduction="none")
    last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    loss_last, grad_last = xf.cross_entropy_with_grad(last, y, reduction="none")
    assert np.array_equal(loss, loss_last)
    assert np.array_equal(grad, np.moveaxis(grad_last, -1, 1))
    assert grad.shape == x.shape and grad.flags.c_contiguous
    fortran = np.asfortranarray(last)
    assert np.array_equal(xf.cross_entropy_with_grad(fortran, y, reduction="none")[1], grad_last)
    strided = np.ascontiguousarray(np.repeat(last, 2, axis=-1))[..., ::2]
    assert np.array_equal(xf.cross_entropy_with_grad(strided, y, reduction="none")[1], grad_last)


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("shape", [(2, 37, 5, 29), (3, 70, 130), (1, 1, 1), (4, 33, 1), (1, 2, 200)])
def test_class_axis_move_is_numpys_copy_bit_for_bit(shape, itemsize):
    # the parallel tiled transposition (xentfast._core._layout) against NumPy's copy: tiles of 32 x 64
    # items, so these shapes have partial tiles on both sides, several tiles per matrix, one-item axes;
    # random words (NaN payloads, signed zeros, subnormals among them) must arrive unchanged
    from xentfast._core import _layout
    rng = np.random.default_rng(sum(shape) + itemsize)
    words = rng.integers(0, 2**64, size=shape, dtype=np.uint64)
    src = words.astype(np.uint32) if itemsize == 4 else words
    for axis in range(len(shape)):
        want = np.ascontiguousarray(np.moveaxis(src, axis, -1))
        n_mats, C, D = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        for n_threads in (1, 2, 3):
            rows = np.empty_like(want)
            _layout.transpose_batched(src, rows, n_mats, C, D, n_threads)
            assert np.array_equal(rows, want), (axis, n_threads)
            back = np.empty_like(src)
            _layout.transpose_batched(rows, back, n_mats, D, C, n_threads)
            assert np.array_equal(back, src), (axis, n_threads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_class_axis_elsewhere_gives_the_rows_bits(dtype):
    # torch's (N, C, d1, d2) layout and axis 0, several tiles of the transposition each way: every
    # function equals the call on the moved C-contiguous rows, for any thread count (59 k entries: two
    # and three threads do run), also into out= (C-contiguous or not) and inplace
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 45, 19, 23)) * 4).astype(dtype)
    x[0, :, 0, 0] = np.nan
    x[1, 3, 2, 2] = -np.inf
    p = rng.random(x.shape).astype(dtype)
    p /= p.sum(axis=1, keepdims=True)
    for axis in (1, 0):
        moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        pm = np.ascontiguousarray(np.moveaxis(p, axis, -1))
        y = rng.integers(0, x.shape[axis], size=moved.shape[:-1])
        y[0, 0, 1] = -100

        def back(a):
            return np.moveaxis(a, -1, axis)

        for n_threads in (1, 2, 3):
            for target, t_moved in ((y, y), (p, pm)):
                kw = dict(reduction="none", label_smoothing=0.1, n_threads=n_threads)
                loss, grad = xf.cross_entropy_with_grad(x, target, axis=axis, **kw)
                loss_m, grad_m = xf.cross_entropy_with_grad(moved, t_moved, **kw)
                assert np.array_equal(loss, loss_m, equal_nan=True)
                assert grad.flags.c_contiguous and np.array_equal(grad, back(grad_m), equal_nan=True)
                for out in (np.empty_like(x), np.empty_like(np.repeat(x, 2, axis=-1))[..., ::2]):
                    g_out = xf.cross_entropy_with_grad(x, target, axis=axis, out=out, **kw)[1]
                    assert g_out is out and np.array_equal(out, grad, equal_nan=True)
                x_in = x.copy()
                assert xf.cross_entropy_with_grad(x_in, target, axis=axis, inplace=True, **kw)[1] is x_in
                assert np.array_equal(x_in, grad, equal_nan=True)
                assert np.array_equal(xf.cross_entropy(x, target, axis=axis, **kw),
                                      xf.cross_entropy(moved, t_moved, **kw), equal_nan=True)
            for fn in (xf.log_softmax, xf.softmax):
                got = fn(x, axis=axis, n_threads=n_threads)
                assert got.flags.c_contiguous
                assert np.array_equal(got, back(fn(moved, n_threads=n_threads)), equal_nan=True)
            assert np.array_equal(xf.logsumexp(x, axis=axis, n_threads=n_threads),
                                  xf.logsumexp(moved, n_threads=n_threads), equal_nan=True)
            probs = xf.softmax(x, axis=axis)
            probs[np.isnan(probs)] = 0.5
            loss, grad = xf.cross_entropy_from_probs_with_grad(probs, p, axis=axis, n_threads=n_threads)
            loss_m, grad_m = xf.cross_entropy_from_probs_with_grad(
                np.ascontiguousarray(np.moveaxis(probs, axis, -1)), pm, n_threads=n_threads)
            assert loss == loss_m and np.array_equal(grad, back(grad_m))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 21, 150, 512, 513])
def test_torch_layout_read_in_place_gives_the_rows_bits(dtype, C, monkeypatch):
    # (B, C, d1, d2): the kernel reads the logits and probability targets and writes the gradient as they
    # lie (tiles of up to 256 positions copied into a thread's blocks, XF_GROUP_ROWS of them side by side),
    # with no copy of their rows made (513 classes are beyond its limit and are moved first).  Partial
    # tiles and groups, and rows every group hands back to the row kernel (NaN, +inf, a -inf target,
    # masked classes, spreads beyond the groups', ignored rows, negative target probabilities), must keep
    # the bits of the moved rows, for every option, into out= as well, on any thread count.
    from xentfast import api
    rng = np.random.default_rng(C)
    x = (rng.standard_normal((2, C, 9, 59)) * 3).astype(dtype)
    y = rng.integers(0, C, size=(2, 9, 59))
    y[0, 0, :5] = -100
    x[0, :, 1, 3] = np.nan
    x[1, 0, 2, 7] = np.inf
    x[1, C - 1, 4, 10] = -np.inf
    y[1, 4, 10] = C - 1
    x[0, C // 2, 5, 20:30] = -np.inf
    x[1, 0, 8, 40:44] = dtype(3e4)
    x[0, :, 6, 16:40] = 0.0
    x[0, 0, 6, 16:40] = 50.0
    w = rng.random(C) + 0.25
    g_rows = rng.random(y.shape)
    moved = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    made = []
    real_rows = api._rows

    def rows_of(a, axis, n_threads=None):
        made.append(a.shape == x.shape)  # the input, or targets of its shape
        return real_rows(a, axis, n_threads)

    monkeypatch.setattr(api, "_rows", rows_of)
    probs = rng.random(x.shape).astype(dtype)
    probs[1, 0, 3, :6] = -0.5
    # confident rows whose one mass is just above 2^-969: a float64 loss below 2^-969, which the row
    # kernel sums again scaled from the row itself (xf_rowjob_tiny_loss_row)
    probs[0, :, 6, 16:40] = 0.0
    probs[0, 0, 6, 16:40] = 1e-291 if dtype == np.float64 else 1e-30
    probs_m = np.ascontiguousarray(np.moveaxis(probs, 1, -1))
    # targets not C-contiguous nor of the input's dtype: read in place after one conversion
    probs_f = np.asfortranarray(probs.astype(np.float64 if dtype == np.float32 else np.float32))
    probs_fm = np.ascontiguousarray(np.moveaxis(probs_f, 1, -1))
    for kw in (dict(), dict(weight=w), dict(reduction="sum", weight=w), dict(reduction="none"),
               dict(label_smoothing=0.2), dict(label_smoothing=0.1, weight=w), dict(z_loss=1e-3),
               dict(target=(probs, probs_m), reduction="none"),
               dict(target=(probs, probs_m), label_smoothing=0.3, weight=w),
               dict(target=(probs_f, probs_fm), z_loss=1e-3), dict(target=(probs_f, probs_fm), weight=w)):
        kw = dict(kw)
        target, target_m = kw.pop("target", (y, y))
        for n_threads in (1, 2, 3):
            go = g_rows if kw.get("reduction") == "none" else 0.5
            loss, grad = xf.cross_entropy_with_grad(x, target, axis=1, grad_output=go, n_threads=n_threads,
                                                    **kw)
            loss_m, grad_m = xf.cross_entropy_with_grad(moved, target_m, grad_output=go, n_threads=n_threads,
                                                        **kw)
            assert np.array_equal(loss, loss_m, equal_nan=True), (kw, n_threads)
            assert grad.flags.c_contiguous
            assert np.array_equal(grad, np.moveaxis(grad_m, -1, 1), equal_nan=True), (kw, n_threads)
            out = np.empty_like(x)
            assert xf.cross_entropy_with_grad(x, target, axis=1, grad_output=go, n_threads=n_threads, out=out,
                                              **kw)[1] is out
            assert np.array_equal(out, grad, equal_nan=True)
            assert np.array_equal(xf.cross_entropy(x, target, axis=1, n_threads=n_threads, **kw),
                                  xf.cross_entropy(moved, target_m, n_threads=n_threads, **kw), equal_nan=True)
    assert any(made) == (C > 512)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 21, 64, 65, 150, 160, 161, 240, 241, 448, 449, 512, 513])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_torch_layout_family_read_in_place_gives_the_rows_bits(cpu_path_back, path, dtype, C, monkeypatch):
    # logsumexp, log_softmax and softmax with axis=1 read (B, C, d1, d2) as it lies and write it so where
    # the path's short-row groups take C classes (every width to their limit, no transposition to pay
    # for); else the class axis is moved.  Either way the bits of the moved rows, with the rows every
    # group hands back (NaN, +inf, -inf, masked classes, spreads beyond the groups', a cancelling lse) and
    # partial tiles and groups, on any thread count.
    from xentfast import api
    cpu_path_back.set_cpu_path(path)
    rng = np.random.default_rng(C)
    x = (rng.standard_normal((2, C, 9, 59)) * 3).astype(dtype)
    x[0, :, 1, 3] = np.nan
    x[1, 0, 2, 7] = np.inf
    x[1, C - 1, 4, 10] = -np.inf
    x[0, C // 2, 5, 20:30] = -np.inf
    x[1, 0, 8, 40:44] = dtype(3e4)
    x[0, :, 6, 16:40] = 0.0
    x[0, 0, 6, 16:40] = 50.0
    x[1, :, 7, 30:50] = -1000.0     # max and log S cancel in the lse: the row path's exact form
    x[1, 0, 7, 30:50] = -1000.0 + C
    moved = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    made = []
    real_rows = api._rows

    def rows_of(a, axis, n_threads=None):
        made.append(a.shape == x.shape)
        return real_rows(a, axis, n_threads)

    monkeypatch.setattr(api, "_rows", rows_of)
    for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
        for n_threads in (1, 2, 3):
            made.clear()
            got = f(x, axis=1, n_threads=n_threads)
            want = f(moved, n_threads=n_threads)
            if f is not xf.logsumexp:
                want = np.moveaxis(want, -1, 1)
                assert got.flags.c_contiguous
            assert got.shape == want.shape and got.dtype == want.dtype
            assert np.array_equal(got, want, equal_nan=True), (f.__name__, n_threads)
            if C <= 21 and _xent.group_rows_taken(moved.reshape(-1, C)[:8], np.empty((8, C), dtype), 0):
                assert not any(made), f.__name__       # read in place where the path has groups
            if C > 512:
                assert any(made)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(40, 21, 1), (9, 21, 3), (7, 21, 7), (6, 21, 8), (5, 21, 9), (3, 150, 2, 6),
                                   (2, 33, 5, 5)])
def test_torch_layout_few_positions(dtype, shape):
    # Fewer positions than a group's rows move the class axis (_channels); from 8 on a tile's last
    # partial group runs padded with rows of zeros: the real rows keep the moved rows' bits, with a
    # NaN row and an ignored one among them, weights and a per-row upstream factor.
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    C = shape[1]
    y = rng.integers(0, C, size=shape[:1] + shape[2:])
    x.reshape(shape[0], C, -1)[0, :, -1] = np.nan
    y.reshape(shape[0], -1)[-1, 0] = -100
    probs = rng.random(shape).astype(dtype)
    w = rng.random(C) + 0.5
    g_rows = rng.random(y.shape)
    moved = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    for target, target_m, kw in ((y, y, dict(weight=w)), (y, y, dict(label_smoothing=0.1)),
                                 (probs, np.ascontiguousarray(np.moveaxis(probs, 1, -1)), dict())):
        loss, grad = xf.cross_entropy_with_grad(x, target, axis=1, reduction="none", grad_output=g_rows, **kw)
        loss_m, grad_m = xf.cross_entropy_with_grad(moved, target_m, reduction="none", grad_output=g_rows, **kw)
        assert np.array_equal(loss, loss_m, equal_nan=True) and np.isnan(loss).any()
        assert np.array_equal(grad, np.moveaxis(grad_m, -1, 1), equal_nan=True)
        assert np.array_equal(xf.cross_entropy(x, target, axis=1, reduction="none", **kw),
                              xf.cross_entropy(moved, target_m, reduction="none", **kw), equal_nan=True)
    for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
        want = f(moved)
        assert np.array_equal(f(x, axis=1), want if f is xf.logsumexp else np.moveaxis(want, -1, 1), equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, axis", [((300, 21, 1), 1), ((64, 1000, 1, 1), 1), ((2, 3, 40, 1), 2),
                                         ((17, 1), 0)])
def test_class_axis_followed_by_length_one_axes_is_read_as_rows(dtype, shape, axis, monkeypatch):
    # A classifier's (N, C, 1, 1) output with axis=1 lies in memory as (N, C) rows: every function reads
    # it (and probability targets of its shape) in place and writes the gradient and the softmax family's
    # outputs as rows, with no transposition either way (it took 6x the rows' time at (8192, 1000, 1)),
    # and gives the bits of the rows layout, into out= and in place too.
    from xentfast import api
    from xentfast._core import _layout
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    C = shape[axis]
    rows = x.reshape(-1, C)
    rows[0] = np.nan
    batch_shape = shape[:axis] + shape[axis + 1:]
    y = rng.integers(0, C, size=batch_shape)
    if y.size > 1:
        y.reshape(-1)[-1] = -100
    probs = rng.random(shape).astype(dtype)
    w = rng.random(C) + 0.5
    g_rows = rng.random(batch_shape)

    def no_transposition(*args):
        raise AssertionError("the class axis was transposed")

    monkeypatch.setattr(_layout, "transpose_batched", no_transposition)
    monkeypatch.setattr(np, "moveaxis", no_transposition)
    assert np.shares_memory(api._rows(x, axis)[0], x)
    for target, target_rows, kw in ((y, y.reshape(-1), dict(weight=w, grad_output=g_rows.reshape(-1))),
                                    (y, y.reshape(-1), dict(label_smoothing=0.1)),
                                    (probs, probs.reshape(-1, C), dict())):
        upstream = kw.pop("grad_output", None)
        loss, grad = xf.cross_entropy_with_grad(x, target, axis=axis, reduction="none",
                                                grad_output=None if upstream is None else g_rows, **kw)
        loss_r, grad_r = xf.cross_entropy_with_grad(rows, target_rows, reduction="none",
                                                    grad_output=upstream, **kw)
        assert loss.shape == batch_shape and grad.shape == shape and grad.flags.c_contiguous
        assert np.array_equal(loss.reshape(-1), loss_r, equal_nan=True) and np.isnan(loss_r).any()
        assert np.array_equal(grad.reshape(-1, C), grad_r, equal_nan=True)
        out = np.empty_like(x)
        assert xf.cross_entropy_with_grad(x, target, axis=axis, out=out, **kw)[1] is out
        x_in = x.copy()
        g_in = xf.cross_entropy_with_grad(x_in, target, axis=axis, inplace=True, **kw)[1]
        assert g_in is x_in and np.array_equal(out, x_in, equal_nan=True)
        assert np.array_equal(out.reshape(-1, C), xf.cross_entropy_with_grad(rows, target_rows, **kw)[1],
                              equal_nan=True)
    for f in (xf.log_softmax, xf.softmax):
        got = f(x, axis=axis)
        assert got.shape == shape and np.array_equal(got.reshape(-1, C), f(rows), equal_nan=True)
    assert np.array_equal(xf.logsumexp(x, axis=axis), xf.logsumexp(rows).reshape(batch_shape), equal_nan=True)


@pytest.mark.parametrize("axis", [-1, 1])
def test_out_and_inplace(axis):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 6, 3)) if axis == 1 else rng.standard_normal((5, 6))
    y = rng.integers(0, 6, size=(5, 3) if axis == 1 else 5)
    loss, grad = xf.cross_entropy_with_grad(x, y, axis=axis)
    out = np.empty_like(x)
    loss_out, g_out = xf.cross_entropy_with_grad(x, y, axis=axis, out=out)
    assert g_out is out and np.array_equal(out, grad) and loss_out == loss
    x_in = x.copy()
    loss_in, g_in = xf.cross_entropy_with_grad(x_in, y, axis=axis, inplace=True)
    assert g_in is x_in and np.array_equal(x_in, grad) and loss_in == loss


class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("call", [
    lambda x: xf.cross_entropy_with_grad(x, np.arange(3), inplace=True),
    lambda x: xf.cross_entropy_from_probs_with_grad(x, np.arange(3), inplace=True),
    lambda x: xf.binary_cross_entropy_with_logits_with_grad(x, np.full(x.shape, 0.5), inplace=True),
    lambda x: xf.sigmoid_focal_loss_with_grad(x, np.full(x.shape, 0.5), inplace=True),
    lambda x: xf.binary_cross_entropy_with_grad(x, np.full(x.shape, 0.5), inplace=True),
], ids=["ce", "ce-probs", "bce", "focal", "bce-probs"])
def test_inplace_returns_the_callers_object(call):
    # an ndarray subclass (np.memmap, np.matrix) as well: the softmax family returned a base-class view
    x = np.full((3, 4), 0.25).view(_Subclass)
    expected = call(np.full((3, 4), 0.25))[1]
    g = call(x)[1]
    assert g is x and np.array_equal(np.asarray(x), expected)


def test_inplace_keeps_zero_copy_on_the_fast_path():
    x = np.random.default_rng(7).standard_normal((8, 9)).astype(np.float32)
    y = np.arange(8)
    _, g = xf.cross_entropy_with_grad(x, y, inplace=True)
    assert np.shares_memory(g, x) and g is x


def test_read_only_input_is_accepted():
    x = np.random.default_rng(8).standard_normal((4, 5))
    x.flags.writeable = False
    loss, grad = xf.cross_entropy_with_grad(x, np.arange(4))
    assert np.isfinite(loss) and grad.flags.writeable


# ---- torch semantics on ordinary inputs ------------------------------------------------------------


def _torch_pair(x, t, **kw):
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    tt = torch.tensor(t)
    w = kw.pop("weight", None)
    loss = torch.nn.functional.cross_entropy(xt, tt, weight=None if w is None else torch.tensor(w), **kw)
    loss.sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.15])
@pytest.mark.parametrize("targets", ["index", "index-ignored", "prob"])
@pytest.mark.parametrize("layout", ["2d", "ncd"])
def test_agrees_with_torch(reduction, weighted, eps, targets, layout):
    rng = np.random.default_rng(hash((reduction, weighted, eps, targets, layout)) % 2**32)
    C = 6
    shape = (9, C) if layout == "2d" else (4, C, 3)
    axis = 1
    x = rng.standard_normal(shape) * 2
    batch = tuple(s for i, s in enumerate(shape) if i != axis)
    if targets == "prob":
        t = rng.random(shape)
        t /= t.sum(axis=axis, keepdims=True)
    else:
        t = rng.integers(0, C, size=batch)
        if targets == "index-ignored":
            t.reshape(-1)[::3] = -100
    kw = dict(reduction=reduction, label_smoothing=eps)
    if weighted:
        kw["weight"] = rng.random(C) + 0.1
    want_loss, want_grad = _torch_pair(x, t, **dict(kw))
    loss, grad = xf.cross_entropy_with_grad(x, t, axis=axis, **kw)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


def test_an_infinite_upstream_factor_against_torch():
    # README, "Known limits": probability targets and smoothing give NaN (inf - inf) as in torch; index
    # targets give the signed infinities, where torch's target entry is NaN (inf p - inf)
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
    y = np.array([2, 0])
    t = np.array([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])
    for target, kw in ((y, {}), (y, {"label_smoothing": 0.1}), (t, {})):
        xt = torch.tensor(x, requires_grad=True)
        loss = torch.nn.functional.cross_entropy(xt, torch.tensor(target), reduction="sum", **kw)
        (want,) = torch.autograd.grad(loss, xt, torch.tensor(np.inf, dtype=torch.float64))
        got = xf.cross_entropy_backward(np.inf, x, target, reduction="sum", **kw)
        if kw or target.ndim == 2:
            assert np.isnan(want.numpy()).all() and np.isnan(got).all()
        else:
            target_entry = np.eye(3, dtype=bool)[y]
            np.testing.assert_array_equal(got[~target_entry], want.numpy()[~target_entry])
            assert np.isnan(want.numpy()[target_entry]).all() and (got[target_entry] == -np.inf).all()
    # the z-loss's gradient is two terms as well (README, known limits): the whole row, 0 * inf included
    assert np.isnan(xf.cross_entropy_backward(np.inf, x, y, reduction="sum", z_loss=1e-3)).all()


def test_a_nan_upstream_factor_against_torch():
    # README, special values: a NaN grad_output makes every row it multiplies NaN, a -inf logit's entry and
    # a zero-weight row included (p_j times a NaN coefficient), as in torch; ignored rows keep 0
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, -np.inf, 3.0], [-1.0, 0.5, 4.0], [0.0, 2.0, 1.0], [0.3, 0.2, 0.1]])
    y = np.array([2, 0, -100, 1])
    w = np.array([1.0, 0.0, 2.0])
    for g, reduction in ((np.nan, "sum"), (np.nan, "mean"), (np.array([np.nan, 1.0, np.nan, np.nan]), "none")):
        for kw in ({}, {"label_smoothing": 0.1}, {"weight": w}):
            xt = torch.tensor(x, requires_grad=True)
            tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
            loss = torch.nn.functional.cross_entropy(xt, torch.tensor(y), reduction=reduction, **tkw)
            (want,) = torch.autograd.grad(loss, xt, torch.tensor(g, dtype=torch.float64))
            got = xf.cross_entropy_backward(g, x, y, reduction=reduction, **kw)
            nan_rows = np.array([True, reduction != "none", False, True])
            assert np.isnan(got[nan_rows]).all() and (got[2] == 0).all(), (reduction, kw, got)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want.numpy()))
            exact, scale = ref.cross_entropy_grad(x, y, reduction=reduction, grad_output=g, return_scale=True, **kw)
            assert_ulp_close(got, exact, BOUND[np.dtype(np.float64)] + 1,
                             scale=scale if "label_smoothing" in kw else None)


# ---- the common call's short validation path ---------------------------------------------------------


def _same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k] is b[k] or (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                    and a[k].flags.c_contiguous == b[k].flags.c_contiguous
                                    and np.array_equal(a[k], b[k])), k
        else:
            assert type(a[k]) is type(b[k]) and a[k] == b[k], k


PLAIN_CALLS = [
    dict(),
    dict(reduction="sum", ignore_index=3, labels=[3, 3, 0, 1, 2]),
    dict(reduction="none", empty_mean="zero", axis=1, inplace=True),
    dict(dtype=np.float64, labels=[-100, -100, -100, -100, -100]),
    dict(grad_output=2.0, out=np.zeros((5, 4))),
]


@pytest.mark.parametrize("call", PLAIN_CALLS)
def test_common_call_takes_the_short_path_and_sets_what_the_general_path_sets(call):
    from xentfast import api
    call = dict(call)
    x = np.linspace(-3, 3, 20).reshape(5, 4).astype(call.pop("dtype", np.float32))
    y = np.array(call.pop("labels", [0, 1, 2, 3, -100]), dtype=np.int64)
    args = (x, y, call.get("ignore_index", -100), call.get("reduction", "mean"), 0.0, call.get("axis", -1), 0,
            call.get("empty_mean", "nan"), "propagate", None, call.get("inplace", False), call.get("grad_output"),
            call.get("out"))
    fast, general = object.__new__(api._Problem), object.__new__(api._Problem)
    assert fast._init_plain(*args)
    general._init_general(x, y, None, *args[2:])
    _same_state(vars(fast), vars(general))
    assert fast.denominator() == general.denominator() == np.count_nonzero(y != args[2])


@pytest.mark.parametrize("change", [
    dict(x=np.zeros((5, 4), np.float32)[:, ::2]), dict(x=np.zeros((5, 1, 4), np.float32)), dict(axis=0),
    dict(y=np.zeros(5, np.int32)), dict(label_smoothing=0.1), dict(z_loss=1e-4), dict(nan_policy="raise"),
    dict(n_threads=1), dict(ignore_index=np.int64(-100)), dict(reduction="avg"), dict(grad_output=np.float64(1)),
    dict(x=np.zeros((5, 4), np.float16)), dict(label_smoothing=True),
])
def test_other_calls_take_the_general_path(change):
    from xentfast import api
    kw = dict(x=np.zeros((5, 4), np.float32), y=np.zeros(5, np.int64), ignore_index=-100, reduction="mean",
              label_smoothing=0.0, axis=-1, z_loss=0.0, empty_mean="nan", nan_policy="propagate", n_threads=None,
              inplace=False, grad_output=None, out=None)
    kw.update(change)
    p = object.__new__(api._Problem)
    assert not p._init_plain(*kw.values())
    assert vars(p) == {}


# ---- huge arrays -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_more_than_2_to_31_elements():
    # np.zeros maps untouched pages to the zero page, so 10.7 GB of logits cost no memory to read;
    # the last row's offset is beyond 2^31 elements, where 32-bit indexing would wrap
    n, c = 5, 2**29
    x = np.zeros((n, c), dtype=np.float32)
    assert x.size > 2**31 and (n - 1) * c >= 2**31  # row 4 starts past the int32 range
    x[n - 1, c - 1] = 10.0
    y = np.array([0, 1, 2, 3, c - 1])
    loss = xf.cross_entropy(x, y, reduction="none")
    # the last row: log((c - 1) + e^10) - 10; the others: log c
    with mpmath.workdps(40):
        want_last = mpmath.log((c - 1) + mpmath.exp(10)) - 10
        want_uniform = mpmath.log(c)
    assert_ulp_close(loss[:4], np.array([want_uniform] * 4, dtype=object), 2)
    assert_ulp_close(loss[4:], np.array([want_last], dtype=object), 2)


@pytest.mark.slow
def test_fused_gradient_beyond_2_to_31_elements():
    # rows of 32768 float32 classes (128 KB): on the AVX2 path each row's gradient is written during the
    # thread's next row (softmax_rows.h, xf_pending_step), so the last rows' places lie past 2^31
    # elements in the output; a wrapped offset writes or reads some other row.  Zero-page logits again,
    # with a few rows drawn; the 8.6 GB gradient is real memory
    n, c = 65540, 32768
    x = np.zeros((n, c), dtype=np.float32)
    assert x.size > 2**31 and (n - 3) * c > 2**31
    rng = np.random.default_rng(1)
    drawn = [0, n // 2, n - 3, n - 2, n - 1]
    x[drawn] = (rng.standard_normal((len(drawn), c)) * 3).astype(np.float32)
    y = (np.arange(n) * 7919) % c
    loss, grad = xf.cross_entropy_with_grad(x, y, reduction="none", n_threads=2)
    for r in drawn + [1, n - 4]:
        want_loss, want_grad = xf.cross_entropy_with_grad(x[r:r + 1], y[r:r + 1], reduction="none", n_threads=1)
        assert loss[r] == want_loss[0] and np.array_equal(grad[r], want_grad[0]), r


# ---- a subnormal upstream factor ---------------------------------------------------------------------

_BIG = np.finfo(np.float64).max
SUBNORMAL_UPSTREAM_CASES = {
    # class weights of 1e12: w_y / sum(w_y) is ordinary, g / sum(w_y) kept a few bits (804 ULP)
    "weights": (np.random.default_rng(5).standard_normal((3000, 4)), np.arange(3000) % 4,
                dict(weight=np.full(4, 1e12)), "mean"),
    # the z-loss's 2 z lse under logits near DBL_MAX: the kernel's coefficient carries 2^1000 apart, and
    # the factor times the rest rounded on the subnormal grid (1.8e8 ULP)
    "z_loss": (np.array([[_BIG, _BIG, _BIG, 0.0]] * 3000), np.zeros(3000, dtype=np.int64), dict(z_loss=1.0),
               "sum"),
    # probability targets with weights and smoothing: the mean's denominator is the row count
    "probabilities": (np.random.default_rng(6).standard_normal((3000, 4)),
                      np.full((3000, 4), 0.25), dict(weight=np.array([1e15, 1.0, 3e14, 2.0]),
                                                     label_smoothing=0.1), "mean"),
}


@pytest.mark.parametrize("g", [5e-324, -3e-320, 1.1e-310])
@pytest.mark.parametrize("case", sorted(SUBNORMAL_UPSTREAM_CASES))
def test_a_subnormal_upstream_factor_keeps_its_bits(case, g):
    x, t, kw, reduction = SUBNORMAL_UPSTREAM_CASES[case]
    loss_1, grad_1 = xf.cross_entropy_with_grad(x, t, reduction=reduction, grad_output=g, n_threads=1, **kw)
    loss_2, grad_2 = xf.cross_entropy_with_grad(x, t, reduction=reduction, grad_output=g, n_threads=2, **kw)
    assert loss_1 == loss_2 and grad_1.tobytes() == grad_2.tobytes()
    assert loss_1 == xf.cross_entropy(x, t, reduction=reduction, **kw)
    assert xf.cross_entropy_backward(g, x, t, reduction=reduction, **kw).tobytes() == grad_1.tobytes()
    xc = x.copy()
    loss_i, grad_i = xf.cross_entropy_with_grad(xc, t, reduction=reduction, grad_output=g, inplace=True, **kw)
    assert grad_i is xc and loss_i == loss_1 and grad_i.tobytes() == grad_1.tobytes()
    # the mpmath reference on 12 rows, per row, times the exact factor of the whole reduction
    sel = np.r_[0:6, len(x) - 6:len(x)]
    exact, scale = ref.cross_entropy_grad(x[sel], t[sel], reduction="none", return_scale=True, **kw)
    if reduction == "mean":
        w = kw.get("weight")
        den = len(x) if (t.ndim == 2 or w is None) else mpmath.fsum(mpmath.mpf(w[c]) for c in t)
    else:
        den = 1
    factor = mpmath.mpf(g) / den
    assert_ulp_close(grad_1[sel], np.array([[e * factor for e in row] for row in exact], dtype=object),
                     BOUND[np.dtype(np.float64)] + 1,
                     scale=np.array([[s * abs(factor) for s in row] for row in scale], dtype=object))
    if not (case == "weights" and g == 5e-324):   # there each entry is below g / 3000: 0 is exact
        assert np.any(grad_1[sel] != 0)


@pytest.mark.parametrize("g", [5e-324, 1.1e-310, 1.0])
def test_a_subnormal_per_row_factor_under_a_z_loss_near_dbl_max(g):
    # per-row factors are exact, but under logits near DBL_MAX the z-loss's coefficient carries 2^1000
    # apart, and the factor times the rest rounded on the subnormal grid (1.8e8 ULP at 5e-324)
    x = np.array([[_BIG, _BIG, _BIG, 0.0], [_BIG / 2, -_BIG, 0.0, 1.0]])
    y = np.array([0, 1])
    up = np.array([g, -g])
    grad = xf.cross_entropy_backward(up, x, y, reduction="none", z_loss=1.0)
    exact, scale = ref.cross_entropy_grad(x, y, reduction="none", z_loss=1.0, grad_output=up, return_scale=True)
    assert_ulp_close(grad, exact, BOUND[np.dtype(np.float64)] + 1, scale=scale)
    assert np.all(grad[0, :3] != 0)


def test_a_z_loss_beyond_the_lift_bound_keeps_a_finite_gradient():
    # z max(w) = 1e347 > 2^1000: not lifted (the lifted entries, 3.4e23 * 2^52, passed FLT_MAX: inf)
    x = np.zeros((1, 2), np.float32)
    kw = dict(weight=np.array([1e300, 1e300]), z_loss=1e47, reduction="sum")
    _, grad = xf.cross_entropy_with_grad(x, np.array([0]), grad_output=5e-324, **kw)
    exact, scale = ref.cross_entropy_grad(x, np.array([0]), grad_output=5e-324, return_scale=True, **kw)
    assert_ulp_close(grad, exact, BOUND[np.dtype(np.float32)] + 1, scale=scale)
