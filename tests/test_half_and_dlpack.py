"""Half-precision inputs and arrays of other libraries (torch, JAX, anything with ``__dlpack__``).

Contract for float16 and bfloat16 inputs: losses, logsumexp and log_softmax come back in float32 within
1 ULP of float32 of the exact value for the half inputs; gradients and softmax come back in the input's
dtype within 1 ULP of it (soft-target gradients in ulps of the reference's cancellation scale, as for the
other dtypes).  The exact inputs are the half values widened to float64 (exact).  The design behind it,
checked too: the float64 path's result rounded once, by mpmath's rounding (xentfast.reference.rounded),
not by the code under test.

Arrays of other libraries must give the NumPy path's bits and come back as the caller's kind.
"""
import math

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xentfast as xf
from xentfast import _dtypes
from xentfast import reference as ref
from xentfast.testing import (assert_ulp_close, binary_logits, binary_targets, binary_xent_cases, class_weights,
                              element_weights, index_targets, logits, prob_targets, softmax_xent_cases, ulp,
                              ulp_error, unit_probabilities)

try:
    import ml_dtypes
    BF16 = ml_dtypes.bfloat16
except ImportError:  # ml_dtypes is optional: the bfloat16 cases skip
    ml_dtypes = BF16 = None

HALF = [pytest.param(np.float16, id="float16"),
        pytest.param(BF16, id="bfloat16", marks=pytest.mark.skipif(BF16 is None, reason="ml_dtypes not installed"))]
HALF_BOUND = 1.0
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

