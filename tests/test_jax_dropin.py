"""xentfast.jax: optax's cross-entropy losses on xentfast's kernels, under jit, grad and vmap.

What is checked, and against what:
* the same bits as xentfast's NumPy functions (the same kernel), loss and gradient, with a per-row
  cotangent, eagerly, under jit and under vmap, on every path (FFI handlers, buffer_callback,
  pure_callback; so the other checks run on the default path only: all give the same bits);
* the documented bounds against the mpmath reference (loss: 2 / 4 ULP; gradient: the bound + 1 for the
  rounding of the upstream factor);
* optax 0.2.8 on ordinary inputs, within xentfast's bound plus the rounding error optax's own formula
  can carry (a few ULP of the magnitudes it subtracts), for every argument optax has (axis, where);
* a linear classifier trained by SGD follows optax's loss trajectory;
* static mistakes raise at trace time naming the argument; invalid data gives NaN (JAX cannot raise on
  data under jit).
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import xentfast as xf  # noqa: E402
import xentfast.jax as xfj  # noqa: E402
from xentfast import reference as ref  # noqa: E402
from xentfast._core import _xent  # noqa: E402
from xentfast.testing import assert_ulp_close  # noqa: E402

BOUND = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}
DTYPES = [np.float32, np.float64]
ids = lambda d: np.dtype(d).name  # noqa: E731


def _skip_unless_required(why):
    # CI builds the FFI handlers and sets XENTFAST_REQUIRE_PEERS=1: there every path must run
    if os.environ.get("XENTFAST_REQUIRE_PEERS", "0") not in ("", "0"):
        pytest.fail(f"XENTFAST_REQUIRE_PEERS=1 but {why}")
    pytest.skip(why)


@pytest.fixture(params=["ffi", "buffer_callback", "pure_callback"])
def path(request, monkeypatch):
    """Every way XLA reaches the kernel (CALLBACK is read at trace time: every test traces afresh)."""
    if request.param == "ffi" and xfj._ffi is None:
        _skip_unless_required("xentfast was built without jaxlib's FFI headers (or for a newer jaxlib): "
                              "no FFI handlers")
    if request.param == "buffer_callback" and xfj._buffer_callback is None:
        _skip_unless_required("this jax has no jax.experimental.buffer_callback")
    monkeypatch.setattr(xfj, "CALLBACK", request.param)
    return request.param


@pytest.fixture(params=DTYPES, ids=ids)
def dtype(request):
    """float32 as JAX's default; float64 inside jax.enable_x64."""
    if request.param is np.float64:
        with jax.enable_x64(True):
            yield np.dtype(np.float64)
    else:
        yield np.dtype(np.float32)


def _data(dtype, n=8, c=16, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal((n, c))).astype(dtype)
    y = rng.integers(0, c, n)
    t = rng.random((n, c)).astype(dtype)
    t /= t.sum(-1, keepdims=True)
    yb = (rng.random((n, c)) < 0.5).astype(dtype)
    g = (0.5 + rng.random(n)).astype(dtype)              # a per-row cotangent, not 1: it must reach the kernel
    return x, y, t, yb, g


def _vjp(f, *args, ct, jit=True):
    """The loss and its pullback of the cotangent `ct`, traced as one program by default (eager dispatch
    compiles every small op on its own, which dominates the run time of these tests)."""
    out, pullback = jax.vjp(jax.jit(f) if jit else f, *args)
    return out, (jax.jit(pullback) if jit else pullback)(jnp.asarray(ct))


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def assert_same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_array_equal(_bits(a), _bits(b))


# ---- the same kernel: bitwise equal to the NumPy functions ---------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_integer_labels_same_bits_as_numpy(path, dtype, jit):
    x, y, _, _, g = _data(dtype)
    Y = jnp.asarray(y)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, Y), jnp.asarray(x), ct=g, jit=jit)
    assert_same_bits(loss, xf.cross_entropy(x, y, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y, reduction="none"))


def test_probability_labels_same_bits_as_numpy(path, dtype):
    x, _, t, _, g = _data(dtype)
    loss, (dx, dt) = _vjp(xfj.softmax_cross_entropy, jnp.asarray(x), jnp.asarray(t), ct=g)
    assert_same_bits(loss, xf.cross_entropy(x, t, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, t, reduction="none"))
    # the labels' gradient: xentfast's log_softmax times the cotangent, one rounding
    assert_same_bits(dt, -(g[:, None] * xf.log_softmax(x)))


def test_z_loss_same_bits_as_numpy(path, dtype):
    x, y, t, _, g = _data(dtype)
    for f, target in ((xfj.softmax_cross_entropy_with_integer_labels, y), (xfj.softmax_cross_entropy, t)):
        loss, (dx,) = _vjp(lambda x: f(x, jnp.asarray(target), z_loss=1e-2), jnp.asarray(x), ct=g)
        assert_same_bits(loss, xf.cross_entropy(x, target, reduction="none", z_loss=1e-2))
        assert_same_bits(dx, xf.cross_entropy_backward(g, x, target, reduction="none", z_loss=1e-2))


def test_sigmoid_same_bits_as_numpy(path, dtype):
    x, _, t, yb, _ = _data(dtype)
    y = np.where(yb > 0, t, yb).astype(dtype)             # soft and hard targets, zeros included
    g = (0.5 + np.random.default_rng(1).random(x.shape)).astype(dtype)
    loss, (dx, dy) = _vjp(xfj.sigmoid_binary_cross_entropy, jnp.asarray(x), jnp.asarray(y), ct=g)
    assert_same_bits(loss, xf.binary_cross_entropy_with_logits(x, y, reduction="none"))
    assert_same_bits(dx, xf.binary_cross_entropy_with_logits_backward(g, x, y, reduction="none"))
    assert_same_bits(dy, -(g * x))                        # the exact derivative in y is -x


def test_sigmoid_infinite_cotangent_same_bits_as_numpy(path, dtype):
    # the kernels, not a front end, handle an infinite upstream factor (binary.h
    # xf_bin_bce_logits_grad_inf), so every call mode gives NumPy's signed infinities for soft targets
    x, _, t, _, _ = _data(dtype)
    g = np.where(np.random.default_rng(2).random(x.shape) < 0.5, np.inf, -np.inf).astype(dtype)
    g[0, 0] = 1.5
    _, (dx, _) = _vjp(xfj.sigmoid_binary_cross_entropy, jnp.asarray(x), jnp.asarray(t), ct=g)
    want = xf.binary_cross_entropy_with_logits_backward(g, x, t, reduction="none")
    assert_same_bits(dx, want)
    assert np.isinf(want.reshape(-1)[1:]).all()


