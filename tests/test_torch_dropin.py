"""xentfast.torch: the custom ops, their autograd, their reductions, and torch's semantics.

What is checked, and against what:
- the ops' results are the NumPy API's bits (forward rows and reduced losses; the gradient for the same
  per-row or scalar upstream value), for every loss and dtype;
- ``torch.library.opcheck`` (schema, autograd registration, fake tensors, AOT dispatch with dynamic
  shapes) on every op and dtype, and ``gradcheck`` in float64;
- agreement with torch.nn.functional (torchvision's formula for the focal loss) on ordinary inputs for
  every option, and the z-loss against its formula in torch ops;
- 'mean' / 'sum' against the mpmath reference within the bound xentfast.torch documents;
- torch.compile(fullgraph=True) and torch.export of a small model, and a short training run that
  reproduces torch's own loss trajectory;
- float16 / bfloat16: float32 losses and half gradients with the NumPy API's bits, opcheck on both;
- the NumPy API's refusal of a tensor that requires grad points to xentfast.torch;
- CUDA tensors (marker gpu): the CPU's bits, on a side stream.
"""
import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import xentfast as xf  # noqa: E402
import xentfast.torch as xt  # noqa: E402
from xentfast import reference as ref  # noqa: E402
from xentfast.testing import max_ulp_error  # noqa: E402

DTYPES = [torch.float32, torch.float64]
HALF = [torch.float16, torch.bfloat16]
ids = lambda d: str(d).replace("torch.", "")  # noqa: E731
NP = {torch.float32: np.float32, torch.float64: np.float64}


def _rng(*key):
    # crc32, not hash(): str hashes change between processes, and a failure must reproduce
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ---- one case per loss, with every option it has switched on -------------------------------------------
#
# Each case: the xentfast.torch function, the NumPy-level forward and backward, the tensors
# (input, target), and the keyword arguments of both levels (the NumPy level takes axis=1 for torch's
# (N, C, d) layout).


class Case:
    def __init__(self, name, fn, np_fwd, np_bwd, x, t, kw, np_kw=None, op_args=()):
        self.name, self.fn, self.np_fwd, self.np_bwd = name, fn, np_fwd, np_bwd
        self.x, self.t, self.kw = x, t, kw
        self.np_kw = dict(kw if np_kw is None else np_kw)
        self.op_args = op_args   # the ops' trailing arguments, in schema order

    def np_args(self):
        conv = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in self.np_kw.items()}
        return self.x.detach().numpy(), self.t.numpy(), conv


def _eighths(rng, n, dtype):
    """Class weights whose sums are exact in any order, so a 'mean' denominator has one value."""
    return (rng.integers(1, 16, n) / 8).astype(dtype)


def _case(name, dtype):
    rng = _rng(name, dtype)
    npdt = NP[dtype]
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    if name == "cross_entropy":
        x = T((rng.standard_normal((5, 6, 3)) * 3).astype(npdt))
        y = rng.integers(0, 6, (5, 3))
        y[0, 1] = y[3, 2] = -100
        w = T(_eighths(rng, 6, npdt))
        kw = dict(weight=w, label_smoothing=0.1, z_loss=1e-3)
        return Case(name, xt.cross_entropy, xf.cross_entropy, xf.cross_entropy_backward, x, T(y), kw,
                    dict(kw, axis=1), (w, -100, 0.1, 1e-3, "propagate"))
    if name == "cross_entropy_from_probs":
        p = rng.random((7, 5)).astype(npdt) + 0.05
        p /= p.sum(axis=1, keepdims=True)
        y = rng.integers(0, 5, 7)
        y[2] = 9   # an ignore_index outside [0, C)
        w = T(_eighths(rng, 5, npdt))
        kw = dict(weight=w, ignore_index=9)
        return Case(name, xt.cross_entropy_from_probs, xf.cross_entropy_from_probs,
                    xf.cross_entropy_from_probs_backward, T(p), T(y), kw, dict(kw, axis=1),
                    (w, 9, None, "propagate"))
    if name == "binary_cross_entropy_with_logits":
        x = T((rng.standard_normal((6, 4)) * 4).astype(npdt))
        t = rng.random((6, 4)).astype(npdt)
        t[t < 0.3] = 0.0
        w = T(rng.random((6, 1)).astype(npdt) + 0.5)
        pw = T(rng.random(4).astype(npdt) * 3)
        kw = dict(weight=w, pos_weight=pw)
        return Case(name, xt.binary_cross_entropy_with_logits, xf.binary_cross_entropy_with_logits,
                    xf.binary_cross_entropy_with_logits_backward, x, T(t), kw, kw, (w, pw, None, "propagate"))
    if name == "sigmoid_focal_loss":
        x = T((rng.standard_normal((5, 4)) * 3).astype(npdt))
        t = (rng.random((5, 4)) < 0.4).astype(npdt)
        kw = dict(alpha=0.3, gamma=1.5)
        return Case(name, xt.sigmoid_focal_loss, xf.sigmoid_focal_loss, xf.sigmoid_focal_loss_backward, x, T(t),
                    kw, kw, (0.3, 1.5, None, "propagate"))
    if name == "binary_cross_entropy":
        p = T((rng.random((4, 5)) * 0.9 + 0.05).astype(npdt))
        t = T(rng.random((4, 5)).astype(npdt))
        w = T(rng.random(5).astype(npdt) + 0.5)
        kw = dict(weight=w)
        return Case(name, xt.binary_cross_entropy, xf.binary_cross_entropy, xf.binary_cross_entropy_backward, p,
                    t, kw, kw, (w, None, None, "propagate"))
    raise AssertionError(name)


LOSSES = ["cross_entropy", "cross_entropy_from_probs", "binary_cross_entropy_with_logits", "sigmoid_focal_loss",
          "binary_cross_entropy"]


