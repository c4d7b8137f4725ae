"""inplace=True: the gradient overwrites the input, and every result keeps the bits of inplace=False.

Some reductions launch the kernel on the input again after the gradient pass: the sum or mean of losses
that are all below 2^-969 (taken again scaled by 2^600), the weighted-gradient fold of a mean with
subnormal class weights (a forward launch next to the gradient launch), and a binary mean whose sum
overflows because a weighted loss did (taken again with the weights scaled by 2^-64).  With the gradient
in place of the input, each of them would read the gradient as logits or probabilities.  Every case
below takes one of those paths; the last tests check that ordinary in-place calls still make a single
pass over the data.
"""
import types

import numpy as np
import pytest
from fake_device import _dev, _host

import xentfast as xf
from xentfast import _backend
from xentfast._threads import threads_for as xf_threads

DTYPES = [np.float32, np.float64]
DBL_MAX = np.finfo(np.float64).max


def _bits(a):
    a = np.asarray(_host(a))
    return a.dtype, a.shape, a.tobytes()


def _same_in_place(f, x, target, **kw):
    """f(x, target, **kw) with inplace=False and with inplace=True: the same loss and gradient bits."""
    want_loss, want_grad = f(x.copy(), target, **kw)
    xi = x.copy()
    loss, grad = f(xi, target, inplace=True, **kw)
    assert grad is xi
    assert _bits(loss) == _bits(want_loss), f"loss: in place {loss!r}, separate {want_loss!r}"
    assert _bits(grad) == _bits(want_grad), "gradient"
    return want_loss


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("weight", [None, [3.0, 0.5]], ids=["unweighted", "weighted"])
def test_softmax_tiny_row_losses(dtype, reduction, weight):
    # each row loss is exp(-720) or so, below 2^-969: the reduction takes them again scaled by 2^600
    x = np.array([[720.0, 0.0], [720.0, 0.0], [700.0, -30.0]], dtype=dtype)
    y = np.array([0, 0, 0])
    w = None if weight is None else np.array(weight)
    loss = _same_in_place(xf.cross_entropy_with_grad, x, y, reduction=reduction, weight=w)
    # float32 rounds the sum to 0; read as logits, the gradient would give about 3 log 2
    assert 0 <= loss < (1e-300 if dtype == np.float64 else 1e-30)