@pytest.mark.parametrize("cpu_path", _xent.available_cpu_paths())
def test_ffi_handlers_give_numpys_bits_on_every_cpu_path(cpu_path_back, cpu_path, monkeypatch):
    """The handlers call _xent's and _binary's kernels through their capsules, on the code path
    _xent.set_cpu_path selected (read at every call).  The paths give the same bits, so this shows the
    handlers work after a switch, not which path ran."""
    if xfj._ffi is None:
        _skip_unless_required("xentfast was built without jaxlib's FFI headers (or for a newer jaxlib)")
    monkeypatch.setattr(xfj, "CALLBACK", "ffi")
    x, y, _, yb, g = _data(np.float32, n=64, c=300)
    _xent.set_cpu_path(cpu_path)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)),
                       jnp.asarray(x), ct=g)
    bce = jax.jit(xfj.sigmoid_binary_cross_entropy)(jnp.asarray(x), jnp.asarray(yb))
    assert_same_bits(loss, xf.cross_entropy(x, y, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y, reduction="none"))
    assert_same_bits(bce, xf.binary_cross_entropy_with_logits(x, yb, reduction="none"))


def _rows_with_odd_ones(rng, n, C, dtype):
    """n rows of C logits and their labels, rows 1, 9, 18 and 26 odd ones that the short-row groups hand
    back (NaN, +inf, a -inf label, a spread beyond the exponentials' range), and a `where` mask of about
    80 % of the rows."""
    x = (3 * rng.standard_normal((n, C))).astype(dtype)
    y = rng.integers(0, C, n)
    odd = x[[1, 9, 18, 26]]
    odd[0, -1], odd[1, -1], odd[2, y[18]] = np.nan, np.inf, -np.inf
    odd[3, -1] = 720.0 if C > 1 else 0.0
    x[[1, 9, 18, 26]] = odd
    keep = rng.random(n) < 0.8
    return x, y, keep


@pytest.mark.parametrize("z", [0.0, 1e-3], ids=["plain", "z-loss"])
@pytest.mark.parametrize("cpu_path", _xent.available_cpu_paths())
@pytest.mark.parametrize("C", [1, 10, 48, 49, 64, 65, 80, 81, 128, 129, 144, 145, 160, 161, 208, 209, 256, 257])
def test_ffi_short_row_groups_give_numpys_bits(cpu_path_back, cpu_path, C, dtype, z, monkeypatch):
    """Short rows of integer labels run side by side in the handlers (GROUP_ROWS at a time), as in the
    NumPy API: around every class limit of the groups, with a last partial group, rows masked by
    `where` (the skip label), rows the groups hand back to the row kernel (NaN, +inf, a -inf label,
    a spread beyond the exponentials' range) and upstream factors of 0, < 0 and inf; with the z-loss
    too."""
    if xfj._ffi is None:
        _skip_unless_required("xentfast was built without jaxlib's FFI headers (or for a newer jaxlib)")
    monkeypatch.setattr(xfj, "CALLBACK", "ffi")
    rng = np.random.default_rng(C)
    x, y, keep = _rows_with_odd_ones(rng, 5 * _xent.GROUP_ROWS + 3, C, dtype)
    n = len(x)
    g = (0.5 + rng.random(n)).astype(dtype)
    g[[3, 12, 30]] = 0.0, -1.5, np.inf
    _xent.set_cpu_path(cpu_path)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(
        x, jnp.asarray(y), where=jnp.asarray(keep), z_loss=z), jnp.asarray(x), ct=g)
    y_np = np.where(keep, y, -100)
    assert_same_bits(loss, xf.cross_entropy(x, y_np, reduction="none", z_loss=z))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y_np, reduction="none", z_loss=z))


@pytest.mark.parametrize("cpu_path", _xent.available_cpu_paths())
@pytest.mark.parametrize("C", [300, 1000])
def test_ffi_forward_rows_in_batches_give_numpys_bits(cpu_path_back, cpu_path, C, dtype, monkeypatch):
    """The loss without its gradient (the forward pass of value_and_grad, a jitted loss) takes the rows
    GROUP_ROWS a task in the handlers as in the NumPy API (xf_forward_in_batches: their logarithms side
    by side): integer labels (beyond the short-row groups, or handed back by them: 300 classes on the avx2
    path), with the z-loss, probability targets; rows masked by `where`, a last partial batch, and the
    rows the groups hand back (NaN, +inf, a -inf label, a spread beyond the exponentials' range)."""
    if xfj._ffi is None:
        _skip_unless_required("xentfast was built without jaxlib's FFI headers (or for a newer jaxlib)")
    monkeypatch.setattr(xfj, "CALLBACK", "ffi")
    rng = np.random.default_rng(C)
    # 8 batches per thread for up to 8 threads (the handlers' rule, threads_for), and a partial one
    x, y, keep = _rows_with_odd_ones(rng, 64 * _xent.GROUP_ROWS + 5, C, dtype)
    keep[[1, 9, 18, 26]] = True
    t = rng.random(x.shape).astype(dtype)
    t /= t.sum(-1, keepdims=True)
    y_np = np.where(keep, y, -100)
    _xent.set_cpu_path(cpu_path)
    X, Y, K, T = jnp.asarray(x), jnp.asarray(y), jnp.asarray(keep), jnp.asarray(t)
    f = xfj.softmax_cross_entropy_with_integer_labels
    with np.errstate(all="ignore"):
        assert_same_bits(jax.jit(lambda x: f(x, Y, where=K))(X), xf.cross_entropy(x, y_np, reduction="none"))
        assert_same_bits(jax.jit(lambda x: f(x, Y, z_loss=1e-2))(X),
                         xf.cross_entropy(x, y, reduction="none", z_loss=1e-2))
        assert_same_bits(jax.jit(xfj.softmax_cross_entropy)(X, T), xf.cross_entropy(x, t, reduction="none"))
    # the rows the groups hand back were there, and the masked rows
    want = xf.cross_entropy(x, y_np, reduction="none")
    assert np.isnan(want).sum() >= 2 and (want[~keep] == 0).all() and (~keep).sum() > 5


