"""The ordinary forms feed no subnormal number to any floating-point operation.

On x86 each operation that takes a subnormal operand (or makes one) is a microcode assist of ~100-150
cycles per vector instruction, since subnormals are never flushed here: an input whose intermediates land
there makes a call several times slower with the same bits (float32 BCE with logits near |x| = 180 and 360
ran 6x and 14x slower, float64 near 360 2.5x; benchmarks/README.md, eighteenth round).  Speed is not
asserted in tests; this checks the cause with the CPU's sticky denormal-operand flag, on the calling thread
(n_threads=1), over every magnitude that the ordinary forms take: BCE with logits (float32: every finite
logit; float64: |x| <= 500 and the far logits), the float32 focal loss (every finite logit; targets 0, 1
and soft ones not below float32's normals), the softmax rows whose spread stays within 600.

The general forms and tiny results (float64 BCE's middle logits 500 < |x| < 900, whose results may be
subnormal, the float64 focal loss, softmax rows with spread beyond 680) still pass through subnormals:
README, "Inputs that cost more".
"""
import numpy as np
import pytest

import xentfast as xf
from xentfast._core import _scalar, _xent

pytestmark = pytest.mark.skipif(_scalar.consumes_subnormals(lambda: None) is None,
                                reason="no denormal-operand flag on this CPU")
PATHS = _xent.available_cpu_paths()


@pytest.fixture(params=PATHS)
def cpu_path(request, cpu_path_back):
    cpu_path_back.set_cpu_path(request.param)
    return request.param


def _magnitudes(hi, far=()):
    """0 ... hi in steps of 1/64 (every binade of e = exp(-|x|) that a window of subnormal powers could
    hit), a little noise so that neighbouring lanes differ, and the far values"""
    a = np.arange(0.0, hi, 1.0 / 64.0)
    a = a + np.random.default_rng(0).uniform(0.0, 1.0 / 64.0, a.size)
    return np.concatenate([a, np.asarray(far, np.float64)])


def _clean(fn, *args, **kwargs):
    used = _scalar.consumes_subnormals(fn, *args, n_threads=1, **kwargs)
    assert used is False


def test_the_flag_sees_a_kernel_on_this_thread():
    # positive controls: float64 BCE at x = -700, y = 0 has the loss e^-700 ~ 2^-1010, and the block's
    # compensated sum of such losses makes subnormal error terms; a float64 softmax entry 720 below its
    # row's max is a subnormal result
    x = np.full(256, -700.0)
    y = np.zeros(256)
    assert _scalar.consumes_subnormals(xf.binary_cross_entropy_with_logits, x, y, n_threads=1) is True
    r = np.zeros((4, 256))
    r[:, 1:] = -720.0
    assert _scalar.consumes_subnormals(xf.softmax, r, n_threads=1) is True
    assert _scalar.consumes_subnormals(np.multiply, np.array([1e-310]), 2.0) is True
    assert _scalar.consumes_subnormals(np.multiply, np.array([1e-300]), 2.0) is False


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("target", [0.0, 1.0, 0.3, 2.0 ** -50])
def test_bce_with_logits_ordinary_elements(cpu_path, dtype, target):
    if dtype == np.float32:
        fmax = float(np.finfo(np.float32).max)
        a = _magnitudes(600.0, far=[800.0, 1e4, 1e9, 1e30, fmax])
    else:
        a = _magnitudes(500.0, far=[900.0, 1e4, 1e9, 1e300, 2.0 ** 900])
    x = np.concatenate([a, -a]).astype(dtype)
    y = np.full(x.size, target, dtype)
    w = np.random.default_rng(1).uniform(0.01, 100.0, x.size).astype(dtype)
    up = np.random.default_rng(2).uniform(-3.0, 3.0, x.size).astype(dtype)
    for reduction in ("none", "mean"):
        _clean(xf.binary_cross_entropy_with_logits_with_grad, x, y, reduction=reduction)
    _clean(xf.binary_cross_entropy_with_logits_with_grad, x, y, weight=w, pos_weight=np.array(3.5, dtype),
           reduction="none", grad_output=up)
    _clean(xf.binary_cross_entropy_with_logits, x, y, reduction="sum")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("C", [10, 300, 5000])
