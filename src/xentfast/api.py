"""Public functions of the softmax family: validate, lay out, dispatch, reduce.

Every argument is checked here, before any kernel runs: the kernels are compiled without bounds checks,
so a label outside [0, C) would otherwise be an out-of-bounds read.  Errors name the argument and show
the offending value.
"""

import functools
import inspect
import math
import operator

import numpy as np

from . import _backend, _dtypes, _threads
from ._core import _layout, _xent
from ._core._xent import fp_ieee_enter as _fp_ieee_enter, fp_ieee_leave as _fp_ieee_leave
from ._backend import xp as _xp
from ._threads import threads_for

__all__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_with_grad",
    "log_softmax",
    "softmax",
    "logsumexp",
]

_REDUCTIONS = ("none", "mean", "sum")
_DEFAULT_IGNORE_INDEX = -100  # torch's
_EMPTY_MEAN = ("nan", "zero")
_NAN_POLICIES = ("propagate", "raise")
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------------------------------
# validation helpers (reused by every public function; never write a second copy)


def _as_logits(input, name="input", writeable=False, backend=_backend.CPU):
    """(x, given) as :func:`_as_float_input`, with at least one dimension (the class axis)."""
    x, given = _as_float_input(input, name=name, writeable=writeable, backend=backend)
    if x.ndim == 0:
        raise ValueError(f"{name}: expected at least 1 dimension (the class axis), got a 0-d array")
    return x, given


def _kind_of(value):
    """The NumPy dtype kind of a NumPy scalar or array ('b', 'U', ...); 'f' for anything without one."""
    return getattr(getattr(value, "dtype", None), "kind", "f")


def _index_argument(value, name, expected="an int"):
    """An int argument; a bool is refused (True would otherwise pass as 1)."""
    if type(value) is int:
        return value
    try:
        if isinstance(value, (bool, np.bool_)) or _kind_of(value) == "b":
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected {expected}, got {value!r}") from None


def _class_axis(axis, ndim, name="axis"):
    axis = _index_argument(axis, name)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for an input with {ndim} dimension(s)")
    return axis % ndim


def _transposable(a):
    """Whether _layout.transpose_batched can move a's class axis: a non-empty C-contiguous NumPy array of
    4- or 8-byte items (CuPy's arrays keep the array module's copy)."""
    return type(a) is np.ndarray and a.size and a.flags.c_contiguous and a.itemsize in (4, 8)


def _class_axis_last_in_memory(shape, axis):
    """Whether a C-contiguous array of this shape holds its rows one after another: the class axis is the
    last one, or every axis after it has length 1 (a classifier's (N, C, 1, 1) output with axis=1), where
    the rows need no transposition and are a view."""
    return axis == len(shape) - 1 or all(d == 1 for d in shape[axis + 1:])


def _rows(x, axis, n_threads=None):
    """(N, C) C-contiguous view or copy of x with the class axis last; batch shape.  A copy of a NumPy
    array with the class axis elsewhere is made on n_threads (the callers pass their validated count)."""
    C = x.shape[axis] if x.ndim else 0
    if axis == x.ndim - 1 and C and x.flags.c_contiguous:
        # the common layout: a view, decided without the array module (each step below costs ~0.5 us)
        return (x if x.ndim == 2 else x.reshape(-1, C)), x.shape[:-1], C
    if C and x.flags.c_contiguous and _class_axis_last_in_memory(x.shape, axis):
        # (8192, 1000, 1) float32 with axis=1, fused: 13.2 ms through the transposition, 2.1 as rows
        return x.reshape(-1, C), x.shape[:axis] + x.shape[axis + 1:], C
    if axis != x.ndim - 1 and _transposable(x):
        # torch's (N, C, d1, ...) layout: each of the prod(x.shape[:axis]) matrices (C, D) transposed in
        # parallel tiles (NumPy's copy runs on one thread, item by item: 2-5x slower on two cores)
        batch_shape = x.shape[:axis] + x.shape[axis + 1:]
        rows = np.empty((math.prod(batch_shape), C), dtype=x.dtype)
        _layout.transpose_batched(x, rows, math.prod(x.shape[:axis]), C, math.prod(x.shape[axis + 1:]),
                                  _threads_for(n_threads, x.size))
        return rows, batch_shape, C
    xp = _xp(x)
    moved = x if axis == x.ndim - 1 else xp.moveaxis(x, axis, -1)  # moveaxis alone costs ~5 us a call
    batch_shape = moved.shape[:-1]
    C = moved.shape[-1]
    rows = xp.ascontiguousarray(moved.reshape(-1, C) if moved.size or C else moved.reshape(0, C))
    return rows, batch_shape, C


def _channels(x, axis):
    """(B, C, D) where the kernels can read x's rows in place, torch's (N, C, d1, ...) layout (the class
    axis neither last nor alone): a C-contiguous NumPy float32/float64 array, B = prod(x.shape[:axis])
    matrices (C, D) whose columns are the rows (_xent.softmax_xent_channels, and softmax_family_channels
    where the path's groups take C), at most CHANNELS_MAX_CLASSES classes; else None (the rows are moved
    first, _rows)."""
    if not (type(x) is np.ndarray and axis != x.ndim - 1 and x.size and x.flags.c_contiguous and x.flags.aligned
            and (x.dtype == _F32 or x.dtype == _F64) and x.shape[axis] <= _xent.CHANNELS_MAX_CLASSES):
        return None
    D = math.prod(x.shape[axis + 1:])
    if D < _xent.GROUP_ROWS:
        # fewer positions than a group's rows: each group would be mostly padding, and moving the axis
        # is a short copy (none at D = 1; (65536, 21, 1) float32 fused 6.6 ms in place, 0.9 moved)
        return None
    return math.prod(x.shape[:axis]), x.shape[axis], D


def _restore(rows, batch_shape, axis):
    shape = batch_shape[:axis] + rows.shape[-1:] + batch_shape[axis:]
    if _class_axis_last_in_memory(shape, axis):
        return rows.reshape(shape)
    return _xp(rows).moveaxis(rows.reshape(batch_shape + rows.shape[-1:]), -1, axis)


def _restore_contiguous(rows, batch_shape, axis, n_threads, dest=None):
    """rows (from _rows) in the input's layout, C-contiguous: into dest (C-contiguous, rows' dtype and
    the input's shape, apart from rows) when given, else a new array; None where _layout cannot (the
    caller then takes _restore's view)."""
    C = rows.shape[-1]
    shape = batch_shape[:axis] + (C,) + batch_shape[axis:]
    if (_class_axis_last_in_memory(shape, axis) or not _transposable(rows)
            or (dest is not None and not _transposable(dest))):
        return None
    if dest is None:
        dest = np.empty(shape, dtype=rows.dtype)
    _layout.transpose_batched(rows, dest, math.prod(shape[:axis]), math.prod(shape[axis + 1:]), C, n_threads)
    return dest


def _check_choice(value, choices, name):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def _check_real(value, name, lo=None, hi=None):
    try:
        if type(value) is float or type(value) is int:
            v = float(value)
        else:
            try:
                # float() would read "0.1", True and their 0-d arrays as numbers
                if isinstance(value, (str, bytes, bool, np.bool_)) or _kind_of(value) not in "iuf":
                    raise TypeError
                v = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"{name}: expected a real number, got {value!r}") from None
    except OverflowError:
        # an int beyond float64 (10**400): as far outside any bound as an infinity
        v = math.inf
    if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        if lo is None and hi is None:
            raise ValueError(f"{name}: must be finite; got {value!r}")
        bounds = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}{']' if hi is not None else ')'}"
        raise ValueError(f"{name}: must be finite and in {bounds}; got {value!r}")
    return v


# Nonzero label smoothing below this is refused: its per-class mass eps / C would fall near or below
# the subnormal range, where it is rounded to a few bits before it multiplies -log p (up to ~10^300)
# and the documented bound cannot hold.  Deliberate difference from torch, which accepts any [0, 1].
_MIN_SMOOTHING = 2.0**-900


def _check_ignore_index(ignore_index):
    value = _index_argument(ignore_index, "ignore_index")
    if value not in _INT64_RANGE:
        raise ValueError(f"ignore_index: {value} is outside int64, the labels' range")
    return value


def _check_smoothing(label_smoothing):
    eps = _check_real(label_smoothing, "label_smoothing", 0.0, 1.0)
    if 0.0 < eps < _MIN_SMOOTHING:
        raise ValueError(f"label_smoothing: nonzero values below 2**-900 are not supported (their per-class "
                         f"mass would be subnormal, beyond the documented accuracy); got {label_smoothing!r}")
    return eps


def _fmt_index(flat_index, shape):
    idx = np.unravel_index(flat_index, shape) if shape else ()
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _bad_labels(t, C, ignore_index):
    """Mask of labels outside [0, C) that are not ignore_index, on the caller's dtype (before any cast
    could wrap a huge unsigned value) and on the array's own device."""
    info = np.iinfo(t.dtype)
    bad = (t >= C) if info.min == 0 else ((t < 0) | (t >= C))
    if info.min <= ignore_index <= info.max:
        bad &= t != ignore_index
    return bad


def _raise_bad_label(t, C, ignore_index):
    bad = _bad_labels(t, C, ignore_index)
    k = int(np.flatnonzero(bad.ravel())[0])
    raise ValueError(
        f"target: labels must be in [0, {C}) or equal ignore_index={ignore_index}; "
        f"found {t.ravel()[k]} at index {_fmt_index(k, t.shape)}")


_NO_WEIGHTS = np.empty(0)
_INT64_RANGE = range(-2**63, 2**63)
_F32, _F64, _I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
_PLAIN_NUMBERS = (int, float)
_HOST_VALUES = (np.ndarray, int, float)