def test_special_values_same_bits(path, dtype):
    """The README's special-value rows go through every path unchanged (NaN bits included)."""
    inf, nan = np.inf, np.nan
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.array([[0.0, -inf, 1.0, 2.0], [-inf, 0.0, 1.0, 2.0], [0.0, nan, 1.0, 2.0], [0.0, inf, 1.0, 2.0],
                  [-inf, -inf, -inf, -inf], [30.0, 0.0, 0.0, 0.0], [-1e30, 1e30, 0.0, -0.0],
                  [tiny, -tiny, 0.0, 5.0]], dtype)
    y = np.array([2, 0, 2, 2, 1, 0, 0, 3])
    g = np.linspace(0.25, 2.0, 8).astype(dtype)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)), jnp.asarray(x), ct=g)
    assert_same_bits(loss, xf.cross_entropy(x, y, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y, reduction="none"))
    t = np.eye(4, dtype=dtype)[y] * 0.75 + 0.0625
    loss, (dx, dt) = _vjp(xfj.softmax_cross_entropy, jnp.asarray(x), jnp.asarray(t), ct=g)
    assert_same_bits(loss, xf.cross_entropy(x, t, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, t, reduction="none"))
    assert_same_bits(dt, -(g[:, None] * xf.log_softmax(x)))
    xb = np.array([-inf, inf, 0.0, -0.0, nan, -40.0, 20.0, tiny], dtype)
    yb = np.array([1.0, 0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.5], dtype)
    loss, (dx,) = _vjp(lambda x: xfj.sigmoid_binary_cross_entropy(x, jnp.asarray(yb)), jnp.asarray(xb), ct=g)
    assert_same_bits(loss, xf.binary_cross_entropy_with_logits(xb, yb, reduction="none"))
    assert_same_bits(dx, xf.binary_cross_entropy_with_logits_backward(g, xb, yb, reduction="none"))


@pytest.mark.parametrize("shape", [(2, 4), (64, 1024)], ids=["small", "threads"])
def test_subnormal_results_survive_xla(path, dtype, shape):
    """XLA's CPU threads flush denormals; the kernels must not: a loss, probability or gradient below the
    normal range keeps its bits (the bounds count the subnormal spacing), on one thread and on several."""
    gap = 100.0 if dtype == np.float32 else 740.0          # exp(-gap) is subnormal in the dtype
    normal = np.finfo(dtype).smallest_normal
    rng = np.random.default_rng(12)
    x = np.zeros(shape, dtype)
    x[:, 1:] = -gap - rng.random((shape[0], shape[1] - 1)).astype(dtype)
    y = np.zeros(shape[0], int)
    g = (0.5 + rng.random(shape[0])).astype(dtype)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)), jnp.asarray(x), ct=g)
    want = xf.cross_entropy(x, y, reduction="none")
    assert 0 < want[0] < normal                           # the case is what it claims to be
    assert_same_bits(loss, want)
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y, reduction="none"))
    # labels' gradient: -g log_softmax(x), whose confident entry -log1p(s) is subnormal
    t = np.zeros(shape, dtype)
    t[:, 0] = 1
    _, (_, dt) = _vjp(xfj.softmax_cross_entropy, jnp.asarray(x), jnp.asarray(t), ct=g)
    want = -(g[:, None] * xf.log_softmax(x))
    assert 0 < want[0, 0] < normal
    assert_same_bits(dt, want)
    # binary: softplus(-gap) and sigma(-gap) are subnormal; -g x with a subnormal x
    xb = np.where(rng.random(shape) < 0.5, -gap, np.finfo(dtype).smallest_subnormal * 3).astype(dtype)
    yb = np.zeros(shape, dtype)
    gb = (0.5 + rng.random(shape)).astype(dtype)
    loss, (dx, dy) = _vjp(xfj.sigmoid_binary_cross_entropy, jnp.asarray(xb), jnp.asarray(yb), ct=gb)
    assert_same_bits(loss, xf.binary_cross_entropy_with_logits(xb, yb, reduction="none"))
    assert_same_bits(dx, xf.binary_cross_entropy_with_logits_backward(gb, xb, yb, reduction="none"))
    assert_same_bits(dy, -(gb * xb))


@pytest.mark.parametrize("shape", [(64, 1024), (1, 40000), (13, 4101)],
                         ids=["many-rows", "one-long-row", "long-rows"])
def test_same_bits_on_several_threads(path, dtype, shape):
    """Sizes where the kernels start OpenMP teams (one thread per 16384 elements): the FFI handlers run
    rows on threads, the NumPy API splits a lone long row into blocks; the bits agree either way.  Rows
    of 16 KB and more (4096 float32 or 2048 float64 classes) leave each gradient for the thread's next
    row to write (softmax_rows.h, xf_pending_step), and the handler's release writes the last one's."""
    rng = np.random.default_rng(11)
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    y = rng.integers(0, shape[1], shape[0])
    yb = (rng.random(shape) < 0.3).astype(dtype)
    g = (0.5 + rng.random(shape[0])).astype(dtype)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)), jnp.asarray(x), ct=g)
    assert_same_bits(loss, xf.cross_entropy(x, y, reduction="none"))
    assert_same_bits(dx, xf.cross_entropy_backward(g, x, y, reduction="none"))
    _, (_, dt) = _vjp(xfj.softmax_cross_entropy, jnp.asarray(x), jnp.asarray(yb), ct=g)
    assert_same_bits(dt, -(g[:, None] * xf.log_softmax(x)))
    loss, (dx,) = _vjp(lambda x: xfj.sigmoid_binary_cross_entropy(x, jnp.asarray(yb)), jnp.asarray(x), ct=np.ones_like(x))
    assert_same_bits(loss, xf.binary_cross_entropy_with_logits(x, yb, reduction="none"))
    assert_same_bits(dx, xf.binary_cross_entropy_with_logits_backward(np.ones_like(x), x, yb, reduction="none"))


def test_vmap_is_one_call_on_more_rows(path, dtype):
    """broadcast_all: a vmapped call is the kernel on the stacked rows, so it gives the stacked bits."""
    x, y, t, yb, g = _data(dtype, n=12)
    X, Y, T, G = x.reshape(3, 4, 16), y.reshape(3, 4), t.reshape(3, 4, 16), g.reshape(3, 4)
    f = jax.jit(jax.vmap(xfj.softmax_cross_entropy_with_integer_labels))
    loss, (dX, _) = _vjp(f, jnp.asarray(X), jnp.asarray(Y), ct=G)
    assert_same_bits(loss, xf.cross_entropy(X, Y, reduction="none"))
    assert_same_bits(dX, xf.cross_entropy_backward(G, X, Y, reduction="none"))
    # one operand unbatched: the logits are shared by every member of the batch
    loss = jax.vmap(xfj.softmax_cross_entropy, in_axes=(None, 0))(jnp.asarray(x[:4]), jnp.asarray(T))
    assert_same_bits(loss, xf.cross_entropy(np.broadcast_to(x[:4], T.shape), T, reduction="none"))
    loss = jax.vmap(xfj.sigmoid_binary_cross_entropy)(jnp.asarray(X), jnp.asarray(yb.reshape(X.shape)))
    assert_same_bits(loss, xf.binary_cross_entropy_with_logits(X, yb.reshape(X.shape), reduction="none"))