# the mpmath reference dominates the run time: a third of the profile's examples per property
few = settings(max_examples=max(10, settings.default.max_examples // 3))


def wide(a):
    """The exact inputs: half (or any float) values widened to float64; integers and None unchanged."""
    if a is None:
        return None
    a = np.asarray(a)
    return a.astype(np.float64) if (a.dtype.kind == "f" or _dtypes.is_bfloat16(a.dtype)) else a


def rounded_once(v64, dt):
    """The float64 path's value(s) rounded once to `dt` by mpmath (independent of xentfast._dtypes)."""
    return np.asarray(ref.rounded(np.asarray(v64, dtype=np.float64).astype(object), dt))


def same_values(got, want, what):
    """Equal values (NaN equal to NaN; the reference rounding has no signed zero, so -0 == 0 here)."""
    g, w = np.asarray(got), np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert np.array_equal(g.astype(np.float64), w.astype(np.float64), equal_nan=True), what


def check_half_loss(loss, loss64, exact, what, dtype=F32):
    assert np.asarray(loss).dtype == F32, f"{what}: loss dtype {np.asarray(loss).dtype}, not float32"
    assert_ulp_close(np.asarray(loss), exact, HALF_BOUND, dtype=dtype, err_msg=what)
    with np.errstate(over="ignore"):
        same_values(loss, np.asarray(loss64).astype(np.float32), f"{what}: not the float64 path rounded once")


def check_half_grad(grad, grad64, exact, scale, dtype, what):
    assert grad.dtype == np.dtype(dtype), f"{what}: gradient dtype {grad.dtype}, not {np.dtype(dtype)}"
    assert_ulp_close(grad, exact, HALF_BOUND, dtype=dtype, scale=scale, err_msg=what)
    same_values(grad, rounded_once(grad64, dtype), f"{what}: not the float64 path rounded once")


# ---- the half contract, softmax family -------------------------------------------------------------


def _xent_kw(case):
    return dict(weight=case.weight, ignore_index=case.ignore_index, label_smoothing=case.label_smoothing,
                z_loss=case.z_loss)


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_cross_entropy_half_contract(dtype, data):
    case = data.draw(softmax_xent_cases(dtype, max_rows=6, max_classes=17))
    reduction = data.draw(st.sampled_from(["none", "none", "mean", "sum"]))
    x, t = case.logits, case.target
    kw = _xent_kw(case)
    kw64 = dict(kw, weight=wide(case.weight))
    note(f"reduction={reduction}, options {kw}")
    simple = t.dtype.kind in "iu" and case.label_smoothing == 0 and case.z_loss == 0
    loss, grad = xf.cross_entropy_with_grad(x, t, reduction=reduction, **kw)
    loss64, grad64 = xf.cross_entropy_with_grad(wide(x), wide(t), reduction=reduction, **kw64)
    exact = ref.cross_entropy(wide(x), wide(t), reduction=reduction, **kw64)
    check_half_loss(loss, loss64, exact, f"{reduction} loss")
    exact_g, scale = ref.cross_entropy_grad(wide(x), wide(t), reduction=reduction, return_scale=True, **kw64)
    check_half_grad(grad, grad64, exact_g, None if simple else scale, dtype, f"gradient of {reduction}")


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_softmax_family_half_contract(dtype, data):
    x = data.draw(logits(dtype, max_rows=6, max_classes=17))
    x64 = wide(x)
    for f, rf in ((xf.logsumexp, ref.logsumexp), (xf.log_softmax, ref.log_softmax)):
        check_half_loss(f(x), f(x64), rf(x64), f.__name__)
    p = xf.softmax(x)
    check_half_grad(p, xf.softmax(x64), ref.softmax(x64), None, dtype, "softmax")


# ---- the half contract, binary family --------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_bce_with_logits_half_contract(dtype, data):
    case = data.draw(binary_xent_cases(dtype, max_size=24))
    reduction = data.draw(st.sampled_from(["none", "none", "mean", "sum"]))
    x, t = case.logits, case.target
    kw = dict(weight=case.weight, pos_weight=case.pos_weight, ignore_index=case.ignore_index)
    kw64 = dict(kw, weight=wide(case.weight), pos_weight=wide(case.pos_weight))
    note(f"reduction={reduction}, options {kw}")
    loss, grad = xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction, **kw)
    loss64, grad64 = xf.binary_cross_entropy_with_logits_with_grad(wide(x), wide(t), reduction=reduction, **kw64)
    exact = ref.binary_cross_entropy_with_logits(wide(x), wide(t), reduction=reduction, **kw64)
    check_half_loss(loss, loss64, exact, f"{reduction} loss")
    exact_g, scale = ref.binary_cross_entropy_with_logits_grad(wide(x), wide(t), reduction=reduction,
                                                               return_scale=True, **kw64)
    check_half_grad(grad, grad64, exact_g, scale, dtype, f"gradient of {reduction}")


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_focal_half_contract(dtype, data):
    x = data.draw(binary_logits(dtype, max_size=24))
    t = data.draw(binary_targets(x.shape, dtype))
    alpha, gamma = data.draw(st.tuples(st.sampled_from([0.25, -1.0, 0.8]), st.sampled_from([2.0, 0.0, 0.5, 3.7])))
    reduction = data.draw(st.sampled_from(["none", "none", "mean"]))
    note(f"alpha={alpha}, gamma={gamma}, reduction={reduction}")
    loss, grad = xf.sigmoid_focal_loss_with_grad(x, t, alpha, gamma, reduction=reduction)
    loss64, grad64 = xf.sigmoid_focal_loss_with_grad(wide(x), wide(t), alpha, gamma, reduction=reduction)
    check_half_loss(loss, loss64, ref.sigmoid_focal_loss(wide(x), wide(t), alpha, gamma, reduction=reduction),
                    "focal loss")
    exact_g, scale = ref.sigmoid_focal_loss_grad(wide(x), wide(t), alpha, gamma, reduction=reduction,
                                                 return_scale=True)
    check_half_grad(grad, grad64, exact_g, scale, dtype, "focal gradient")


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_bce_from_probabilities_half_contract(dtype, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6))
    p = data.draw(unit_probabilities(shape, dtype))
    t = data.draw(binary_targets(shape, dtype))
    w = data.draw(element_weights(shape, dtype))
    mode = data.draw(st.sampled_from([{}, {}, {"eps": 1e-7}, {"log_clamp": -100.0}]))
    reduction = data.draw(st.sampled_from(["none", "none", "sum"]))
    note(f"mode={mode}, reduction={reduction}")
    loss, grad = xf.binary_cross_entropy_with_grad(p, t, w, reduction=reduction, **mode)
    loss64, grad64 = xf.binary_cross_entropy_with_grad(wide(p), wide(t), wide(w), reduction=reduction, **mode)
    check_half_loss(loss, loss64, ref.binary_cross_entropy(wide(p), wide(t), wide(w), reduction=reduction, **mode),
                    "BCE loss")
    exact_g, scale = ref.binary_cross_entropy_grad(wide(p), wide(t), wide(w), reduction=reduction,
                                                   return_scale=True, **mode)
    check_half_grad(grad, grad64, exact_g, scale, dtype, "BCE gradient")