# Zero-size stand-ins for the kernels' absent arguments, made once for NumPy (np.empty costs ~0.4 us, and
# a call passes three or four); keyed by the scalar type and by the dtype, so that neither needs
# converting.  Nothing is ever written through them: they have no element.
_CPU_PLACEHOLDERS = {(ndim, key): np.empty((0,) * ndim, dtype=dt) for ndim in (1, 2, 3)
                     for dt in (np.int64, np.float32, np.float64) for key in (dt, np.dtype(dt))}


def _placeholder(xp, ndim, dtype):
    if xp is np:
        return _CPU_PLACEHOLDERS[ndim, dtype]
    return xp.empty((0,) * ndim, dtype=dtype)


def _index_targets(target, batch_shape, C, ignore_index, backend=_backend.CPU, checks=None):
    """(labels as flat int64, kept): `kept` is the number of kept rows, the unweighted mean's
    denominator, when the check below counted them (NumPy labels that int64 holds), else None."""
    t = backend.xp.asarray(target)
    if t.shape != batch_shape:
        raise ValueError(
            f"target: class indices must have the input's shape without the class axis, {batch_shape}; "
            f"got shape {t.shape}")
    if backend.is_cpu and (t.dtype.kind == "i" or t.itemsize < 8) and ignore_index in _INT64_RANGE:
        # int64 holds every label exactly (uint64 could wrap onto ignore_index): check after the cast.
        # target_weight_sum counts the kept rows with a label in [0, C) (the others are skipped, never
        # read through); every kept label is in range when that is all the kept rows.  One C loop
        # instead of five NumPy operations, which cost ~2 us each on small arrays.
        y = t if t.ndim == 1 and t.dtype is _I64 and t.flags.c_contiguous else (
            np.ascontiguousarray(t.reshape(-1), dtype=np.int64))
        kept = backend.softmax.target_weight_sum(y, _NO_WEIGHTS, ignore_index, False, C)
        if kept != y.shape[0] and kept != y.shape[0] - np.count_nonzero(y == ignore_index):
            _raise_bad_label(t, C, ignore_index)
        return y, kept
    checks = checks or backend.checks(immediate=True)
    if t.size:
        checks.require(_bad_labels(t, C, ignore_index).any(),
                       lambda: _raise_bad_label(backend.to_host(t), C, ignore_index))
    return backend.xp.ascontiguousarray(t.reshape(-1), dtype=np.int64), None


def _raise_label_beyond_int64(target, batch_shape, C, ignore_index):
    """A Python sequence of ints became float64 (an int from 2**63 to 2**64 beside smaller ones) or object
    (beyond 2**64) in NumPy: name the out-of-range label rather than call the integers floating point."""
    try:
        labels = np.array(target, dtype=object)
    except ValueError:          # ragged: the general error follows
        return
    if labels.shape != batch_shape or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in labels.flat):
        return
    for k, v in enumerate(labels.flat):
        if not (0 <= v < C or v == ignore_index):
            raise ValueError(f"target: labels must be in [0, {C}) or equal ignore_index={ignore_index}; "
                             f"found {v} at index {_fmt_index(k, batch_shape)}")


def _prob_targets(target, x, axis, n_threads=None, layout=False):
    """Probability targets as rows like x's, or with `layout` (x read in place, _channels) in x's layout:
    C-contiguous and aligned, in x's dtype."""
    t = _xp(x).asarray(target)
    if t.shape != x.shape:
        raise ValueError(f"target: class probabilities must have the input's shape {x.shape}; got {t.shape}")
    if layout:
        return np.require(t, dtype=x.dtype, requirements=["C", "A"])
    rows, _, _ = _rows(t.astype(x.dtype, copy=False), axis, n_threads)
    return rows


def _split_target(target, x, axis, batch_shape, C, ignore_index, backend=_backend.CPU, checks=None,
                  n_threads=None, layout=False):
    """Index targets (int64, flat) or probability targets (rows like x; with `layout`, in x's layout,
    _prob_targets): (y, t, kept) with one of y and t None; `kept` as in _index_targets (None for
    probabilities)."""
    t = backend.xp.asarray(target)
    if t.dtype.kind in "fO" and t.shape == batch_shape and not hasattr(target, "dtype"):
        _raise_label_beyond_int64(target, batch_shape, C, ignore_index)
    if t.dtype.kind in "iu":
        if t.shape == x.shape:
            raise TypeError(f"target: integer values of the input's shape {x.shape}; class indices have the "
                            f"input's shape without the class axis, {batch_shape}, and class probabilities "
                            f"(one-hot rows too) must be floating point: cast them to a float dtype")
        if t.shape != batch_shape and x.ndim >= 3 and axis == x.ndim - 1 and t.shape == x.shape[:1] + x.shape[2:]:
            raise ValueError(f"target: class indices must have the input's shape without the class axis, "
                             f"{batch_shape}; got shape {t.shape}, the input's shape without axis 1: for "
                             f"torch's (N, C, d1, ...) layout pass axis=1")
        y, kept = _index_targets(t, batch_shape, C, ignore_index, backend, checks)
        return y, None, kept
    if t.dtype.kind == "f" or _dtypes.is_bfloat16(t.dtype):
        if t.shape == batch_shape and t.shape != x.shape:
            raise TypeError(
                f"target: got floating-point values of shape {t.shape}, the shape of class indices; "
                f"cast to an integer dtype for indices, or pass probabilities of shape {x.shape}")
        if ignore_index >= 0:
            # a probability row has no label to compare.  torch's rule: a class number (>= 0) raises, rather
            # than leave the caller believing that class's rows were dropped; a negative value, which no
            # label can equal (its default -100 among them), is accepted and changes nothing
            raise ValueError(f"ignore_index: only index targets can be ignored; got ignore_index={ignore_index} "
                             f"with probability targets (a negative value, the default -100 among them, "
                             f"has no effect there)")
        return None, _prob_targets(t, x, axis, n_threads, layout), None
    if t.dtype.kind == "b":
        raise TypeError("target: got a boolean array; pass integer class indices or float class probabilities")
    got = "None" if target is None else f"dtype {t.dtype}"
    raise TypeError(f"target: expected integer class indices or float probabilities, got {got}")


def _bad_weights(w):
    return ~_xp(w).isfinite(w) | (w < 0)


def _raise_bad_weight(w):
    k = int(np.flatnonzero(_bad_weights(w))[0])
    raise ValueError(f"weight: class weights must be finite and >= 0; found {w[k].item()!r} at index {k}")


def _class_weights(weight, C, backend=_backend.CPU, checks=None):
    if weight is None:
        return None
    checks = checks or backend.checks(immediate=True)
    w = backend.xp.asarray(weight)
    if not _dtypes.is_real(w.dtype):
        raise TypeError(f"weight: expected real class weights, got dtype {w.dtype}")
    if w.shape != (C,):
        raise ValueError(f"weight: expected shape ({C},), one weight per class; got shape {w.shape}")
    w = backend.xp.ascontiguousarray(w, dtype=np.float64)
    checks.require(_bad_weights(w).any(), lambda: _raise_bad_weight(backend.to_host(w)))
    return w


def _upstream_factor(grad_output, reduction, loss_shape, backend=_backend.CPU, keep_float32=False):
    """Validated grad_output: (flat float64 array for reduction='none' or None, scalar factor).

    keep_float32: a float32 array stays float32 (flat, contiguous), for kernels that widen it themselves.
    A scalar grad_output held in a 0-d device array is read back to the host (one transfer)."""
    if grad_output is None:
        return None, 1.0
    if (isinstance(grad_output, np.ndarray) or _backend.is_device_array(grad_output)) and not backend.owns(grad_output):
        raise TypeError(f"grad_output: got a {type(grad_output).__module__}.{type(grad_output).__name__} for "
                        f"inputs held as {backend.name} arrays; pass every array on the same device")
    if reduction == "none":
        g = backend.xp.asarray(grad_output)
        if not _dtypes.is_real(g.dtype):
            raise TypeError(f"grad_output: expected real values, got dtype {g.dtype}")
        if g.shape != loss_shape:
            raise ValueError(f"grad_output: expected the loss's shape {loss_shape} (reduction='none'); "
                             f"got {g.shape}")
        kept = np.float32 if keep_float32 and g.dtype == np.float32 else np.float64
        return backend.xp.ascontiguousarray(g.reshape(-1), dtype=kept), 1.0
    ga = backend.xp.asarray(grad_output)
    if ga.shape != ():
        raise ValueError(f"grad_output: expected a scalar for reduction={reduction!r}; got shape {ga.shape}")
    if not _dtypes.is_real(ga.dtype):
        if isinstance(grad_output, int) and not isinstance(grad_output, bool):
            # NumPy holds an int outside int64 and uint64 as an object: a float where one holds it, as the
            # options' numbers are taken
            try:
                return None, float(grad_output)
            except OverflowError:
                raise ValueError("grad_output: the integer is beyond float64's range (about 1.8e308)") from None
        raise TypeError(f"grad_output: expected a real scalar, got dtype {ga.dtype}")
    return None, float(ga)


def _nan_rows(xp, rows, labels, ignore_index):
    """Rows holding a NaN, ignored rows left out (their loss and gradient are 0 whatever they hold)."""
    nan_rows = xp.isnan(rows).any(axis=1)
    return nan_rows if labels is None else nan_rows & (labels != ignore_index)


def _raise_nan_row(rows, batch_shape, name, what, labels, ignore_index):
    r = int(np.flatnonzero(_nan_rows(np, rows, labels, ignore_index))[0])
    c = int(np.flatnonzero(np.isnan(rows[r]))[0])
    raise ValueError(f"{name}: NaN {what} in row {_fmt_index(r, batch_shape)} at class {c} (nan_policy='raise')")


def _check_nan_policy(nan_policy, rows, batch_shape, name="input", backend=_backend.CPU, checks=None,
                      what="logit", labels=None, ignore_index=None):
    """nan_policy='raise': ValueError naming the first row (not ignored: `labels` equal to ignore_index)
    holding a NaN."""
    _check_choice(nan_policy, _NAN_POLICIES, "nan_policy")
    if nan_policy == "raise" and rows.size:
        checks = checks or backend.checks(immediate=True)
        checks.require(_nan_rows(backend.xp, rows, labels, ignore_index).any(),
                       lambda: _raise_nan_row(backend.to_host(rows), batch_shape, name, what,
                                              None if labels is None else backend.to_host(labels), ignore_index))