# ---- the ops are the NumPy API -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_rows_are_the_numpy_apis_bits(name, dtype):
    case = _case(name, dtype)
    x, t, kw = case.np_args()
    got = case.fn(case.x, case.t, reduction="none", **case.kw)
    want = case.np_fwd(x, t, reduction="none", **kw)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_gradient_is_the_numpy_apis_bits(name, dtype, reduction):
    # the backward ops hand the upstream value to xentfast's backward unchanged: per row for 'none', the
    # scalar with the reduction for 'mean' and 'sum' (so the mean's factor is the NumPy API's, never a
    # grad / denominator that autograd rounded to the loss dtype first); the reduced loss is its bits too
    case = _case(name, dtype)
    x, t, kw = case.np_args()
    xr = case.x.clone().requires_grad_()
    loss = case.fn(xr, case.t, reduction=reduction, **case.kw)
    shape = case.np_fwd(x, t, reduction="none", **kw).shape
    if reduction == "none":
        g = torch.from_numpy(_rng("g", name).standard_normal(shape).astype(NP[dtype]))
    else:
        assert torch.equal(loss, torch.from_numpy(np.asarray(case.np_fwd(x, t, reduction=reduction, **kw))))
        g = torch.tensor(-0.37, dtype=loss.dtype)
    loss.backward(g)
    want = case.np_bwd(g.numpy(), x, t, reduction=reduction, **kw)
    assert torch.equal(xr.grad, torch.from_numpy(want))


_EXTRAS = [
    ("cross_entropy", dict(label_smoothing=0.3, z_loss=0.1)),
    ("cross_entropy_from_probs", dict(eps=0.2)),
    ("binary_cross_entropy_with_logits", dict(ignore_index=0.0)),
    ("sigmoid_focal_loss", dict(alpha=-1.0, gamma=0.0, ignore_index=1.0)),
    ("binary_cross_entropy", dict(eps=0.1)),
    ("binary_cross_entropy", dict(log_clamp=-1.0)),
]


@pytest.mark.parametrize("name,extra", _EXTRAS, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_extras_reach_the_numpy_api(name, extra):
    case = _case(name, torch.float64)
    kw = dict(case.kw, **extra)
    x, t, np_kw = case.np_args()
    np_kw.update(extra)
    got, got_grad = _grad_of(case.fn, case.x, case.t, reduction="none", **kw)
    want = case.np_fwd(x, t, reduction="none", **np_kw)
    want_grad = case.np_bwd(np.ones(want.shape), x, t, reduction="none", **np_kw)
    assert torch.equal(got, torch.from_numpy(want)) and torch.equal(got_grad, torch.from_numpy(want_grad))
    assert not torch.equal(got, case.fn(case.x, case.t, reduction="none", **case.kw))   # the option did something


@pytest.mark.parametrize("name", LOSSES)
def test_nan_policy(name):
    case = _case(name, torch.float64)
    x = case.x.clone()
    x.view(-1)[0] = math.nan
    assert torch.isnan(case.fn(x, case.t, reduction="none", **case.kw)).any()
    with pytest.raises(ValueError, match="NaN"):
        case.fn(x, case.t, nan_policy="raise", **case.kw)


# ---- opcheck and gradcheck -----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["fwd", "bwd", "fwd-mean", "bwd-sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_opcheck(name, dtype, which):
    case = _case(name, dtype)
    reduced = "-" in which
    fwd, bwd = (xt._REDUCED_OPS if reduced else xt._OPS)[name]
    args = case.op_args + ((which.split("-")[1], "nan") if reduced else ())
    x = case.x.clone().requires_grad_()
    if which.startswith("fwd"):
        torch.library.opcheck(fwd, (x, case.t) + args)
    else:
        rows = fwd(case.x, case.t, *args)
        g = torch.from_numpy(_rng("g", name).standard_normal(rows.shape).astype(NP[dtype]))
        torch.library.opcheck(bwd, (g, case.x, case.t) + args)


def test_opcheck_cross_entropy_probability_targets_and_unbatched():
    fwd, _ = xt._OPS["cross_entropy"]
    rng = _rng("opcheck-prob")
    x = torch.from_numpy(rng.standard_normal((4, 5, 2))).requires_grad_()
    p = torch.from_numpy(rng.random((4, 5, 2)))
    torch.library.opcheck(fwd, (x, p / p.sum(1, keepdim=True), None, -100, 0.2, 0.0, "propagate"))
    x1 = torch.from_numpy(rng.standard_normal(5)).requires_grad_()
    torch.library.opcheck(fwd, (x1, torch.tensor(3), None, -100, 0.0, 0.0, "propagate"))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("name", LOSSES)
def test_gradcheck_float64(name, reduction):
    case = _case(name, torch.float64)
    x = case.x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: case.fn(v, case.t, reduction=reduction, **case.kw), (x,))


# ---- torch's semantics on ordinary inputs, every option --------------------------------------------------


def _grad_of(fn, x, *args, **kw):
    xr = x.clone().requires_grad_()
    loss = fn(xr, *args, **kw)
    loss.backward(torch.ones_like(loss) if loss.ndim else None)
    return loss.detach(), xr.grad