def test_vmap_of_grad(path, dtype):
    x, y, _, _, _ = _data(dtype, n=12)
    X, Y = x.reshape(3, 4, 16), y.reshape(3, 4)
    mean_loss = lambda x, y: xfj.softmax_cross_entropy_with_integer_labels(x, y).mean()  # noqa: E731
    dX = jax.jit(jax.vmap(jax.grad(mean_loss)))(jnp.asarray(X), jnp.asarray(Y))
    # the mean's cotangent 1/4 reaches the kernel as a per-row grad_output, exact in binary
    assert_same_bits(dX, xf.cross_entropy_backward(np.full((3, 4), 0.25, dtype), X, Y, reduction="none"))


# ---- the documented bounds, at the JAX level --------------------------------------------------------------


def test_within_documented_bounds(dtype):
    x, y, t, yb, g = _data(dtype, n=4, c=6)
    bound = BOUND[dtype]
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)),
                       jnp.asarray(x), ct=g)
    assert_ulp_close(np.asarray(loss), ref.cross_entropy(x, y, reduction="none"), bound)
    assert_ulp_close(np.asarray(dx), ref.cross_entropy_grad(x, y, reduction="none", grad_output=g), bound + 1)
    loss, (dx,) = _vjp(lambda x: xfj.sigmoid_binary_cross_entropy(x, jnp.asarray(yb)), jnp.asarray(x),
                       ct=np.ones_like(x))
    assert_ulp_close(np.asarray(loss), ref.binary_cross_entropy_with_logits(x, yb, reduction="none"), bound)
    assert_ulp_close(np.asarray(dx), ref.binary_cross_entropy_with_logits_grad(x, yb, reduction="none"), bound + 1)


def test_confident_rows_keep_their_loss():
    """The founding example: float32 logits [30, 0], target 0.  optax returns 0 (log(1 + tiny))."""
    x = jnp.array([[30.0, 0.0]], jnp.float32)
    loss = xfj.softmax_cross_entropy_with_integer_labels(x, jnp.array([0]))
    assert_ulp_close(np.asarray(loss), ref.cross_entropy(np.asarray(x), np.array([0]), reduction="none"), 2.0)
    assert float(optax.softmax_cross_entropy_with_integer_labels(x, jnp.array([0]))[0]) == 0.0
    # y = 1 at x = +inf: optax's -y log_sigmoid(x) - (1 - y) log_sigmoid(-x) is 0 * -inf = NaN
    assert float(xfj.sigmoid_binary_cross_entropy(jnp.array([jnp.inf]), jnp.array([1.0]))[0]) == 0.0


# ---- agreement with optax ----------------------------------------------------------------------------------
#
# xentfast is within its bound of the exact value; optax evaluates lse - x_y (or t . (lse - x)) in the
# working precision, so its error is a few ULP of the magnitudes it subtracts, max(|lse|, |x|).  The
# tolerances below are that sum: xentfast's bound in ULP of the result, plus 4 ULP of those magnitudes.


def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _ulp(a, dtype):
    return np.spacing(np.abs(np.asarray(a, dtype=dtype))).astype(np.float64)


def _lse(x):
    x = np.asarray(x, np.float64)
    m = np.max(x, -1, keepdims=True)
    return (m + np.log(np.sum(np.exp(x - m), -1, keepdims=True)))[..., 0]


def _assert_close(actual, expected, tol, what):
    diff = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    worst = np.unravel_index(np.argmax(diff - tol), diff.shape) if diff.size else None
    assert np.all(diff <= tol), (f"{what}: |xentfast - optax| = {diff[worst]:.3g} > tolerance {tol[worst]:.3g} "
                                 f"at {worst}")


def _softmax_tols(rows, q, loss, dx, g, dtype, summed):
    """Tolerances of the loss and the logits' gradient against optax, in the kernel's layout.

    rows: the logits as the kernel sees them (class axis last, -inf for masked classes); q: the target
    mass per class (one-hot for integer labels).  optax's log-probabilities x_c - lse are a few ULP of
    |lse| + |x_c| off; with probability labels it sums C products, adding C eps of the sum of their
    magnitudes (the recursive summation bound).  Its gradient p_j sum(q) - q_j takes p_j = exp(x_j - lse),
    whose argument is |lse| ULP off."""
    eps = _eps(dtype)
    r = np.asarray(rows, np.float64)
    lse = _lse(r)[..., None]
    mag = np.where(np.isfinite(r), np.abs(lse) + np.abs(np.where(np.isfinite(r), r, 0.0)), 0.0)
    q = np.abs(np.asarray(q, np.float64))
    C = r.shape[-1]
    loss_tol = BOUND[dtype] * _ulp(loss, dtype) + (4 + (C if summed else 0)) * eps * np.sum(q * mag, -1)
    p = np.exp(r - lse)
    g = np.abs(np.asarray(g, np.float64))[..., None]
    grad_tol = ((BOUND[dtype] + 1) * _ulp(dx, dtype)
                + 4 * eps * g * (p * (1 + np.abs(lse)) * q.sum(-1, keepdims=True) + q))
    return loss_tol, grad_tol


def test_integer_labels_agree_with_optax(dtype):
    x, y, _, _, g = _data(dtype, n=32, c=10)
    X, Y = jnp.asarray(x), jnp.asarray(y)
    loss, (dx,) = _vjp(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, Y), X, ct=g)
    want, (want_dx,) = _vjp(lambda x: optax.losses.softmax_cross_entropy_with_integer_labels(x, Y), X, ct=g)
    assert loss.dtype == want.dtype and loss.shape == want.shape
    loss_tol, grad_tol = _softmax_tols(x, np.eye(10)[y], loss, dx, g, dtype, summed=False)
    _assert_close(loss, want, loss_tol, "loss")
    _assert_close(dx, want_dx, grad_tol, "gradient")


def test_probability_labels_agree_with_optax(dtype):
    x, _, t, _, g = _data(dtype, n=32, c=10)
    X, T = jnp.asarray(x), jnp.asarray(t)
    loss, (dx, dt) = _vjp(xfj.softmax_cross_entropy, X, T, ct=g)
    want, (want_dx, want_dt) = _vjp(optax.losses.softmax_cross_entropy, X, T, ct=g)
    loss_tol, grad_tol = _softmax_tols(x, t, loss, dx, g, dtype, summed=True)
    _assert_close(loss, want, loss_tol, "loss")
    _assert_close(dx, want_dx, grad_tol, "gradient")
    # d/dt_c = g (lse - x_c): optax rounds x - lse once more than xentfast's log_softmax
    mag = np.maximum(np.abs(_lse(x))[:, None], np.abs(x))
    _assert_close(dt, want_dt, BOUND[dtype] * _ulp(dt, dtype) + 4 * g[:, None] * _ulp(mag, dtype), "labels gradient")


