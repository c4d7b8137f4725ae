"""Dispatch by array type (xentfast._backend), tested without a GPU.

The stand-in device backend of tests/fake_device.py (fixture ``device``) holds its arrays in
``DevArray``, which refuses NumPy's module functions as a CuPy array does, so a code path that forgets
the call's array module fails here instead of on the one GPU run.  Its kernels are the CPU kernels, so
every result must carry the NumPy call's bits; its host transfers are counted, so the "one round trip
before the kernels" rule is checked too.  The same API on real CuPy arrays is tested in
tests/test_cuda.py (marker gpu).
"""
import numpy as np
import pytest
from fake_device import _dev, same_bits

import xentfast as xf


def _problem(dtype, seed=0, shape=(6, 9)):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    y = rng.integers(0, shape[-1], shape[:-1])
    y.flat[1] = -100
    return x, y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1, "z_loss": 1e-3}, {"weight": True}])
def test_softmax_family_runs_on_the_device_with_the_cpu_bits(device, dtype, reduction, options):
    x, y = _problem(dtype)
    kw = dict(options, reduction=reduction)
    if kw.pop("weight", False):
        kw["weight"] = np.linspace(0.5, 2, x.shape[-1])
    dkw = {k: (_dev(np.asarray(v)) if k == "weight" else v) for k, v in kw.items()}
    loss, grad = xf.cross_entropy_with_grad(x, y, **kw)
    dloss, dgrad = xf.cross_entropy_with_grad(_dev(x), _dev(y), **dkw)
    same_bits(dloss, loss, "loss")
    same_bits(dgrad, grad, "gradient")
    same_bits(xf.cross_entropy(_dev(x), _dev(y), **dkw), xf.cross_entropy(x, y, **kw), "forward")
    go = np.float64(0.5) if reduction != "none" else np.linspace(1, 2, x.shape[0])
    dgo = go if reduction != "none" else _dev(go)
    same_bits(xf.cross_entropy_backward(dgo, _dev(x), _dev(y), **dkw), xf.cross_entropy_backward(go, x, y, **kw),
              "backward")
    probs = xf.softmax(x)
    same_bits(xf.cross_entropy(_dev(x), _dev(probs), reduction=reduction), xf.cross_entropy(x, probs, reduction=reduction),
              "probability targets")
    for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
        same_bits(f(_dev(x)), f(x), f.__name__)


def test_class_axis_out_and_inplace_on_the_device(device):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7, 4)).astype(np.float32)   # torch layout (N, C, d): axis=1
    y = rng.integers(0, 7, (3, 4))
    loss, grad = xf.cross_entropy_with_grad(x, y, axis=1)
    out = _dev(np.full_like(x, np.nan))
    dloss, dgrad = xf.cross_entropy_with_grad(_dev(x), _dev(y), axis=1, out=out)
    assert dgrad is out
    same_bits(dloss, loss, "loss")
    same_bits(dgrad, grad, "gradient into out=")
    x2 = rng.standard_normal((5, 11)).astype(np.float64)
    y2 = rng.integers(0, 11, 5)
    _, g2 = xf.cross_entropy_with_grad(x2, y2)
    xd = _dev(x2.copy())
    _, gd = xf.cross_entropy_with_grad(xd, _dev(y2), inplace=True)
    assert gd is xd
    same_bits(xd, g2, "inplace gradient")
    with pytest.raises(TypeError, match=r"^out: NumPy array\(s\) mixed with fake-device array\(s\) \(input, target\)"):
        xf.cross_entropy_with_grad(_dev(x2), _dev(y2), out=np.empty_like(x2))


def test_validation_costs_one_transfer_before_the_kernel(device):
    x, y = _problem(np.float32)
    w = _dev(np.linspace(0.5, 2, x.shape[-1]))
    xf.cross_entropy_with_grad(_dev(x), _dev(y), weight=w, nan_policy="raise", reduction="none")
    # labels, weights, NaN policy and the mean's denominator: all flags in one copy to the host
    assert device.before_kernel == [1]
    device.before_kernel.clear()
    device.count = 0
    xf.binary_cross_entropy_with_logits(_dev(x), _dev((x > 0).astype(np.float32)), weight=w,
                                        pos_weight=_dev(np.full(x.shape[-1], 2.0)), nan_policy="raise",
                                        ignore_index=-1.0)
    assert device.before_kernel == [1]