@pytest.mark.parametrize("dtype", HALF)
@few
@given(data=st.data())
def test_cross_entropy_from_probs_half_contract(dtype, data):
    rows, C = data.draw(st.integers(1, 5)), data.draw(st.sampled_from([1, 2, 3, 8]))
    p = data.draw(unit_probabilities((rows, C), dtype))
    if data.draw(st.booleans()):
        t = data.draw(prob_targets((rows, C), dtype))
    else:
        t = data.draw(index_targets(C, rows))
    w = data.draw(st.one_of(st.none(), class_weights(C, dtype)))
    reduction = data.draw(st.sampled_from(["none", "none", "mean"]))
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, t, w, reduction=reduction)
    loss64, grad64 = xf.cross_entropy_from_probs_with_grad(wide(p), wide(t), wide(w), reduction=reduction)
    check_half_loss(loss, loss64, ref.cross_entropy_from_probs(wide(p), wide(t), wide(w), reduction=reduction),
                    "CE-from-probabilities loss")
    check_half_grad(grad, grad64, ref.cross_entropy_from_probs_grad(wide(p), wide(t), wide(w), reduction=reduction),
                    None, dtype, "CE-from-probabilities gradient")


# ---- the rounding, out=, inplace=, backward, dtypes of every entry point ----------------------------


@pytest.mark.skipif(BF16 is None, reason="ml_dtypes not installed")
def test_bfloat16_gradients_are_rounded_once():
    rng = np.random.default_rng(7)
    with np.errstate(invalid="ignore", over="ignore"):   # NaN bit patterns; float32 overflow
        # doubles just above and below bfloat16 midpoints: rounding to float32 first lands on the midpoint
        # and then ties to even, the wrong way for half of them
        base = rng.integers(0, 2**16, 4000).astype(np.uint16).view(BF16).astype(np.float64)
        base = base[np.isfinite(base) & (base != 0)]
        mid = base * (1 + 2.0**-8)
        a = np.concatenate([mid * (1 + 2.0**-40), mid * (1 - 2.0**-40), mid,
                            rng.standard_normal(4000) * np.exp(rng.uniform(-95, 95, 4000)),
                            [3.39e38, 3.4e38, 1e39, 2.0**-133, 2.0**-134, 2.0**-134 * (1 + 2.0**-30), 1e-45,
                             5e-324, np.inf, -np.inf]])
        twice = a.astype(np.float32).astype(BF16)
    want = rounded_once(a, BF16)
    assert np.array_equal(_dtypes.round_to(a, BF16).view(np.uint16), want.view(np.uint16))
    assert np.isnan(_dtypes.round_to(np.array([np.nan]), BF16)[0])
    assert np.count_nonzero(twice.view(np.uint16) != want.view(np.uint16)) > 0, "the case set lost its teeth"