def _lift_exponent(g, den):
    """k >= 0 such that 2^k g / den is a normal number below 2^-1020, for finite g != 0 and den > 0 whose
    quotient is subnormal: g = m 2^eg, den = n 2^ed with m, n in [1/2, 1) give 2^k g / den >= 2^(k + eg -
    ed - 1) = 2^-1022.  The two families' lifts of a subnormal upstream factor (_Problem._scale_lift,
    api_binary._Elementwise._lifted_mean_scale)."""
    return -1021 - math.frexp(g)[1] + math.frexp(den)[1]


def _weight_lift(w, scale):
    """k >= 0 for class weights with a subnormal entry (the caller has checked) under a scalar upstream
    factor: the kernel's products with such a weight round on the subnormal grid before the factor
    magnifies them (weights 5e-324 under grad_output 1e30: 7e14 ULP; a weighted mean's folded weight
    7e-310: 20 ULP).  The caller lifts the weights by 2^k and lowers the factor by as much, k such that
    the factor stays >= 1/2 and the largest weight below 2^1021 (so a huge weight beside the subnormal
    one limits k: weights [5e-324, 1e300] keep most of the error)."""
    wmax = float(w.max())
    if not math.isfinite(scale) or abs(scale) < 1.0 or wmax <= 0:
        return 0
    return max(0, min(math.frexp(scale)[1] - 1, 1021 - math.frexp(wmax)[1]))


def _fold_lift(xp, w, folded, den, g):
    """k >= 0 that puts the least positive class weight over the mean's denominator among the normals,
    for a weighted mean's folded weights (_Problem._run_launches): w / den rounds such a weight on the
    subnormal grid, or to 0 (5e-324 / 2), and the z-loss's 2 z lse (up to 2^1024) magnifies what it lost
    (weights [5e-324, 2], lse 1e200: an entry of 4.9e-128 came out 0).  _weight_lift moves only what
    the factor holds (g >= 2), nothing under g = 1.  Every gradient product holds one weight and the
    factor (index targets: r = w_y), so 2^k on the weights and 2^-k on g leave it exact; capped so that
    the largest folded weight stays below 2^1021 and g 2^-k a normal number."""
    positive = w[w > 0]
    if not positive.size or g == 0 or not math.isfinite(g):
        return 0
    need = math.frexp(den)[1] - math.frexp(float(positive.min()))[1] - 1021
    cap = min(1021 - math.frexp(float(xp.max(folded)))[1], math.frexp(g)[1] + 1021)
    return max(0, min(need, cap))


def _least_magnitude(xp, factors):
    """The least |f| over the finite nonzero entries of a per-row factor array (0 if none): the one that
    limits _weight_lift, since every factor is lowered by the same power of two."""
    a = xp.abs(factors)
    a = a[(a > 0) & xp.isfinite(a)]
    return float(a.min()) if a.size else 0.0


def _ldexp_inf(v, k):
    """v 2^k rounded once, inf where it overflows (math.ldexp raises there)."""
    try:
        return math.ldexp(v, k)
    except OverflowError:
        return math.copysign(math.inf, v)


_TINY_K = float(_xent.TINY_RERUN_EXP)
_TINY_TERM = _xent.TINY_TERM
_SMALLEST_NORMAL = float(np.finfo(np.float64).smallest_normal)


def _threads_for(n_threads, n_elements):
    """threads_for, without its two OpenMP queries where the answer cannot depend on them: the default
    thread count on fewer than two threads' worth of elements is one thread."""
    if n_threads is None and n_elements < 2 * _threads.MIN_ELEMENTS_PER_THREAD:
        return 1
    return threads_for(n_threads, n_elements)


_TINY_SUM_PER_TERM = _xent.TINY_SUM_PER_TERM

def _dd_sum(backend, losses, n_threads):
    """The double-double sum (hi, lo) of a float64 vector of losses on the call's `n_threads` (the
    validated count its kernels ran on; on the CPU the sum's own default is every OpenMP thread, which
    a call limited to one thread must not start).  The bits do not depend on it (xentfast/ddsum.h)."""
    if backend.is_cpu:
        return backend.softmax.dd_sum(losses, n_threads)
    return backend.softmax.dd_sum(losses)


def _sum_and_tiny(backend, losses, n_threads):
    """(hi, lo) of the double-double sum of the losses and _tiny_terms(max |loss|), in one transfer on
    the GPU.  NaN losses give a NaN sum; the max then only matters through _tiny_terms."""
    xp = backend.xp
    if not losses.size:
        return 0.0, 0.0, False
    if backend.is_cpu:
        hi, lo = _dd_sum(backend, losses, n_threads)
        # the max is needed only for a small sum: |sum| <= n max |loss| (up to the double-double's
        # relative error, far below the factor 2 spared here), so a sum beyond 2 n 2^-969 puts max |loss|
        # beyond 2^-969; an infinite sum means an infinite loss (or a max near DBL_MAX), a NaN sum a NaN
        # loss (or infinities of both signs): none of them tiny.  Skipping it saves ~5 us a call.
        if not abs(hi) <= losses.shape[0] * _TINY_SUM_PER_TERM:
            return hi, lo, False
        return hi, lo, _tiny_terms(float(np.max(np.abs(losses))))
    both = xp.concatenate([backend.softmax.dd_sum_device(losses), xp.max(xp.abs(losses)).reshape(1)])
    hi, lo, biggest = backend.to_host(both).tolist()
    return hi, lo, _tiny_terms(biggest)


def _tiny_terms(biggest):
    """True when every reduced term is below 2^-969 (and one is not 0): each was rounded onto (or near)
    the subnormal grid, and a sum of n of them, or their sum divided by a subnormal denominator, would
    carry up to n/2 of those ULPs.  The kernel then runs again with the losses scaled by 2^600 (exact).
    Not where every term is 0: terms below half the least subnormal that sum to more stay 0 (a known
    limit, README), because the rerun would cost a pass on every all-ignored batch and its 2^600 times
    a weight beyond 2^424 overflows (inf * 0 = NaN for an exact 0).  `biggest` is max |loss|."""
    return 0.0 < biggest < _TINY_TERM