def test_softmax_tiny_weights_and_leading_ignored_rows():
    # ordinary logits under class weights of 1e-300: row losses below 2^-969 again (a sum is not
    # rescaled); the first rows are ignored, so the first kept row is the one that says so.  float64
    # only: the float32 sum is 0 both ways, even from the gradient read as logits (it is that small too)
    x = np.array([[0.0, 0.0], [1.0, 2.0], [0.5, -1.0], [3.0, 3.0]])
    y = np.array([-100, -100, 0, 1])
    _same_in_place(xf.cross_entropy_with_grad, x, y, reduction="sum", weight=np.array([1e-300, 2e-300]))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_softmax_tiny_losses_with_probability_targets(dtype, reduction):
    x = np.array([[720.0, 0.0], [0.0, 725.0]], dtype=dtype)
    t = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=dtype)
    _same_in_place(xf.cross_entropy_with_grad, x, t, reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("grad_output", [None, 1e300], ids=["subnormal-weight", "scale-overflows"])
def test_softmax_weighted_mean_fold(dtype, grad_output):
    # a weighted mean whose 1/sum(w_y) gradient factor is folded into the weights: the gradient launch
    # and the forward launch are separate, and the forward one must still read the logits
    x = np.array([[1.0, 2.0], [0.5, -1.0], [-3.0, 0.25]], dtype=dtype)
    y = np.array([0, 0, 1])
    w = np.array([5e-324, 1.0]) if grad_output is None else np.array([1e-300, 1e-300])
    kw = dict(reduction="mean", weight=w)
    if grad_output is not None:
        kw["grad_output"] = grad_output
    with np.errstate(over="ignore"):
        loss = _same_in_place(xf.cross_entropy_with_grad, x, y, **kw)
    assert np.isfinite(loss) and loss > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_ce_from_probs_tiny_row_losses(dtype, reduction):
    # -w_y log p_y with w = 1e-300: below 2^-969 (cross_entropy_from_probs does not rescale a mean)
    p = np.array([[0.5, 0.5], [0.25, 0.75], [0.125, 0.875]], dtype=dtype)
    y = np.array([0, 1, 0])
    _same_in_place(xf.cross_entropy_from_probs_with_grad, p, y, reduction=reduction,
                   weight=np.array([1e-300, 3e-300]))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ce_from_probs_weighted_mean_fold(dtype):
    p = np.array([[0.5, 0.5], [0.25, 0.75], [0.125, 0.875]], dtype=dtype)
    y = np.array([0, 1, 0])
    with np.errstate(over="ignore"):
        _same_in_place(xf.cross_entropy_from_probs_with_grad, p, y, reduction="mean", weight=np.array([5e-324, 1.0]))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("weight", [None, [2.0, 0.5, 1.0]], ids=["unweighted", "weighted"])
def test_bce_logits_tiny_element_losses(dtype, reduction, weight):
    x = np.array([720.0, 700.0, 730.0], dtype=dtype)
    y = np.ones(3, dtype=dtype)
    w = None if weight is None else np.array(weight)
    _same_in_place(xf.binary_cross_entropy_with_logits_with_grad, x, y, reduction=reduction, weight=w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_focal_tiny_element_losses(dtype, reduction):
    x = (np.linspace(739.0, 741.0, 16) / 3).astype(dtype)
    y = np.ones(16, dtype=dtype)
    _same_in_place(xf.sigmoid_focal_loss_with_grad, x, y, reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_bce_from_probabilities_tiny_element_losses(dtype, reduction):
    p = np.array([0.5, 0.25, 0.875], dtype=dtype)
    y = np.array([1.0, 0.0, 1.0], dtype=dtype)
    _same_in_place(xf.binary_cross_entropy_with_grad, p, y, reduction=reduction, weight=np.array(1e-300))


# float64 only: a float32 input cannot have a finite mean after a weighted loss overflowed a double
# (|x| <= 3.4e38 needs w > 5e269, and the mean is then beyond float32), so both results are inf there
@pytest.mark.parametrize("x, y, kw", [
    ([-1e10, 0.0], [1.0, 0.0], dict(weight=np.array([2e298, 1.0]))),
    ([-DBL_MAX, 0.0], [1.0, 1.0], dict(pos_weight=np.array(2.0))),
    ([-1e299, 3.0, 0.0], [1.0, 0.5, 0.0], dict(weight=np.array([4.0, 1.0, 1.0]), pos_weight=np.array(1e9))),
], ids=["weight", "pos_weight", "both"])
def test_bce_logits_mean_beyond_an_overflowed_loss(x, y, kw):
    # a weighted element loss is beyond DBL_MAX, the mean is not: the mean is taken again with the
    # weights scaled by 2^-64, from the logits
    loss = _same_in_place(xf.binary_cross_entropy_with_logits_with_grad, np.array(x), np.array(y),
                          reduction="mean", **kw)
    assert np.isfinite(loss) and loss > 1e307


def test_bce_mean_of_exact_infinities_is_inf_in_place():
    # x = -inf with y = 1 is an exact infinite loss: +inf in both modes, with or without weights <= 1
    x = np.array([-np.inf, 0.0, 2.0])
    y = np.array([1.0, 0.0, 1.0])
    for kw in ({}, dict(weight=np.array([0.5, 1.0, 0.25])), dict(pos_weight=np.array(3.0))):
        assert _same_in_place(xf.binary_cross_entropy_with_logits_with_grad, x, y, reduction="mean", **kw) == np.inf


# ---- ordinary in-place calls: one pass over the data ---------------------------------------------------


def _count_launches(monkeypatch, threads=None):
    """Rows (softmax family) or elements (binary family) each kernel launch covers; `threads`, if a list,
    receives each launch's thread count."""
    sizes = []

    def counting(f, rows_of, threads_at):
        def call(*args, **kwargs):
            sizes.append(rows_of(args))
            if threads is not None:
                threads.append(args[threads_at])
            return f(*args, **kwargs)
        return call

    cpu = _backend.CPU
    soft = types.SimpleNamespace(**{k: getattr(cpu.softmax, k) for k in dir(cpu.softmax) if not k.startswith("__")})
    soft.softmax_xent = counting(cpu.softmax.softmax_xent, lambda a: a[0].shape[0], 11)
    binary = types.SimpleNamespace(**{k: getattr(cpu.binary, k) for k in dir(cpu.binary) if not k.startswith("__")})
    binary.elementwise = counting(cpu.binary.elementwise, lambda a: a[1].shape[0], 22)
    binary.ce_probs = counting(cpu.binary.ce_probs, lambda a: a[0].shape[0], 11)
    monkeypatch.setattr(cpu, "softmax", soft)
    monkeypatch.setattr(cpu, "binary", binary)
    return sizes


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ordinary_in_place_calls_make_one_pass(monkeypatch, reduction):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 7))
    y = rng.integers(0, 7, 3000)
    y[:5] = -100
    w = rng.uniform(0.5, 3.0, 7)
    sizes = _count_launches(monkeypatch)
    # one row decides that no rerun can come (the first kept one), then the fused pass
    xf.cross_entropy_with_grad(x.copy(), y, reduction=reduction, weight=w, inplace=True)
    assert sizes == [1, 3000]
    sizes.clear()
    xf.cross_entropy_from_probs_with_grad(xf.softmax(x), y, reduction=reduction, weight=w, inplace=True)
    assert sizes == [1, 3000]
    sizes.clear()
    # the binary family: the first 64 elements, then the fused pass; weights above 1 on float64
    # logits cost one read of the logits for the bound of _only_exact_infinities, no kernel launch
    t = (x > 0).astype(np.float64)
    xf.binary_cross_entropy_with_logits_with_grad(x.copy(), t, reduction=reduction, weight=w,
                                                  pos_weight=np.full(7, 3.0), inplace=True)
    assert sizes == [64, 21000]
    sizes.clear()
    # nothing to decide without a reduction or in place (weighted: the plain-call lane, which launches
    # no kernel through the backend, would take the unweighted call)
    xf.cross_entropy_with_grad(x.copy(), y, reduction="none", inplace=True)
    xf.cross_entropy_with_grad(x.copy(), y, reduction=reduction, weight=w)
    assert sizes == [3000, 3000]


def test_the_probe_runs_on_one_thread(monkeypatch):
    # a team of threads on one row or a few elements costs more than the work, milliseconds on a busy
    # machine: the probe asks for one thread whatever the call's count
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 1000))
    threads = []
    sizes = _count_launches(monkeypatch, threads)
    xf.cross_entropy_with_grad(x.copy(), rng.integers(0, 1000, 40), inplace=True, n_threads=2)
    xf.binary_cross_entropy_with_logits_with_grad(x.copy(), (x > 0).astype(np.float64), inplace=True,
                                                  n_threads=2)
    assert sizes == [1, 40, 64, 40000]
    assert threads == [1, xf_threads(2, 40000), 1, xf_threads(2, 40000)]