@pytest.mark.parametrize("dtype", HALF)
def test_every_entry_point_takes_half_inputs(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 6)) * 3).astype(dtype)
    y = rng.integers(0, 6, 4)
    t = (rng.uniform(size=(4, 6)) > 0.5).astype(dtype)
    p = rng.uniform(0.01, 0.99, (4, 6)).astype(dtype)
    calls = [
        ("cross_entropy", (x, y), {}),
        ("binary_cross_entropy_with_logits", (x, t), {"pos_weight": np.full(6, 2.0, dtype)}),
        ("sigmoid_focal_loss", (x, t), {"reduction": "mean"}),
        ("binary_cross_entropy", (p, t), {}),
        ("cross_entropy_from_probs", (p, y), {}),
    ]
    for name, args, kw in calls:
        fwd, bwd, fused = getattr(xf, name), getattr(xf, name + "_backward"), getattr(xf, name + "_with_grad")
        loss = fwd(*args, **kw)
        g = bwd(1.0, *args, **kw)
        loss2, g2 = fused(*args, **kw)
        assert np.asarray(loss).dtype == F32 and g.dtype == np.dtype(dtype), name
        # the fused call gives the separate calls' bits, and the float64 path's rounded once
        assert np.asarray(loss).tobytes() == np.asarray(loss2).tobytes() and g.tobytes() == g2.tobytes(), name
        wide_args = tuple(wide(a) for a in args)
        wide_kw = {k: wide(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        same_values(g, rounded_once(bwd(1.0, *wide_args, **wide_kw), dtype), name)
        assert np.asarray(loss) == np.float32(fwd(*wide_args, **wide_kw)), name
    assert xf.logsumexp(x).dtype == F32 and xf.log_softmax(x).dtype == F32 and xf.softmax(x).dtype == np.dtype(dtype)
    assert xf.logsumexp(x[:, :0]).dtype == F32


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("axis", [-1, 0])
def test_out_and_inplace_with_half_inputs(dtype, axis):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((5, 7)) * 4).astype(dtype)
    y = rng.integers(0, x.shape[axis], x.shape[1 - axis % 2])
    loss, grad = xf.cross_entropy_with_grad(x, y, axis=axis, reduction="sum")
    out = np.full_like(x, np.nan)
    loss_o, g_o = xf.cross_entropy_with_grad(x, y, axis=axis, reduction="sum", out=out)
    assert g_o is out and out.tobytes() == grad.tobytes() and loss_o == loss
    xc = x.copy()
    loss_i, g_i = xf.cross_entropy_with_grad(xc, y, axis=axis, reduction="sum", inplace=True)
    assert g_i is xc and xc.tobytes() == grad.tobytes() and loss_i == loss
    with pytest.raises(ValueError, match=rf"^out: expected shape \(5, 7\) and dtype {np.dtype(dtype).name}; "
                                         r"got shape \(5, 7\), dtype float32"):
        xf.cross_entropy_with_grad(x, y, axis=axis, out=np.empty(x.shape, np.float32))
    with pytest.raises(ValueError, match="^out: overlaps input"):
        xf.cross_entropy_with_grad(x, y, axis=axis, out=x)
    # the elementwise family, a 0-d input included
    t = (x > 0).astype(dtype)
    _, g = xf.binary_cross_entropy_with_logits_with_grad(x, t)
    xc = x.copy()
    _, g_i = xf.binary_cross_entropy_with_logits_with_grad(xc, t, inplace=True)
    assert g_i is xc and xc.tobytes() == g.tobytes()
    s = np.array(x[0, 0])
    g0 = xf.binary_cross_entropy_with_logits_backward(1.0, s, t[0, 0])
    _, gs = xf.binary_cross_entropy_with_logits_with_grad(s, t[0, 0], inplace=True)
    assert gs is s and s.shape == () and s.tobytes() == g0.tobytes() and g0.dtype == np.dtype(dtype)


def test_inplace_half_reduction_that_reruns_the_kernel_reads_the_logits():
    # every loss below 2^-969 (float64): the reduction runs the kernel again, on the logits, after the
    # gradient pass; with half inputs that must still see the logits (not the gradient)
    x = np.full((3, 2), [720.0, 0.0], dtype=np.float16)
    y = np.zeros(3, dtype=np.int64)
    want = xf.cross_entropy(x, y, reduction="sum")
    xc = x.copy()
    loss, _ = xf.cross_entropy_with_grad(xc, y, reduction="sum", inplace=True)
    assert loss == want == 0.0     # 3 exp(-720) is 0 in float32; the gradient read as logits gives 3 log 2


def test_half_targets_and_weights_are_widened_not_rounded():
    x = np.array([[0.5, -1.0, 2.0]], dtype=np.float16)
    t = np.array([[0.1, 0.3, 0.6]])                       # float64: kept as given, not rounded to float16
    t16 = t.astype(np.float16)
    loss = xf.cross_entropy(x, t, reduction="none")
    assert loss[0] == np.float32(ref.rounded(ref.cross_entropy(wide(x), t, reduction="none")[0], np.float32))
    assert loss[0] != xf.cross_entropy(x, t16, reduction="none")[0]
    # half class weights, grad_output and targets of a float32 call are read exactly
    x32 = x.astype(np.float32)
    w16 = np.array([0.5, 2.0, 1.5], dtype=np.float16)
    assert xf.cross_entropy(x32, np.array([2]), weight=w16) == xf.cross_entropy(x32, np.array([2]), weight=wide(w16))
    if BF16 is not None:
        wb = w16.astype(BF16)
        assert xf.cross_entropy(x32, np.array([2]), weight=wb) == xf.cross_entropy(x32, np.array([2]), weight=wide(wb))
        tb = t.astype(BF16)
        assert xf.cross_entropy(x32, tb) == xf.cross_entropy(x32, wide(tb).astype(np.float32))
        g = xf.binary_cross_entropy_with_logits_backward(np.ones(3, BF16), x32[0], tb[0], reduction="none")
        assert g.dtype == F32


# ---- the ULP tools in half precision ---------------------------------------------------------------


def test_ulp_of_half_formats():
    assert ulp(1.0, np.float16) == 2.0**-10 and ulp(0.0, np.float16) == 2.0**-24
    assert ulp(65504.0, np.float16) == 32
    assert ulp(2.0**-20, np.float16) == 2.0**-24          # subnormal spacing below 2^-14
    if BF16 is not None:
        assert ulp(1.0, BF16) == 2.0**-7 and ulp(0.0, BF16) == 2.0**-133 and ulp(3.0e38, BF16) == 2.0**120
        a = np.array([1.0, 1.0078125], dtype=BF16)
        # the unit defaults to the array's own format, bfloat16 included
        assert list(ulp_error(a, [1, 1], a.dtype)) == [0.0, 1.0]
        with pytest.raises(AssertionError, match=r"Not within 0.5 ulp \(bfloat16\)"):
            assert_ulp_close(a, [1, 1], 0.5)


# ---- the stand-in device backend -------------------------------------------------------------------

from fake_device import _dev, same_bits  # noqa: E402


@pytest.mark.parametrize("dtype", HALF)
def test_half_inputs_on_the_device_give_the_cpu_bits(device, dtype):  # noqa: F811
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 9)) * 4).astype(dtype)
    y = rng.integers(0, 9, 6)
    t = (rng.uniform(size=x.shape) > 0.5).astype(dtype)
    for reduction in ("none", "mean"):
        loss, grad = xf.cross_entropy_with_grad(x, y, reduction=reduction)
        dloss, dgrad = xf.cross_entropy_with_grad(_dev(x), _dev(y), reduction=reduction)
        same_bits(dloss, loss, "loss")
        same_bits(dgrad, grad, "gradient")
        loss, grad = xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction)
        dloss, dgrad = xf.binary_cross_entropy_with_logits_with_grad(_dev(x), _dev(t), reduction=reduction)
        same_bits(dloss, loss, "binary loss")
        same_bits(dgrad, grad, "binary gradient")
    for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
        same_bits(f(_dev(x)), f(x), f.__name__)
    out = _dev(np.zeros_like(x))
    _, g = xf.cross_entropy_with_grad(_dev(x), _dev(y), out=out)
    assert g is out
    same_bits(out, xf.cross_entropy_backward(1.0, x, y), "out=")