def test_sigmoid_agrees_with_optax(dtype):
    x, _, t, yb, _ = _data(dtype, n=16, c=8)
    y = np.where(yb > 0, t, yb).astype(dtype)
    g = np.ones_like(x)
    loss, (dx, dy) = _vjp(xfj.sigmoid_binary_cross_entropy, jnp.asarray(x), jnp.asarray(y), ct=g)
    want, (want_dx, want_dy) = _vjp(optax.losses.sigmoid_binary_cross_entropy, jnp.asarray(x), jnp.asarray(y), ct=g)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    sp_pos, sp_neg = np.logaddexp(0, x64), np.logaddexp(0, -x64)        # softplus(x), softplus(-x)
    sig, sig_neg = 1 / (1 + np.exp(-x64)), 1 / (1 + np.exp(x64))
    # optax sums two non-negative terms, each a few ULP off: a few ULP of the loss
    _assert_close(loss, want, BOUND[dtype] * _ulp(loss, dtype) + 4 * _eps(dtype) * ((1 - y64) * sp_pos + y64 * sp_neg),
                  "loss")
    # its gradient is (1 - y) sigma(x) - y sigma(-x): a few ULP of each term
    _assert_close(dx, want_dx,
                  (BOUND[dtype] + 1) * _ulp(dx, dtype) + 4 * _eps(dtype) * ((1 - y64) * sig + y64 * sig_neg),
                  "gradient")
    # d/dy: optax's softplus(-x) - softplus(x) cancels to -x; a few ULP of the softplus values
    _assert_close(dy, want_dy, _ulp(dy, dtype) + 4 * _ulp(np.maximum(sp_pos, sp_neg), dtype), "labels gradient")


def test_sigmoid_broadcasts_like_optax():
    x, _, _, yb, _ = _data(np.float32, n=4, c=3)
    for xs, ys in ((x, yb[0]), (x[0], yb), (x, np.float32(1.0)), (x[:, :1], yb)):
        got = xfj.sigmoid_binary_cross_entropy(jnp.asarray(xs), jnp.asarray(ys))
        want = optax.losses.sigmoid_binary_cross_entropy(jnp.asarray(xs), jnp.asarray(ys))
        assert got.shape == want.shape
        xb, yb_ = np.broadcast_arrays(np.asarray(xs), np.asarray(ys, np.float32))
        assert_same_bits(got, xf.binary_cross_entropy_with_logits(np.ascontiguousarray(xb), yb_, reduction="none"))
    # the logits' gradient sums over the broadcast, as optax's does: three same-signed terms (y in {0, 1},
    # x of one row), each a few ULP off in optax
    X1, YB = jnp.asarray(x[:, :1]), jnp.asarray(yb)
    dx = jax.grad(lambda x: xfj.sigmoid_binary_cross_entropy(x, YB).sum())(X1)
    want = jax.grad(lambda x: optax.losses.sigmoid_binary_cross_entropy(x, YB).sum())(X1)
    np.testing.assert_allclose(dx, want, rtol=8 * _eps(np.float32), atol=0)


# with x64 off a device array holds no float64 label: that case is the host array's
@pytest.mark.parametrize("x64, as_device_array", [(True, True), (True, False), (False, False)])
def test_sigmoid_label_range_is_that_of_the_labels_as_given(x64, as_device_array):
    # float32 logits cast a float64 label of 1 + 1e-9 to 1 (and with x64 off, jnp.asarray rounds a NumPy
    # float64 label before anything sees it): the range is checked on the labels as given, as the NumPy
    # API checks it (there an error; here NaN, as for every label outside [0, 1])
    host = np.array([1 + 1e-9, 1.0, -1e-12])
    with jax.enable_x64(x64):
        x = jnp.asarray(np.array([0.5, -1.0, 2.0], np.float32))
        y = jnp.asarray(host) if as_device_array else host
        loss = np.asarray(xfj.sigmoid_binary_cross_entropy(x, y))
        dx = np.asarray(jax.grad(lambda v: xfj.sigmoid_binary_cross_entropy(v, y).sum())(x))
        jitted = np.asarray(jax.jit(xfj.sigmoid_binary_cross_entropy)(x, y))
    assert np.isnan(loss[0]) and np.isnan(loss[2]) and np.isfinite(loss[1])
    assert dx[0] == 0 and dx[2] == 0 and dx[1] != 0
    if as_device_array:          # traced under jit: the check runs on the device array's values
        assert np.array_equal(jitted, loss, equal_nan=True)
    with pytest.raises(ValueError, match="target"):
        xf.binary_cross_entropy_with_logits(np.asarray(x), host, reduction="none")


# with x64 off JAX wraps int64 to int32: a host label of 2**32 + 1 became class 1 and gave that class's
# loss, silently (2**64 - 1 as uint64 likewise); a Python int beyond int32 raised a bare OverflowError
@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("labels", [np.array([1, 2**32 + 1, -2**32 + 2], np.int64),
                                    np.array([1, 2**64 - 1, 2**32 + 2], np.uint64),
                                    [1, 2**32 + 1, -2**32 + 2]], ids=["int64", "uint64", "list"])
def test_integer_label_range_is_that_of_the_labels_as_given(x64, labels):
    x = np.array([[0.5, -1.0, 2.0]] * 3, np.float32)
    f = xfj.softmax_cross_entropy_with_integer_labels
    with jax.enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # JAX's note that int64 is not available
        loss = np.asarray(f(x, labels))
        dx = np.asarray(jax.grad(lambda v: f(v, labels).sum())(jnp.asarray(x)))
    assert loss[0] == xf.cross_entropy(x[:1], np.array([1]), reduction="none")[0]
    assert np.isnan(loss[1:]).all()
    assert (dx[1:] == 0).all() and (dx[0] != 0).all()
    with pytest.raises(ValueError, match=r"labels: .*64 bits"):
        f(x, [1, 2**70, 0])


def _rows(a, axes):
    """`a` laid out as the kernel sees it: class axes last, in the order given, flattened."""
    moved = np.moveaxis(a, axes, range(a.ndim - len(axes), a.ndim))
    return moved.reshape(moved.shape[:a.ndim - len(axes)] + (-1,))