class _Problem:
    """A validated cross-entropy call: rows, targets, weights and options, ready for the kernel."""

    # set once an in-place gradient pass has overwritten the logits (_loss_and_grad): from then on no
    # launch may read them
    input_overwritten = False
    _k = None  # loss_scale(), once known
    # (B, C, D) where the kernel reads the input in torch's layout in place (_channels), and the gradient
    # buffer it then writes in that layout (_grad_target); None otherwise
    channels = None
    layout_grad = None
    _rows = None
    # probability targets in the input's layout where the kernel reads both in place (channels), else
    # None; their rows (t) are then made on first use, as the input's are
    t_layout = None
    _t = None

    @property
    def rows(self):
        """The (N, C) C-contiguous rows the kernels read: in torch's layout (channels) made on first use,
        by the launches that cannot read the input in place (a probe's rows, a gradient buffer of rows)."""
        if self._rows is None:
            self._rows = _rows(self.x_orig, self.axis, self.n_threads)[0]
        return self._rows

    @rows.setter
    def rows(self, value):
        self._rows = value

    @property
    def t(self):
        """Probability targets as (N, C) rows like `rows`, or None (index targets)."""
        if self._t is None and self.t_layout is not None:
            self._t = _rows(self.t_layout, self.axis, self.n_threads)[0]
        return self._t

    @t.setter
    def t(self, value):
        self._t = value

    @property
    def has_t(self):
        """Whether the targets are probabilities, without making their rows (t)."""
        return self._t is not None or self.t_layout is not None

    def __init__(self, input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss,
                 empty_mean, nan_policy, n_threads, inplace=False, grad_output=None, out=None):
        self.given_arrays = (("target", target), ("weight", weight))
        if not (type(input) is np.ndarray and type(target) is np.ndarray and weight is None
                and self._init_plain(input, target, ignore_index, reduction, label_smoothing, axis, z_loss,
                                     empty_mean, nan_policy, n_threads, inplace, grad_output, out)):
            self._init_general(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss,
                               empty_mean, nan_policy, n_threads, inplace, grad_output, out)

    def _init_plain(self, input, target, ignore_index, reduction, label_smoothing, axis, z_loss, empty_mean,
                    nan_policy, n_threads, inplace, grad_output, out):
        """The common call, validated by type checks and the label check alone: NumPy float32 or float64
        (N, C) C-contiguous logits with the class axis last, int64 labels, no weights, smoothing or z-loss,
        the default NaN policy and thread count, no device array anywhere.  Sets what _init_general
        would set (tests/test_softmax_xent.py compares the two) and returns True; returns False, having
        set nothing, for any other call.  Saves ~3.5 us a call (an (8, 100) call takes ~13 us in all)."""
        dt = input.dtype
        if not ((dt is _F32 or dt is _F64) and input.ndim == 2 and input.shape[1] > 0
                and input.flags.c_contiguous and (inplace is False or (inplace is True and input.flags.writeable))
                and type(axis) is int and (axis == -1 or axis == 1)
                and target.dtype is _I64 and target.shape == input.shape[:1]
                and type(ignore_index) is int and ignore_index in _INT64_RANGE
                and type(reduction) is str and reduction in _REDUCTIONS
                and type(empty_mean) is str and empty_mean in _EMPTY_MEAN
                and type(nan_policy) is str and nan_policy == "propagate"
                and type(label_smoothing) in _PLAIN_NUMBERS and label_smoothing == 0
                and type(z_loss) in _PLAIN_NUMBERS and z_loss == 0
                and n_threads is None
                and (grad_output is None or type(grad_output) in _HOST_VALUES)
                and (out is None or type(out) is np.ndarray)):
            return False
        N, C = input.shape
        self.backend = _backend.CPU
        self.xp = np
        self.k = _backend.CPU.softmax
        self.x_orig = self.x_given = self.rows = input
        self.dtype = self.grad_dtype = self.loss_dtype = dt
        self.axis = 1
        self.reduction, self.empty_mean = reduction, empty_mean
        self.eps = self.z = 0.0
        self.ignore_index = ignore_index
        self.batch_shape, self.C = (N,), C
        self.y, self._kept = _index_targets(target, self.batch_shape, C, ignore_index)
        self.t = self.w = None
        self.N = N
        self.n_threads = _threads_for(None, N * C)
        self._den = self._kept
        return True

    def _init_general(self, input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss,
                      empty_mean, nan_policy, n_threads, inplace, grad_output, out):
        self.backend = _backend.for_call(input=input, target=target, weight=weight, grad_output=grad_output,
                                         out=out)
        self.xp = self.backend.xp
        self.k = self.backend.softmax
        checks = self.backend.checks()
        self.x_orig, self.x_given = _as_logits(input, writeable=inplace, backend=self.backend)
        self._set_dtypes()
        self.axis = _class_axis(axis, self.x_orig.ndim)
        self.reduction = _check_choice(reduction, _REDUCTIONS, "reduction")
        self.empty_mean = _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
        self.eps = _check_smoothing(label_smoothing)
        self.z = _check_real(z_loss, "z_loss", 0.0)
        self.ignore_index = _check_ignore_index(ignore_index)
        # before the layout's copy, which runs on these threads (the same count for any layout: N C = size)
        self.n_threads = _threads_for(n_threads, self.x_orig.size)
        channels = _channels(self.x_orig, self.axis)
        if channels is not None:
            # the kernel reads the input as it lies: no rows yet (rows)
            self.channels = channels
            self.batch_shape = self.x_orig.shape[:self.axis] + self.x_orig.shape[self.axis + 1:]
            self.C = channels[1]
        else:
            self.rows, self.batch_shape, self.C = _rows(self.x_orig, self.axis, self.n_threads)
        if self.C == 0:
            raise ValueError(f"input: the class axis (axis={axis}) has length 0; at least one class is needed")
        self.y, t, self._kept = _split_target(target, self.x_orig, self.axis, self.batch_shape, self.C,
                                              self.ignore_index, self.backend, checks, self.n_threads,
                                              layout=channels is not None)
        if channels is not None:
            self.t_layout = t
        else:
            self.t = t
        self.w = _class_weights(weight, self.C, self.backend, checks)
        _check_nan_policy(nan_policy, self.rows if nan_policy == "raise" else None, self.batch_shape,
                          backend=self.backend, checks=checks, labels=self.y, ignore_index=self.ignore_index)
        if self.has_t:
            # a NaN target probability makes its row NaN as a NaN logit does (README, special values)
            _check_nan_policy(nan_policy, self.t if nan_policy == "raise" else None, self.batch_shape, "target",
                              self.backend, checks, "target probability")
        self.N = math.prod(self.batch_shape)
        self._finish_checks(checks)

    def read_arrays(self):
        """(argument name, array) of what the kernels read besides the input, as they read it (a
        converted copy shares nothing with the caller's array, the caller's own array may).  The
        caller's own arguments (given_arrays) are checked against the gradient buffer as well: where the
        kernels read a converted copy (int32 labels, float32 weights), a buffer over the caller's array
        would still overwrite it with the gradient."""
        return (("target", self.y), ("target", self._t), ("target", self.t_layout), ("weight", self.w))

    def _set_dtypes(self):
        """dtype: the kernels' (float64 for half inputs); loss_dtype: losses and reductions; grad_dtype: the
        gradient, the caller's dtype (xentfast._dtypes (a))."""
        self.dtype = self.x_orig.dtype
        self.grad_dtype = self.x_given.dtype
        self.loss_dtype = _dtypes.loss_dtype(self.grad_dtype)

    def _finish_checks(self, checks):
        """Raise on any failed data check; on the GPU the mean's denominator rides along with the
        validation flags: one transfer per call (the device sum skips out-of-range labels, so it is safe
        to run before the flags are read)."""
        # unweighted index targets: the label check counted the kept rows, the same target_weight_sum
        self._den = self._kept if self.w is None else None
        if self.backend.is_cpu or self.y is None:
            checks.fetch()
        else:
            self._den, = checks.fetch(self.k.target_weight_sum_device(
                self.y, self._w_or_empty(), self.ignore_index, self.w is not None, self.C))

    def _subnormal_weights(self):
        """Whether a class weight is subnormal (one more look at the C weights, on the GPU a transfer;
        asked only for weighted means with a gradient)."""
        w = self.w
        return bool(((w > 0) & (w < _SMALLEST_NORMAL)).any())

    def _fold_weights(self, scale):
        """Whether a weighted mean's gradient takes its weights folded with the denominator (run): where
        scale = grad_output / denominator overflows, or where subnormal weights would round on the
        subnormal grid in the kernel's products before the scale lifts them."""
        return not math.isfinite(scale) or self._subnormal_weights()

    def _w_or_empty(self):
        return self.w if self.w is not None else _placeholder(self.xp, 1, np.float64)

    def denominator(self):
        """torch's `mean` denominator: sum of target weights over kept rows (index), or rows (probabilities)."""
        if self._den is None:
            if self.y is None:
                self._den = float(self.N)
            else:
                self._den = self.k.target_weight_sum(self.y, self._w_or_empty(), self.ignore_index,
                                                     self.w is not None, self.C)
        if self._den == math.inf and self.reduction == "mean":
            # every row's share w_y / sum(w_y) would round to 0 (a NaN mean, a zero gradient), although
            # the mean itself is finite; scaling every weight by one factor leaves it unchanged
            raise ValueError("weight: the mean's denominator, the sum of the kept rows' target weights, "
                             "overflows float64; scale the weights down (the mean does not change)")
        return self._den

    def upstream(self, grad_output):
        """(row_scale array or None, scalar scale, scalar grad_output) for the gradient of
        (loss * grad_output).sum(); the scale includes the mean's 1 / denominator."""
        rows, g = _upstream_factor(grad_output, self.reduction, self.batch_shape, self.backend)
        if self.reduction != "mean":
            return rows, g, g
        den = self.denominator()
        # the mean's gradient is 0 when nothing is averaged (all rows ignored / zero weights): every
        # contributing row is empty, so the loss is a constant whatever empty_mean says
        return None, (g / den if den != 0 else 0.0), g

    def loss_scale(self):
        """Power of two 2^-k >= 1/denominator by which the kernel scales row losses for `mean`: exact, and
        each scaled weighted row stays below its unweighted loss, so a finite mean never overflows on
        the way (weights > 1 on losses near DBL_MAX)."""
        if self._k is None:
            den = self.denominator() if self.reduction == "mean" else 0.0
            self._k = min(max(math.frexp(den)[1], -1000), 1000) if den > 0 else 0
        return self._k

    def run(self, grad=None, grad_output=None):
        xp = self.xp
        loss = xp.empty(self.N, dtype=np.float64)
        if self.reduction == "mean" and self.denominator() == 0:
            # nothing is averaged: the loss is the empty_mean constant, whatever the rows hold (even
            # NaN), and the gradient of a constant is 0
            loss.fill(0.0)
            if grad is not None:
                grad.fill(0)
            return loss
        row_scale, scale, g = self.upstream(grad_output) if grad is not None else (None, 1.0, 1.0)
        lift = self._scale_lift(row_scale, scale, g, grad.dtype) if grad is not None else 0
        if lift:
            g = math.ldexp(g, lift)
            scale = g / self.denominator() if self.reduction == "mean" else g
        self._run_launches(loss, grad, row_scale, scale, g)
        if lift:
            xp.ldexp(grad, -lift, out=grad)
        return loss

    def _scale_lift(self, row_scale, scale, g, grad_dtype):
        """k > 0 where a scalar upstream factor (grad_output, over the mean's denominator) is subnormal, else
        0.  The kernel would round its products with it on the subnormal grid (or start from the few bits
        g / denominator kept), and weights, the z-loss's 2 z lse or 1 / p can lift such a product back into
        the normals with a relative error of up to 1 (grad_output 5e-324 under logits near DBL_MAX with a
        z-loss: 1.8e8 ULP).  The kernel runs under 2^k times the factor, a normal number that rounds once,
        and the gradient is scaled back by 2^-k after it: exact, or one rounding where the entry is
        subnormal.  Only where no entry can overflow on the way (_lift_fits): the scaled factor is below
        2^-1020, but an entry is that times A + 2 z r lse (times q / p for cross_entropy_from_probs).
        Only into a float64 buffer: a float32 one would round the entries that land among float32's
        subnormals twice (and CuPy's kernels flush those to 0), while the rounding the lift removes shows
        in float32 results only under a magnification beyond ~2^870, except where the factor over the
        denominator rounded to 0 (grad_output 5e-324 over a mean of 2 rows): then every entry is lost,
        also the infinite ones of 1 / p at p = 0 (-0 for -inf), and float32 buffers are lifted too."""
        if (row_scale is not None or g == 0 or not math.isfinite(g) or abs(scale) >= _SMALLEST_NORMAL
                or (grad_dtype != np.float64 and scale != 0) or not self._lift_fits()):
            return 0
        return _lift_exponent(g, self.denominator() if self.reduction == "mean" else 1.0)

    def _lift_fits(self):
        """Whether the lifted factor (< 2^-1020) times A + 2 z r lse stays finite: A is a sum of masses
        (finite, or the kernel's own overflow path), and 2 z r lse is below 2^2044 while z max(1, w) <=
        2^1000 (|lse| <= 2^1024)."""
        r = float(self.w.max()) if self.w is not None and self.w.size else 1.0
        return self.z == 0 or self.z * max(1.0, r) <= 2.0**1000

    def _run_launches(self, loss, grad, row_scale, scale, g):
        """run()'s kernel launches under the upstream factors it settled."""
        xp = self.xp
        if (grad is not None and self.reduction == "mean" and self.w is not None and self.y is not None
                and self._fold_weights(scale)):
            if math.isfinite(g):
                # index targets (the row weight r = w_y, z-loss included, scales the whole row), with
                # subnormal class weights: grad_output / sum(w_y) may overflow although every
                # w_y / sum(w_y) <= 1, and a subnormal w_y's products round on the subnormal grid before
                # 1 / sum(w_y) magnifies them.  Fold the denominator into the weights for the gradient,
                # and take the losses from a forward pass with the weights as given (the same bits a
                # fused pass gives them)
                den = self.denominator()
                with np.errstate(over="ignore"):  # an overflowing fold is expected: see below
                    folded = self.w / den
                if self.eps == 0:
                    # only target classes' weights enter, and w_y <= sum(w_y): a weight that overflows
                    # here belongs to a class no kept row targets
                    folded = xp.where(xp.isfinite(folded), folded, 0.0)
                elif not bool(xp.isfinite(folded).all()):
                    # smoothing's eps/C_eff w_c enters every entry, and w_c / sum(w_y) can overflow (a
                    # subnormal target weight beside ordinary ones) where the entry, eps/C_eff w_c (p_j
                    # A - q_j) / sum(w_y), does not: fold 2^-s of the denominator's inverse into the
                    # weights and give the kernel 2^s g (exact scalings; its coef_mult keeps products
                    # finite), with s such that the largest folded weight is below 2^1023
                    s = math.frexp(float(self.w.max()))[1] - math.frexp(den)[1] - 1021
                    try:
                        g_up = math.ldexp(g, s)
                    except OverflowError:   # math.ldexp raises where NumPy would give inf
                        g_up = math.inf
                    if math.isfinite(g_up):
                        den = math.ldexp(den, s)
                        folded = self.w / den
                        g = g_up
                # keyed on the weights' subnormals, not the folded ones: w / den can round one to 0
                lift = (max(_weight_lift(folded, g), _fold_lift(xp, self.w, folded, den, g))
                        if self._subnormal_weights() and bool(xp.isfinite(folded).all()) else 0)
                if lift:
                    # the power of two before the division as far as the weights take it: a folded
                    # weight below the normals was rounded on the subnormal grid by the division itself
                    before = max(0, min(lift, 1021 - math.frexp(float(self.w.max()))[1]))
                    with np.errstate(over="ignore"):
                        folded = xp.ldexp(xp.ldexp(self.w, before) / den, lift - before)
                    if self.eps == 0:
                        folded = xp.where(xp.isfinite(folded), folded, 0.0)
                    g = math.ldexp(g, -lift)
                self._launch_loss_then_grad(folded, g, loss, grad)
                return
        lift = 0
        if grad is not None and self.w is not None and (self.y is not None or self.z == 0):
            # the gradient is linear in the weights (not a z-loss over probability targets: its row
            # weight is 1); a factor below 2 magnifies nothing (and the weights' look, a transfer on a
            # device, is skipped)
            if row_scale is None:
                if math.isfinite(scale) and abs(scale) >= 2.0 and self._subnormal_weights():
                    lift = _weight_lift(self.w, scale)
            elif self._subnormal_weights():
                # per-row factors: the power of two that the smallest of them takes (weights
                # [3e-320, 1, 1] with a z-loss under factors 1e300: 5.5e11 ULP without it)
                lift = _weight_lift(self.w, _least_magnitude(xp, row_scale))
        if lift:
            # the same gradient with 2^lift w and 2^-lift times the factors, all exact
            if row_scale is None:
                self._launch_loss_then_grad(xp.ldexp(self.w, lift), math.ldexp(scale, -lift), loss, grad)
            else:
                self._launch_loss_then_grad(xp.ldexp(self.w, lift), scale, loss, grad,
                                            row_scale=xp.ldexp(row_scale, -lift))
            return
        self._launch(self._w_or_empty(), row_scale, scale, loss, grad)

    def _launch_loss_then_grad(self, grad_weights, grad_scale, loss, grad, row_scale=None):
        """The losses from the weights as given (the bits a fused pass gives them), then the gradient
        under weights and factors (the scalar one, or per-row ones) rescaled for it.  The forward launch
        first: an in-place gradient overwrites the logits it reads."""
        self._launch(self._w_or_empty(), None, 1.0, loss, None)
        self._launch(grad_weights, row_scale, grad_scale, self.xp.empty(self.N, dtype=np.float64), grad)

    def rerun_possible(self):
        """Whether reduce() may launch the kernel on the logits again: the tiny-terms pass, taken when
        every reduced row loss is below 2^-969 (_tiny_terms).  One row's loss settles it in every
        ordinary case: a NaN or a loss >= 2^-969 in one row puts max |loss| there too (rows are
        independent, so the row alone gives the bits it has in the full launch).  Costs a kernel call on
        one row and, on a device, one transfer."""
        if self.N == 0 or (self.reduction == "mean" and self.denominator() == 0):
            return False
        loss = self.xp.empty(1, dtype=np.float64)
        self._launch(self._w_or_empty(), None, 1.0, loss, None, sel=self._probe_row())
        v = float(loss[0])
        return not (v != v or abs(v) >= _TINY_TERM)

    def _probe_row(self):
        """A one-element index array naming a row likely to carry loss: the first kept row whose target
        weight is positive (row 0 if there is none: the probe then proves nothing and costs only that)."""
        y = self.y
        if y is None:
            return self.xp.zeros(1, dtype=np.int64)
        if self.backend.is_cpu:
            y0 = int(y[0])
            if y0 != self.ignore_index and (self.w is None or self.w[y0] > 0):
                return np.zeros(1, dtype=np.int64)
        carries = y != self.ignore_index
        if self.w is not None:
            carries &= self.w[y.clip(0, self.C - 1)] > 0
        # array methods, not module functions: no device round trip to pick the row
        return carries.argmax().reshape(1)

    def _logits_intact(self):
        if self.input_overwritten:  # pragma: no cover - a broken rerun_possible() would land here
            raise RuntimeError("internal error: a reduction would read the in-place gradient as the logits")

    def _selected(self, sel):
        """(rows, y, t) of the whole problem, or of the rows `sel` indexes (copies, for a probe)."""
        if sel is None:
            return self.rows, self.y, self.t
        return (self.rows[sel], None if self.y is None else self.y[sel],
                None if self.t is None else self.t[sel])

    def _launch(self, w, row_scale, scale, loss, grad, loss_exp=None, sel=None):
        """One kernel call; row losses come times 2^loss_exp (default: the mean's 2^-k, loss_scale()).
        `sel`: only the rows it indexes, losses only (rerun_possible's probe), on one thread: a team of
        threads on one row costs more than the row (milliseconds on a busy machine, where a sleeping
        thread waits for a time slice).  Subclasses with another kernel (cross_entropy_from_probs)
        override this alone."""
        xp = self.xp
        in_place = sel is None and self.channels is not None and (grad is None or grad is self.layout_grad)
        x, y, t = (self.x_orig, self.y, self.t_layout) if in_place else self._selected(sel)
        y = y if y is not None else _placeholder(xp, 1, np.int64)
        rs = row_scale if row_scale is not None else _placeholder(xp, 1, np.float64)
        loss_scale = math.ldexp(1.0, -self.loss_scale() if loss_exp is None else int(loss_exp))
        if in_place:
            # torch's layout read as it lies (targets too), the gradient written in it (_channels)
            t = t.reshape(self.channels) if t is not None else _placeholder(xp, 3, self.dtype)
            g = grad.reshape(self.channels) if grad is not None else _placeholder(xp, 3, self.dtype)
            self.k.softmax_xent_channels(x.reshape(self.channels), y, t, w, self.ignore_index, self.eps, self.z,
                                         rs, scale, loss, g, self.n_threads, self.y is not None,
                                         self.has_t, self.w is not None, row_scale is not None,
                                         grad is not None, loss_scale)
            return
        t = t if t is not None else _placeholder(xp, 2, self.dtype)
        g = grad if grad is not None else _placeholder(xp, 2, self.dtype)
        self.k.softmax_xent(x, y, t, w, self.ignore_index, self.eps, self.z, rs, scale, loss, g,
                            self.n_threads if sel is None else 1, self.y is not None, self.has_t,
                            self.w is not None,
                            row_scale is not None, grad is not None, False, loss_scale)

    def reduce(self, row_losses):
        if self.reduction == "none":
            with np.errstate(over="ignore"):  # a double loss beyond float32's range is inf, as it should be
                return row_losses.astype(self.loss_dtype).reshape(self.batch_shape)
        hi, lo, tiny = _sum_and_tiny(self.backend, row_losses, self.n_threads)
        k = self.loss_scale()  # the rows came scaled by 2^-k (run); undo it after dividing
        if tiny:
            # every row loss sits on (or near) the subnormal grid, where a sum or a mean of n of them
            # carries up to n/2 grid steps: take the losses again scaled by 2^600 more (the kernel
            # applies the scale to the weights, exactly), and unscale once at the end.  On top of the
            # mean's 2^-k, not in its place: with tiny weights (k << 0) the rows were tiny because the
            # weights are, and 2^600 alone left them on the grid (w = 1e-250: a mean of 0).  Capped at
            # 2^1023, the largest scale a double holds; the scaled rows stay below 2^-369.
            self._logits_intact()
            scaled = self.xp.empty(self.N, dtype=np.float64)
            s = min(int(_TINY_K) - k, 1023)
            self._launch(self._w_or_empty(), None, 1.0, scaled, None, loss_exp=s)
            hi, lo = _dd_sum(self.backend, scaled, self.n_threads)
            k = -s
        if self.reduction == "sum":
            total = (hi + lo) * math.ldexp(1.0, k)
        else:
            den = self.denominator()
            if den == 0:
                return self.backend.result(np.nan if self.empty_mean == "nan" else 0.0, self.loss_dtype)
            # den = m 2^e: dividing by m and scaling by 2^(k - e) once gives the bits of hi / den * 2^k
            # wherever neither step over- or underflowed, and the mean itself where hi / den would have
            # (smoothing's w_c terms can make a row scaled by 2^-k large while den is tiny); inf only if
            # the mean itself overflows
            m, e = math.frexp(den)
            total = _ldexp_inf(hi / m + lo / m, k - e)
        return self.backend.result(total, self.loss_dtype)