# ---- torch tensors ---------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


def _torch_dtypes():
    torch = _torch()
    return {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _numpy_dtype(name):
    if name == "bfloat16":
        if BF16 is None:
            pytest.skip("ml_dtypes not installed")
        return np.dtype(BF16)
    return np.dtype(name)


def _tensor(a, torch_dtype):
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(wide(a))).to(torch_dtype)


def _as_numpy(t):
    torch = _torch()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def same_kind_and_bits(got, want, kind, what):
    assert isinstance(got, kind), f"{what}: returned {type(got).__name__}, not {kind.__name__}"
    g = _as_numpy(got) if kind.__module__.startswith("torch") else np.asarray(got)
    w = np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert g.tobytes() == w.tobytes(), what


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_torch_tensors_round_trip_with_the_numpy_bits(name):
    torch = _torch()
    dt = _numpy_dtype(name)
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((5, 8)) * 3).astype(dt)
    y = rng.integers(0, 8, 5)
    y[2] = -100
    t = (rng.uniform(size=x.shape) > 0.4).astype(dt)
    xt, yt, tt = _tensor(x, _torch_dtypes()[name]), torch.from_numpy(y), _tensor(t, _torch_dtypes()[name])
    assert _as_numpy(xt).tobytes() == x.tobytes()
    for reduction in ("none", "mean"):
        got = xf.cross_entropy_with_grad(xt, yt, reduction=reduction, label_smoothing=0.1)
        want = xf.cross_entropy_with_grad(x, y, reduction=reduction, label_smoothing=0.1)
        same_kind_and_bits(got[0], want[0], torch.Tensor, f"{reduction} loss")
        same_kind_and_bits(got[1], want[1], torch.Tensor, f"gradient of {reduction}")
        got = xf.binary_cross_entropy_with_logits_with_grad(xt, tt, reduction=reduction)
        want = xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction)
        same_kind_and_bits(got[0], want[0], torch.Tensor, "binary loss")
        same_kind_and_bits(got[1], want[1], torch.Tensor, "binary gradient")
    for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
        same_kind_and_bits(f(xt), f(x), torch.Tensor, f.__name__)
    go = torch.linspace(0.5, 2.0, 5, dtype=torch.float64)
    same_kind_and_bits(xf.cross_entropy_backward(go, xt, yt, reduction="none"),
                       xf.cross_entropy_backward(go.numpy(), x, y, reduction="none"), torch.Tensor, "backward")


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_torch_strided_tensors_out_and_inplace(name):
    torch = _torch()
    dt = _numpy_dtype(name)
    rng = np.random.default_rng(8)
    base = (rng.standard_normal((6, 10)) * 3).astype(dt)
    y = rng.integers(0, 6, 5)
    bt = _tensor(base, _torch_dtypes()[name])
    xt = bt[:, ::2].T                        # (5, 6), strided: class axis last, not contiguous
    assert not xt.is_contiguous()
    x = np.ascontiguousarray(base[:, ::2].T)
    want_loss, want_grad = xf.cross_entropy_with_grad(x, y, reduction="sum")
    loss, grad = xf.cross_entropy_with_grad(xt, torch.from_numpy(y), reduction="sum")
    same_kind_and_bits(loss, want_loss, torch.Tensor, "strided loss")
    same_kind_and_bits(grad, want_grad, torch.Tensor, "strided gradient")
    out = torch.full(xt.shape, float("nan"), dtype=xt.dtype)
    _, g = xf.cross_entropy_with_grad(xt, torch.from_numpy(y), reduction="sum", out=out)
    assert g is out
    same_kind_and_bits(out, want_grad, torch.Tensor, "out=")
    # in place, through the strided view: the gradient lands in the caller's storage
    _, g = xf.cross_entropy_with_grad(xt, y, reduction="sum", inplace=True)
    assert g is xt
    same_kind_and_bits(xt.contiguous(), want_grad, torch.Tensor, "inplace")
    same_kind_and_bits(bt[:, 1::2].contiguous(), np.ascontiguousarray(base[:, 1::2]), torch.Tensor, "untouched")