@pytest.mark.parametrize("axis", [0, 1, (1, 3), (3, 1)], ids=str)
def test_class_axes_like_optax(axis):
    rng = np.random.default_rng(3)
    x = (3 * rng.standard_normal((3, 4, 2, 5))).astype(np.float32)
    axes = (axis,) if isinstance(axis, int) else axis
    batch = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    C = int(np.prod([x.shape[a] for a in axes]))
    y = rng.integers(0, C, batch)
    t = rng.random(x.shape).astype(np.float32)
    g = np.ones(batch, np.float32)
    cases = ((xfj.softmax_cross_entropy_with_integer_labels, optax.losses.softmax_cross_entropy_with_integer_labels,
              y, np.eye(C)[y], False),
             (xfj.softmax_cross_entropy, optax.losses.softmax_cross_entropy, t, _rows(t, axes), True))
    for f, o, lab, q, summed in cases:
        got, (dx,) = _vjp(lambda x: f(x, jnp.asarray(lab), axis=axis), jnp.asarray(x), ct=g)
        want, (want_dx,) = _vjp(lambda x: o(x, jnp.asarray(lab), axis=axis), jnp.asarray(x), ct=g)
        assert got.shape == want.shape == batch and dx.shape == x.shape
        dx_rows = _rows(np.asarray(dx), axes)
        loss_tol, grad_tol = _softmax_tols(_rows(x, axes), q, got, dx_rows, g, np.dtype(np.float32), summed)
        _assert_close(got, want, loss_tol, f"loss, axis={axis}")
        _assert_close(dx_rows, _rows(np.asarray(want_dx), axes), grad_tol, f"gradient, axis={axis}")


def test_axis_none_is_one_distribution():
    x, _, t, _, _ = _data(np.float32, n=3, c=4)
    got = xfj.softmax_cross_entropy(jnp.asarray(x), jnp.asarray(t), axis=None)
    assert got.shape == ()
    assert_same_bits(got, xf.cross_entropy(x.reshape(-1), t.reshape(-1), reduction="none"))
    want = optax.losses.softmax_cross_entropy(jnp.asarray(x), jnp.asarray(t), axis=None)
    loss_tol, _ = _softmax_tols(x.reshape(-1), t.reshape(-1), got, np.zeros(12), 1.0, np.dtype(np.float32), True)
    _assert_close(got, want, loss_tol, "axis=None")


@pytest.mark.parametrize("mask", ["rows", "classes"])
def test_where_like_optax(mask):
    x, y, t, _, g = _data(np.float32, n=16, c=8, seed=5)
    rng = np.random.default_rng(6)
    if mask == "rows":
        where = rng.random(16) < 0.6
        where[:2] = [False, True]
    else:
        where = rng.random((16, 8)) < 0.6
        where[0] = False                                  # a row with no class kept
        where[np.arange(16), y] |= np.arange(16) > 0      # optax and xentfast differ where the label is masked
    full = np.broadcast_to(where if where.ndim == 2 else where[:, None], x.shape)
    kept = full.any(-1)
    x[0, 3] = np.nan                                      # what a masked row holds takes no part either
    X, Y, T, W = map(jnp.asarray, (x, y, t, where))
    for f, o, lab, q, summed in ((xfj.softmax_cross_entropy_with_integer_labels,
                                  optax.losses.softmax_cross_entropy_with_integer_labels, Y, np.eye(8)[y], False),
                                 (xfj.softmax_cross_entropy, optax.losses.softmax_cross_entropy, T, t * full, True)):
        got, (dx,) = _vjp(lambda x: f(x, lab, where=W), X, ct=g)
        want, (want_dx,) = _vjp(lambda x: o(x, lab, where=W), X, ct=g)
        np.testing.assert_array_equal(np.asarray(got)[~kept], 0.0)
        np.testing.assert_array_equal(np.asarray(dx)[~full], 0.0)       # masked classes take no part
        rows = np.where(full, x, -np.inf)[kept]
        loss_tol, grad_tol = _softmax_tols(rows, q[kept], np.asarray(got)[kept], np.asarray(dx)[kept], g[kept],
                                           np.dtype(np.float32), summed)
        _assert_close(np.asarray(got)[kept], np.asarray(want)[kept], loss_tol, f"loss, where by {mask}")
        _assert_close(np.asarray(dx)[kept], np.asarray(want_dx)[kept], grad_tol, f"gradient, where by {mask}")
        np.testing.assert_array_equal(np.asarray(want_dx)[~full], 0.0)


def test_where_masking_the_label_class_gives_inf():
    x = jnp.array([[1.0, 2.0, 3.0]])
    loss = xfj.softmax_cross_entropy_with_integer_labels(x, jnp.array([2]), where=jnp.array([[True, True, False]]))
    assert float(loss[0]) == np.inf


# ---- a small model: jit, grad, vmap ------------------------------------------------------------------------


def _classifier_data(dtype, n=64, d=5, c=4, seed=7):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    W_true = rng.standard_normal((d, c)).astype(dtype)
    y = np.argmax(X @ W_true + 0.5 * rng.standard_normal((n, c)), -1)
    return jnp.asarray(X), jnp.asarray(y)


def _train(loss_fn, params, X, y, steps=25, lr=0.5):
    opt = optax.sgd(lr)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        def objective(p):
            return loss_fn(X @ p["W"] + p["b"], y).mean()
        loss, grads = jax.value_and_grad(objective)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return np.array(losses), params


def test_sgd_follows_optax_trajectory(dtype):
    """Softmax regression is convex and SGD with this step contracts, so per-step differences of a few
    ULP (the two losses' roundings) stay of that size along the trajectory instead of compounding."""
    X, y = _classifier_data(dtype)
    params = {"W": jnp.zeros((5, 4), dtype), "b": jnp.zeros(4, dtype)}
    ours, p_ours = _train(xfj.softmax_cross_entropy_with_integer_labels, params, X, y)
    theirs, p_theirs = _train(optax.losses.softmax_cross_entropy_with_integer_labels, params, X, y)
    assert ours[-1] < 0.6 * ours[0]                       # it learns
    np.testing.assert_allclose(ours, theirs, rtol=64 * _eps(dtype), atol=0)
    scale = float(jnp.abs(p_theirs["W"]).max())
    np.testing.assert_allclose(p_ours["W"], p_theirs["W"], rtol=0, atol=64 * _eps(dtype) * scale)