def _assert_agree(ours, theirs, dtype):
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-13)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("layout", ["NC", "NCd", "C"])
@pytest.mark.parametrize("targets", ["index", "ignored", "prob"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_agrees_with_torch(reduction, weighted, smoothing, targets, layout, dtype):
    rng = _rng("ce", reduction, weighted, smoothing, targets, layout, dtype)
    C = 5
    shape = {"NC": (8, C), "NCd": (3, C, 4), "C": (C,)}[layout]
    x = torch.from_numpy(rng.standard_normal(shape) * 2).to(dtype)
    batch = shape[:1] + shape[2:] if len(shape) > 1 else ()
    if targets == "prob":
        p = torch.from_numpy(rng.random(shape)).to(dtype)
        t = p / p.sum(dim=1 if len(shape) > 1 else 0, keepdim=True)
    else:
        t = torch.from_numpy(np.asarray(rng.integers(0, C, batch)))
        if targets == "ignored" and layout != "C":       # (one unbatched row ignored: a mean of nothing)
            t.view(-1)[::3] = -7
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    if targets == "ignored":
        kw["ignore_index"] = -7
    if weighted:
        kw["weight"] = torch.from_numpy(rng.random(C) + 0.1).to(dtype)
    _assert_agree(_grad_of(xt.cross_entropy, x, t, **kw), _grad_of(F.cross_entropy, x, t, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_z_loss_is_the_weighted_squared_logsumexp(reduction, dtype):
    rng = _rng("z", reduction, dtype)
    x = torch.from_numpy(rng.standard_normal((7, 6)) * 3).to(dtype)
    y = torch.from_numpy(rng.integers(0, 6, 7))
    y[4] = -100
    w = torch.from_numpy(rng.random(6) + 0.1).to(dtype)
    z = 0.05

    def formula(v, y, reduction):
        kept = y != -100
        r = torch.where(kept, w[y.clamp(0)], 0.0)
        rows = F.cross_entropy(v, y, weight=w, reduction="none") + z * r * torch.logsumexp(v, 1) ** 2
        return {"none": rows, "sum": rows.sum(), "mean": rows.sum() / r.sum()}[reduction]

    ours = _grad_of(xt.cross_entropy, x, y, weight=w, z_loss=z, reduction=reduction)
    _assert_agree(ours, _grad_of(formula, x, y, reduction=reduction), dtype)


_BCE_WEIGHTS = {
    "none": (None, None),
    "weight(C)": ((5,), None),
    "weight(N,1)": ((4, 1), None),
    "pos_weight(C)": (None, (5,)),
    "both(N,C)": ((4, 5), (4, 5)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("weights", list(_BCE_WEIGHTS))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bce_with_logits_agrees_with_torch(reduction, weights, dtype):
    rng = _rng("bce", reduction, weights, dtype)
    x = torch.from_numpy(rng.standard_normal((4, 5)) * 3).to(dtype)
    t = torch.from_numpy(rng.random((4, 5))).to(dtype)
    ws, pws = _BCE_WEIGHTS[weights]
    kw = dict(reduction=reduction)
    if ws:
        kw["weight"] = torch.from_numpy(rng.random(ws) + 0.2).to(dtype)
    if pws:
        kw["pos_weight"] = torch.from_numpy(rng.random(pws) * 3).to(dtype)
    _assert_agree(_grad_of(xt.binary_cross_entropy_with_logits, x, t, **kw),
                  _grad_of(F.binary_cross_entropy_with_logits, x, t, **kw), dtype)
    m_ours = xt.BCEWithLogitsLoss(kw.get("weight"), reduction=reduction, pos_weight=kw.get("pos_weight"))
    m_torch = torch.nn.BCEWithLogitsLoss(kw.get("weight"), reduction=reduction, pos_weight=kw.get("pos_weight"))
    _assert_agree(_grad_of(m_ours, x, t), _grad_of(m_torch, x, t), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bce_with_logits_ignore_index_leaves_the_mean(reduction, dtype):
    rng = _rng("bce-ignore", reduction, dtype)
    x = torch.from_numpy(rng.standard_normal((6, 3)) * 2).to(dtype)
    t = torch.from_numpy(rng.random((6, 3))).to(dtype)
    t[1, 2] = t[4, 0] = t[5, 1] = -1.0
    kept = t != -1.0

    def masked(v, t, reduction):
        rows = F.binary_cross_entropy_with_logits(v, t.clamp(0), reduction="none") * kept
        return {"none": rows, "sum": rows.sum(), "mean": rows.sum() / kept.sum()}[reduction]

    _assert_agree(_grad_of(xt.binary_cross_entropy_with_logits, x, t, reduction=reduction, ignore_index=-1),
                  _grad_of(masked, x, t, reduction=reduction), dtype)


@pytest.mark.parametrize("ignore_index", [-1, 0, 2])
def test_ignore_index_with_soft_targets_follows_torch(ignore_index):
    # torch accepts a negative ignore_index with probability targets (CrossEntropyLoss(ignore_index=-1)
    # with soft labels: no effect) and refuses a class number
    rng = _rng("soft-ignore", ignore_index)
    x = torch.from_numpy(rng.standard_normal((5, 4)))
    t = torch.softmax(torch.from_numpy(rng.standard_normal((5, 4))), 1)
    if ignore_index >= 0:
        with pytest.raises(RuntimeError):
            F.cross_entropy(x, t, ignore_index=ignore_index)
        with pytest.raises(ValueError, match="only index targets can be ignored"):
            xt.cross_entropy(x, t, ignore_index=ignore_index)
        return
    _assert_agree(_grad_of(xt.cross_entropy, x, t, ignore_index=ignore_index),
                  _grad_of(F.cross_entropy, x, t, ignore_index=ignore_index), torch.float64)


def _torchvision_focal(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    # torchvision.ops.sigmoid_focal_loss, as published
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("alpha,gamma", [(0.25, 2.0), (-1.0, 2.0), (0.6, 0.0), (0.25, 3.7)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_sigmoid_focal_loss_agrees_with_torchvision(reduction, alpha, gamma, dtype):
    rng = _rng("focal", reduction, alpha, gamma, dtype)
    x = torch.from_numpy(rng.standard_normal((5, 4)) * 2).to(dtype)
    t = torch.from_numpy((rng.random((5, 4)) < 0.3) * 1.0).to(dtype)
    kw = dict(alpha=alpha, gamma=gamma, reduction=reduction)
    _assert_agree(_grad_of(xt.sigmoid_focal_loss, x, t, **kw), _grad_of(_torchvision_focal, x, t, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy_agrees_with_torch(reduction, weighted, dtype):
    rng = _rng("bcep", reduction, weighted, dtype)
    p = torch.from_numpy(rng.random((4, 5)) * 0.98 + 0.01).to(dtype)
    t = torch.from_numpy(rng.random((4, 5))).to(dtype)
    kw = dict(reduction=reduction)
    if weighted:
        kw["weight"] = torch.from_numpy(rng.random(5) + 0.2).to(dtype)
    _assert_agree(_grad_of(xt.binary_cross_entropy, p, t, **kw), _grad_of(F.binary_cross_entropy, p, t, **kw), dtype)


def test_binary_cross_entropy_log_clamp_gives_torchs_forward():
    p = torch.tensor([0.0, 1e-50, 0.3, 1.0], dtype=torch.float64)
    t = torch.tensor([1.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    ours = xt.binary_cross_entropy(p, t, reduction="none", log_clamp=-100.0)
    torch.testing.assert_close(ours, F.binary_cross_entropy(p, t, reduction="none"), rtol=1e-14, atol=0)
    assert torch.isinf(xt.binary_cross_entropy(p, t, reduction="none")[0])   # no clamp by default


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("targets", ["index", "prob"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_from_probs_is_nll_loss_of_log(reduction, weighted, targets, dtype):
    rng = _rng("ceprobs", reduction, weighted, targets, dtype)
    p = torch.from_numpy(rng.random((6, 4, 2)) + 0.05).to(dtype)
    p = p / p.sum(1, keepdim=True)
    w = torch.from_numpy(rng.random(4) + 0.1).to(dtype) if weighted else None
    if targets == "index":
        t = torch.from_numpy(rng.integers(0, 4, (6, 2)))
        t[1, 0] = -100

        def torch_version(v, t, reduction):
            return F.nll_loss(v.log(), t, weight=w, reduction=reduction)
    else:
        q = torch.from_numpy(rng.random((6, 4, 2))).to(dtype)
        t = q / q.sum(1, keepdim=True)

        def torch_version(v, t, reduction):
            rows = -(t * v.log() * (1 if w is None else w[:, None])).sum(1)
            return {"none": rows, "sum": rows.sum(), "mean": rows.sum() / rows.numel()}[reduction]

    _assert_agree(_grad_of(xt.cross_entropy_from_probs, p, t, weight=w, reduction=reduction),
                  _grad_of(torch_version, p, t, reduction=reduction), dtype)


# ---- reductions: the documented bound, empty means, layouts ----------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_reduction_within_documented_bound(dtype, reduction):
    # 'mean' and 'sum' are the NumPy API's reductions (module docstring (c)): its bound, 4 ULP
    rng = _rng("bound", dtype, reduction)
    npdt = NP[dtype]
    x = (rng.standard_normal((400, 12)) * rng.choice([0.5, 4.0, 30.0], (400, 1))).astype(npdt)
    y = rng.integers(0, 12, 400)
    y[rng.random(400) < 0.1] = -100
    w = rng.random(12) + 0.1
    kw = dict(label_smoothing=0.05, z_loss=1e-3)
    exact = ref.cross_entropy(x, y, w, reduction=reduction, dps=40, **kw)
    got = xt.cross_entropy(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w), reduction=reduction, **kw)
    bound = 4.0
    err, _ = max_ulp_error(got.numpy(), exact, npdt)
    assert err <= bound, err
    # BCE with logits: elements, weights, pos_weight
    xb = (rng.standard_normal((300, 7)) * 5).astype(npdt)
    tb = rng.random((300, 7)).astype(npdt)
    pw = (rng.random(7) * 3).astype(npdt)
    exact = ref.binary_cross_entropy_with_logits(xb, tb, pos_weight=pw, reduction=reduction, dps=40)
    got = xt.binary_cross_entropy_with_logits(torch.from_numpy(xb), torch.from_numpy(tb), reduction=reduction,
                                              pos_weight=torch.from_numpy(pw))
    err, _ = max_ulp_error(got.numpy(), exact, npdt)
    assert err <= bound, err


# the NumPy API's per-element bounds (README, error bounds)
BOUND = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}


def test_reductions_and_their_gradients_where_rounded_rows_or_factors_would_fail():
    # The drop-ins once reduced the rows with torch ops: rows rounded to the dtype before the sum, and
    # autograd's grad / denominator rounded to it before the backward op.  Each case below was wrong that
    # way (147 ULP, 0 for 1.9e-22, 82 ULP, +-inf for a finite gradient, inf for 10); the reduced ops give
    # the NumPy API's answer, within its bounds (mean / sum 4 ULP, their gradients bound + 1).
    f32 = np.float32
    cases = [   # logits, labels, class weights, upstream value
        (np.array([[80.0, 0.0]] * 4, f32), [0] * 4, np.array([1e-6, 1.0], f32), None),
        (np.array([[50.0, 0.0]] * 3), [0] * 3, np.array([1e-305, 1.0]), None),
        (np.array([[1.0, 0.0, -1.0]], f32), [0], np.array([1e10, 1.0, 1.0], f32), 1e-30),
        (np.array([[1.0, 0.0, -1.0]]), [0], np.array([1e20, 1.0, 1.0]), 1e-300),
        (np.array([[1.0, 0.0]], f32), [0], np.array([0.25, 1.0], f32), 3e38),
        (np.array([[0.0, 10.0], [0.0, 0.0]], f32), [0, 1], np.array([3e38, 1.0], f32), None),
    ]
    for x, y, w, g in cases:
        y = np.array(y)
        X = torch.from_numpy(x).requires_grad_()
        loss = xt.cross_entropy(X, torch.from_numpy(y), torch.from_numpy(w))
        loss.backward(None if g is None else torch.tensor(g, dtype=loss.dtype))
        assert max_ulp_error(loss.detach().numpy(), ref.cross_entropy(x, y, w), x.dtype)[0] <= 4.0, (x, w)
        gv = 1.0 if g is None else float(x.dtype.type(g))
        exact = ref.cross_entropy_grad(x, y, w, grad_output=gv)
        assert max_ulp_error(X.grad.numpy(), exact, x.dtype)[0] <= BOUND[x.dtype] + 1, (x, w, g)
    # BCE from probabilities: grad_output / 3 below float32's normal range, times 1/p
    p, t = np.array([1e-30, 0.5, 0.3], f32), np.array([1.0, 0.0, 1.0], f32)
    P = torch.from_numpy(p).requires_grad_()
    xt.binary_cross_entropy(P, torch.from_numpy(t)).backward(torch.tensor(1e-44))
    exact = ref.binary_cross_entropy_grad(p, t, grad_output=float(f32(1e-44)))
    assert max_ulp_error(P.grad.numpy(), exact, f32)[0] <= BOUND[np.dtype(f32)] + 1


@pytest.mark.parametrize("empty_mean,want", [("nan", math.nan), ("zero", 0.0)])
@pytest.mark.parametrize("how", ["all ignored", "zero weights", "no rows"])
def test_mean_of_nothing_has_zero_gradient(how, empty_mean, want):
    x = torch.randn(4, 3, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1])
    w = None
    if how == "all ignored":
        y = torch.full((4,), -100)
    elif how == "zero weights":
        w = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    else:
        x, y = x[:0], y[:0]
    loss, grad = _grad_of(xt.cross_entropy, x, y, weight=w, label_smoothing=0.1, empty_mean=empty_mean)
    assert (math.isnan(loss.item()) and math.isnan(want)) or loss.item() == want
    assert torch.equal(grad, torch.zeros_like(x))
    if empty_mean == "nan":
        assert torch.isnan(F.cross_entropy(x, y, weight=w))   # torch's answer


def test_bce_mean_of_nothing():
    x = torch.randn(3, 2, dtype=torch.float64)
    t = torch.full((3, 2), -100.0, dtype=torch.float64)
    loss, grad = _grad_of(xt.binary_cross_entropy_with_logits, x, t, ignore_index=-100)
    assert torch.isnan(loss) and torch.equal(grad, torch.zeros_like(x))
    loss, _ = _grad_of(xt.sigmoid_focal_loss, x, t, ignore_index=-100, reduction="mean", empty_mean="zero")
    assert loss.item() == 0.0


def test_strided_inputs_give_the_contiguous_bits():
    rng = _rng("strided")
    base = torch.from_numpy(rng.standard_normal((6, 10)))
    x = base.t()[::2]                                   # (5, 6), strides (2, 10): a view, not a copy
    assert not x.is_contiguous()
    y = torch.from_numpy(rng.integers(0, 6, 5))
    a, ga = _grad_of(xt.cross_entropy, x, y, reduction="none")
    b, gb = _grad_of(xt.cross_entropy, x.contiguous(), y, reduction="none")
    assert torch.equal(a, b) and torch.equal(ga, gb)
    t = torch.from_numpy(rng.random((6, 10))).t()
    a, ga = _grad_of(xt.binary_cross_entropy_with_logits, base.t(), t)
    b, gb = _grad_of(xt.binary_cross_entropy_with_logits, base.t().contiguous(), t.contiguous())
    assert torch.equal(a, b) and torch.equal(ga, gb)


# ---- argument handling --------------------------------------------------------------------------------


def test_refusals_name_the_argument():
    x = torch.randn(3, 4)
    y = torch.tensor([0, 1, 3])
    with pytest.raises(ValueError, match="size_average and reduce"):
        xt.cross_entropy(x, y, size_average=True)
    with pytest.raises(ValueError, match="size_average and reduce"):
        xt.BCEWithLogitsLoss(reduce=False)
    with pytest.raises(ValueError, match="reduction: expected one of"):
        xt.cross_entropy(x, y, reduction="avg")
    soft = torch.rand(3, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="target: xentfast differentiates with respect to the input"):
        xt.binary_cross_entropy_with_logits(x, soft)
    with pytest.raises(NotImplementedError, match="weight"):
        xt.cross_entropy(x, y, weight=torch.ones(4, requires_grad=True))
    # nothing is differentiated under no_grad: torch computes the loss, and so does the drop-in
    learnable = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4))
    with torch.no_grad():
        assert xt.cross_entropy(x, y, weight=learnable).item() == pytest.approx(
            F.cross_entropy(x, y, weight=learnable).item(), rel=1e-6)
        assert xt.binary_cross_entropy_with_logits(x, soft).item() == pytest.approx(
            F.binary_cross_entropy_with_logits(x, soft).item(), rel=1e-6)
    # the NumPy API's own validation, raised from inside the op
    with pytest.raises(ValueError, match=r"target: labels must be in \[0, 4\)"):
        xt.cross_entropy(x, torch.tensor([0, 1, 7]))


def test_integer_logits_are_refused_without_a_numpy_idiom():
    # the drop-in hands its tensors to the NumPy API as arrays; the hint once read ".astype(np.float32)"
    with pytest.raises(TypeError, match="input: expected .* logits, got dtype int64") as info:
        xt.cross_entropy(torch.ones(4, 5, dtype=torch.long), torch.tensor([0, 1, 2, 3]))
    assert "astype" not in str(info.value) and "cast them to float32" in str(info.value)


def test_refusals_of_arguments_the_op_schema_would_read_otherwise():
    x = torch.randn(5, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 1])
    # torch: "'ignore_index' must be int"; the op's int schema would truncate it and drop label 1
    for f in (xt.cross_entropy, xt.cross_entropy_from_probs):
        with pytest.raises(TypeError, match="ignore_index: expected an int, got 1.5"):
            f(x.softmax(1), y, ignore_index=1.5)
        # beyond int64 the op's schema refused it naming no argument ("Expected a value of type 'int'")
        with pytest.raises(ValueError, match=f"ignore_index: {2**70} is outside int64"):
            f(x.softmax(1), y, ignore_index=2**70)
    # a meta tensor among CPU ones would send the call to the shape-only fake kernels (garbage values)
    meta = dict(device="meta")
    with pytest.raises(ValueError, match="target: on device meta, expected the input's device cpu"):
        xt.binary_cross_entropy_with_logits(x, torch.zeros(5, 5, **meta))
    with pytest.raises(ValueError, match="weight: on device meta"):
        xt.cross_entropy(x, y, weight=torch.ones(5, **meta), reduction="none")
    with pytest.raises(ValueError, match="pos_weight: on device meta"):
        xt.binary_cross_entropy_with_logits(x, torch.zeros(5, 5), pos_weight=torch.ones(5, **meta))
    with pytest.raises(ValueError, match="targets: on device meta"):
        xt.sigmoid_focal_loss(x, torch.zeros(5, 5, **meta))
    with pytest.raises(ValueError, match="target: on device meta"):
        xt.binary_cross_entropy(x.sigmoid(), torch.zeros(5, 5, **meta))
    # every tensor on meta is the fake kernels' own business: shapes only
    assert xt.cross_entropy(x.to("meta"), y.to("meta")).shape == ()


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("name", LOSSES)
def test_double_backward_is_refused_by_name(name, reduction):
    # README: no double backward; the error says so and names the function, not just the op
    case = _case(name, torch.float64)
    x = case.x.clone().requires_grad_()
    loss = case.fn(x, case.t, reduction=reduction, **case.kw)
    (g,) = torch.autograd.grad(loss.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=f"xentfast.torch.{name}: no second derivative"):
        g.pow(2).sum().backward()


def test_forward_mode_and_functorch_gradients_are_refused():
    # torch would return zero tangents through the custom ops (jvp, jacfwd, forward_ad) without a word
    x = torch.randn(3, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    t = torch.rand(3, 4, dtype=torch.float64)
    calls = [lambda: torch.func.jvp(lambda a: xt.cross_entropy(a, y, reduction="none"), (x,), (x,)),
             lambda: torch.func.jacfwd(lambda a: xt.binary_cross_entropy_with_logits(a, t))(x),
             lambda: torch.func.grad(lambda a: xt.sigmoid_focal_loss(a, t, reduction="mean"))(x),
             lambda: torch.func.vjp(lambda a: xt.binary_cross_entropy(a.sigmoid(), t), x)]
    for call in calls:
        with pytest.raises(RuntimeError, match="support no torch.func transform but vmap"):
            call()
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level(), pytest.raises(RuntimeError, match="forward-mode dual tensor"):
        xt.cross_entropy_from_probs(fwad.make_dual(x.softmax(1), x), y)
    # reverse mode and vmap of the loss alone still work
    jac = torch.autograd.functional.jacobian(lambda a: xt.cross_entropy(a, y, reduction="none"), x)
    assert jac.shape == (3, 3, 4) and jac.abs().sum() > 0
    batched = torch.func.vmap(lambda a, b: xt.cross_entropy(a, b))(x.reshape(3, 1, 4), y.reshape(3, 1))
    torch.testing.assert_close(batched, xt.cross_entropy(x, y, reduction="none"), rtol=0, atol=0)


def test_strings_and_booleans_are_not_numbers():
    # float() and operator.index would read them as 0.1 and 1 before the NumPy API saw them (torch raises)
    x = torch.randn(3, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    t = torch.rand(3, 4, dtype=torch.float64)
    for call, words in ((lambda: xt.cross_entropy(x, y, label_smoothing="0.1"), "label_smoothing: expected a real"),
                        (lambda: xt.cross_entropy(x, y, z_loss=True), "z_loss: expected a real"),
                        (lambda: xt.cross_entropy(x, y, ignore_index=True), "ignore_index: expected an int"),
                        (lambda: xt.sigmoid_focal_loss(x, t, gamma="2"), "gamma: expected a real"),
                        (lambda: xt.sigmoid_focal_loss(x, t, alpha=True), "alpha: expected a real"),
                        (lambda: xt.binary_cross_entropy_with_logits(x, t, ignore_index=True), "ignore_index")):
        with pytest.raises(TypeError, match=words):
            call()


@pytest.mark.parametrize("label_dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_narrow_labels_with_class_weights(label_dtype):
    # the weighted mean's denominator indexes the weights with the labels: torch reads a uint8 index as
    # a mask (here N == C: silently the sum of all weights) and refuses int8 and int16 ones; the NumPy
    # API reads them as labels
    x = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    w = torch.arange(1.0, 6.0, dtype=torch.float64)
    y = torch.tensor([1, 4, 2, 3, 1])
    got = xt.cross_entropy(x, y.to(label_dtype), weight=w)
    want = F.cross_entropy(x, y, weight=w)
    assert abs(got.item() - want.item()) <= 4 * math.ulp(want.item())
    (g_got,) = torch.autograd.grad(got, x)
    (g_want,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g_got, g_want, rtol=1e-14, atol=1e-17)


def test_modules_match_torchs_and_share_state_dict_keys():
    rng = _rng("modules")
    w = torch.from_numpy(rng.random(5) + 0.1)
    ours = xt.CrossEntropyLoss(w, ignore_index=1, label_smoothing=0.1)
    theirs = torch.nn.CrossEntropyLoss(w, ignore_index=1, label_smoothing=0.1)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    x = torch.from_numpy(rng.standard_normal((6, 5)))
    y = torch.from_numpy(rng.integers(0, 5, 6))
    _assert_agree(_grad_of(ours, x, y), _grad_of(theirs, x, y), torch.float64)
    assert xt.CrossEntropyLoss(w, z_loss=0.1)(x, y) > xt.CrossEntropyLoss(w)(x, y)
    b_ours = xt.BCEWithLogitsLoss(pos_weight=torch.ones(5))
    b_theirs = torch.nn.BCEWithLogitsLoss(pos_weight=torch.ones(5))
    assert b_ours.state_dict().keys() == b_theirs.state_dict().keys()


# ---- graphs and training -----------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self, loss, multi, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)
        self.loss, self.multi = loss, multi

    def forward(self, x, y, t):
        h = self.body(x)
        return self.loss(h, y, label_smoothing=0.1) + self.multi(h, t)


def _batch(dtype=torch.float32, n=32):
    # labels a small net can learn: a fixed linear map of the inputs decides them
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g, dtype=dtype)
    teacher = torch.randn(6, 4, generator=g, dtype=dtype)
    y = (x @ teacher).argmax(1)
    t = (x @ teacher.flip(1) > 0).to(dtype)
    return x, y, t


def test_compile_fullgraph_and_export():
    net = _Net(xt.cross_entropy, xt.binary_cross_entropy_with_logits)
    x, y, t = _batch()
    eager = net(x, y, t)
    eager.backward()
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    compiled = torch.compile(net, fullgraph=True)
    loss = compiled(x, y, t)
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-6, atol=0)
    for p, g in zip(net.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-7)
    exported = torch.export.export(net, (x, y, t))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"xentfast.cross_entropy_fwd_reduced.default",
            "xentfast.binary_cross_entropy_with_logits_fwd_reduced.default"} <= targets


def test_compile_with_float_options_that_change_between_calls():
    # a float option that changes makes Dynamo trace it as a symbolic float: the drop-ins may only
    # convert it (float()), the checks that do arithmetic on it run inside the op
    x, y, t = _batch()
    x = x.detach()
    xb = torch.randn(t.shape, dtype=t.dtype, generator=torch.Generator().manual_seed(3))
    ce = torch.compile(lambda a, b, ls: xt.cross_entropy(a, b, label_smoothing=ls), fullgraph=True)
    focal = torch.compile(lambda a, b, al: xt.sigmoid_focal_loss(a, b, alpha=al, reduction="mean"),
                          fullgraph=True)
    bce = torch.compile(lambda a, b, ig: xt.binary_cross_entropy_with_logits(a, b, ignore_index=ig),
                        fullgraph=True)
    for v in (0.25, 0.5, 0.75):    # float32 values: the ignore value must be one (api_binary)
        torch.testing.assert_close(ce(x, y, v), xt.cross_entropy(x, y, label_smoothing=v), rtol=0, atol=0)
        torch.testing.assert_close(focal(xb, t, v), xt.sigmoid_focal_loss(xb, t, alpha=v, reduction="mean"),
                                   rtol=0, atol=0)
        torch.testing.assert_close(bce(xb, t, -v), xt.binary_cross_entropy_with_logits(xb, t, ignore_index=-v),
                                   rtol=0, atol=0)


def test_compile_with_a_reduction_that_changes_between_calls():
    # the reduced ops take reduction and empty_mean as strings: a change between calls recompiles, and
    # every call gives the eager bits, loss and gradient; dynamic shapes too
    x, y, _ = _batch(n=12)
    fn = torch.compile(lambda a, b, red, em: xt.cross_entropy(a, b, reduction=red, empty_mean=em),
                       fullgraph=True, dynamic=True)
    for n, red, em in ((12, "mean", "nan"), (12, "sum", "nan"), (7, "mean", "zero"), (5, "sum", "zero")):
        xc = x[:n].clone().requires_grad_()
        xe = x[:n].clone().requires_grad_()
        got, want = fn(xc, y[:n], red, em), xt.cross_entropy(xe, y[:n], reduction=red, empty_mean=em)
        got.backward()
        want.backward()
        assert torch.equal(got, want) and torch.equal(xc.grad, xe.grad), (n, red, em)
    # nothing to average: empty_mean decides the loss, the gradient is 0
    ignored = torch.full((4,), -100)
    assert fn(x[:4], ignored, "mean", "zero").item() == 0.0
    assert math.isnan(fn(x[:4], ignored, "mean", "nan").item())


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_training_reproduces_torchs_loss_trajectory(dtype):
    x, y, t = _batch(dtype, n=64)

    def trajectory(ce, bce):
        net = _Net(ce, bce, dtype)
        opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
        losses = []
        for _ in range(12):
            opt.zero_grad()
            loss = net(x, y, t)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses, dtype=torch.float64)

    ours = trajectory(xt.cross_entropy, xt.binary_cross_entropy_with_logits)
    theirs = trajectory(F.cross_entropy, F.binary_cross_entropy_with_logits)
    assert ours[-1] < 0.7 * ours[0]                 # it trains
    torch.testing.assert_close(ours, theirs, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


# ---- CUDA ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES + HALF, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_cuda_gives_the_cpu_bits_on_a_side_stream(name, dtype):
    case = _half_case(name, dtype) if dtype in HALF else _case(name, dtype)
    dev = torch.device("cuda")
    move = lambda v: v.to(dev) if isinstance(v, torch.Tensor) else v  # noqa: E731
    kw = {k: move(v) for k, v in case.kw.items()}
    want, want_grad = _grad_of(case.fn, case.x, case.t, reduction="none", **case.kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got, got_grad = _grad_of(case.fn, case.x.to(dev), case.t.to(dev), reduction="none", **kw)
        mean = case.fn(case.x.to(dev), case.t.to(dev), reduction="mean", **kw)
    torch.cuda.current_stream().wait_stream(side)
    assert got.device.type == "cuda" and got_grad.device.type == "cuda"
    assert torch.equal(got.cpu(), want) and torch.equal(got_grad.cpu(), want_grad)
    # the mean of the CuPy and the NumPy API's reductions (each within 4 ULP of the exact mean)
    torch.testing.assert_close(mean.cpu(), case.fn(case.x, case.t, reduction="mean", **case.kw),
                               rtol=4 * torch.finfo(mean.dtype).eps, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", LOSSES)
def test_opcheck_cuda(name):
    case = _case(name, torch.float32)
    fwd, bwd = xt._OPS[name]
    dev = torch.device("cuda")
    args = tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in case.op_args)
    x, t = case.x.to(dev).requires_grad_(), case.t.to(dev)
    torch.library.opcheck(fwd, (x, t) + args)
    rows = fwd(x.detach(), t, *args)
    torch.library.opcheck(bwd, (torch.ones_like(rows), x.detach(), t) + args)


# ---- half precision: float32 losses, gradients in the input's dtype ------------------------------------


def _np_view(t):
    """A tensor's NumPy view, bfloat16 through its int16 bits (NumPy has no bfloat16 buffer format)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch_view(a):
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _half_case(name, dtype):
    # the float32 case with half logits (and half probability targets); class weights stay float32
    case = _case(name, torch.float32)
    case.x = case.x.to(dtype)
    if case.t.dtype.is_floating_point:
        case.t = case.t.to(dtype)
    return case


@pytest.mark.parametrize("dtype", HALF, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_half_losses_are_float32_and_gradients_half(name, dtype):
    case = _half_case(name, dtype)
    x, t = _np_view(case.x), _np_view(case.t)
    np_kw = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in case.np_kw.items()}
    got, grad = _grad_of(case.fn, case.x, case.t, reduction="none", **case.kw)
    want = case.np_fwd(x, t, reduction="none", **np_kw)
    g = np.ones(want.shape, dtype=np.float32)
    want_grad = case.np_bwd(g, x, t, reduction="none", **np_kw)
    assert got.dtype == torch.float32 and grad.dtype == dtype
    assert torch.equal(got, _torch_view(want)) and torch.equal(grad, _torch_view(want_grad))
    mean = case.fn(case.x, case.t, **case.kw, reduction="mean")
    assert mean.dtype == torch.float32


@pytest.mark.parametrize("which", ["fwd", "bwd", "fwd-mean", "bwd-sum"])
@pytest.mark.parametrize("dtype", HALF, ids=ids)
@pytest.mark.parametrize("name", LOSSES)
def test_opcheck_half(name, dtype, which):
    case = _half_case(name, dtype)
    reduced = "-" in which
    fwd, bwd = (xt._REDUCED_OPS if reduced else xt._OPS)[name]
    args = case.op_args + ((which.split("-")[1], "nan") if reduced else ())
    if which.startswith("fwd"):
        torch.library.opcheck(fwd, (case.x.clone().requires_grad_(), case.t) + args)
    else:
        rows = fwd(case.x, case.t, *args)
        torch.library.opcheck(bwd, (torch.ones_like(rows), case.x, case.t) + args)


def test_bfloat16_mean_is_the_float32_mean_of_exact_rows():
    # torch's own bfloat16 cross-entropy returns a bfloat16 loss (spacing 0.0625 near 10); here the loss is
    # float32, within 1 ULP of the exact mean of the bfloat16 inputs (README, half precision)
    rng = _rng("bf16-mean")
    x = torch.from_numpy(rng.standard_normal((64, 50)) * 4).to(torch.bfloat16)
    y = torch.from_numpy(rng.integers(0, 50, 64))
    exact = ref.cross_entropy(x.double().numpy(), y.numpy(), dps=40)
    got = xt.cross_entropy(x, y)
    assert got.dtype == torch.float32
    err, _ = max_ulp_error(got.numpy(), exact, np.float32)
    assert err <= 1.0, err


def test_float32_mean_past_the_float32_sum_range_is_finite_as_documented():
    # README (softmax family, "Deliberate differences from torch"): the row losses are summed in double,
    # so a mean whose sum passes FLT_MAX keeps its finite value; torch sums in float32
    x = np.array([[-3e38, 0.0], [-3e38, 0.0]], np.float32)
    y = np.array([0, 0])
    rows = xf.cross_entropy(x, y, reduction="none")
    assert rows.dtype == np.float32 and (rows == np.float32(3e38)).all()
    assert xf.cross_entropy(x, y) == np.float32(3e38)
    assert xt.cross_entropy(torch.from_numpy(x), torch.from_numpy(y)).item() == np.float32(3e38)
    assert math.isinf(F.cross_entropy(torch.from_numpy(x), torch.from_numpy(y)).item())
    assert math.isinf(xf.cross_entropy(x, y, reduction="sum"))


def test_numpy_api_refuses_a_tensor_that_requires_grad():
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(TypeError, match="xentfast.torch"):
        xf.cross_entropy(x, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="xentfast.torch"):
        xf.binary_cross_entropy_with_logits(x, torch.rand(3, 4))


def test_logits_changed_in_place_before_backward_raise():
    # README: the op saves its inputs, not the log-softmax, so autograd's version check refuses a
    # backward through logits changed in place after the forward (F.cross_entropy lets it pass)
    leaf = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 2])
    x = leaf * 1
    loss = F.cross_entropy(x, y)
    x.add_(1)
    loss.backward()
    x = leaf * 1
    loss = xt.cross_entropy(x, y)
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("call, exc, words", [
    # float(False) was a clamp of 0: every loss and gradient 0
    (lambda p, t, x, y: xt.binary_cross_entropy(p, t, log_clamp=False), TypeError, "log_clamp: expected a real"),
    (lambda p, t, x, y: xt.binary_cross_entropy(p, t, log_clamp=np.False_), TypeError, "log_clamp: expected a real"),
    (lambda p, t, x, y: xt.binary_cross_entropy(p, t, log_clamp="-1"), TypeError, "log_clamp: expected a real"),
    (lambda p, t, x, y: xt.binary_cross_entropy(p, t, eps=True), TypeError, "eps: expected a real"),
    # float(10**400) raised a bare OverflowError
    (lambda p, t, x, y: xt.cross_entropy(x, y, label_smoothing=10**400), ValueError, "label_smoothing: must be finite"),
    (lambda p, t, x, y: xt.cross_entropy(x, y, z_loss=10**400), ValueError, "z_loss: must be finite"),
    (lambda p, t, x, y: xt.sigmoid_focal_loss(x, t[:3], gamma=10**400), ValueError, "gamma: must be finite"),
    # float(tensor(True)) was full smoothing, silently; float(None) a TypeError naming nothing
    (lambda p, t, x, y: xt.cross_entropy(x, y, label_smoothing=torch.tensor(True)), TypeError,
     "label_smoothing: expected a real"),
    (lambda p, t, x, y: xt.cross_entropy(x, y, label_smoothing=None), TypeError, "label_smoothing: expected a real"),
    (lambda p, t, x, y: xt.sigmoid_focal_loss(x, t, gamma=None), TypeError, "gamma: expected a real"),
    (lambda p, t, x, y: xt.sigmoid_focal_loss(x, t, alpha=np.array(True)), TypeError, "alpha: expected a real"),
    (lambda p, t, x, y: xt.cross_entropy(x, y, weight="abc"), TypeError, "weight: expected a tensor or an array"),
    (lambda p, t, x, y: xt.binary_cross_entropy_with_logits(x, t, pos_weight=[None]), TypeError,
     "pos_weight: expected a tensor or an array"),
    # not tensors: a device message comparing cpu with cpu, an AttributeError, a pybind signature error
    (lambda p, t, x, y: xt.cross_entropy(x.numpy(), y), TypeError, "input: expected a torch.Tensor, got numpy.ndarray"),
    (lambda p, t, x, y: xt.cross_entropy(x.tolist(), y), TypeError, "input: expected a torch.Tensor, got list"),
    (lambda p, t, x, y: xt.cross_entropy(x, y.numpy()), TypeError, "target: expected a torch.Tensor"),
    (lambda p, t, x, y: xt.cross_entropy_from_probs(p.numpy(), y), TypeError, "input: expected a torch.Tensor"),
    (lambda p, t, x, y: xt.binary_cross_entropy_with_logits(x.numpy(), t), TypeError, "input: expected a torch.Tensor"),
    (lambda p, t, x, y: xt.sigmoid_focal_loss(x, t.numpy()), TypeError, "targets: expected a torch.Tensor"),
    (lambda p, t, x, y: xt.binary_cross_entropy(p, 1.0), TypeError, "target: expected a torch.Tensor, got float"),
])
def test_real_options_refuse_bools_strings_and_huge_ints(call, exc, words):
    p = torch.full((3, 4), 0.4, dtype=torch.float64)
    t = torch.ones(3, 4, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(exc, match=words):
        call(p, t, x, torch.tensor([0, 1, 2]))


def test_a_tensor_input_with_a_non_bool_inplace_names_the_flag():
    # the foreign-array import tested `if inplace` first: NumPy's ambiguity message for an array
    with pytest.raises(TypeError, match="inplace: expected True or False"):
        xf.cross_entropy_with_grad(torch.randn(3, 4), torch.tensor([0, 1, 2]), inplace=np.array([True, True]))


@pytest.mark.parametrize("fn", ["binary_cross_entropy_with_logits", "sigmoid_focal_loss"])
@pytest.mark.parametrize("dtypes", [(torch.float64, torch.float32), (torch.float16, torch.float16)],
                         ids=["f64-f32", "f16-f16"])
def test_mean_counts_the_elements_the_op_keeps(fn, dtypes):
    # ignore_index=0.1 is not a float32 or float16 value: float32(0.1) != 0.1 in the op's float64
    # comparison, so the element is a kept soft target, and the mean divides by all three (torch compares
    # a Python float in the tensor's own dtype, where the element would match and drop out of the count)
    x_dtype, t_dtype = dtypes
    x = torch.tensor([0.5, -1.0, 2.0], dtype=x_dtype)
    t = torch.tensor([0.1, 1.0, 0.0], dtype=t_dtype)
    tol = 1e-12 if x_dtype == torch.float64 else 2e-3   # the float16 results' rounding; the defect was x1.5
    op = getattr(xt, fn)
    rows = op(x, t, ignore_index=0.1, reduction="none")
    assert bool((rows != 0).all())            # nothing ignored
    loss, grad = _grad_of(op, x, t, ignore_index=0.1, reduction="mean")
    _, grad_sum = _grad_of(op, x, t, ignore_index=0.1, reduction="sum")
    want = rows.to(torch.float64).sum() / 3
    assert abs(loss.to(torch.float64).item() - want.item()) <= tol * abs(want.item())
    torch.testing.assert_close(grad.to(torch.float64), grad_sum.to(torch.float64) / 3, rtol=tol, atol=0)
    flat = getattr(xf, fn)(x.to(torch.float64).numpy() if x_dtype == torch.float16 else x.numpy(),
                           t.to(torch.float64).numpy(), ignore_index=0.1, reduction="mean")
    assert abs(loss.to(torch.float64).item() - float(flat)) <= tol * abs(float(flat))