def test_numpy_out_beside_a_torch_input_comes_back_as_itself():
    """out= is returned as the caller's own object whatever the input's kind; a NumPy out= beside a torch
    input came back as a torch view of it."""
    torch = _torch()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 3))
    y = np.array([0, 2, 1, -100])
    t = (x > 0).astype(np.float64)
    want_grad = xf.cross_entropy_backward(1.0, x, y)
    out = np.full(x.shape, np.nan)
    _, g = xf.cross_entropy_with_grad(torch.from_numpy(x), torch.from_numpy(y), out=out)
    assert g is out
    same_kind_and_bits(out, want_grad, np.ndarray, "cross-entropy out=")
    out = np.full(x.shape, np.nan)
    _, g = xf.binary_cross_entropy_with_logits_with_grad(torch.from_numpy(x), torch.from_numpy(t), out=out)
    assert g is out
    same_kind_and_bits(out, xf.binary_cross_entropy_with_logits_with_grad(x, t)[1], np.ndarray, "BCE out=")


def test_torch_tensor_that_requires_grad_is_refused():
    torch = _torch()
    x = torch.zeros(2, 3, requires_grad=True)
    for call in (lambda: xf.cross_entropy(x, torch.tensor([0, 1])),
                 lambda: xf.softmax(x),
                 lambda: xf.binary_cross_entropy_with_logits(x, torch.zeros(2, 3))):
        with pytest.raises(TypeError, match=r"^input: the torch.Tensor requires grad.*xentfast\.torch.*"
                                            r"input\.detach\(\)"):
            call()
    with pytest.raises(TypeError, match=r"^weight: the torch.Tensor requires grad"):
        xf.cross_entropy(x.detach(), torch.tensor([0, 1]), weight=torch.ones(3, requires_grad=True))


