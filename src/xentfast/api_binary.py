"""Public functions of the binary family: BCE with logits, sigmoid focal loss, BCE from probabilities and
cross-entropy from class probabilities.

Validation, layout and reduction reuse the softmax family's helpers in :mod:`xentfast.api` (the same
messages, the same ``out=``/``inplace`` logic, the same double-double reduction); the arithmetic is
``xentfast/binary.h`` through :mod:`xentfast._core._binary`.  Every argument is checked before any kernel
runs, and every error names the argument and shows the offending value.
"""

import functools
import math
import operator

import numpy as np

from . import _backend, _dtypes
from . import api as _api
from ._backend import xp as _xp
from ._core import _binary
from .api import (
    _EMPTY_MEAN,
    _HALF_BOUND,
    _HALF_NOTES,
    _REDUCTIONS,
    _SMALLEST_NORMAL,
    _as_float_input,
    _check_choice,
    _check_real,
    _class_axis,
    _class_weights,
    _dd_sum,
    _document,
    _finish_grad,
    _first_bad,
    _grad_target,
    _loss_and_grad,
    _on_input_device,
    _TINY_K,
    _placeholder,
    _rows,
    _split_target,
    _sum_and_tiny,
    _threads_for,
    _upstream_factor,
    _upstream_param,
)

__all__ = [
    "binary_cross_entropy_with_logits",
    "binary_cross_entropy_with_logits_backward",
    "binary_cross_entropy_with_logits_with_grad",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_backward",
    "sigmoid_focal_loss_with_grad",
    "binary_cross_entropy",
    "binary_cross_entropy_backward",
    "binary_cross_entropy_with_grad",
    "cross_entropy_from_probs",
    "cross_entropy_from_probs_backward",
    "cross_entropy_from_probs_with_grad",
]

_NAN_POLICIES = ("propagate", "raise")


# ---------------------------------------------------------------------------------------------------
# validation


def _ignore_value(ignore_index):
    if ignore_index is None:
        return None
    if isinstance(ignore_index, (bool, np.bool_)):
        raise TypeError(f"ignore_index: expected None, an int or a finite float; got {ignore_index!r}")
    try:
        return operator.index(ignore_index)
    except TypeError:
        pass
    if isinstance(ignore_index, (float, np.floating)) and math.isfinite(ignore_index):
        return float(ignore_index)
    raise TypeError(f"ignore_index: expected None, an int or a finite float; got {ignore_index!r}")


def _check_ignore_exact(ignore, dtype):
    """The kernels compare each target, widened to double, with float(ignore) and the validation compares
    in the targets' dtype: the two agree only when ignore is one of that dtype's values (-0.1 is not a
    float32, so float32 targets of -0.1 would be ignored by one test and not by the other)."""
    try:
        with np.errstate(over="ignore"):
            held = float(dtype.type(ignore))
    except OverflowError:                  # an int beyond float64
        held = math.inf
    if not math.isfinite(held):
        raise ValueError(f"ignore_index: {ignore!r} is outside the range of {dtype}, the targets' dtype")
    if held != ignore:
        raise ValueError(f"ignore_index: {ignore!r} is not a {dtype} value, so no {dtype} target can equal it "
                         f"exactly (nearest: {held!r}); pass that value, or use targets of a wider dtype")


def _not_unit(tc, ignore):
    with np.errstate(invalid="ignore"):
        ok = (tc >= 0) & (tc <= 1)
        if ignore is not None:
            ok |= tc == ignore
    return ~ok


def _raise_not_unit(tc, ignore, name):
    k, where = _first_bad(_not_unit(tc, ignore), tc.shape)
    also = f" or equal ignore_index={ignore}" if ignore is not None else ""
    raise ValueError(f"{name}: values must be in [0, 1]{also}; found {tc.ravel()[k].item()!r} at index {where}")


def _unit_targets(target, x, ignore, name="target", backend=_backend.CPU, checks=None, n_threads=None):
    """Targets of x's shape, cast to x's dtype (the kernels': float64, exactly, for half inputs), every
    value in [0, 1] or equal to `ignore`."""
    checks = checks or backend.checks(immediate=True)
    if ignore is not None:
        _check_ignore_exact(ignore, x.dtype)
    t = backend.xp.asarray(target)
    if not (_dtypes.is_real(t.dtype) or t.dtype.kind == "b"):
        got = "None" if target is None else f"dtype {t.dtype}"
        raise TypeError(f"{name}: expected real values in [0, 1], got {got}")
    if t.shape != x.shape:
        raise ValueError(f"{name}: expected the input's shape {x.shape}; got {t.shape}")
    if backend.is_cpu and t.dtype == x.dtype:
        # no cast, so nothing to warn about; every value inside [0, 1] settles the check in one parallel
        # pass (a NaN fails it), instead of five NumPy operations and two errstates
        tc = np.ascontiguousarray(t)
        flat = tc.reshape(-1)
        if _binary.unit_targets(flat, _threads_for(n_threads, flat.size)):
            return tc
        checks.require(_not_unit(tc, ignore).any(), lambda: _raise_not_unit(backend.to_host(tc), ignore, name))
        return tc
    # the caller's values are checked, not their cast: float32 logits would turn a target of 1 + 1e-9
    # into 1, and 16777217 into an ignore_index of 16777216.  A float ignore_index is compared as a
    # float64 (NumPy would compare a Python float in float32 targets' own dtype, where 0.1 is
    # float32(0.1)); _check_ignore_exact made it exact in the logits' dtype, so in float64 too.
    ig = np.float64(ignore) if ignore is not None and t.dtype.kind == "f" else ignore
    checks.require(_not_unit(t, ig).any(), lambda: _raise_not_unit(backend.to_host(t), ig, name))
    with np.errstate(over="ignore", invalid="ignore"):
        tc = backend.xp.ascontiguousarray(t, dtype=x.dtype)
    if ignore is not None and t.dtype != x.dtype:
        # an ignore_index inside [0, 1] that a valid target becomes only by the cast
        checks.require(_becomes_ignored(t, tc, ig).any(),
                       lambda: _raise_becomes_ignored(backend.to_host(t), backend.to_host(tc), ig, x.dtype, name))
    return tc


def _becomes_ignored(t, tc, ignore):
    return (tc == ignore) != (t == ignore)


def _raise_becomes_ignored(t, tc, ignore, dtype, name):
    k, where = _first_bad(_becomes_ignored(t, tc, ignore), t.shape)
    raise ValueError(f"{name}: {t.ravel()[k].item()!r} at index {where} becomes ignore_index={ignore} in {dtype}, "
                     f"the input's dtype; pass targets of that dtype")


def _not_probability(x):
    with np.errstate(invalid="ignore"):
        return (x < 0) | (x > 1)


def _raise_not_probability(x, name):
    k, where = _first_bad(_not_probability(x), x.shape)
    raise ValueError(f"{name}: probabilities must be in [0, 1] (NaN propagates); found {x.ravel()[k].item()!r} "
                     f"at index {where}")


def _check_probabilities(x, name="input", backend=_backend.CPU, checks=None, n_threads=None):
    checks = checks or backend.checks(immediate=True)
    if backend.is_cpu and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
        # every value inside [0, 1] settles it in one parallel pass (a NaN, which passes, fails it: then
        # the NumPy test below); three NumPy operations cost float32 BCE from probabilities ~15 %
        flat = x.reshape(-1)
        if _binary.unit_targets(flat, _threads_for(n_threads, flat.size)):
            return
    checks.require(_not_probability(x).any(), lambda: _raise_not_probability(backend.to_host(x), name))


class _Bcast:
    """A weight broadcast to the input, addressed by the kernel as base[(i // div) % mod]."""

    def __init__(self, base, div, mod):
        self.base, self.div, self.mod = base, div, mod


def _bad_weight(w):
    return ~_xp(w).isfinite(w) | (w < 0)


def _raise_bad_weight(w, name):
    k, where = _first_bad(_bad_weight(w), w.shape)
    raise ValueError(f"{name}: weights must be finite and >= 0; found {w.ravel()[k].item()!r} at index {where}")