def _loss_and_grad(problem, buf, grad_output, **grad_only):
    """The reduced loss, with the gradient written into `buf` (a problem of either family).

    When `buf` is the logits themselves (inplace=True, no copy) and the reduction may have to launch the
    kernel on them again after the gradient pass (rerun_possible: never in ordinary cases), the loss is
    reduced first, from a forward pass, and the gradient pass comes after it (one more pass, bits
    unchanged: a fused pass gives the same losses and gradient as the separate ones).  `grad_only`: the
    run() options of that gradient pass (the binary family can skip its losses)."""
    holds_logits = buf is _rows_made(problem)
    if holds_logits and problem.reduction != "none":
        problem.upstream(grad_output)  # a bad grad_output still raises before any kernel runs
    if holds_logits and problem.reduction != "none" and problem.rerun_possible():
        loss = problem.reduce(problem.run())
        problem.run(grad=buf, grad_output=grad_output, **grad_only)
        problem.input_overwritten = True
        return loss
    losses = problem.run(grad=buf, grad_output=grad_output)
    problem.input_overwritten = holds_logits
    return problem.reduce(losses)


def _rows_made(problem):
    """The problem's rows where they exist, without making them (_Problem.rows in torch's layout)."""
    return problem._rows if isinstance(problem, _Problem) else problem.rows