@pytest.mark.parametrize("call, match", [
    (lambda d: xf.cross_entropy(d(np.zeros((2, 3), np.float32)), d(np.array([0, 7]))),
     r"target: labels must be in \[0, 3\) or equal ignore_index=-100; found 7 at index \[1\]"),
    (lambda d: xf.cross_entropy(d(np.zeros((2, 3), np.float32)), d(np.array([0, 1], np.uint8)), ignore_index=-100,
                                weight=d(np.array([1.0, -1.0, 1.0]))),
     r"weight: class weights must be finite and >= 0; found -1.0 at index 1"),
    (lambda d: xf.cross_entropy(d(np.array([[0.0, np.nan]])), d(np.array([0])), nan_policy="raise"),
     r"input: NaN logit in row \[0\] at class 1"),
    (lambda d: xf.binary_cross_entropy(d(np.array([0.5, 1.5])), d(np.array([0.0, 1.0]))),
     r"input: probabilities must be in \[0, 1\]"),
    (lambda d: xf.binary_cross_entropy_with_logits(d(np.array([0.5, 1.5])), d(np.array([0.0, 2.0]))),
     r"target: values must be in \[0, 1\]; found 2.0 at index \[1\]"),
    (lambda d: xf.sigmoid_focal_loss(d(np.array([0.5, np.nan])), d(np.array([0.0, 1.0])), nan_policy="raise"),
     r"input: NaN at index \[1\]"),
])
def test_device_errors_are_the_cpu_errors(device, call, match):
    with pytest.raises(ValueError, match=match):
        call(lambda a: a)
    with pytest.raises(ValueError, match=match):
        call(_dev)


def test_mixed_arrays_raise_type_error_naming_them(device):
    x, y = _problem(np.float32)
    with pytest.raises(TypeError, match=r"^target: NumPy array\(s\) mixed with fake-device array\(s\) \(input\)"):
        xf.cross_entropy(_dev(x), y)
    with pytest.raises(TypeError, match=r"^input, target: NumPy .*\(weight\)"):
        xf.cross_entropy(x, y, weight=_dev(np.ones(x.shape[-1])))
    with pytest.raises(TypeError, match=r"^grad_output: NumPy array\(s\) mixed"):
        xf.cross_entropy_backward(np.ones(x.shape[0]), _dev(x), _dev(y), reduction="none")
    with pytest.raises(TypeError, match=r"^target: NumPy"):
        xf.binary_cross_entropy_with_logits(_dev(x), np.zeros_like(x))
    # Python scalars and lists take the arrays' side
    same_bits(xf.cross_entropy(_dev(x[:2]), [0, 1]), xf.cross_entropy(x[:2], [0, 1]), "list target")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_family_runs_on_the_device_with_the_cpu_bits(device, dtype, reduction):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((5, 8)) * 6).astype(dtype)
    t = (rng.uniform(size=(5, 8)) > 0.5).astype(dtype)
    t[0, 0] = -1
    w = rng.uniform(0.5, 2, (5, 1))
    pw = rng.uniform(0.5, 2, 8)
    calls = [
        (xf.binary_cross_entropy_with_logits_with_grad, (x, t), dict(weight=w, pos_weight=pw, ignore_index=-1.0)),
        (xf.sigmoid_focal_loss_with_grad, (x, np.abs(t)), dict(alpha=0.3, gamma=1.5)),
        (xf.binary_cross_entropy_with_grad, (1 / (1 + np.exp(-x)), np.abs(t)), dict(weight=w, eps=1e-7)),
    ]
    for f, args, kw in calls:
        args = tuple(a.astype(dtype) for a in args)
        loss, grad = f(*args, reduction=reduction, **kw)
        dkw = {k: (_dev(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        dloss, dgrad = f(*map(_dev, args), reduction=reduction, **dkw)
        same_bits(dloss, loss, f"{f.__name__} loss")
        same_bits(dgrad, grad, f"{f.__name__} gradient")
    p = xf.softmax(x)
    y = rng.integers(0, 8, 5)
    for target in (y, xf.softmax(x[::-1].copy())):
        loss, grad = xf.cross_entropy_from_probs_with_grad(p, target, reduction=reduction, weight=pw)
        dloss, dgrad = xf.cross_entropy_from_probs_with_grad(_dev(p), _dev(target), reduction=reduction,
                                                             weight=_dev(pw))
        same_bits(dloss, loss, "cross_entropy_from_probs loss")
        same_bits(dgrad, grad, "cross_entropy_from_probs gradient")


def test_tiny_losses_take_the_scaled_reduction_on_the_device(device):
    # every element loss below 2^-969: the reduction reruns the kernel scaled by 2^600 (api_binary)
    x = np.full(4, -700.0)
    t = np.zeros(4)
    same_bits(xf.binary_cross_entropy_with_logits(_dev(x), _dev(t), reduction="sum"),
              xf.binary_cross_entropy_with_logits(x, t, reduction="sum"), "tiny sum")
    assert xf.binary_cross_entropy_with_logits(x, t, reduction="sum") > 0