def _broadcast_weight(weight, shape, name, backend=_backend.CPU, checks=None):
    if weight is None:
        return None
    checks = checks or backend.checks(immediate=True)
    xp = backend.xp
    w = xp.asarray(weight)
    if not _dtypes.is_real(w.dtype):
        raise TypeError(f"{name}: expected real weights, got dtype {w.dtype}")
    try:
        ok = np.broadcast_shapes(w.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {w.shape} does not broadcast to the input's shape {tuple(shape)}")
    w = xp.asarray(w, dtype=np.float64)
    checks.require(_bad_weight(w).any(), lambda: _raise_bad_weight(backend.to_host(w), name))
    wb = xp.broadcast_to(w, shape)
    n = math.prod(shape)
    if n == 0:
        # no element reads a weight, and the slicing below would index an axis of length 0
        return _Bcast(xp.ones(1), 1, 1)
    # axes along which the weight really varies; a contiguous run of them is a (div, mod) pattern
    live = [i for i, (s, st) in enumerate(zip(shape, wb.strides)) if s > 1 and st != 0]
    if not live:
        return _Bcast(xp.ascontiguousarray(wb.reshape(-1)[:1] if n else w.reshape(-1)[:1]), 1, 1)
    lo, hi = live[0], live[-1]
    gaps = [i for i in range(lo, hi + 1) if shape[i] > 1 and wb.strides[i] == 0]
    if gaps:
        return _Bcast(xp.ascontiguousarray(wb).reshape(-1), 1, n)
    sub = wb[tuple(slice(None) if lo <= i <= hi else 0 for i in range(len(shape)))]
    return _Bcast(xp.ascontiguousarray(sub).reshape(-1), math.prod(shape[hi + 1:]),
                  math.prod(shape[lo:hi + 1]))


def _nan_kept(x, t, ignore):
    """NaN elements, ignored ones left out (their loss and gradient are 0 whatever the logit holds)."""
    nan = _xp(x).isnan(x)
    return nan if ignore is None else nan & (t.reshape(x.shape) != ignore)


def _raise_nan(x, name, t, ignore):
    raise ValueError(f"{name}: NaN at index {_first_bad(_nan_kept(x, t, ignore), x.shape)[1]} (nan_policy='raise')")


def _check_nan_policy(nan_policy, x, name="input", backend=_backend.CPU, checks=None, t=None, ignore=None):
    _check_choice(nan_policy, _NAN_POLICIES, "nan_policy")
    if nan_policy == "raise":
        checks = checks or backend.checks(immediate=True)
        checks.require(_nan_kept(x, t, ignore).any(),
                       lambda: _raise_nan(backend.to_host(x), name,
                                          None if t is None else backend.to_host(t), ignore))


def _check_eps(eps):
    return None if eps is None else _check_real(eps, "eps", 0.0, 0.5)


def _check_log_clamp(log_clamp):
    if log_clamp is None:
        return None
    # _check_real refuses bool and str: float(False) was a clamp of 0, which zeroed every loss and gradient
    try:
        v = _check_real(log_clamp, "log_clamp")
    except ValueError:
        v = math.nan  # not finite: the message below, with torch's value
    if not (math.isfinite(v) and v <= 0):
        raise ValueError(f"log_clamp: must be finite and <= 0 (torch's BCELoss uses -100.0); got {log_clamp!r}")
    return v


# ---------------------------------------------------------------------------------------------------
# the elementwise problem


class _Elementwise:
    """A validated elementwise loss call (BCE with logits, focal, BCE from probabilities).

    Carries the attributes the shared out=/inplace helpers of xentfast.api expect (x_orig, axis, rows,
    batch_shape): the last axis stands in for the class axis, so the gradient buffer logic is the
    softmax family's, unchanged.  0-d inputs are handled as shape (1,) and reshaped back.
    """

    # as _api._Problem.input_overwritten: no launch may read the logits once an in-place gradient is there
    input_overwritten = False
    _exact_infinities = None   # cache of _only_exact_infinities()

    def __init__(self, op, input, target, *, weight=None, pos_weight=None, reduction="mean", ignore_index=None,
                 empty_mean="nan", nan_policy="propagate", n_threads=None, inplace=False, what="logits",
                 alpha=0.25, gamma=2.0, eps=None, log_clamp=None):
        self.op = op
        self.given_arrays = (("target", target), ("weight", weight), ("pos_weight", pos_weight))
        self.backend = _backend.for_call(input=input, target=target, weight=weight, pos_weight=pos_weight)
        self.xp = xp = self.backend.xp
        checks = self.backend.checks()
        x, given = _as_float_input(input, writeable=inplace, what=what, backend=self.backend)
        self.scalar = x.ndim == 0
        self.x_orig = x.reshape(1) if self.scalar else x
        self.x_given = given.reshape(1) if self.scalar else given
        self.dtype = x.dtype                                   # the kernels'
        self.grad_dtype = given.dtype                          # the caller's
        self.loss_dtype = _dtypes.loss_dtype(given.dtype)      # float32 for half inputs
        self.shape = x.shape
        self.reduction = _check_choice(reduction, _REDUCTIONS, "reduction")
        self.empty_mean = _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
        self.ignore = _ignore_value(ignore_index)
        xs = self.x_orig
        self.axis = xs.ndim - 1
        self.rows, self.batch_shape, _ = _rows(xs, self.axis)
        self.flat = self.rows.reshape(-1)
        self.t = _unit_targets(target, x, self.ignore, backend=self.backend, checks=checks,
                               n_threads=n_threads).reshape(-1)
        # against the caller's shape: a 0-d input (run as shape (1,)) takes only 0-d weights, as in torch
        self.w = _broadcast_weight(weight, x.shape, "weight", self.backend, checks)
        self.pw = _broadcast_weight(pos_weight, x.shape, "pos_weight", self.backend, checks)
        self.alpha, self.gamma = alpha, gamma
        self.eps, self.log_clamp = eps, log_clamp
        if what == "probabilities":
            _check_probabilities(x, backend=self.backend, checks=checks, n_threads=n_threads)
        _check_nan_policy(nan_policy, x, backend=self.backend, checks=checks, t=self.t, ignore=self.ignore)
        self.n = self.flat.shape[0]
        self.n_threads = _threads_for(n_threads, self.n)
        if self.ignore is None:
            checks.fetch()
            self.kept = self.n
        else:
            # the mean's denominator comes back with the validation flags (xentfast._backend (b))
            kept, = checks.fetch(xp.count_nonzero(self.t != self.ignore))
            self.kept = int(kept)

    def upstream(self, grad_output):
        """(per-element factor array or None, scalar factor) for the gradient of (loss * grad_output).sum()."""
        # float32 upstream factors of float32 inputs go to the CPU kernels as they are: each block widens
        # its own (a float64 copy made first cost a serial pass and a fresh array per call, ~20 % of a
        # one-thread call at 4096x1000; benchmarks/README.md)
        keep_float32 = self.backend.is_cpu and self.dtype == np.float32
        rows, g = _upstream_factor(grad_output, self.reduction, self.shape, self.backend, keep_float32)
        if self.reduction != "mean":
            return rows, g
        # nothing averaged: the mean is a constant (NaN or 0 by empty_mean), its gradient 0
        return None, (g / self.kept if self.kept else 0.0)

    def run(self, grad=None, grad_output=None, want_loss=True, loss_k=0.0, count=None, summed=None):
        """Element losses (double for reductions, input dtype for 'none'; times 2**loss_k) and the gradient
        into `grad`.  `count`: the losses of the first `count` elements only (rerun_possible's probe; a
        prefix, so that broadcast weights keep their element indices), on one thread (as the softmax
        family's probe).

        `summed`: a reduction's losses come back as their double-double sum, taken inside the kernel
        (_KernelSum, the bits dd_sum gives over the stored losses), instead of as a float64 array of the
        input's size (8 bytes per element written, read back, and page-faulted in on every call).  None:
        whenever that is possible and the logits stay readable, so that reduce() can still ask for the
        losses themselves in its rare cases (CPU, the whole input, the gradient not written over it)."""
        g_rows, scale = self.upstream(grad_output) if grad is not None else (None, 1.0)
        # the mean's scalar factor itself (upstream() gives it over kept), for the subnormal cases below
        g = (_upstream_factor(grad_output, self.reduction, self.shape, self.backend)[1]
             if grad is not None and self.reduction == "mean" else 0.0)
        lifted = self._lifted_mean_scale(g, grad) if count is None else None
        if lifted is not None and lifted[2] is None:
            # the weights cannot take 2^-k: the kernel writes the gradient times 2^k into the float64
            # buffer, scaled back after it (exact, or one rounding on subnormal entries; the softmax
            # family's lift)
            k, scale, _ = lifted
            losses = self._launch(grad, None, scale, want_loss, loss_k, count, summed)
            self.xp.ldexp(grad, -k, out=grad)
            return losses
        if lifted is not None:
            k, scale, folded = lifted
            if summed is None:
                summed = (want_loss and self.reduction != "none" and self.n > 0 and self.backend.is_cpu
                          and grad is not self.rows)
            # the losses from a pass with the weights as given (a forward call's bits), before an in-place
            # gradient overwrites the input; then the gradient under 2^k g / kept and weights times 2^-k
            losses = self.run(want_loss=True, loss_k=loss_k, summed=summed) if want_loss else None
            saved = self.w
            self.w = folded
            try:
                self._launch(grad, None, scale, False, loss_k, None, False)
            finally:
                self.w = saved
            return losses
        if grad is not None and g_rows is None and scale == 0 and self.reduction == "mean" and self.kept:
            # g / kept below half the smallest subnormal, and no lift applied: the smallest subnormal of g's
            # sign instead of 0, so that an infinite gradient (p = 0 < y) keeps its sign where 0 * inf
            # would give NaN or 0 (the finite entries were lost either way: README, "Known limits")
            if g != 0 and math.isfinite(g):
                scale = math.copysign(5e-324, g)
        return self._launch(grad, g_rows, scale, want_loss, loss_k, count, summed)

    def _lifted_mean_scale(self, g, grad):
        """(k, 2^k g / kept) where a mean's gradient scale g / kept would be subnormal (or 0) for a finite
        g != 0 (the mean's grad_output; 0 for other calls), else None.  Rounded there, it keeps only the
        bits above 2^-1074, and the kernel multiplies it by weights, pos_weight or 1/p, which can lift the product back to normal numbers with a
        relative error of up to 1 (grad_output 5e-324, weights 2^60: all zeros).  Lifted by 2^k it is
        normal and rounds once, and the weights take the 2^-k; the kernels form s w q (...) as products of
        normalised mantissas (xentfast/binary.h), so the gradient is that of the exact scale.  Only where
        every weight takes the 2^-k exactly (k <= 116: a weight of at least 2^-906 always does): a weight
        that would lose bits on the subnormal grid could carry its element's gradient back into the
        normals under 1/p.  There the gradient itself takes the 2^-k, after the kernel wrote it into a
        float64 buffer (`folded` None), where no entry can overflow: the lifted scale (< 2^-1020) times w
        q and 1/p <= 2^1074 (BCE from p) or w max(1, pos_weight) (BCE with logits, whose bracket is at
        most max(1, q)); otherwise (float32 buffers, such weights) the rounded g / kept stands (README,
        "Known limits").  The focal loss has no weights and a gradient below 2 per unit scale: nothing
        magnifies the rounding.  Returns (k, the lifted scale, the weights times 2^-k or None)."""
        if self.reduction != "mean" or not self.kept or self.op == _binary.OP_FOCAL:
            return None
        if g == 0 or not math.isfinite(g) or abs(g / self.kept) >= _SMALLEST_NORMAL:
            return None
        k = _api._lift_exponent(g, self.kept)
        xp, w = self.xp, self.w
        if w is None:
            return k, math.ldexp(g, k) / self.kept, _Bcast(xp.full(1, math.ldexp(1.0, -k)), 1, 1)
        base = xp.ldexp(w.base, -k)
        if bool((xp.ldexp(base, k) == w.base).all()):
            return k, math.ldexp(g, k) / self.kept, _Bcast(base, w.div, w.mod)
        if grad.dtype != np.float64:
            return None
        # the largest factor beside the lifted scale, as a power of two (products beyond DBL_MAX)
        bits = math.frexp(float(w.base.max()))[1]
        if self.op == _binary.OP_BCE_PROB:
            bits += 1074
        elif self.pw is not None:
            bits += math.frexp(max(1.0, float(self.pw.base.max())))[1]
        if bits > 2040:
            return None
        return k, math.ldexp(g, k) / self.kept, None

    def _launch(self, grad, g_rows, scale, want_loss, loss_k, count, summed):
        """One kernel call for run(), under the upstream factors it settled."""
        g32 = None
        if g_rows is not None and g_rows.dtype == np.float32:
            g32, g_rows = g_rows, None
        xp = self.xp
        empty = _placeholder(xp, 1, np.float64)
        x, t, n = (self.flat, self.t, self.n) if count is None else (self.flat[:count], self.t[:count], count)
        keep_double = self.reduction != "none"
        double_out, dtype_out = want_loss and keep_double, want_loss and not keep_double
        if summed is None:
            summed = (double_out and count is None and n > 0 and self.backend.is_cpu
                      and (grad is None or grad is not self.rows))
        part = np.empty(2 * (-(-n // _binary.BLOCK)), dtype=np.float64) if summed else None
        loss_d = xp.empty(n, dtype=np.float64) if double_out and not summed else empty
        loss_o = xp.empty(n, dtype=self.dtype) if dtype_out else _placeholder(xp, 1, self.dtype)
        gflat = grad.reshape(-1) if grad is not None else _placeholder(xp, 1, self.dtype)
        w, pw = self.w, self.pw
        clip = self.eps is not None
        clamp = self.log_clamp is not None
        sums = self.backend.binary.elementwise(
            self.op, x, t,
            w.base if w else empty, w.div if w else 1, w.mod if w else 1,
            pw.base if pw else empty, pw.div if pw else 1, pw.mod if pw else 1,
            g_rows if g_rows is not None else empty, scale,
            self.ignore is not None, float(self.ignore) if self.ignore is not None else 0.0,
            float(self.alpha), float(self.gamma), clip, self.eps if clip else 0.0, clamp,
            self.log_clamp if clamp else 0.0, loss_d, loss_o, gflat, self.n_threads if count is None else 1,
            w is not None, pw is not None, g_rows is not None, want_loss and keep_double,
            want_loss and not keep_double, grad is not None, loss_k, part, g32,
            **(dict(zip(("clamp_lo", "clamp_hi"), _clamp_thresholds(self.log_clamp))) if clamp else {}))
        if summed:
            return _KernelSum(sums)
        return loss_d if keep_double else loss_o

    def reduce(self, losses):
        if self.reduction == "none":
            with np.errstate(over="ignore"):
                return losses.astype(self.loss_dtype, copy=False).reshape(self.shape)
        b = self.backend
        if isinstance(losses, _KernelSum):
            hi, lo = losses
            # _sum_and_tiny's test: only a sum this small needs max |loss|, and an overflowed mean needs
            # the losses themselves; both take them from the (intact) logits again, as run() ensured
            if abs(hi) <= self.n * _api._TINY_SUM_PER_TERM or (hi == np.inf and self.reduction == "mean"):
                return self.reduce(self.run(summed=False))
            tiny = False
        else:
            hi, lo, tiny = _sum_and_tiny(b, losses, self.n_threads)
        if tiny:
            self._logits_intact()
            return _reduce_scaled(b, self.run(loss_k=_TINY_K, summed=False), self.reduction, self.kept,
                                  self.empty_mean, self.loss_dtype, self.n_threads)
        if self.reduction == "sum":
            total = hi + lo
        else:
            if self.kept == 0:
                return b.result(np.nan if self.empty_mean == "nan" else 0.0, self.loss_dtype)
            total = hi / self.kept + lo / self.kept
            if hi == np.inf:
                total = self._mean_beyond_overflow(losses)
        return b.result(total, self.loss_dtype)

    def _mean_beyond_overflow(self, losses):
        """float64 only: the sum of the element losses beyond DBL_MAX while the mean may not be.

        Finite losses: their sum is taken scaled by 2^-64 (exact for every loss that matters next to such
        a sum).  Infinite ones are either exact (x = +-inf, p = 0 < y: the mean is +inf) or weighted
        losses that overflowed on their own (w q |x| > DBL_MAX); the losses are linear in the weight, so
        the kernel runs again with every weight times 2^-64 and the mean is scaled back.  A focal loss
        never exceeds its |x| (alpha_t, u^g <= 1): its infinite losses are exact."""
        xp = self.xp
        if bool(xp.isfinite(losses).all()):
            hi, lo = _dd_sum(self.backend, losses * 2.0**-64, self.n_threads)
            with np.errstate(over="ignore"):
                return (hi / self.kept + lo / self.kept) * 2.0**64
        if self.op == _binary.OP_FOCAL or self._only_exact_infinities():
            return np.inf
        self._logits_intact()
        if self.w:
            # weights below 2^-900 stay as they are: scaled they could underflow to 0 and turn an infinite
            # loss (p = 0 < y, x = -+inf) into 0, and unscaled they are negligible next to such a sum
            base = xp.where(self.w.base >= 2.0**-900, self.w.base * 2.0**-64, self.w.base)
            scaled = _Bcast(base, self.w.div, self.w.mod)
        else:
            scaled = _Bcast(xp.full(1, 2.0**-64), 1, 1)
        saved, self.w = self.w, scaled
        try:
            losses = self.run(summed=False)
        finally:
            self.w = saved
        if bool(xp.isinf(losses).any()):
            return np.inf            # an element whose exact loss is infinite
        hi, lo = _dd_sum(self.backend, losses, self.n_threads)
        with np.errstate(over="ignore"):
            return (hi / self.kept + lo / self.kept) * 2.0**64

    def _only_exact_infinities(self):
        """Whether no element with a finite input can have an infinite loss, from bounds on the weights
        and the input: every infinite loss is then exact (x = +-inf, p = 0 < y or p = 1 > y), stays
        infinite under the scaled weights of _mean_beyond_overflow (each is > 0, and the products of
        xentfast/binary.h never underflow), and the mean is +inf without running the kernel again.

        With W = max weight and Q = max pos_weight, a loss is at most W max(1, Q) (M + log 2) for
        |x| <= M (its two terms are the masses 1 - y and y times softplus(+-x), scaled), and
        W (L + log 2) from probabilities, L = max(-log 2^-1074, -log_clamp).  The bound 4 W max(1, Q)
        (M + 1) <= DBL_MAX leaves room for the roundings.  W, Q <= 1 need no bound on x: every
        factor of the loss is then at most 1 but softplus(|x|), which is finite for finite x and only
        one of the two terms holds it; so ordinary calls never read the logits here.  The answer is
        cached: it must be known before an in-place gradient pass, and is asked again in reduce()."""
        if self._exact_infinities is None:
            dbl_max = np.finfo(np.float64).max
            # array methods, not module functions, as everywhere the call's array module is not at hand
            W = float(self.w.base.max()) if self.w else 1.0
            Q = float(self.pw.base.max()) if self.pw else 1.0
            if self.op == _binary.OP_BCE_PROB:
                L = max(745.2, -self.log_clamp if self.log_clamp is not None else 0.0)
                ok = 4.0 * W * (L + 1.0) <= dbl_max
            elif W <= 1.0 and Q <= 1.0:
                ok = True
            else:
                if self.dtype == np.float32:
                    M = float(np.finfo(np.float32).max)
                else:
                    # a read of the logits, only for float64 with weights above 1; NaN or inf: no bound
                    lo, hi = float(self.flat.min()), float(self.flat.max())
                    M = max(-lo, hi) if math.isfinite(lo) and math.isfinite(hi) else np.inf
                ok = 4.0 * W * max(1.0, Q) * (M + 1.0) <= dbl_max
            self._exact_infinities = bool(ok)
        return self._exact_infinities

    def rerun_possible(self):
        """Whether reduce() may launch the kernel on the input again: the tiny-terms pass (every element
        loss below 2^-969) or the mean beyond DBL_MAX with an overflowed weighted loss.  The first is
        ruled out in every ordinary case by the losses of the first 64 elements (a NaN or a loss
        >= 2^-969 among them puts max |loss| there too), the second by _only_exact_infinities."""
        if self.n == 0 or (self.reduction == "mean" and self.kept == 0):
            return False
        if (self.reduction == "mean" and self.op != _binary.OP_FOCAL
                and not self._only_exact_infinities()):
            return True
        head = self.run(count=min(self.n, _PROBE_ELEMENTS))
        v = float(self.xp.max(self.xp.abs(head)))
        return not (v != v or v >= _api._TINY_TERM)

    def _logits_intact(self):
        if self.input_overwritten:  # pragma: no cover - a broken rerun_possible() would land here
            raise RuntimeError("internal error: a reduction would read the in-place gradient as the input")

    # --- the three entry points ---

    def forward(self):
        return self.reduce(self.run())

    def read_arrays(self):
        """As the softmax family's _Problem.read_arrays."""
        return (("target", self.t), ("weight", self.w.base if self.w is not None else None),
                ("pos_weight", self.pw.base if self.pw is not None else None))

    def backward(self, grad_output):
        buf, dest = _grad_target(self, None, False)
        self.run(grad=buf, grad_output=grad_output, want_loss=False)
        g = _finish_grad(self, buf, dest)
        return g.reshape(()) if self.scalar else g

    def with_grad(self, input, grad_output, out, inplace):
        # a 0-d problem runs as shape (1,): a 0-d out= buffer is viewed the same way, and no other is taken
        if self.scalar and self.backend.owns(out) and (out.shape != () or out.dtype != self.x_given.dtype):
            raise ValueError(f"out: expected shape () and dtype {self.x_given.dtype}; got shape {out.shape}, "
                             f"dtype {out.dtype}")
        out1 = out.reshape(1) if (self.scalar and self.backend.owns(out)) else out
        buf, dest = _grad_target(self, out1, inplace, grad_output)
        loss = _loss_and_grad(self, buf, grad_output, want_loss=False)
        g = _finish_grad(self, buf, dest)
        if out is not None:
            return loss, out
        if inplace:
            return loss, input
        return loss, (g.reshape(()) if self.scalar else g)


class _KernelSum(tuple):
    """(hi, lo): the double-double sum of a reduction's element losses, taken by the kernel (run())."""


# elements whose losses rerun_possible() looks at: enough that an ordinary input has a loss of at least
# 2^-969 among them, few enough to cost ~2 us (an element costs tens of ns)
_PROBE_ELEMENTS = 64


def _reduce_scaled(backend, losses, reduction, den, empty_mean, dtype, n_threads):
    """The reduction of losses that came times 2^600: sum or mean first, the unscaling last (its one
    rounding is the only one that can land on the subnormal grid)."""
    hi, lo = _dd_sum(backend, losses, n_threads)
    if reduction == "sum":
        total = hi + lo
    else:
        if den == 0:
            return backend.result(np.nan if empty_mean == "nan" else 0.0, dtype)
        total = hi / den + lo / den
    return backend.result(total * 2.0**-_TINY_K, dtype)


def _elementwise(op, input, target, inplace=False, **kw):
    return _Elementwise(op, input, target, inplace=inplace, **kw)


# ---------------------------------------------------------------------------------------------------
# BCE with logits

# the parts of the docstrings (_document) that the element-wise families share
_LOSS_OF_INPUT_SHAPE = ("loss : ndarray of the input's shape and dtype (float32 for half precision) for "
                        "reduction='none',\n        else a NumPy scalar")
_GRAD_OF_INPUT_SHAPE = "dinput : ndarray of the input's shape and dtype"
_INPUT_UPSTREAM = _upstream_param("the input's shape for reduction='none'")
_AS_BCE_LOGITS_WITH_GRAD = """
    grad_output, out, inplace
        As in :func:`binary_cross_entropy_with_logits_with_grad`."""


def _document_trio(forward, backward, with_grad, params, bound, notes):
    """The docstrings of an element-wise loss's three functions, each given with its summary line: the
    loss and the gradient of the input's shape, with_grad's extra arguments as BCE with logits' ones."""
    _document(*forward, params, _LOSS_OF_INPUT_SHAPE, bound, notes)
    _document(*backward, _INPUT_UPSTREAM + params, _GRAD_OF_INPUT_SHAPE, bound, notes)
    _document(*with_grad, params + _AS_BCE_LOGITS_WITH_GRAD, "loss, dinput", bound, notes)

_BCE_LOGITS_PARAMS = """
    input : array_like of float16, bfloat16, float32 or float64, or any array with ``__dlpack__``
        Logits, any shape (0-d included).  Half precision costs a float64 copy (Notes).
    target : array_like
        Targets in [0, 1] (soft targets allowed), the input's shape; cast to the input's dtype (to
        float64, exactly, for half precision).
    weight : array_like, optional
        Element weights, finite and >= 0, broadcast to the input (torch's ``weight``).
    pos_weight : array_like, optional
        Weights of the positive term, finite and >= 0, broadcast to the input; a shape ``(C,)`` vector
        lines up with the last axis (torch's ``pos_weight``).
    reduction : {'none', 'mean', 'sum'}, default 'mean'
        'mean' divides the sum by the number of elements that are not ignored (torch: by all elements;
        weights are not part of the denominator, as in torch).
    ignore_index : int or float, optional
        Elements whose target equals it contribute 0 loss and 0 gradient, whatever their logit holds
        (even NaN), and are left out of the mean's denominator (Paddle's option).  Default: none.
        It must be a value of the targets' dtype as the kernels read them (float32 for float32 input,
        float64 otherwise): ``ignore_index=-0.1`` with float32 input raises ValueError.
    empty_mean : {'nan', 'zero'}, default 'nan'
        'mean' with nothing to average (every element ignored, or an empty input): NaN (torch's mean of
        nothing) or 0.  The gradient is 0 in both cases.
    nan_policy : {'propagate', 'raise'}, default 'propagate'
        'raise': ValueError naming the first NaN logit, ignored elements excepted.
    n_threads : int, optional
        OpenMP threads; None means all available.  Results are bitwise identical for every value."""

_BCE_LOGITS_NOTES = """
    With ``q`` = pos_weight and ``w`` = weight (1 when absent), per element::

        loss   = w [(1 - y) softplus(x) + q y softplus(-x)]
        d/dx   = w [(1 - y) sigmoid(x) - q y sigmoid(-x)]

    the form without cancellation (torch evaluates ``(1-y) x - (1 + (q-1) y) log_sigmoid(x)`` and
    ``(1 + (q-1) y) sigmoid(x) - q y``, both of which cancel in a tail: the loss of ``y = 0, x = -40`` is
    4.25e-18, not 0; the gradient of ``y = 1, x = 20`` in float32 is -2.06e-09, not 0).  One exponential
    ``e = exp(-|x|)`` per element gives both softplus values and both sigmoids; no ``max(x, 0)`` or
    ``|x|`` is differentiated, so ``x = +-0`` needs no subgradient convention (Paddle's and TensorFlow's
    bugs at 0) and the gradient is the exact derivative for every ``pos_weight``.

    Special values: ``x = +inf`` gives loss ``+inf`` unless ``y = 1`` (then 0), gradient ``w (1 - y)``;
    ``x = -inf`` mirrors it; a NaN logit gives NaN loss and gradient; a term whose coefficient
    (weight, pos_weight, target mass) is 0 contributes exactly 0 even where its softplus is infinite.

    Deliberate differences from torch: ``ignore_index`` and ``empty_mean`` are extras (Paddle has
    ``ignore_index`` with mean over the kept elements, which is what xentfast does); targets outside
    [0, 1] are rejected (torch computes a loss that can be negative); weights must be >= 0.
    Differences from Paddle's ``sigmoid_cross_entropy_with_logits``: ``pos_weight`` has torch's meaning
    (Paddle before PR #65859 weighted only the log term); the gradient at ``x = 0`` is ``1/2 - y`` for
    ``q = 1`` (Paddle's CPU kernel gives ``-1/2 - y``).
""" + _HALF_NOTES

_BOUND_BCE = """
    Per element, reduction='none': loss <= 2 ULP (float32), <= 4 ULP (float64); gradient the same,
    relative, for targets in {0, 1}, and in units of ulp(w (|(1-y) sigmoid(x)| + |q y sigmoid(-x)|)) for
    soft targets.  'mean' / 'sum' <= 4 ULP; gradients of 'mean' / 'sum' or with an element-wise
    ``grad_output``: one more ULP (the upstream factor's rounding).  Measured against
    ``xentfast.reference``; the README lists the measured maxima, and a known miss (float64 weights near
    1e300 with |x| beyond ~1100).""" + _HALF_BOUND


@_on_input_device(plain_lane=_binary.plain_binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction="mean", *,
                                     ignore_index=None, empty_mean="nan", nan_policy="propagate", n_threads=None):
    return _elementwise(_binary.OP_BCE_LOGITS, input, target, weight=weight, pos_weight=pos_weight,
                        reduction=reduction, ignore_index=ignore_index, empty_mean=empty_mean,
                        nan_policy=nan_policy, n_threads=n_threads).forward()


@_on_input_device
def binary_cross_entropy_with_logits_backward(grad_output, input, target, weight=None, pos_weight=None,
                                              reduction="mean", *, ignore_index=None, empty_mean="nan",
                                              nan_policy="propagate", n_threads=None):
    return _elementwise(_binary.OP_BCE_LOGITS, input, target, weight=weight, pos_weight=pos_weight,
                        reduction=reduction, ignore_index=ignore_index, empty_mean=empty_mean,
                        nan_policy=nan_policy, n_threads=n_threads).backward(grad_output)


@_on_input_device(plain_lane=_binary.plain_binary_cross_entropy_with_logits_with_grad)
def binary_cross_entropy_with_logits_with_grad(input, target, weight=None, pos_weight=None, reduction="mean", *,
                                               ignore_index=None, empty_mean="nan", nan_policy="propagate",
                                               grad_output=None, out=None, inplace=False, n_threads=None):
    return _elementwise(_binary.OP_BCE_LOGITS, input, target, inplace=inplace, weight=weight,
                        pos_weight=pos_weight, reduction=reduction, ignore_index=ignore_index,
                        empty_mean=empty_mean, nan_policy=nan_policy,
                        n_threads=n_threads).with_grad(input, grad_output, out, inplace)


_document(
    binary_cross_entropy_with_logits, "Sigmoid (binary) cross-entropy from logits, torch semantics.",
    _BCE_LOGITS_PARAMS, _LOSS_OF_INPUT_SHAPE, _BOUND_BCE, _BCE_LOGITS_NOTES,
    """>>> import numpy as np, xentfast as xf
    >>> x = np.array([-40.0, 0.0, 20.0]); y = np.array([0.0, 1.0, 1.0])
    >>> xf.binary_cross_entropy_with_logits(x, y, reduction="none")          # doctest: +SKIP
    array([4.24835426e-18, 6.93147181e-01, 2.06115362e-09])""")

_document(
    binary_cross_entropy_with_logits_backward, """Gradient of :func:`binary_cross_entropy_with_logits`.

    Returns d/d input of ``(binary_cross_entropy_with_logits(...) * grad_output).sum()``.""",
    _INPUT_UPSTREAM + _BCE_LOGITS_PARAMS, _GRAD_OF_INPUT_SHAPE, _BOUND_BCE, _BCE_LOGITS_NOTES)

_document(
    binary_cross_entropy_with_logits_with_grad, """Loss and gradient of BCE with logits in one pass.

    Returns ``(loss, dinput)``, bitwise equal to what :func:`binary_cross_entropy_with_logits` and
    :func:`binary_cross_entropy_with_logits_backward` return separately.""",
    _BCE_LOGITS_PARAMS + """
    grad_output : array_like or scalar, optional
        As in the backward function (default 1).
    out : ndarray, optional
        Buffer of the input's shape and dtype for the gradient (must not overlap the input).
    inplace : bool, default False
        Write the gradient into ``input`` (a writeable ndarray), with the bits of ``inplace=False``.  A
        'mean' or 'sum' whose reduction may read the logits again after the gradient pass (every element
        loss below 2**-969, judged from the first 64; or a 'mean' with weights or ``pos_weight`` above 1
        on float64 logits large enough to overflow a weighted loss, judged from max |x|) reduces the loss
        first, at the cost of one more pass.""",
    "loss, dinput", _BOUND_BCE, _BCE_LOGITS_NOTES)


# ---------------------------------------------------------------------------------------------------
# focal loss

# The focal gradient's tail terms are formed scaled by 2**600 (binary.h); gamma times such a term must stay
# finite, where a NaN gradient appeared beyond ~1e128.
_MAX_FOCAL_GAMMA = 2.0**400


def _check_focal(alpha, gamma):
    try:
        a = _check_real(alpha, "alpha")
    except ValueError:
        # -inf is negative too: the weighting off, as torchvision's `alpha >= 0` test reads it.  NaN and
        # +inf are not, and get the rule below rather than _check_real's "must be finite", which -inf
        # would contradict
        a = -1.0 if alpha < 0 else math.nan
    if not a <= 1:
        raise ValueError(f"alpha: must be in [0, 1], or negative (-inf included) to switch the weighting off; "
                         f"got {alpha!r}")
    g = _check_real(gamma, "gamma", 0.0)
    if g > _MAX_FOCAL_GAMMA:
        raise ValueError(f"gamma: must be at most 2**400 (~2.6e120), beyond which the gradient's scaled terms "
                         f"(2**600) overflow; got {gamma!r} (u**gamma is 0 for every u < 1 long before)")
    return a, g


_FOCAL_PARAMS = """
    input : array_like of float16, bfloat16, float32 or float64, or any array with ``__dlpack__``
        Logits, any shape.  Half precision costs a float64 copy (Notes).
    target : array_like
        Targets in [0, 1], the input's shape; cast to the input's dtype (float64 for half precision).
    alpha : float <= 1, default 0.25
        Weight of the positive class, ``alpha_t = alpha y + (1 - alpha)(1 - y)``; negative switches the
        weighting off (``alpha_t = 1``), as in torchvision.
    gamma : float >= 0, default 2.0
        Focusing exponent.
    reduction : {'none', 'mean', 'sum'}, default 'none'
        torchvision's default is 'none'; 'mean' divides by the number of kept elements.
    ignore_index : int or float, optional
        As in :func:`binary_cross_entropy_with_logits` (an extra; torchvision has none).
    empty_mean, nan_policy, n_threads
        As in :func:`binary_cross_entropy_with_logits`."""

_FOCAL_NOTES = """
    torchvision's definition, per element, with ``p = sigmoid(x)``, ``p_t = p y + (1 - p)(1 - y)``::

        loss = alpha_t ce (1 - p_t)**gamma,    ce = (1 - y) softplus(x) + y softplus(-x)

    evaluated as ``u = 1 - p_t = ((1-y) + y e)/(1 + e)`` (x >= 0) or ``((1-y) e + y)/(1 + e)`` (x < 0), a
    sum of non-negative terms, and ``u**gamma = exp(gamma log u)`` with ``log u`` a double-double
    (``log u = -softplus(+-x)`` exactly for y in {0, 1}).  The plain formula ``(1 - p_t)**gamma`` cancels
    (``1 - p_t`` with ``p_t`` near 1) and underflows on the confident side long before the loss does;
    here the confident side is computed in log space and scaled, and stays accurate down to the
    subnormal range.  The gradient is the exact derivative::

        d/dx = alpha_t u**gamma [(1 - y) sigmoid(x) - y sigmoid(-x) + gamma ce W (1 - 2y)],
        W = sigmoid(x) sigmoid(-x) / u

    ``gamma = 0`` gives the weighted BCE with logits (``0**0 = 1``).  Special values as BCE with logits;
    ``x = +-inf`` on the confident side gives loss 0 and gradient 0.

    Deliberate differences from torchvision: ``alpha`` above 1 is rejected (it makes ``alpha_t``
    negative); ``ignore_index``, ``empty_mean`` and the backward functions are extras (torchvision relies
    on autograd through the plain formula, whose gradient is 0 wherever ``1 - p_t`` rounds to 0).
""" + _HALF_NOTES

_BOUND_FOCAL = """
    Per element, gamma <= 20: loss <= 2 ULP (float32), <= 4 ULP (float64); gradient the same, relative,
    for targets in {0, 1}, and in units of ulp(alpha_t u**gamma (u + gamma ce W |1 - 2y|)) for soft
    targets.  Beyond, gamma multiplies u's relative error (~2**-57): ~10 ULP at gamma = 100 (README,
    known limits).
    'mean' / 'sum' <= 4 ULP; gradients of reductions or with ``grad_output``: one more ULP.""" + _HALF_BOUND


@_on_input_device
def sigmoid_focal_loss(input, target, alpha=0.25, gamma=2.0, reduction="none", *, ignore_index=None,
                       empty_mean="nan", nan_policy="propagate", n_threads=None):
    a, g = _check_focal(alpha, gamma)
    return _elementwise(_binary.OP_FOCAL, input, target, alpha=a, gamma=g, reduction=reduction,
                        ignore_index=ignore_index, empty_mean=empty_mean, nan_policy=nan_policy,
                        n_threads=n_threads).forward()


@_on_input_device
def sigmoid_focal_loss_backward(grad_output, input, target, alpha=0.25, gamma=2.0, reduction="none", *,
                                ignore_index=None, empty_mean="nan", nan_policy="propagate", n_threads=None):
    a, g = _check_focal(alpha, gamma)
    return _elementwise(_binary.OP_FOCAL, input, target, alpha=a, gamma=g, reduction=reduction,
                        ignore_index=ignore_index, empty_mean=empty_mean, nan_policy=nan_policy,
                        n_threads=n_threads).backward(grad_output)


@_on_input_device
def sigmoid_focal_loss_with_grad(input, target, alpha=0.25, gamma=2.0, reduction="none", *, ignore_index=None,
                                 empty_mean="nan", nan_policy="propagate", grad_output=None, out=None,
                                 inplace=False, n_threads=None):
    a, g = _check_focal(alpha, gamma)
    return _elementwise(_binary.OP_FOCAL, input, target, inplace=inplace, alpha=a, gamma=g,
                        reduction=reduction, ignore_index=ignore_index, empty_mean=empty_mean,
                        nan_policy=nan_policy, n_threads=n_threads).with_grad(input, grad_output, out, inplace)


_document_trio(
    (sigmoid_focal_loss, "Sigmoid focal loss (Lin et al. 2017) with torchvision's semantics."),
    (sigmoid_focal_loss_backward, "Gradient of :func:`sigmoid_focal_loss` with respect to ``input``."),
    (sigmoid_focal_loss_with_grad, "Focal loss and its gradient in one pass (same bits as separately)."),
    _FOCAL_PARAMS, _BOUND_FOCAL, _FOCAL_NOTES)


# ---------------------------------------------------------------------------------------------------
# BCE from probabilities

@functools.lru_cache(maxsize=64)
def _clamp_thresholds(c):
    """(lo, hi) for log_clamp c: the least double >= e^c and the greatest double <= 1 - e^c, so that for
    every double p, log p < c exactly iff p < lo and log(1 - p) < c iff p > hi (xentfast/binary.h
    xf_bin_prob_logs).  The kernels' rounded logs cannot decide it: within an ulp of c they fall on either
    side, and the derivative is 0 on one side and up to 1/p on the other.  For c != 0, e^c and 1 - e^c are
    irrational (Lindemann): never a double, so the precision grows until the double nearest each is
    seen to lie above or below it (200 bits settle every ordinary c; c = -5e-324 takes ~1100).  c = 0
    gives exactly 1 and 0."""
    if c == 0:
        return 1.0, 0.0
    import mpmath   # here, not at import time (~16 ms); a context of its own leaves the global precision be

    ctx = mpmath.MPContext()
    ctx.prec = 200
    while True:
        e = ctx.exp(ctx.mpf(c))
        one_minus = -ctx.expm1(ctx.mpf(c))   # relative precision where e^c is close to 1
        lo, hi = float(e), float(one_minus)
        # 1 - e^c within 2^-prec of 1 (e^c underflowed the precision): it lies in (1 - 2^-53, 1)
        if ctx.mpf(lo) != e and (ctx.mpf(hi) != one_minus or hi == 1.0):
            if ctx.mpf(lo) < e:
                lo = float(np.nextafter(lo, np.inf))
            if ctx.mpf(hi) > one_minus or hi == 1.0:
                hi = float(np.nextafter(hi, -np.inf))
            return lo, hi
        ctx.prec *= 2


def _prob_modes(eps, log_clamp):
    e = _check_eps(eps)
    c = _check_log_clamp(log_clamp)
    if e is not None and c is not None:
        raise ValueError(f"eps and log_clamp: pick one convention (got eps={eps!r}, log_clamp={log_clamp!r})")
    return e, c


_BCE_PROB_PARAMS = """
    input : array_like of float16, bfloat16, float32 or float64, or any array with ``__dlpack__``
        Probabilities in [0, 1] (NaN propagates), any shape.  Half precision costs a float64 copy (Notes).
    target : array_like
        Targets in [0, 1], the input's shape; cast to the input's dtype (float64 for half precision).
    weight : array_like, optional
        Element weights, finite and >= 0, broadcast to the input.
    reduction : {'none', 'mean', 'sum'}, default 'mean'
        'mean' divides by the number of elements (torch).
    eps : float in [0, 0.5], optional
        Keras's convention: clip ``p`` to ``[eps, 1 - eps]`` (as real numbers) before taking logs; the
        gradient is the exact gradient of that clipped function, 0 where ``p`` was clipped.
    log_clamp : float <= 0, optional
        torch's ``BCELoss`` convention: each log is replaced by ``max(log, log_clamp)``; torch uses
        -100.  The gradient is the exact gradient of the clamped function (0 where clamped).
    empty_mean, nan_policy, n_threads
        As in :func:`binary_cross_entropy_with_logits`."""

_BCE_PROB_NOTES = """
    One formula in every mode::

        loss = w [-y log p_c - (1 - y) log(1 - p_c)],    d/dp = w [(1 - y)/(1 - p) - y/p]

    with ``p_c = p`` by default, ``-log 0 = +inf`` and the gradient to match (``-inf`` at ``p = 0 < y``,
    ``+inf`` at ``p = 1 > y``), ``0 * inf = 0`` for a term whose mass is 0.  ``log(1 - p)`` is
    ``log1p(-p)`` (no ``1 - p`` rounding) and ``1 - p`` in the gradient is carried exactly.  Ordinary
    elements (``0 < p < 1`` away from the clip or clamp, float64 ``p >= 2^-400``; targets in [0, 1];
    weights and upstream factors within ``2^+-60``) take a faster form of the same function, the
    gradient as ``s w (p - y) / (p (1 - p))``: within 0.5 + 2^-13 ULP in float32 (where ``1 - p`` may
    round, 2^-53 of it, for ``p < 2^-30``) and 0.75 ULP in float64 (README, the design bullets "float32
    BCE from probabilities" and "float64 BCE from probabilities").

    Which to call: if you have the logits, call :func:`binary_cross_entropy_with_logits`; ``sigmoid``
    loses everything below ``p = 2^-53`` near 1 and no clipping gets it back (README, "Logits or
    probabilities?").

    Deliberate differences: torch's ``BCELoss`` clamps the log at -100 in its forward and its backward
    uses ``w (p - y) / max(p (1 - p), 1e-12)``, which is not the derivative of its forward where the
    clamp or the 1e-12 bites; ``log_clamp=-100`` reproduces its forward and gives the derivative of that
    forward.  Keras clips to ``[eps, 1 - eps]`` with ``1 - eps`` rounded to the tensor's dtype (float32:
    ``1 - 1e-7`` is ``1 - 1.19e-7``) and its ``binary_crossentropy`` then adds ``eps`` inside the logs
    again (keras#15249); xentfast clips once, with exact bounds.
""" + _HALF_NOTES

_BOUND_BCE_PROB = """
    Per element: loss <= 2 ULP (float32), <= 4 ULP (float64); gradient the same, relative, for targets in
    {0, 1}, and in units of ulp(w ((1-y)/(1-p) + y/p)) for soft targets.  'mean' / 'sum' <= 4 ULP;
    gradients of reductions or with ``grad_output``: one more ULP.""" + _HALF_BOUND


@_on_input_device
def binary_cross_entropy(input, target, weight=None, reduction="mean", *, eps=None, log_clamp=None,
                         empty_mean="nan", nan_policy="propagate", n_threads=None):
    e, c = _prob_modes(eps, log_clamp)
    return _elementwise(_binary.OP_BCE_PROB, input, target, weight=weight, reduction=reduction,
                        empty_mean=empty_mean, nan_policy=nan_policy, n_threads=n_threads, what="probabilities",
                        eps=e, log_clamp=c).forward()


@_on_input_device
def binary_cross_entropy_backward(grad_output, input, target, weight=None, reduction="mean", *, eps=None,
                                  log_clamp=None, empty_mean="nan", nan_policy="propagate", n_threads=None):
    e, c = _prob_modes(eps, log_clamp)
    return _elementwise(_binary.OP_BCE_PROB, input, target, weight=weight, reduction=reduction,
                        empty_mean=empty_mean, nan_policy=nan_policy, n_threads=n_threads, what="probabilities",
                        eps=e, log_clamp=c).backward(grad_output)


@_on_input_device
def binary_cross_entropy_with_grad(input, target, weight=None, reduction="mean", *, eps=None, log_clamp=None,
                                   empty_mean="nan", nan_policy="propagate", grad_output=None, out=None,
                                   inplace=False, n_threads=None):
    e, c = _prob_modes(eps, log_clamp)
    return _elementwise(_binary.OP_BCE_PROB, input, target, inplace=inplace, weight=weight, reduction=reduction,
                        empty_mean=empty_mean, nan_policy=nan_policy, n_threads=n_threads, what="probabilities",
                        eps=e, log_clamp=c).with_grad(input, grad_output, out, inplace)


_document_trio(
    (binary_cross_entropy, "Binary cross-entropy from probabilities (torch's ``binary_cross_entropy``)."),
    (binary_cross_entropy_backward, "Gradient of :func:`binary_cross_entropy` with respect to ``input``."),
    (binary_cross_entropy_with_grad, "BCE from probabilities and its gradient in one pass."),
    _BCE_PROB_PARAMS, _BOUND_BCE_PROB, _BCE_PROB_NOTES)


# ---------------------------------------------------------------------------------------------------
# cross-entropy from class probabilities


class _ProbsProblem(_api._Problem):
    """A validated cross_entropy_from_probs call.

    Reuses the softmax family's problem object: torch's mean denominator, the upstream factor, the run
    (with its subnormal-weight fold) and the reduction (with its rescaling of tiny losses); the input
    check and the kernel (_launch) are its own.
    """

    def __init__(self, input, target, weight, ignore_index, reduction, axis, eps, empty_mean, nan_policy,
                 n_threads, inplace=False):
        self.given_arrays = (("target", target), ("weight", weight))
        self.backend = _backend.for_call(input=input, target=target, weight=weight)
        self.xp = self.backend.xp
        self.k = self.backend.softmax
        checks = self.backend.checks()
        x, self.x_given = _as_float_input(input, writeable=inplace, what="probabilities", backend=self.backend)
        if x.ndim == 0:
            raise ValueError("input: expected at least 1 dimension (the class axis), got a 0-d array")
        self.x_orig = x
        self._set_dtypes()
        self.axis = _class_axis(axis, x.ndim)
        self.reduction = _check_choice(reduction, _REDUCTIONS, "reduction")
        self.empty_mean = _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
        self.eps = 0.0
        self.z = 0.0
        self.clip_eps = _check_eps(eps)
        self.ignore_index = _api._check_ignore_index(ignore_index)
        # before the layout's copy, which runs on these threads (the same count for any layout)
        self.n_threads = _threads_for(n_threads, x.size)
        self.rows, self.batch_shape, self.C = _rows(x, self.axis, self.n_threads)
        if self.C == 0:
            raise ValueError(f"input: the class axis (axis={axis}) has length 0; at least one class is needed")
        self.y, self.t, self._kept = _split_target(target, x, self.axis, self.batch_shape, self.C,
                                                   self.ignore_index, self.backend, checks, self.n_threads)
        self.w = _class_weights(weight, self.C, self.backend, checks)
        _check_probabilities(x, backend=self.backend, checks=checks, n_threads=n_threads)
        _api._check_nan_policy(nan_policy, self.rows, self.batch_shape, backend=self.backend, checks=checks,
                               what="probability", labels=self.y, ignore_index=self.ignore_index)
        if self.t is not None:
            _api._check_nan_policy(nan_policy, self.t, self.batch_shape, "target", self.backend, checks,
                                   "target probability")
        self.N = self.rows.shape[0]
        self._finish_checks(checks)

    def _lift_fits(self):
        """Whether the lifted factor (< 2^-1020, _Problem._scale_lift) times the mass over p stays finite:
        1/p <= 2^1074, so masses up to 2^969.  A mass is w_y (index targets) or w_c t_c, and probability
        targets may exceed 1 (t = 2^1000 with p = 5e-324 overflowed): the largest weight times the largest
        target (one more pass, over the targets, in this rare path only)."""
        w = float(self.w.max()) if self.w is not None and self.w.size else 1.0
        t = float(self.t.max()) if self.t is not None and self.t.size else 1.0
        return w * max(t, 1.0) <= 2.0**969

    def _fold_weights(self, scale):
        """Only where the scale overflows: this kernel's gradient -s w q / p forms its products on
        normalised mantissas (binary.h xf_bin_mul_div), so subnormal weights cost it nothing, while a fold
        w / denominator would round a subnormal quotient once before 1 / p magnifies it (1e-310 / 3 under
        p = 1e-310: 230 ULP off -1/3).  With the scale infinite the denominator is below 2^-1024, so each
        fold w_y / denominator of two subnormals is normal."""
        return not math.isfinite(scale)

    def _launch(self, w, row_scale, scale, loss, grad, loss_exp=None, sel=None):
        """The row kernel of cross-entropy from probabilities, for the softmax family's run/reduce (which
        fold subnormal weights and rescale tiny losses the same way for both); losses come times
        2^loss_exp (default: the mean's 2^-k, loss_scale(), which also lifts rows whose tiny weights
        would leave them on the subnormal grid); `sel` as in the softmax family."""
        xp = self.xp
        p, y, t = self._selected(sel)
        y = y if y is not None else _placeholder(xp, 1, np.int64)
        t = t if t is not None else _placeholder(xp, 2, self.dtype)
        g = grad if grad is not None else _placeholder(xp, 2, self.dtype)
        clip = self.clip_eps is not None
        self.backend.binary.ce_probs(p, y, t, w, self.ignore_index,
                                     row_scale if row_scale is not None else _placeholder(xp, 1, np.float64),
                                     scale, clip,
                                     self.clip_eps if clip else 0.0, loss, g,
                                     self.n_threads if sel is None else 1, self.y is not None,
                                     self.t is not None, self.w is not None, row_scale is not None,
                                     grad is not None,
                                     float(-self.loss_scale() if loss_exp is None else loss_exp))


_CE_PROBS_PARAMS = """
    input : array_like of float16, bfloat16, float32 or float64, or any array with ``__dlpack__``
        Class probabilities in [0, 1] (NaN propagates); the class axis is ``axis``.  Half precision costs a
        float64 copy (Notes).  Rows need not sum
        to 1 (no renormalisation; Keras divides by the row sum first).
    target : array_like
        Integer class indices (the input's shape without ``axis``) or class probabilities (the input's
        shape, cast to its dtype).
    weight : array_like, shape (C,), optional
        Class weights, finite and >= 0.
    ignore_index : int, default -100
        Index targets equal to it contribute 0 and leave the mean (as in torch's ``nll_loss``); with
        probability targets only the default is accepted (ValueError otherwise).
    reduction : {'none', 'mean', 'sum'}, default 'mean'
        'mean' divides by the sum of the target classes' weights over kept rows (index targets) or by
        the number of rows (probability targets), as torch does.
    axis : int, default -1
        The class axis.
    eps : float in [0, 0.5], optional
        Keras's ``categorical_crossentropy``: clip ``p`` to ``[eps, 1 - eps]`` first; the gradient is 0
        where clipped.
    empty_mean : {'nan', 'zero'}, default 'nan'
        As in :func:`xentfast.cross_entropy`.
    nan_policy : {'propagate', 'raise'}, default 'propagate'
        A NaN anywhere in a row makes that row's loss and gradient NaN; 'raise' raises instead (ignored
        rows excepted).
    n_threads : int, optional
        OpenMP threads (rows are the parallel unit); results are identical for every value."""

_CE_PROBS_NOTES = """
    Per row: ``loss = -sum_c q_c log p_c`` with ``q_c = w_y [c = y]`` (index targets, torch's
    ``nll_loss(log p, y)``) or ``q_c = w_c t_c`` (probability targets); ``d/dp_j = -q_j / p_j``.  The
    sum runs over non-negative terms with TwoSum compensation; ``-log 0 = +inf`` (gradient ``-inf``)
    where ``q > 0``, and ``0 * inf = 0`` where ``q = 0``.

    Which to call: from logits, :func:`xentfast.cross_entropy` is exact where ``log(softmax(x))`` is
    not (a float32 softmax underflows to 0 once a logit gap passes ~104, and ``p_y`` near 1 has lost the
    digits of ``1 - p_y``); see the README, "Logits or probabilities?".

    Deliberate differences: torch's ``nll_loss`` takes log-probabilities (this takes probabilities);
    Keras renormalises rows and clips with ``1 - eps`` rounded to float32.
""" + _HALF_NOTES

_BOUND_CE_PROBS = """
    Per row: loss <= 2 ULP (float32), <= 4 ULP (float64); every gradient entry the same, relative (no
    entry is a difference).  'mean' / 'sum' <= 4 ULP; gradients of reductions or with ``grad_output``: one
    more ULP.""" + _HALF_BOUND


@_on_input_device
def cross_entropy_from_probs(input, target, weight=None, ignore_index=-100, reduction="mean", *, axis=-1,
                             eps=None, empty_mean="nan", nan_policy="propagate", n_threads=None):
    p = _ProbsProblem(input, target, weight, ignore_index, reduction, axis, eps, empty_mean, nan_policy, n_threads)
    return p.reduce(p.run())


@_on_input_device
def cross_entropy_from_probs_backward(grad_output, input, target, weight=None, ignore_index=-100,
                                      reduction="mean", *, axis=-1, eps=None, empty_mean="nan",
                                      nan_policy="propagate", n_threads=None):
    p = _ProbsProblem(input, target, weight, ignore_index, reduction, axis, eps, empty_mean, nan_policy, n_threads)
    buf, dest = _grad_target(p, None, False)
    p.run(grad=buf, grad_output=grad_output)
    return _finish_grad(p, buf, dest)


@_on_input_device
def cross_entropy_from_probs_with_grad(input, target, weight=None, ignore_index=-100, reduction="mean", *,
                                       axis=-1, eps=None, empty_mean="nan", nan_policy="propagate",
                                       grad_output=None, out=None, inplace=False, n_threads=None):
    p = _ProbsProblem(input, target, weight, ignore_index, reduction, axis, eps, empty_mean, nan_policy, n_threads,
                      inplace=inplace)
    buf, dest = _grad_target(p, out, inplace, grad_output)
    loss = _loss_and_grad(p, buf, grad_output)
    g = _finish_grad(p, buf, dest)
    return loss, (input if inplace else g)  # the caller's object, as cross_entropy_with_grad


_document(
    cross_entropy_from_probs, "Cross-entropy from class probabilities (torch's ``nll_loss`` of ``log p``).",
    _CE_PROBS_PARAMS,
    "loss : ndarray (the input's shape without ``axis``) for reduction='none', else a NumPy scalar;\n"
    "        the input's dtype, float32 for half precision",
    _BOUND_CE_PROBS, _CE_PROBS_NOTES)

_document(
    cross_entropy_from_probs_backward, "Gradient of :func:`cross_entropy_from_probs` w.r.t. ``input``.",
    _upstream_param("the loss's shape for reduction='none'") + _CE_PROBS_PARAMS, _GRAD_OF_INPUT_SHAPE,
    _BOUND_CE_PROBS, _CE_PROBS_NOTES)

_document(
    cross_entropy_from_probs_with_grad, "Cross-entropy from probabilities and its gradient in one pass.",
    _CE_PROBS_PARAMS + """
    grad_output, out, inplace
        As in :func:`xentfast.cross_entropy_with_grad`.""", "loss, dinput", _BOUND_CE_PROBS, _CE_PROBS_NOTES)