def _caller_memory(backend, a):
    """The caller's argument as an array of the backend over its own memory, or None.  On the CPU a
    buffer object (memoryview, ctypes array, __array_interface__) is viewed, not copied; a list gives
    a fresh array, which overlaps nothing, and so does anything that is no array at all."""
    if a is None or backend.owns(a):
        return a
    if backend.is_cpu and not isinstance(a, (list, tuple)):
        try:
            a = np.asarray(a)
        except (TypeError, ValueError, RuntimeError):
            return None                                  # the argument's own check reports what is wrong
        return a if a.dtype != object else None
    return None


def _check_apart(problem, dest, what, grad_output):
    """dest (out=, or the input with inplace=True) has no two elements in one place (each would hold the
    last gradient written there) and shares no memory with anything else the kernels read: they read
    targets, weights and the upstream gradient while writing the gradient (a row's target probabilities
    after its exponentials were kept in the gradient buffer, say)."""
    backend = problem.backend
    if backend.has_internal_overlap(dest):
        raise ValueError(f"{what}: some of its elements share memory (a broadcast or stride-0 view); the "
                         f"gradient needs a place of its own for every element")
    named = problem.read_arrays() + tuple((name, _caller_memory(backend, a)) for name, a in
                                          problem.given_arrays + (("grad_output", grad_output),))
    for name, a in named:
        if a is not None and backend.owns(a) and backend.overlaps(dest, a):
            raise ValueError(f"{what}: shares memory with {name}; the gradient needs a buffer of its own")


