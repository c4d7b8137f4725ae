"""The conformance kit (xentfast.testing.check_conformance) and the founding bugs as permanent cases.

* Paddle's pre-fix gradient of sigmoid_cross_entropy_with_logits with pos_weight (PR #54869 .. #64253:
  sigma(x) q - y, which drops the derivative of max(x, 0) and |x|) passes the op test's finite-difference
  check at max_relative_error=0.005 and is flagged by the checker;
* xentfast passes the checker for every loss and both dtypes;
* torch passes where it is exact and its known precision losses (confident-correct loss = 0, p_y - 1 = 0,
  sigmoid(x) - 1 = 0, the NaN of x = -inf with y = 1) show up as large ULP errors, not hidden.
"""
import mpmath
import numpy as np
import pytest

import xentfast as xf
from xentfast.testing import ElementwiseReference, check_conformance

DTYPES = [np.float32, np.float64]
ids = lambda d: np.dtype(d).name  # noqa: E731
HUGE = 1e6      # "large ULP error": far beyond any rounding, a wrong or cancelled result


# ---- Paddle's pre-fix sigmoid_cross_entropy_with_logits ---------------------------------------------------


def paddle_forward(x, label, pos_weight=None):
    """Paddle's forward between PR #54869 and PR #65859: max(x, 0) - x y + q log(1 + e^-|x|)."""
    q = 1.0 if pos_weight is None else pos_weight
    return np.maximum(x, 0) - x * label + q * np.log1p(np.exp(-np.abs(x)))


def paddle_prefix_backward(x, label, pos_weight=None):
    """Paddle's grad kernel before PR #64253: sigmoid(x) q - y."""
    q = 1.0 if pos_weight is None else pos_weight
    return q / (1 + np.exp(-x)) - label


def _paddle_exact_loss(x, y, pos_weight=mpmath.mpf(1)):
    return max(x, 0) - x * y + pos_weight * mpmath.log1p(mpmath.exp(-abs(x)))


def _paddle_exact_grad(x, y, pos_weight=mpmath.mpf(1)):
    # the derivative of the forward above (x != 0; the suites below never draw x = 0)
    return (1 if x > 0 else 0) - y - pos_weight * mpmath.sign(x) * mpmath.exp(-abs(x)) / (1 + mpmath.exp(-abs(x)))


PADDLE_SEMANTICS = ElementwiseReference(_paddle_exact_loss, _paddle_exact_grad,
                                        name="Paddle's own forward, max(x,0) - x y + q log1p(e^-|x|)")


def op_test_check_grad(forward, backward, inputs, max_relative_error, delta=0.005):
    """Paddle's OpTest.check_grad for this op, as the seed reports it: the numeric gradient of mean(Out)
    by central differences with step `delta`, the analytic one from the grad kernel with upstream 1/numel,
    and max |numeric - analytic| / |numeric| where |numeric| < 1e-3 is replaced by 1 (the rule behind the
    seed's absolute "max gradient diff 7.811970e-04" = 1/1280 for a (64, 20) input).  Returns the max diff."""
    x = inputs["x"].copy()
    n = x.size
    numeric = np.empty_like(x)
    for i in range(n):
        orig = x.flat[i]
        x.flat[i] = orig + delta
        up = forward(x, inputs["label"], inputs["pos_weight"]).mean()
        x.flat[i] = orig - delta
        down = forward(x, inputs["label"], inputs["pos_weight"]).mean()
        x.flat[i] = orig
        numeric.flat[i] = (up - down) / (2 * delta)
    analytic = backward(x, inputs["label"], inputs["pos_weight"]) / n
    abs_a = np.abs(numeric)
    abs_a[abs_a < 1e-3] = 1
    diff = float(np.max(np.abs(numeric - analytic) / abs_a))
    return diff