def test_vmap_grad_of_an_ensemble():
    """Three models trained side by side: vmap over parameters of grad of a jitted loss."""
    X, y = _classifier_data(np.float32)
    W = jnp.asarray(np.random.default_rng(8).standard_normal((3, 5, 4)).astype(np.float32))

    def member(loss_fn):
        return lambda W: loss_fn(X @ W, y).mean()

    got = jax.jit(jax.vmap(jax.value_and_grad(member(xfj.softmax_cross_entropy_with_integer_labels))))(W)
    want = jax.vmap(jax.value_and_grad(member(optax.losses.softmax_cross_entropy_with_integer_labels)))(W)
    np.testing.assert_allclose(got[0], want[0], rtol=16 * _eps(np.float32), atol=0)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=16 * _eps(np.float32) * float(jnp.abs(want[1]).max()))


# ---- what is saved and what is computed ---------------------------------------------------------------------


def _kernel_calls(jaxpr):
    return sum(1 for e in jaxpr.jaxpr.eqns if e.primitive.name in ("ffi_call", "buffer_callback", "pure_callback"))


def test_label_gradient_only_when_asked(path):
    x, _, t, yb, _ = _data(np.float32)
    for f, lab in ((xfj.softmax_cross_entropy, t), (xfj.sigmoid_binary_cross_entropy, yb)):
        loss = lambda x, t: f(x, t).sum()  # noqa: E731
        # forward + logits gradient: two kernel calls, no label gradient
        assert _kernel_calls(jax.make_jaxpr(jax.grad(loss))(x, lab)) == 2
        # labels only: no logits gradient kernel
        dt = jax.grad(loss, argnums=1)(jnp.asarray(x), jnp.asarray(lab))
        both = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(lab))
        assert_same_bits(dt, both[1])
        want = jax.grad(lambda t: f(jnp.asarray(x), t).sum())(jnp.asarray(lab))
        assert_same_bits(dt, want)
    assert _kernel_calls(jax.make_jaxpr(jax.grad(lambda t: xfj.softmax_cross_entropy(x, t).sum()))(t)) == 2


def test_half_precision_in_float32():
    x, y, _, yb, _ = _data(np.float32)
    xh = jnp.asarray(x, jnp.bfloat16)
    x32 = np.asarray(xh.astype(jnp.float32))                # the widening is exact
    loss = xfj.softmax_cross_entropy_with_integer_labels(xh, jnp.asarray(y))
    assert loss.dtype == jnp.float32
    assert_same_bits(loss, xf.cross_entropy(x32, y, reduction="none"))
    dx = jax.grad(lambda x: xfj.softmax_cross_entropy_with_integer_labels(x, jnp.asarray(y)).sum())(xh)
    assert dx.dtype == jnp.bfloat16
    assert_same_bits(np.asarray(dx.astype(jnp.float32)),
                     np.asarray(jnp.asarray(xf.cross_entropy_backward(np.ones(8, np.float32), x32, y, reduction="none"))
                                .astype(jnp.bfloat16).astype(jnp.float32)))
    assert xfj.sigmoid_binary_cross_entropy(xh.astype(jnp.float16), jnp.asarray(yb)).dtype == jnp.float32


def test_empty_batch(path):
    loss = xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((0, 5)), jnp.zeros((0,), jnp.int32))
    assert loss.shape == (0,)
    dx = jax.grad(lambda x: xfj.softmax_cross_entropy(x, jnp.zeros((0, 5))).sum())(jnp.zeros((0, 5)))
    assert dx.shape == (0, 5)


# ---- bad input --------------------------------------------------------------------------------------------


def test_invalid_data_gives_nan_not_an_exception(path):
    """Data cannot raise under jit: a bad label is NaN for its own row only, with gradient 0."""
    x, y, _, _, _ = _data(np.float32)
    y = y.copy()
    y[2], y[5] = 16, -1
    for f in (xfj.softmax_cross_entropy_with_integer_labels, jax.jit(xfj.softmax_cross_entropy_with_integer_labels)):
        loss = np.asarray(f(jnp.asarray(x), jnp.asarray(y)))
        assert np.isnan(loss[[2, 5]]).all()
        ok = np.ones(8, bool)
        ok[[2, 5]] = False
        assert_same_bits(loss[ok], xf.cross_entropy(x[ok], y[ok], reduction="none"))
    Y = jnp.asarray(y)
    dx = np.asarray(jax.grad(lambda x: jnp.nansum(xfj.softmax_cross_entropy_with_integer_labels(x, Y)))(jnp.asarray(x)))
    np.testing.assert_array_equal(dx[[2, 5]], 0.0)
    # a masked row's label is not looked at
    where = np.ones(8, bool)
    where[2] = False
    loss = np.asarray(xfj.softmax_cross_entropy_with_integer_labels(jnp.asarray(x), Y, where=jnp.asarray(where)))
    assert loss[2] == 0.0 and np.isnan(loss[5])
    # unsigned and narrow label dtypes are compared before any cast
    loss = xfj.softmax_cross_entropy_with_integer_labels(jnp.asarray(x[:2, :4]), jnp.array([3, 255], jnp.uint8))
    assert np.isfinite(loss[0]) and np.isnan(loss[1])
    lab = jnp.array([0.0, 1.5, jnp.nan, 1.0])
    loss = np.asarray(xfj.sigmoid_binary_cross_entropy(jnp.zeros(4), lab))
    np.testing.assert_array_equal(np.isnan(loss), [False, True, True, False])