def test_softmax_rows_within_600(cpu_path, dtype, C):
    # each row: the max at 0, the other classes at -d + noise for a spread d from 0 to 600 (rows with a
    # small sum s = sum exp(x_j - max) of every size: log1p(s)'s powers of s were the subnormals)
    d = np.linspace(0.0, 598.0, 240)
    rng = np.random.default_rng(3)
    x = (-d[:, None] + rng.uniform(-1.0, 1.0, (d.size, C))).astype(dtype)
    x[:, 0] = 0.0
    t = rng.integers(0, C, d.size)
    t[::2] = 0
    _clean(xf.cross_entropy_with_grad, x, t)
    _clean(xf.cross_entropy_with_grad, x, t, reduction="none", label_smoothing=0.1)
    _clean(xf.cross_entropy, x, t, reduction="sum")
    _clean(xf.log_softmax, x)
    _clean(xf.softmax, x)
    _clean(xf.logsumexp, x)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0, 7.0, 20.0])
@pytest.mark.parametrize("target", [0.0, 1.0, 0.3])
def test_float32_focal_loss_every_finite_logit(cpu_path, gamma, target):
    # (a target such as 1e-30 with gamma = 20 still meets subnormal products near |x| ~ 30: binary.h)
    fmax = float(np.finfo(np.float32).max)
    a = _magnitudes(800.0, far=[1e3, 1e4, 1e30, fmax])
    x = np.concatenate([a, -a]).astype(np.float32)
    y = np.full(x.size, target, np.float32)
    up = np.random.default_rng(4).uniform(-3.0, 3.0, x.size).astype(np.float32)
    _clean(xf.sigmoid_focal_loss_with_grad, x, y, gamma=gamma, reduction="none")
    _clean(xf.sigmoid_focal_loss_with_grad, x, y, gamma=gamma, alpha=-1.0, reduction="mean")
    _clean(xf.sigmoid_focal_loss_with_grad, x, y, gamma=gamma, reduction="none", grad_output=up)


@pytest.mark.parametrize("mode", [dict(), dict(eps=1e-7), dict(log_clamp=-100.0)], ids=["exact", "eps", "clamp"])
@pytest.mark.parametrize("target", [0.0, 1.0, 0.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_bce_from_probabilities_every_probability(cpu_path, dtype, mode, target):
    # every binade of p that the fast forms take (float32 from its least normal: a float32 subnormal p is
    # itself a subnormal operand of its conversion to double; float64 from 2^-400), and of 1 - p down to
    # the dtype's epsilon: the logs, the division and the gradient stay normal (binary.h)
    rng = np.random.default_rng(5)
    lo, digits = (-126, 24) if dtype == np.float32 else (-400, 53)
    small = np.exp2(np.arange(float(lo), 0.0, 1.0 / 16.0) + rng.uniform(0.0, 1.0 / 16.0, -lo * 16))
    near_one = 1.0 - np.exp2(-np.arange(1.0, digits - 1.0, 1.0 / 16.0) - rng.uniform(0.0, 1.0 / 16.0, (digits - 2) * 16))
    p = np.concatenate([small, near_one]).astype(dtype)
    p = p[(p > 0) & (p < 1)]
    y = np.full(p.size, target, dtype)
    up = rng.uniform(-3.0, 3.0, p.size).astype(dtype)
    _clean(xf.binary_cross_entropy_with_grad, p, y, reduction="none", **mode)
    _clean(xf.binary_cross_entropy_with_grad, p, y, reduction="mean", grad_output=0.5, **mode)
    _clean(xf.binary_cross_entropy_with_grad, p, y, weight=dtype(2.5), reduction="none", grad_output=up, **mode)