def paddle_op4_inputs(seed=0):
    """TestSigmoidCrossEntropyWithLogitsOp4: (64, 20) float64, logit(U(0,1)) logits, U(0,1) soft labels,
    U(0,1) pos_weight."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0, 1, (64, 20))
    return {"x": np.log(u / (1 - u)), "label": rng.uniform(0, 1, (64, 20)), "pos_weight": rng.uniform(0, 1, (64, 20))}


def test_finite_differences_pass_paddle_prefix_gradient():
    inputs = paddle_op4_inputs()
    diff = op_test_check_grad(paddle_forward, paddle_prefix_backward, inputs, 0.005)
    # the op test's tolerance: passes (the bug lived for a year behind it) ...
    assert diff <= 0.005
    # ... while the seed's tightened tolerance 0.0005 fails, by at most 1/1280 = (1 - q)[x > 0] / numel
    assert 0.0005 < diff <= 1 / 1280


def test_checker_flags_paddle_prefix_gradient():
    # against Paddle's own forward: the loss conforms, the gradient is not its derivative
    fams = ["pos_weight", "soft targets, pos_weight"]
    report = check_conformance(paddle_forward, paddle_prefix_backward, dtype=np.float64, families=fams,
                               reference=PADDLE_SEMANTICS)
    print(report)
    assert not report.passed
    assert report["pos_weight"].loss_ulp <= 4
    for fam in fams:
        r = report[fam]
        assert r.grad_ulp > 1e12, fam          # an O(1) relative error, not rounding
        assert r.grad_worst["input"] > 0       # the dropped derivative of max(x, 0) and |x| is at x > 0
    # against torch semantics (what Paddle's binary_cross_entropy_with_logits documents): forward and
    # gradient both flagged where pos_weight != 1
    report = check_conformance(paddle_forward, paddle_prefix_backward, dtype=np.float64, families=fams)
    assert report["pos_weight"].loss_ulp > HUGE and report["pos_weight"].grad_ulp > HUGE


def test_fixed_paddle_gradient_passes_finite_differences_and_checker_against_its_forward():
    # PR #64253's gradient, [x > 0] - y - q sign(x) e^-|x| / (1 + e^-|x|), is the derivative of the forward
    def fixed(x, label, pos_weight=None):
        q = 1.0 if pos_weight is None else pos_weight
        e = np.exp(-np.abs(x))
        return (x > 0) - label - q * np.sign(x) * e / (1 + e)

    inputs = paddle_op4_inputs()
    assert op_test_check_grad(paddle_forward, fixed, inputs, 0.0005) <= 0.0005
    report = check_conformance(paddle_forward, fixed, dtype=np.float64, families=["pos_weight"],
                               reference=PADDLE_SEMANTICS)
    assert report["pos_weight"].grad_ulp < HUGE    # no longer wrong; rounding of the plain numpy form remains


# ---- xentfast conforms ----------------------------------------------------------------------------------


def _xf_pair(loss):
    if loss == "binary_cross_entropy_with_logits":
        return (lambda x, t, **p: xf.binary_cross_entropy_with_logits(x, t, reduction="none", **p),
                lambda x, t, **p: xf.binary_cross_entropy_with_logits_backward(np.ones_like(x), x, t,
                                                                               reduction="none", **p))
    if loss == "sigmoid_focal_loss":
        return (lambda x, t, **p: xf.sigmoid_focal_loss(x, t, **p),
                lambda x, t, **p: xf.sigmoid_focal_loss_backward(np.ones_like(x), x, t, **p))
    if loss == "binary_cross_entropy":
        return (lambda x, t, **p: xf.binary_cross_entropy(x, t, reduction="none", **p),
                lambda x, t, **p: xf.binary_cross_entropy_backward(np.ones_like(x), x, t, reduction="none", **p))
    if loss == "cross_entropy":
        return (lambda x, t, **p: xf.cross_entropy(x, t, reduction="none", **p),
                lambda x, t, **p: xf.cross_entropy_backward(np.ones(len(t), x.dtype), x, t, reduction="none", **p))
    return (lambda x, t, **p: xf.cross_entropy_from_probs(x, t, reduction="none", **p),
            lambda x, t, **p: xf.cross_entropy_from_probs_backward(np.ones(len(t), x.dtype), x, t, reduction="none",
                                                                   **p))


LOSSES = ["binary_cross_entropy_with_logits", "sigmoid_focal_loss", "binary_cross_entropy", "cross_entropy",
          "cross_entropy_from_probs"]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("loss", LOSSES)
def test_xentfast_conforms(loss, dtype):
    fwd, bwd = _xf_pair(loss)
    report = check_conformance(fwd, bwd, loss, dtype, seed=1)
    print(report)
    report.assert_conforms()
    assert len(report.results) >= 6


def test_report_names_the_worst_input_and_records_crashes():
    def bad_forward(x, t, **p):
        raise RuntimeError("no kernel for this dtype")

    report = check_conformance(bad_forward, None, dtype=np.float32, families=["ordinary"])
    assert not report.passed and "RuntimeError" in report["ordinary"].error and "ERROR" in str(report)

    # a forward that flushes the confident-correct tail to 0: flagged, with that input named
    def flushing(x, t, **p):
        out = np.asarray(xf.binary_cross_entropy_with_logits(x, t, reduction="none", **p))
        return np.where(out < 1e-10, 0.0, out)

    report = check_conformance(flushing, None, families=["confident correct", "ordinary"])
    r = report["confident correct"]
    assert r.loss_ulp > HUGE and r.loss_worst["actual"] == 0.0 and r.loss_worst["exact"] > 0
    assert report["ordinary"].passed
    assert "confident correct" in str(report) and "FLAGGED" in str(report)
    with pytest.raises(ValueError, match="families"):
        check_conformance(flushing, None, families=["nope"])
    with pytest.raises(ValueError, match="loss"):
        check_conformance(flushing, None, loss="hinge")


# ---- torch: passes where exact, its precision losses reported -------------------------------------------


def _torch_bce():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def kw(p):
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}

    def fwd(x, t, **p):
        return F.binary_cross_entropy_with_logits(torch.from_numpy(x), torch.from_numpy(t), reduction="none",
                                                  **kw(p)).numpy()

    def bwd(x, t, **p):
        xt = torch.from_numpy(x).requires_grad_()
        F.binary_cross_entropy_with_logits(xt, torch.from_numpy(t), reduction="sum", **kw(p)).backward()
        return xt.grad.numpy()

    return fwd, bwd


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_torch_bce_precision_losses_are_reported(dtype):
    fwd, bwd = _torch_bce()
    report = check_conformance(fwd, bwd, dtype=dtype)
    print(report)
    # the semantics agree: where torch's formula has nothing to cancel it is within the contract
    for fam in ("zero logits", "confident wrong", "large", "tiny"):
        assert report[fam].passed, fam
    # (1-y) x - log_sigmoid(x) cancels to 0 on the confident side (pytorch#195529), sigmoid(x) - 1 rounds
    # to 0 (pytorch#195677): reported as errors of ~2^52 (float64) / ~2^23+ (float32) ULP, not hidden
    cc = report["confident correct"]
    assert cc.loss_ulp > HUGE and cc.loss_worst["actual"] == 0.0 and cc.loss_worst["exact"] > 0
    assert cc.grad_ulp > HUGE and cc.grad_worst["actual"] == 0.0
    # x = -inf with y = 1: torch returns NaN where the loss is +inf
    assert report["infinities"].loss_ulp == np.inf
    assert not report.passed


def test_torch_cross_entropy_precision_losses_are_reported():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def fwd(x, y):
        return F.cross_entropy(torch.from_numpy(x), torch.from_numpy(y), reduction="none").numpy()

    def bwd(x, y):
        xt = torch.from_numpy(x).requires_grad_()
        F.cross_entropy(xt, torch.from_numpy(y), reduction="sum").backward()
        return xt.grad.numpy()

    report = check_conformance(fwd, bwd, "cross_entropy", np.float32)
    print(report)
    cc = report["confident correct"]
    # lse - x_y = log(1 + tiny) = 0, and p_y - 1 = 0
    assert cc.loss_ulp > HUGE and cc.loss_worst["actual"] in (0.0, -0.0)
    assert cc.grad_ulp > HUGE and cc.grad_worst["actual"] == 0.0
    assert report["ties"].passed


def test_torch_bce_from_probabilities_clamp_is_reported():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def fwd(p, t):
        return F.binary_cross_entropy(torch.from_numpy(p), torch.from_numpy(t), reduction="none").numpy()

    report = check_conformance(fwd, None, "binary_cross_entropy", np.float64, families=["ordinary", "near 0"])
    assert report["ordinary"].loss_ulp <= 4
    # log p clamped at -100: p = e^-500 with y = 1 gives 100 instead of 500
    assert report["near 0"].loss_ulp > HUGE