def test_torch_tensor_with_the_negative_bit_is_refused():
    # DLPack hands over the storage without the lazy negation: read, every value would have its sign flipped
    torch = _torch()
    x = torch.complex(torch.zeros(2, 3), -torch.arange(6.0).reshape(2, 3)).conj().imag
    assert x.is_neg()
    for call in (lambda: xf.softmax(x),
                 lambda: xf.cross_entropy(x, torch.tensor([0, 1])),
                 lambda: xf.cross_entropy(x.resolve_neg(), torch.tensor([0, 1]), weight=x[0])):
        with pytest.raises(TypeError, match=r"the torch.Tensor has its negative bit set.*resolve_neg\(\)"):
            call()
    assert np.array_equal(xf.softmax(x.resolve_neg()).numpy(), xf.softmax(x.resolve_neg().numpy()))


def test_mixed_torch_and_numpy_on_the_cpu():
    torch = _torch()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = rng.integers(0, 5, 4)
    w = rng.uniform(0.5, 2, 5)
    want = xf.cross_entropy(x, y, weight=w)
    # the results take the kind of `input`
    same_kind_and_bits(xf.cross_entropy(torch.from_numpy(x), y, weight=w), want, torch.Tensor, "torch logits")
    got = xf.cross_entropy(x, torch.from_numpy(y), weight=torch.from_numpy(w))
    assert type(got) is type(want) and got == want
    got = xf.cross_entropy_backward(torch.tensor(2.0, dtype=torch.float64), x, y)
    assert isinstance(got, np.ndarray) and got.tobytes() == xf.cross_entropy_backward(2.0, x, y).tobytes()


# ---- JAX arrays ------------------------------------------------------------------------------------


def _jax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    return jax, jnp


# float64 needs jax_enable_x64, a process-wide switch this file leaves alone
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_jax_arrays_round_trip_with_the_numpy_bits(name):
    jax, jnp = _jax()
    dt = _numpy_dtype(name)
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((4, 7)) * 3).astype(dt)
    y = rng.integers(0, 7, 4).astype(np.int32)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    assert xj.dtype == dt
    for reduction in ("none", "mean"):
        got = xf.cross_entropy_with_grad(xj, yj, reduction=reduction)
        want = xf.cross_entropy_with_grad(x, y, reduction=reduction)
        same_kind_and_bits(got[0], want[0], jax.Array, f"{reduction} loss")
        same_kind_and_bits(got[1], want[1], jax.Array, f"gradient of {reduction}")
    t = (x > 0).astype(dt)
    got = xf.sigmoid_focal_loss_with_grad(xj, jnp.asarray(t))
    want = xf.sigmoid_focal_loss_with_grad(x, t)
    same_kind_and_bits(got[1], want[1], jax.Array, "focal gradient")
    same_kind_and_bits(xf.softmax(xj), xf.softmax(x), jax.Array, "softmax")