def _check_flag(value, name):
    """A bool argument: "no" or 0.5 would otherwise pass as True (inplace="no" overwrote the input)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def _grad_target(problem, out, inplace, grad_output=None):
    """The (N, C) C-contiguous buffer the kernel writes the gradient into (in torch's layout read in place,
    problem.channels, a buffer in the input's layout: problem.layout_grad), and how to hand it back.

    Half-precision inputs (problem.x_orig is then a float64 copy of problem.x_given) always get a float64
    buffer of their own, rounded into `out` or the input by _finish_grad: the widened copy itself is not
    reused, because a reduction may launch the kernel on the logits again after the gradient pass."""
    x = problem.x_orig
    given = problem.x_given
    backend = problem.backend
    xp = backend.xp
    inplace = _check_flag(inplace, "inplace")
    direct = problem.grad_dtype == problem.dtype
    last_axis_contiguous = direct and _class_axis_last_in_memory(x.shape, problem.axis) and x.flags.c_contiguous
    if inplace:
        if out is not None:
            raise ValueError("out: cannot be combined with inplace=True (the gradient goes into input)")
        _check_apart(problem, given, "input (inplace=True)", grad_output)
        if last_axis_contiguous:
            return problem.rows, given
        return xp.empty_like(problem.rows), given
    if out is not None:
        if not backend.owns(out):
            raise TypeError(f"out: expected a {backend.array_type.__module__}.{backend.array_type.__name__} "
                            f"(the input's kind), got {type(out).__name__}")
        if out.shape != given.shape or out.dtype != given.dtype:
            swapped = not out.dtype.isnative and out.dtype.newbyteorder("=") == given.dtype
            order = " in native byte order" if swapped else ""
            raise ValueError(f"out: expected shape {given.shape} and dtype {given.dtype}{order}; got shape "
                             f"{out.shape}, dtype {out.dtype.str if swapped else out.dtype}")
        if not getattr(out.flags, "writeable", True):
            raise ValueError("out: the array is read-only")
        if backend.overlaps(out, given):
            raise ValueError("out: overlaps input; use inplace=True to write the gradient into input")
        _check_apart(problem, out, "out", grad_output)
        if last_axis_contiguous and out.flags.c_contiguous:
            return out.reshape(problem.rows.shape), out
    if direct and getattr(problem, "channels", None) is not None:
        # the kernel writes torch's layout as the input lies (_Problem._launch)
        problem.layout_grad = out if out is not None and out.flags.c_contiguous else xp.empty_like(x)
        return problem.layout_grad, out
    if out is not None:
        return xp.empty_like(problem.rows), out
    return xp.empty_like(problem.rows), None


def _finish_grad(problem, buf, dest):
    """Return the gradient in the input's layout and dtype, copying into `dest` when the kernel wrote
    elsewhere; a half-precision gradient is rounded here, once (xentfast._dtypes (c))."""
    xp = problem.backend.xp
    x = problem.x_orig
    if buf is getattr(problem, "layout_grad", None):
        # written in the input's layout and dtype already (_grad_target)
        if dest is not None and dest is not buf:
            dest[...] = buf
        return buf if dest is None else dest
    if dest is None and _class_axis_last_in_memory(x.shape, problem.axis) and buf.dtype == problem.grad_dtype:
        # the kernel wrote a fresh C-contiguous buffer in the input's layout: hand it over as it is
        return buf if buf.shape == x.shape else buf.reshape(x.shape)
    if problem.grad_dtype == buf.dtype and (dest is None or not problem.backend.overlaps(buf, dest)):
        moved = _restore_contiguous(buf, problem.batch_shape, problem.axis, problem.n_threads, dest)
        if moved is not None:
            return moved
    shaped = _restore(buf, problem.batch_shape, problem.axis)
    if problem.grad_dtype != buf.dtype:
        shaped = _dtypes.round_to(shaped, problem.grad_dtype)
    if dest is None:
        return xp.ascontiguousarray(shaped)
    if not problem.backend.overlaps(buf, dest):
        dest[...] = shaped
    return dest


def _on_input_device(fn=None, *, plain_lane=None):
    """Run a public function with the device of its first CuPy argument current (kernels and outputs
    land there); a no-op for NumPy calls.  Arrays of other libraries (torch, JAX, anything with
    ``__dlpack__``) are read through DLPack and the results handed back as ``input``'s kind
    (xentfast._backend (d)).

    ``plain_lane``: a C-level function with ``fn``'s signature that computes the most common small call
    itself (or returns NotImplemented), tried first (the plain-call lanes of _core/_xent.pyx and
    _core/_binary.pyx)."""
    if fn is None:
        return functools.partial(_on_input_device, plain_lane=plain_lane)
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if plain_lane is not None:
            try:
                result = plain_lane(*args, **kwargs)
            except TypeError:   # arguments fn does not take either: fn raises, naming itself
                result = NotImplemented
            if result is not NotImplemented:
                return result
        # subnormals are never flushed, whatever the caller set (torch.set_flush_denormal, XLA's threads):
        # the documented bounds count the subnormal spacing.  The kernels' OpenMP threads do the same in
        # each parallel region (_core/fp_ieee.h); this covers the calling thread's own arithmetic.
        fp_saved = _fp_ieee_enter()
        try:
            return run(args, kwargs)
        except ValueError as exc:
            # NumPy's message for a ragged list, or one nested deeper than 64 levels, names no argument:
            # find the one it came from
            numpy_says = "inhomogeneous" in str(exc) or "setting an array element with a sequence" in str(exc)
            ragged = _backend.ragged_argument(signature, args, kwargs) if numpy_says else None
            if ragged is None or str(exc).startswith(f"{ragged}:"):
                raise
            raise ValueError(f"{ragged}: {exc}") from None
        finally:
            _fp_ieee_leave(fp_saved)

    def run(args, kwargs):
        plain = _backend.plain_call(args, kwargs)
        if plain and not _backend.may_hold_masked(args, kwargs):
            return fn(*args, **kwargs)
        masked = _backend.masked_argument(signature, args, kwargs)
        if masked is not None:
            name, in_sequence = masked
            what, fill = (("a list holding a masked array", "each masked array's .filled(value)")
                          if in_sequence else ("a masked array", f"{name}.filled(value)"))
            raise TypeError(f"{name}: {what}, whose mask would be ignored (masked entries read as values); "
                            f"pass {fill}, and leave rows out with ignore_index or weights")
        if plain:
            return fn(*args, **kwargs)
        if _backend.has_foreign(args, kwargs):
            return _backend.call_foreign(fn, signature, args, kwargs)
        with _backend.device_of_call(args, kwargs):
            return fn(*args, **kwargs)
    return call


# ---------------------------------------------------------------------------------------------------
# public functions

# shared by every public function of both families (xentfast.api_binary imports them)
_HALF_BOUND = """
    float16 / bfloat16 input: every loss (per row or element, 'mean', 'sum') in float32 within 1 ULP of
    float32, and every gradient entry in the input's dtype within 1 ULP of that dtype (relative, or in ulps
    of the same scale as above), of the exact value for the half-precision inputs.  Analysis: 0.5 ULP (the
    one final rounding) plus under 2^-26; measured maximum 0.50."""

_HALF_NOTES = """
    Half precision and other array types: float16 and ``ml_dtypes.bfloat16`` inputs are widened exactly
    to float64 and run through the float64 kernels, so a call holds a float64 copy of the input (4x its
    memory) and, for a gradient, a float64 gradient buffer as well; a kernel that reads half precision
    directly may come later.  The loss is then rounded once to float32, the gradient once to the input's
    dtype (bfloat16 through float32 rounded to odd, so not twice).  Half-precision targets, weights and
    ``grad_output`` are widened exactly too, never rounded to half.  torch tensors, JAX arrays and any
    other array with ``__dlpack__`` are read through DLPack (CPU: NumPy, CUDA: CuPy), and the results
    come back as ``input``'s kind (``out=`` and an in-place gradient as the caller's own object).  A torch
    tensor that requires grad raises TypeError: ``xentfast.torch`` has the autograd ops.  JAX arrays are
    read-only here, so ``inplace=True`` on one raises ValueError."""

_XENT_DOC_PARAMS = """
    input : array_like of float16, bfloat16, float32 or float64, or any array with ``__dlpack__``
        Logits; the class axis is ``axis``.  Half precision costs a float64 copy (Notes).
    target : array_like
        Integer class indices, shape of ``input`` without ``axis`` (any integer dtype), or class
        probabilities of ``input``'s shape (cast to ``input``'s dtype; to float64, exactly, for half
        precision).
    weight : array_like, shape (C,), optional
        Class weights, finite and >= 0.
    ignore_index : int, default -100
        Index targets equal to it contribute 0 loss and 0 gradient, whatever their logits hold (even NaN),
        and are left out of the mean's denominator.  With probability targets only the default is
        accepted (ValueError otherwise, as torch raises).
    reduction : {'none', 'mean', 'sum'}, default 'mean'
        'mean' divides by the sum of the target classes' weights over kept rows (index targets) or by the
        number of rows (probability targets), as torch does.
    label_smoothing : float, 0 or in [2**-900, 1], default 0.0
        Mixes the target with the uniform distribution over classes with finite logits.  Nonzero values
        below 2**-900 raise ValueError (their per-class mass would be subnormal).
    axis : int, default -1
        The class axis (torch's ``(N, C, d1, ...)`` layout is ``axis=1``).
    z_loss : float >= 0, default 0.0
        Adds ``z_loss * r * logsumexp(row)**2`` per row (PaLM's auxiliary loss), ``r`` being the row's weight
        (``weight[target]`` for index targets, 1 for probabilities), so 'mean' averages it like the loss.
        A row whose lse cancels (log-probabilities as logits: lse ~ 0) takes :func:`logsumexp`'s exact
        path, 150-450 times the cost of an ordinary row.
    empty_mean : {'nan', 'zero'}, default 'nan'
        Result of ``reduction='mean'`` when the denominator is 0 (all rows ignored, zero weights, no rows):
        NaN as torch, or 0.  The gradient is 0 in both cases.
    nan_policy : {'propagate', 'raise'}, default 'propagate'
        'propagate': a NaN logit or target probability makes its row's loss and gradient NaN.  'raise':
        ValueError naming the first row and class holding a NaN, ignored rows excepted (costs one extra
        read of the logits, and of the target probabilities).
    n_threads : int, optional
        OpenMP threads; None means all available (``OMP_NUM_THREADS``).  Results are bitwise identical
        for every value."""

_XENT_DOC_NOTES = """
    Semantics (per row, class axis last; m = max x, lse = log sum exp x, p = softmax x):

    * effective target mass ``q_c``: index targets ``(1-eps) w_y [c=y] + eps/C_eff w_c [x_c > -inf]``,
      probabilities ``w_c ((1-eps) t_c + eps/C_eff [x_c > -inf])``, where ``C_eff`` counts the classes
      with finite logits;
    * loss = ``sum_c q_c (lse - x_c) + z_loss r lse**2`` with ``0 * inf = 0``;
    * d loss / d x_j = ``p_j (sum_c q_c + 2 z_loss r lse) - q_j``.

    Evaluated without cancellation: ``lse - x_y = (m - x_y) + log1p(s)`` with ``s`` the sum of
    ``exp(x_j - m)`` over every class but the argmax, so confident rows keep their tiny loss; the target's
    gradient is ``-s/S`` (or ``p_y - 1`` with ``p_y <= 1/2``), never ``p_y - 1`` near 1.

    Special values: ``-inf`` logits are masked classes (probability 0, gradient 0); a ``-inf`` target
    logit gives loss ``+inf`` with a finite gradient; a row with a NaN, a ``+inf`` logit, or only ``-inf``
    logits has NaN loss and gradient (no softmax exists).  Ignored rows are 0.

    Deliberate differences from ``torch.nn.functional.cross_entropy``: label smoothing spreads over the
    classes with finite logits (torch spreads over all C and returns +inf when one is -inf); label
    smoothing in (0, 2**-900) is refused; ``z_loss``, ``empty_mean`` and ``nan_policy`` are extras.  (Rows
    with a ``+inf`` logit are NaN in both.)
""" + _HALF_NOTES


def _document(fn, summary, params, returns, bound, notes, examples=None):
    """Gives a public function its numpydoc docstring from these parts, in the order every loss shares,
    so that none leaves out its error bound (the accuracy contract; tests/test_docs.py checks it)."""
    sections = [summary, f"Parameters\n    ----------{params}", f"Returns\n    -------\n    {returns}",
                f"Error bound\n    -----------{bound}", f"Notes\n    -----{notes}"]
    if examples:
        sections.append(f"Examples\n    --------\n    {examples}")
    fn.__doc__ = "\n\n    ".join(sections) + "\n    "


def _upstream_param(shape_clause):
    """The backward functions' first parameter, grad_output: `shape_clause` gives its shape for
    reduction='none'."""
    return ("\n    grad_output : array_like, scalar or None\n        Upstream gradient: " + shape_clause +
            ", a scalar otherwise; None means 1 (every entry).")


@_on_input_device(plain_lane=_xent.plain_cross_entropy)
def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, *,
                  axis=-1, z_loss=0.0, empty_mean="nan", nan_policy="propagate", n_threads=None):
    p = _Problem(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss, empty_mean,
                 nan_policy, n_threads)
    return p.reduce(p.run())


_document(
    cross_entropy, "Softmax cross-entropy between logits and targets (torch.nn.functional semantics).",
    _XENT_DOC_PARAMS,
    "loss : ndarray or scalar of input's dtype (float32 for float16 / bfloat16 input)\n"
    "        Shape of ``input`` without ``axis`` for ``reduction='none'``, else a NumPy scalar.",
    """
    Per-row loss: <= 2 ULP (float32), <= 4 ULP (float64) of the exact value of the rounded inputs.
    'mean' / 'sum' (with weights, ignore_index): <= 4 ULP.  Measured against ``xentfast.reference``.
    Known misses at extreme class weights (beyond ~2^±50, float64): the README's "Known limits".""" +
    _HALF_BOUND,
    _XENT_DOC_NOTES,
    """>>> import numpy as np, xentfast
    >>> x = np.array([[30.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    >>> xentfast.cross_entropy(x, np.array([0, 1]), reduction="none")   # doctest: +SKIP
    array([9.357623e-14, 6.931472e-01], dtype=float32)""")


@_on_input_device
def cross_entropy_backward(grad_output, input, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0, *, axis=-1, z_loss=0.0, empty_mean="nan",
                           nan_policy="propagate", n_threads=None):
    p = _Problem(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss, empty_mean,
                 nan_policy, n_threads, grad_output=grad_output)
    buf, dest = _grad_target(p, None, False)
    p.run(grad=buf, grad_output=grad_output)
    return _finish_grad(p, buf, dest)


_document(
    cross_entropy_backward, """Gradient of :func:`cross_entropy` with respect to ``input``.

    Returns d/d input of ``(cross_entropy(...) * grad_output).sum()``: the exact derivative of the forward.""",
    _upstream_param("the loss's shape for ``reduction='none'``") + _XENT_DOC_PARAMS,
    "dinput : ndarray, input's shape and dtype (C-contiguous)",
    """
    Index targets without smoothing or z-loss: <= 2 ULP (float32), <= 4 ULP (float64), relative, every
    entry including the target class.  Probability targets, smoothing, z-loss (where ``p_j A - q_j``
    cancels by nature): the same numbers in units of ``ulp(|p_j A| + |q_j|)`` times the upstream scale,
    with ``A = sum_c q_c + 2 z_loss r lse``.  That holds also where ``A``'s two terms cancel (``lse``
    near ``-sum_c q_c / (2 z_loss r)``: all logits negative), down to ``|A| ~ 2**-44 (|sum_c q_c| +
    C |2 z_loss r|)``; closer still, ``A`` is within ``(C + 18) 2**-99 |z_loss r| + 2**-100 |sum_c q_c|``
    absolutely.  An upstream factor other than 1 (``grad_output``, or the mean's ``1 / sum w``) adds
    one ULP, its rounding.""" + _HALF_BOUND,
    _XENT_DOC_NOTES)


@_on_input_device(plain_lane=_xent.plain_cross_entropy_with_grad)
def cross_entropy_with_grad(input, target, weight=None, ignore_index=-100, reduction="mean",
                            label_smoothing=0.0, *, axis=-1, z_loss=0.0, empty_mean="nan",
                            nan_policy="propagate", grad_output=None, out=None, inplace=False,
                            n_threads=None):
    p = _Problem(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss, empty_mean,
                 nan_policy, n_threads, inplace=inplace, grad_output=grad_output, out=out)
    buf, dest = _grad_target(p, out, inplace, grad_output)
    loss = _loss_and_grad(p, buf, grad_output)
    g = _finish_grad(p, buf, dest)
    # the caller's object itself, as the binary family returns it (dest is a base-class view of an
    # ndarray subclass: np.memmap, np.matrix)
    return loss, (input if inplace else g)


_document(
    cross_entropy_with_grad, """Loss and gradient from one fused pass.

    Returns ``(loss, dinput)`` where ``loss`` is :func:`cross_entropy`'s result and ``dinput`` the gradient
    of ``(loss * grad_output).sum()`` (``grad_output`` defaults to 1), bitwise equal to what
    :func:`cross_entropy` and :func:`cross_entropy_backward` return separately.""",
    _XENT_DOC_PARAMS + """
    grad_output : array_like or scalar, optional
        As in :func:`cross_entropy_backward`.
    out : ndarray, optional
        Buffer of ``input``'s shape and dtype for the gradient (must not overlap ``input``).
    inplace : bool, default False
        Write the gradient into ``input`` (a writeable ndarray); no N x C allocation when the class axis is
        last and ``input`` is C-contiguous (half precision: always a float64 buffer, rounded into
        ``input``).  The results have the bits of ``inplace=False``.  A 'mean' or 'sum' first computes
        the loss of one row; if every row loss may be below 2**-969 (their reduction then reads the
        logits again), the loss is reduced before the gradient pass, at the cost of one more pass.""",
    "loss : as :func:`cross_entropy`\n    dinput : ndarray (``out`` or ``input`` when given)",
    """
    As :func:`cross_entropy` for the loss and :func:`cross_entropy_backward` for the gradient, half
    precision included.""",
    _XENT_DOC_NOTES)


def _softmax_family(input, axis, n_threads, mode):
    backend = _backend.for_call(input=input)
    xp = backend.xp
    x, given = _as_logits(input, backend=backend)
    # logsumexp and log_softmax are loss-like (float32 for half inputs), softmax a probability (the
    # input's dtype): xentfast._dtypes (a)
    out_dtype = given.dtype if mode == 2 else _dtypes.loss_dtype(given.dtype)
    ax = _class_axis(axis, x.ndim)
    nt = _threads_for(n_threads, x.size)
    channels = _channels(x, ax) if given.dtype == x.dtype else None
    if channels is not None:
        # torch's layout read and written as it lies where the path's groups take its classes (_channels)
        k = backend.softmax
        if mode == 0:
            lse = np.empty(channels[0] * channels[2])
            if k.softmax_family_channels(x.reshape(channels), _placeholder(np, 3, x.dtype), lse, 0, nt):
                return lse.astype(out_dtype).reshape(x.shape[:ax] + x.shape[ax + 1:])
        else:
            out = np.empty_like(x)
            if k.softmax_family_channels(x.reshape(channels), out.reshape(channels), _placeholder(np, 1, np.float64),
                                         mode, nt):
                return out
    rows, batch_shape, C = _rows(x, ax, nt)
    lse = xp.empty(rows.shape[0], dtype=np.float64)
    if mode == 0:
        if C == 0:
            return xp.full(batch_shape, -np.inf, dtype=out_dtype)
        backend.softmax.softmax_family(rows, xp.empty((0, 0), dtype=x.dtype), lse, 0, nt, True)
        return lse.astype(out_dtype).reshape(batch_shape)
    out = xp.empty_like(rows)
    if C:
        backend.softmax.softmax_family(rows, out, lse, mode, nt, False)
    moved = _restore_contiguous(out, batch_shape, ax, nt) if out_dtype == out.dtype else None
    if moved is not None:
        return moved
    return xp.ascontiguousarray(_dtypes.round_to(_restore(out, batch_shape, ax), out_dtype))


@_on_input_device(plain_lane=_xent.plain_logsumexp)
def logsumexp(input, axis=-1, *, n_threads=None):
    """log(sum(exp(input))) along ``axis``, without overflow.

    Returns an array of ``input``'s dtype (float32 for float16 / bfloat16 input) and shape without
    ``axis``.  ``input`` may be any array type and dtype the losses take (:func:`cross_entropy`, Notes: a
    half-precision input is widened to a float64 copy).  Special values: a row of only
    ``-inf`` gives ``-inf`` (the empty sum), any ``+inf`` gives ``+inf``, any NaN gives NaN; an empty
    class axis gives ``-inf``.

    Error bound
    -----------
    <= 2 ULP (float32), <= 4 ULP (float64) on every row, relative to the result (subnormal spacing
    below the normals).  Where ``max x`` and ``log S`` cancel (``log S > 2 |lse|``, possible only for
    ``max x`` in ``[-1.5 log C, 0)``; e.g. a row of log-probabilities, whose lse is ~1e-16, or rows
    whose lse is subnormal) the row is recomputed as ``log1p(sum(exp(x)) - 1)`` at rising precision
    (double-double, then 160-, 480- and 1216-bit fixed point) until a proven error bound is small
    enough; such rows cost 150-450 times an ordinary row (500 classes, one thread: ~0.05 ms float32,
    ~0.3 ms float64), other rows nothing.
    The fixed-point steps hold rows of fewer than 2**32 classes; a cancelling row wider than that keeps
    the double-double value, whose bound is not proven.  float16 / bfloat16 input: <= 1 ULP of float32.
    """
    return _softmax_family(input, axis, n_threads, 0)


@_on_input_device(plain_lane=_xent.plain_log_softmax)
def log_softmax(input, axis=-1, *, n_threads=None):
    """``input - logsumexp(input)`` along ``axis``, evaluated as ``(x - m) - log1p(s)``.

    Rows with a NaN, a ``+inf`` logit or only ``-inf`` logits are NaN; ``-inf`` entries of other rows
    give ``-inf``.  Returns ``input``'s dtype, float32 for float16 / bfloat16 input (a float64 copy is
    made); any array type the losses take.

    Error bound
    -----------
    <= 2 ULP (float32), <= 4 ULP (float64), every entry; float16 / bfloat16 input: <= 1 ULP of float32.
    """
    return _softmax_family(input, axis, n_threads, 1)


@_on_input_device(plain_lane=_xent.plain_softmax)
def softmax(input, axis=-1, *, n_threads=None):
    """``exp(input - logsumexp(input))`` along ``axis``.

    Same special-value policy as :func:`log_softmax`; ``-inf`` entries give exactly 0.  Tiny
    probabilities are not flushed to 0 before they underflow the dtype.  Returns ``input``'s dtype, half
    precision included (computed from a float64 copy, rounded once); any array type the losses take.
    Each entry is ``exp(x_j - m)`` times ``1 / S`` rounded once, by the kernel of
    :func:`cross_entropy_with_grad`: off the target class, its ``reduction="sum"`` gradient holds the
    same bits.

    Error bound
    -----------
    <= 2 ULP (float32), <= 4 ULP (float64), every entry (relative, subnormal spacing below the normals);
    <= 1 ULP of float16 / bfloat16 for half-precision input.
    """
    return _softmax_family(input, axis, n_threads, 2)


# ---------------------------------------------------------------------------------------------------
# helpers for the elementwise (binary) family, used by xentfast.api_binary; the softmax functions above
# keep _as_logits, whose messages speak of a class axis


def _as_float_input(input, name="input", what="logits", writeable=False, backend=_backend.CPU):
    """(x, given) for a float16, bfloat16, float32 or float64 array of any rank (0-d included).

    `given` is the caller's array (it receives an in-place gradient); `x` is what the kernels read:
    `given` itself for float32/float64, a float64 copy for half precision (exact, and 4x the memory of
    `given`: xentfast._dtypes (a)).  Messages call the values `what`.  `writeable` is the caller's
    `inplace`, checked here first: an array there would fail in `if` with NumPy's ambiguity message."""
    if _check_flag(writeable, "inplace"):
        if not backend.owns(input):
            raise TypeError(f"{name}: inplace=True needs a NumPy or CuPy array to write into, "
                            f"got {type(input).__name__}")
        if not getattr(input.flags, "writeable", True):
            raise ValueError(f"{name}: inplace=True on a read-only array; pass a writeable copy or use out=")
    given = backend.xp.asarray(input)
    dt = given.dtype
    if not dt.isnative and (dt.newbyteorder("=") in _FLOAT_DTYPES or _dtypes.is_half(dt.newbyteorder("="))):
        # the kernels read native numbers: a byte-swapped array is read through a native copy, as NumPy's
        # own functions do, and the results come back in native byte order
        if writeable:
            raise TypeError(f"{name}: inplace=True needs native byte order, got dtype {dt.str!r}; convert with "
                            f".astype({name}.dtype.newbyteorder('='))")
        given = given.astype(dt.newbyteorder("="))
        dt = given.dtype
    if dt in _FLOAT_DTYPES:
        return given, given
    if _dtypes.is_half(dt):
        return given.astype(np.float64), given
    hint = ""
    if dt.kind in "iub":
        # the drop-ins reach this check with their tensors viewed as NumPy arrays: no library's idiom here
        hint = f" ({what} must be floating point; cast them to float32 or float64 if integers were meant)"
    elif dt.kind == "f":
        hint = " (cast to float64: wider formats are not supported)"
    elif dt.kind == "c":
        hint = f" ({what} must be real)"
    raise TypeError(f"{name}: expected float16, bfloat16, float32 or float64 {what}, got dtype {dt}{hint}")


def _first_bad(mask, shape):
    """Flat index of the first True entry of `mask` and its multi-index text, or None."""
    if not mask.any():
        return None
    k = int(np.flatnonzero(mask.ravel())[0])
    return k, _fmt_index(k, shape)