def test_in_place_rerun_takes_two_passes(monkeypatch):
    # the pathological case pays a forward pass before the gradient pass, not a copy of the input
    x = np.array([[720.0, 0.0]] * 4)
    y = np.zeros(4, dtype=np.int64)
    sizes = _count_launches(monkeypatch)
    xf.cross_entropy_with_grad(x, y, reduction="sum", inplace=True)
    assert sizes == [1, 4, 4, 4]      # probe, forward, the rescaled forward, gradient


def test_in_place_rerun_on_a_device(device):
    # the probe picks its row with array methods on the device arrays (no NumPy module functions)
    x = np.array([[0.0, 0.0], [720.0, 0.0], [730.0, 1.0]])
    y = np.array([-100, 0, 0])
    want_loss, want_grad = xf.cross_entropy_with_grad(x, y, reduction="sum", weight=np.array([2.0, 1.0]))
    xd = _dev(x.copy())
    loss, grad = xf.cross_entropy_with_grad(xd, _dev(y), reduction="sum", weight=_dev(np.array([2.0, 1.0])),
                                            inplace=True)
    assert grad is xd
    assert _bits(loss) == _bits(want_loss) and _bits(grad) == _bits(want_grad)
    xb = np.array([720.0, 700.0, 730.0])
    want_loss, want_grad = xf.binary_cross_entropy_with_logits_with_grad(xb, np.ones(3), reduction="mean",
                                                                       pos_weight=np.array(2.0))
    xd = _dev(xb.copy())
    loss, grad = xf.binary_cross_entropy_with_logits_with_grad(xd, _dev(np.ones(3)), reduction="mean",
                                                               pos_weight=_dev(np.array(2.0)), inplace=True)
    assert _bits(loss) == _bits(want_loss) and _bits(grad) == _bits(want_grad)


def test_in_place_mean_with_nothing_to_average():
    # every row ignored (a fully padded batch) or of zero target weight: the mean is empty_mean, the
    # gradient 0, and the reduction must not launch on the overwritten logits
    x = np.array([[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]])
    for kw in (dict(target=np.array([-100, -100])), dict(target=np.array([0, 0]), weight=np.array([0.0, 1, 1]))):
        loss, grad = xf.cross_entropy_with_grad(x.copy(), inplace=True, **kw)
        assert np.isnan(loss) and (grad == 0).all()
        loss, _ = xf.cross_entropy_with_grad(x.copy(), inplace=True, empty_mean="zero", **kw)
        assert loss == 0
    loss, grad = xf.binary_cross_entropy_with_logits_with_grad(x.copy(), np.full(x.shape, -1.0), ignore_index=-1,
                                                               inplace=True)
    assert np.isnan(loss) and (grad == 0).all()