def test_jax_arrays_are_read_only():
    _, jnp = _jax()
    x = jnp.zeros((2, 3), dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"^input: inplace=True, but the jaxlib\.\w+ can only be read"):
        xf.cross_entropy_with_grad(x, np.array([0, 1]), inplace=True)
    with pytest.raises(ValueError, match=r"^out: the array is read-only"):
        xf.cross_entropy_with_grad(np.zeros((2, 3), np.float32), np.array([0, 1]), out=jnp.zeros((2, 3)))


# ---- any __dlpack__ array, and what is refused -----------------------------------------------------


class _Namespace:
    """A minimal array namespace: from_dlpack wraps NumPy's."""

    @staticmethod
    def from_dlpack(a):
        return Boxed(np.from_dlpack(a))

    @staticmethod
    def asarray(a):
        return Boxed(np.asarray(a))


class Boxed:
    """An array known only by the protocols: __dlpack__, __dlpack_device__, __array_namespace__."""

    def __init__(self, a, device=(1, 0)):
        self.a, self.device = a, device

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device

    def __array_namespace__(self, api_version=None):
        return _Namespace


def test_any_dlpack_array_comes_back_through_its_namespace():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4))
    y = np.array([0, 3, 1])
    loss, grad = xf.cross_entropy_with_grad(Boxed(x), Boxed(y), reduction="none")
    want_loss, want_grad = xf.cross_entropy_with_grad(x, y, reduction="none")
    assert isinstance(loss, Boxed) and isinstance(grad, Boxed)
    assert loss.a.tobytes() == want_loss.tobytes() and grad.a.tobytes() == want_grad.tobytes()
    mean = xf.cross_entropy(Boxed(x), y)
    assert isinstance(mean, Boxed) and mean.a.shape == () and mean.a == xf.cross_entropy(x, y)


def test_unsupported_devices_and_dtypes_are_named():
    x = np.zeros((2, 3))
    with pytest.raises(TypeError, match=r"^input: the test_half_and_dlpack\.Boxed is on DLPack device type 8; "
                                        r"xentfast runs on the CPU"):
        xf.cross_entropy(Boxed(x, device=(8, 0)), np.array([0, 1]))
    with pytest.raises(TypeError, match=r"^target: the test_half_and_dlpack\.Boxed is on DLPack device type 8"):
        xf.cross_entropy(x, Boxed(np.array([0, 1]), device=(8, 0)))
    bad = [(np.complex128, r"complex128 \(logits must be real\)"), (np.int32, r"int32 \(logits must be floating point"),
           (np.bool_, r"bool \(logits must be floating point")]
    if np.dtype(np.longdouble) != F64:
        bad.append((np.longdouble, r"float128 \(cast to float64: wider formats are not supported\)"))
    for dt, words in bad:
        for f in (lambda a: xf.cross_entropy(a, np.array([0, 1])), xf.softmax,
                  lambda a: xf.binary_cross_entropy_with_logits(a, np.zeros((2, 3)))):
            with pytest.raises(TypeError, match=r"^input: expected float16, bfloat16, float32 or float64 logits, "
                                                r"got dtype " + words):
                f(x.astype(dt))
    with pytest.raises(TypeError, match=r"^input: expected float16, bfloat16, float32 or float64 probabilities, "
                                        r"got dtype int64"):
        xf.binary_cross_entropy(np.zeros(3, np.int64), np.zeros(3))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"^input: expected float16, bfloat16, float32 or float64 logits, got dtype "
                                        r"complex64"):
        xf.cross_entropy(torch.zeros(2, 3, dtype=torch.complex64), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match=r"^target: got a boolean array"):
        xf.cross_entropy(torch.zeros(2, 3), torch.tensor([True, False]))


def test_numpy_calls_do_not_take_the_dlpack_path(monkeypatch):
    from xentfast import _backend

    def refuse(*a, **k):
        raise AssertionError("NumPy arguments went through the DLPack path")
    monkeypatch.setattr(_backend, "call_foreign", refuse)
    x = np.zeros((2, 3), np.float16)
    xf.cross_entropy_with_grad(x, [0, 1], weight=np.ones(3), grad_output=np.float64(2.0), label_smoothing=0.1)
    xf.binary_cross_entropy_with_logits(np.float32(0.5), 1.0)
    assert math.isfinite(xf.logsumexp(x)[0])