@pytest.mark.parametrize("call, exc, message", [
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((2, 3), jnp.int32), jnp.zeros(2, jnp.int32)),
     TypeError, r"logits: expected floating-point logits, got dtype int32"),
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((2, 3)), jnp.zeros(2)),
     TypeError, r"labels: expected integer class indices, got dtype float32"),
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((2, 3)), jnp.zeros(3, jnp.int32)),
     ValueError, r"labels: shape \(3,\) does not broadcast to the logits' shape without the class axis \(2,\)"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 4))),
     ValueError, r"labels: shape \(2, 4\) does not broadcast to the logits' shape \(2, 3\)"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3), jnp.complex64)),
     TypeError, r"labels: expected real class probabilities, got dtype complex64"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), where=jnp.ones(2)),
     TypeError, r"where: expected a boolean mask, got dtype float32"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), where=jnp.ones(3, bool)),
     ValueError, r"where: shape \(3,\) does not broadcast to the logits' shape \(2, 3\)"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), axis=2),
     ValueError, r"axis: 2 is out of range for logits with 2 dimension\(s\)"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), axis=(1, -1)),
     ValueError, r"axis: repeated axis in \(1, -1\)"),
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), axis=None),
     TypeError, r"axis: expected an int or a tuple of ints; got None"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), axis=1.0),
     TypeError, r"axis: expected an int, a tuple of ints or None; got 1.0"),
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((2, 0)), jnp.zeros(2, jnp.int32)),
     ValueError, r"logits: the class axis \(axis=-1\) has length 0"),
    (lambda: xfj.softmax_cross_entropy_with_integer_labels(jnp.zeros((0, 2)), jnp.zeros(2, jnp.int32), axis=0),
     ValueError, r"logits: the class axis \(axis=0\) has length 0"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 0)), jnp.zeros((2, 0)), axis=None),
     ValueError, r"logits: the class axis \(every axis\) has length 0"),
    (lambda: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), z_loss=-1.0),
     ValueError, r"z_loss: must be finite and >= 0; got -1.0"),
    (lambda: jax.jit(lambda z: xfj.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3)), z_loss=z))(1e-4),
     TypeError, r"z_loss: expected a Python number \(the coefficient is static\); got a traced value"),
    (lambda: xfj.sigmoid_binary_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((4, 3))),
     ValueError, r"labels: shape \(4, 3\) does not broadcast with the logits' shape \(2, 3\)"),
    (lambda: xfj.sigmoid_binary_cross_entropy(jnp.zeros(3, jnp.bool_), jnp.zeros(3)),
     TypeError, r"logits: expected floating-point logits, got dtype bool"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_static_errors_name_the_argument(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_unknown_callback_path(monkeypatch):
    monkeypatch.setattr(xfj, "CALLBACK", "cffi")
    with pytest.raises(ValueError, match=r"CALLBACK: expected one of ffi, buffer_callback, pure_callback; got 'cffi'"):
        xfj.sigmoid_binary_cross_entropy(jnp.zeros(3), jnp.zeros(3))


def test_ffi_handlers_only_with_their_jaxlib_or_newer(monkeypatch):
    """Handlers built against a newer FFI API than the running jaxlib's are refused by XLA, and registering
    them can break the CPU backend: they must not be loaded at all then."""
    if xfj._ffi is None:
        _skip_unless_required("xentfast was built without jaxlib's FFI headers")
    import jaxlib
    assert xfj._load_ffi() is xfj._ffi
    monkeypatch.setattr(xfj._ffi, "JAXLIB_VERSION", "999.0.0")
    assert xfj._load_ffi() is None
    monkeypatch.setattr(xfj._ffi, "JAXLIB_VERSION", jaxlib.__version__ + ".dev0")
    assert xfj._load_ffi() is xfj._ffi
    assert xfj._version("0.10.2rc1") == (0, 10, 2) and xfj._version("1.2") == (1, 2, 0)


def test_core_package_needs_no_jax():
    """xentfast imports without JAX; xentfast.jax says what is missing."""
    code = ("import sys; sys.modules['jax'] = None\n"
            "import xentfast\n"
            "try:\n"
            "    import xentfast.jax\n"
            "except ImportError as e:\n"
            "    print('ImportError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ImportError"), out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", "import sys, xentfast; print('jax' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_int64_labels_reach_the_kernel():
    # beyond 2**31 - 1 classes (x64 enabled) the labels go to the kernel as int64: the FFI handler took
    # only int32 ("no kernel for labels of XLA dtype 5"); checked here on a small row through the same op
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 7)).astype(np.float32)
    y = np.array([0, 6, 3, xfj._SKIP])
    with jax.enable_x64(True):
        op = xfj._xent_op(0.0, False)
        got = jax.jit(op)(jnp.asarray(x), jnp.asarray(y, jnp.int64))
        dx = jax.jit(jax.grad(lambda v: op(v, jnp.asarray(y, jnp.int64)).sum()))(jnp.asarray(x))
        want = op(jnp.asarray(x), jnp.asarray(y, jnp.int32))
        want_dx = jax.grad(lambda v: op(v, jnp.asarray(y, jnp.int32)).sum())(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(want_dx))


def test_unsigned_labels_beyond_int32_classes_need_x64():
    # with x64 off the kernel takes int32 labels, and a uint32 label from 2**31 on would wrap; C itself,
    # a Python int beyond int32, also failed to convert (an OverflowError blaming the labels).  Traced
    # only: no array of 2**31 classes is made
    x = jax.ShapeDtypeStruct((1, 2**31 + 64), jnp.float32)
    y = jax.ShapeDtypeStruct((1,), jnp.uint32)
    with pytest.raises(ValueError, match=r"labels: uint32 labels .* need 64-bit labels"):
        jax.eval_shape(xfj.softmax_cross_entropy_with_integer_labels, x, y)
    with warnings.catch_warnings():
        # int32 labels without x64 are taken as they are (an int64 cast would warn of its truncation)
        warnings.simplefilter("error")
        out = jax.eval_shape(xfj.softmax_cross_entropy_with_integer_labels, x, jax.ShapeDtypeStruct((1,), jnp.int32))
    assert out.shape == (1,)


def test_zero_mass_on_minus_inf_and_plus_inf_logits_differ_from_optax_as_documented():
    # xentfast.jax's docstring, "Deliberate differences": 0 * inf = 0, and a +inf logit has no softmax
    x = jnp.array([[0.0, -jnp.inf, 1.0]])
    t = jnp.array([[0.5, 0.0, 0.5]])
    loss, grad = jax.value_and_grad(lambda a: xfj.softmax_cross_entropy(a, t).sum())(x)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all()
    assert float(loss) == float(xf.cross_entropy(np.asarray(x), np.asarray(t), reduction="sum"))
    assert np.isnan(float(optax.softmax_cross_entropy(x, t)[0]))
    up = jnp.array([[0.0, jnp.inf, 1.0]])
    assert np.isnan(float(xfj.softmax_cross_entropy_with_integer_labels(up, jnp.array([0]))[0]))
    assert float(optax.softmax_cross_entropy_with_integer_labels(up, jnp.array([0]))[0]) == np.inf


def test_sigmoid_labels_as_a_list_of_traced_values():
    # a list holding tracers cannot be checked on the host: it is checked as JAX holds it
    x = jnp.asarray(np.array([0.5, -1.0], np.float32))
    f = xfj.sigmoid_binary_cross_entropy
    got = np.asarray(jax.jit(lambda a, b: f(x, [a, b]))(jnp.float32(0.3), jnp.float32(2.0)))
    assert np.isfinite(got[0]) and np.isnan(got[1])
    assert got[0] == np.asarray(f(x, np.array([0.3, 1.0], np.float32)))[0]
    d = jax.grad(lambda a: f(x, [a, 1.0]).sum())(jnp.float32(0.3))
    assert np.isfinite(d) and d != 0
    v = np.asarray(jax.vmap(lambda a: f(x, [a, a]))(jnp.array([0.3, 2.0], jnp.float32)))
    assert np.isfinite(v[0]).all() and np.isnan(v[1]).all()
