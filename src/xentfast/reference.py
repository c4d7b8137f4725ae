"""Exact arbitrary-precision reference for every public xentfast function.

This module recomputes, with :mod:`mpmath`, the mathematically exact value of each public function of
xentfast -- the forward losses, ``logsumexp``, ``log_softmax``, ``softmax`` and the gradient of the
cross-entropy; for the binary family ``binary_cross_entropy_with_logits``, ``sigmoid_focal_loss``,
``binary_cross_entropy`` and ``cross_entropy_from_probs`` with their ``*_grad`` (see the section
"Binary family" below for their semantics) -- so that any implementation (xentfast's own kernels, or a user's) can be measured in
ulps against it.  It is pure Python, depends only on NumPy and mpmath, and is slow (tens of
microseconds per element): it is meant for small arrays in tests, not for training.

Precision
---------
Every function takes ``dps`` (decimal digits, default 60; use at least 50).  Inputs are converted to
mpmath numbers *exactly* (every float32/float64 is a dyadic rational), and each result is computed so
that its relative error is below ``10**-dps``, or -- for values below the float64 range, which round
to a subnormal or to zero anyway -- its absolute error is below ``10**-dps`` times the float64
subnormal spacing ``2**-1074`` (divided by the factor the value is later multiplied by).  Where the
defining formula cancels (``p_y - 1`` in a confident row, ``p_j - t_j`` for soft targets close to the
softmax, ``lse`` close to 0), the computation is repeated at a higher working precision until that
holds, so the results really are exact at the working precision.  Each function works inside its own
:func:`mpmath.workprec` context and never touches the global ``mpmath.mp`` precision.

Results are **not rounded** to the input's float format: arrays are NumPy ``dtype=object`` arrays of
:class:`mpmath.mpf`, and any 0-d result (``reduction="mean"`` or ``"sum"``, or a 1-D input reduced
over its only axis) is returned as a plain :class:`mpmath.mpf`.  Use :func:`rounded` to obtain the
correctly rounded float32/float64 value, and :func:`xentfast.testing.ulp_error` /
:func:`xentfast.testing.assert_ulp_close` to measure a result in ulps.

Inputs may also be ``dtype=object`` arrays of :class:`mpmath.mpf` (used as exact values), which is
what makes finite-difference checks of the gradient at high precision possible.

Examples
--------
>>> import numpy as np
>>> from xentfast import reference as ref
>>> x = np.array([[2.0, 0.5, -1.0]])
>>> y = np.array([0])
>>> exact = ref.cross_entropy(x, y)                 # mpf, exact to 60 digits
>>> float(ref.rounded(exact, np.float64))           # correctly rounded float64
0.24131129665715706
>>> g = ref.cross_entropy_grad(x, y)                 # object array, shape (1, 3)

Semantics (summary of the contract)
-----------------------------------
Per row along ``axis`` with logits ``x``: ``m = max x``, ``lse = log sum exp x``,
``p_j = exp(x_j - lse)``.

* Row classes, checked in this order: a row whose index target equals ``ignore_index`` has loss 0
  and gradient 0 whatever its logits hold, and does not count in the mean's denominator; a row with
  any NaN, any ``+inf``, or only ``-inf`` logits has loss NaN and an all-NaN gradient row.  Otherwise
  ``-inf`` logits are *masked* classes with ``p_j = 0``; ``C_eff`` counts the finite logits.
* Effective target ``q`` and row weight ``r`` (``eps = label_smoothing``, ``w`` class weights, 1 when
  absent): index target ``y`` -> ``q_c = (1-eps) w_y [c==y] + eps/C_eff w_c [x_c > -inf]``,
  ``r = w_y``; probability target ``t`` -> ``q_c = w_c ((1-eps) t_c + eps/C_eff [x_c > -inf])``,
  ``r = 1``.
* Loss ``sum_c q_c (lse - x_c) + z_loss r lse**2`` with ``0 * inf = 0`` (a class with ``q_c == 0``
  contributes nothing; a ``-inf`` logit with ``q_c > 0`` gives ``+inf``).
* Gradient ``p_j (A + 2 z_loss r lse) - q_j`` with ``A = sum_c q_c``: 0 for a masked class without
  target mass, and exactly ``-q_j`` for a masked class that carries target mass (``p_j = 0``).
* ``"mean"`` divides by ``sum of w_y`` over non-ignored rows (index targets) or by the number of
  rows (probability targets); a zero denominator gives NaN (``empty_mean="nan"``) or 0
  (``empty_mean="zero"``) and an all-zero gradient.
* ``logsumexp``: all ``-inf`` -> ``-inf``, any ``+inf`` -> ``+inf``, any NaN -> NaN.
  ``log_softmax`` / ``softmax``: rows with NaN, ``+inf`` or only ``-inf`` are all NaN; ``-inf``
  entries of other rows give ``-inf`` / 0.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
from mpmath import libmp, mpf

from . import _dtypes

__all__ = [
    "cross_entropy",
    "cross_entropy_grad",
    "logsumexp",
    "log_softmax",
    "softmax",
    "binary_cross_entropy_with_logits",
    "binary_cross_entropy_with_logits_grad",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_grad",
    "binary_cross_entropy",
    "binary_cross_entropy_grad",
    "cross_entropy_from_probs",
    "cross_entropy_from_probs_grad",
    "rounded",
]

_MP = mpmath.mp
_ZERO = _MP.make_mpf(libmp.fzero)
_ONE = _MP.make_mpf(libmp.fone)
_INF = _MP.make_mpf(libmp.finf)
_NINF = _MP.make_mpf(libmp.fninf)
_NAN = _MP.make_mpf(libmp.fnan)
# The derivative of an element or class entry that no term of the loss depends on (an ignored element, a
# zero weight, both target masses 0, a probability clipped or clamped on its only term, a class without
# target mass): 0 under any upstream factor, +-inf and NaN included (README, special values), as the
# kernels' term-wise products give it.  Marked by identity, not value: a derivative that merely evaluates
# to 0 (x = 0 with y = 1/2) is still multiplied by the factor, and inf * 0 is NaN there.
_NO_TERM = _MP.make_mpf(libmp.fzero)

# Absolute accuracy goal, in bits below the float64 subnormal spacing 2**-1074 (plus target_bits):
# values that small are subnormal or zero in every IEEE format, so a refinement never has to chase
# e.g. exp(-1e300) to full relative precision.
_SUBNORMAL_LOG2 = -1074
# Guards the adaptive precision loop against pathological factors (e.g. grad_output = 1e308).
_MAX_PREC = 1 << 15

# (precision p, minimum normal exponent, maximum exponent) of the IEEE formats rounded() supports.
_FORMATS = {
    np.dtype(np.float16): (11, -14, 15),
    np.dtype(np.float32): (24, -126, 127),
    np.dtype(np.float64): (53, -1022, 1023),
}


# bfloat16 (ml_dtypes) is float32's exponent range with 8 bits of precision; it is recognised by identity
# with ml_dtypes.bfloat16 (xentfast._dtypes), so ml_dtypes stays optional
_BFLOAT16 = (8, -126, 127)


def _format(dtype):
    dt = np.dtype(dtype)
    try:
        return _FORMATS[dt]
    except KeyError:
        if _dtypes.is_bfloat16(dt):
            return _BFLOAT16
        raise ValueError(f"unsupported floating-point dtype {dt}; expected float16, bfloat16, float32 or "
                         f"float64") from None


def _pow2(n):
    """Exact 2**n as an mpf (independent of the working precision)."""
    return _MP.make_mpf((0, 1, int(n), 1))


# --------------------------------------------------------------------------------------------------
# Conversion


def _exact_mpf(v):
    """Convert one scalar to an mpf without rounding."""
    if isinstance(v, mpf):
        return v
    if isinstance(v, (bool, np.bool_)):
        return _ONE if v else _ZERO
    if isinstance(v, (int, np.integer)):
        return _MP.make_mpf(libmp.from_int(int(v)))
    # float(v) is exact for float16/32/64 (they are subsets of float64); from_float at 53 bits keeps it exact.
    return _MP.make_mpf(libmp.from_float(float(v), 53, libmp.round_nearest))


def _to_mpf_array(a, name):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        flat = [_MP.make_mpf(libmp.from_float(v, 53, libmp.round_nearest))
                for v in a.astype(np.float64).ravel().tolist()]
    elif a.dtype.kind in "iub" or a.dtype == object:
        flat = [_exact_mpf(v) for v in a.ravel().tolist()]
    else:
        raise TypeError(f"{name} must be a real floating-point array (got dtype {a.dtype})")
    out = np.empty(a.shape, dtype=object)
    out.reshape(-1)[:] = flat if flat else []
    return out


def _obj_array(values, shape):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


def _result(arr):
    """0-d results are returned as a plain mpf, everything else as an object array."""
    if arr.ndim == 0:
        return arr[()]
    return arr


def _check_dps(dps):
    dps = int(dps)
    if dps < 15:
        raise ValueError(f"dps must be at least 15 (50 or more for the accuracy contract); got {dps}")
    return dps


def _rows(x, axis):
    """Move `axis` last and return (list of rows, shape with the class axis last)."""
    if x.ndim == 0:
        raise ValueError("input must have at least one dimension (the class axis)")
    axis = int(axis)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of bounds for an input with {x.ndim} dimensions")
    axis %= x.ndim
    xm = np.moveaxis(x, axis, -1)
    shape = xm.shape
    C = shape[-1]
    flat = xm.reshape(-1, C) if C else np.empty((int(np.prod(shape[:-1])), 0), dtype=object)
    return [list(r) for r in flat], shape, axis


def _unrows(rows, shape, axis):
    flat = [v for r in rows for v in r]
    return np.moveaxis(_obj_array(flat, shape), -1, axis)


# --------------------------------------------------------------------------------------------------
# Per-row building blocks


class _Prep:
    """Exact, precision-independent facts about a row whose maximum is finite."""

    __slots__ = ("m", "d", "finite", "n_finite")

    def __init__(self, m, d, finite):
        self.m = m
        self.d = d
        self.finite = finite
        self.n_finite = sum(finite)


def _prep_row(x):
    """Classify a row: returns "nan", "posinf", "neginf" (all -inf or empty), or a _Prep."""
    if any(v != v for v in x):
        return "nan"
    if any(v == _INF for v in x):
        return "posinf"
    finite = [v != _NINF for v in x]
    if not any(finite):
        return "neginf"
    m = max(v for v, f in zip(x, finite) if f)
    # x_j - m is computed exactly so that exp(x_j - m) is correctly rounded even when |x_j - m| is
    # huge; a rounded difference would carry an absolute error of |x_j - m| * 2**-prec into the exponent.
    d = [mpmath.fsub(v, m, exact=True) if f else _NINF for v, f in zip(x, finite)]
    return _Prep(m, d, finite)


class _Stats:
    __slots__ = ("e", "s", "logs", "lse", "lse_abs", "p")


def _row_stats(prep):
    """exp(x_j - m), their sum, log of the sum, lse and softmax, at the current working precision."""
    st = _Stats()
    e = []
    k = 0
    rest = []
    for dj, f in zip(prep.d, prep.finite):
        if not f:
            e.append(_ZERO)
        elif not dj:
            e.append(_ONE)
            k += 1
        else:
            v = mpmath.exp(dj)
            e.append(v)
            rest.append(v)
    rest = mpmath.fsum(rest)
    # Splitting off the k maxima (each exp(0) == 1) lets log1p keep the tiny tail exp(-gap) that
    # log(k + rest) would round away in a confident row.
    st.logs = mpmath.log(k) + mpmath.log1p(rest / k) if rest else mpmath.log(k)
    st.s = k + rest
    st.e = e
    st.p = [v / st.s if v else _ZERO for v in e]
    st.lse = prep.m + st.logs
    # Bound on |lse| terms: the sum m + logs may cancel when m is in [-log C, 0].
    st.lse_abs = abs(prep.m) + st.logs
    return st


def _extra_bits(value, err, thr, target_bits):
    """How many more bits are needed so that `err` is below the accuracy goal for `value`.

    The goal is relative error 2**-target_bits, or absolute error `thr` (None: any error is fine).
    """
    if thr is None or not err or not mpmath.isfinite(value) or not mpmath.isfinite(err):
        return 0
    goal = abs(value) * _pow2(-target_bits) if value else _ZERO
    if thr > goal:
        goal = thr
    if err <= goal:
        return 0
    return int(mpmath.mag(err)) - int(mpmath.mag(goal)) + 2


def _adaptive(evaluate, target_bits, guard):
    """Run evaluate(prec) -> (result, [(value, error_scale, threshold), ...]) until accurate enough.

    error_scale * 2**(guard - prec) bounds the rounding error of value at working precision prec
    (error_scale is the magnitude of the terms that may cancel; `guard` covers the constant factors).
    """
    prec = target_bits + guard + 8
    while True:
        with mpmath.workprec(prec):
            result, checks = evaluate()
            need = 0
            for value, scale, thr in checks:
                err = scale * _pow2(guard - prec)
                need = max(need, _extra_bits(value, err, thr, target_bits))
        if need <= 0 or prec >= _MAX_PREC:
            return result
        prec = min(_MAX_PREC, prec + need + 16)


def _threshold(factor, target_bits):
    """Absolute error goal for a quantity that is multiplied by `factor` before being returned."""
    with mpmath.workprec(64):
        goal = _pow2(_SUBNORMAL_LOG2 - target_bits)
        if factor is None:
            return goal
        if not factor or not mpmath.isfinite(factor):
            return None
        return goal / abs(factor)


# --------------------------------------------------------------------------------------------------
# logsumexp / log_softmax / softmax


def _lse_row(x, target_bits):
    prep = _prep_row(x)
    if prep == "nan":
        return _NAN
    if prep == "posinf":
        return _INF
    if prep == "neginf":
        return _NINF
    guard = 8 + len(x).bit_length()
    thr = _threshold(None, target_bits)

    def evaluate():
        st = _row_stats(prep)
        return st.lse, [(st.lse, st.lse_abs, thr)]

    return _adaptive(evaluate, target_bits, guard)


def logsumexp(input, axis=-1, dps=60):
    """Exact ``log(sum(exp(input), axis))``.

    Parameters
    ----------
    input : array_like
        float32/float64 array (or object array of mpf) with at least one dimension.
    axis : int, optional
        Axis to reduce.
    dps : int, optional
        Decimal digits of working precision (use 50 or more).

    Returns
    -------
    numpy.ndarray of mpf or mpf
        Shape of `input` without `axis`; a plain mpf when that shape is ``()``.  A row with any NaN
        gives NaN, else any ``+inf`` gives ``+inf``, and a row of only ``-inf`` (or no elements) gives
        ``-inf``.
    """
    dps = _check_dps(dps)
    tb = libmp.dps_to_prec(dps)
    x = _to_mpf_array(input, "input")
    rows, shape, _ = _rows(x, axis)
    out = [_lse_row(r, tb) for r in rows]
    return _result(_obj_array(out, shape[:-1]))


def _normalized_rows(input, axis, dps, log):
    dps = _check_dps(dps)
    tb = libmp.dps_to_prec(dps)
    x = _to_mpf_array(input, "input")
    rows, shape, ax = _rows(x, axis)
    out = []
    for r in rows:
        prep = _prep_row(r)
        if not isinstance(prep, _Prep):
            out.append([_NAN] * len(r))
            continue
        # x_j - lse = (x_j - m) - logs: both terms are <= 0 and x_j - m is exact, so there is no
        # cancellation and one evaluation at the target precision suffices (same for exp/s).
        with mpmath.workprec(tb + 8 + len(r).bit_length()):
            st = _row_stats(prep)
            if log:
                out.append([dj - st.logs if f else _NINF for dj, f in zip(prep.d, prep.finite)])
            else:
                out.append(list(st.p))
    return _result(_unrows(out, shape, ax))


def log_softmax(input, axis=-1, dps=60):
    """Exact ``input - logsumexp(input, axis, keepdims=True)``.

    Parameters
    ----------
    input : array_like
        float32/float64 array (or object array of mpf) with at least one dimension.
    axis : int, optional
        Class axis.
    dps : int, optional
        Decimal digits of working precision (use 50 or more).

    Returns
    -------
    numpy.ndarray of mpf
        Same shape as `input`.  Rows with any NaN, any ``+inf`` or only ``-inf`` are all NaN;
        ``-inf`` entries of other rows are ``-inf``.
    """
    return _normalized_rows(input, axis, dps, log=True)


def softmax(input, axis=-1, dps=60):
    """Exact ``exp(input - logsumexp(input, axis, keepdims=True))``.

    Parameters
    ----------
    input : array_like
        float32/float64 array (or object array of mpf) with at least one dimension.
    axis : int, optional
        Class axis.
    dps : int, optional
        Decimal digits of working precision (use 50 or more).

    Returns
    -------
    numpy.ndarray of mpf
        Same shape as `input`.  Rows with any NaN, any ``+inf`` or only ``-inf`` are all NaN;
        ``-inf`` entries of other rows are exactly 0.
    """
    return _normalized_rows(input, axis, dps, log=False)


# --------------------------------------------------------------------------------------------------
# cross-entropy


_REDUCTIONS = ("none", "mean", "sum")


class _Problem:
    """Validated, exactly converted arguments of cross_entropy / cross_entropy_grad."""

    def __init__(self, input, target, weight, ignore_index, reduction, label_smoothing, axis,
                 z_loss, empty_mean, dps):
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
        if empty_mean not in ("nan", "zero"):
            raise ValueError(f"empty_mean must be 'nan' or 'zero'; got {empty_mean!r}")
        eps = float(label_smoothing)
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1]; got {label_smoothing!r}")
        z = float(z_loss)
        if not math.isfinite(z):
            raise ValueError(f"z_loss must be finite; got {z_loss!r}")
        self.dps = _check_dps(dps)
        self.target_bits = libmp.dps_to_prec(self.dps)
        self.reduction = reduction
        self.empty_mean = empty_mean
        self.eps = _exact_mpf(eps)
        self.z = _exact_mpf(z)

        x = _to_mpf_array(input, "input")
        self.rows, self.shape, self.axis = _rows(x, axis)
        C = self.shape[-1]
        self.C = C
        self.loss_shape = self.shape[:-1]
        in_shape = x.shape

        t = np.asarray(target)
        if t.dtype.kind in "iu":
            self.is_index = True
            expected = self.loss_shape
            if t.shape != expected:
                raise ValueError(f"index target must have shape {expected} (input shape without the "
                                 f"class axis); got {t.shape}")
            self.targets = [int(v) for v in t.ravel().tolist()]
            ii = int(ignore_index)
            for v in self.targets:
                if v != ii and not 0 <= v < C:
                    raise ValueError(f"target {v} is out of range for {C} classes "
                                     f"(and is not ignore_index={ii})")
            self.ignore_index = ii
        elif t.dtype.kind == "f" or t.dtype == object:
            self.is_index = False
            if t.shape != in_shape:
                raise ValueError(f"probability target must have the input's shape {in_shape}; "
                                 f"got {t.shape}")
            tm = np.moveaxis(_to_mpf_array(t, "target"), self.axis, -1)
            self.targets = [list(r) for r in tm.reshape(-1, C)] if C else [[] for _ in self.rows]
            self.ignore_index = None
        else:
            raise TypeError(f"target must be an integer (class index) or floating (probability) "
                            f"array; got dtype {t.dtype}")

        if weight is None:
            self.w = None
        else:
            w = np.asarray(weight)
            if w.shape != (C,):
                raise ValueError(f"weight must have shape ({C},); got {w.shape}")
            self.w = list(_to_mpf_array(w, "weight"))

        with mpmath.workprec(self.target_bits + 64):
            if self.is_index:
                # Ignored rows do not count; the others count with their target's weight (torch).
                ws = [(self.w[y] if self.w is not None else _ONE)
                      for y in self.targets if y != self.ignore_index]
                self.denominator = mpmath.fsum(ws)
            else:
                self.denominator = _exact_mpf(len(self.rows))

    def ignored(self, i):
        return self.is_index and self.targets[i] == self.ignore_index

    def row_weight(self, i):
        if self.is_index and self.w is not None:
            return self.w[self.targets[i]]
        return _ONE

    def evaluate_row(self, i, prep, want_grad):
        """loss, gradient, gradient error scales and cancelling-term magnitudes of row i, at the
        current working precision, plus the loss's error scale."""
        d, finite = prep.d, prep.finite
        C = len(d)
        st = _row_stats(prep)
        eps, z = self.eps, self.z
        smooth = eps / prep.n_finite
        one_m_eps = _ONE - eps
        w = self.w
        if self.is_index:
            y = self.targets[i]
            q = [(smooth * w[c] if w is not None else smooth) if finite[c] else _ZERO for c in range(C)]
            q[y] = q[y] + one_m_eps * (w[y] if w is not None else _ONE)
            qabs = [abs(v) for v in q]
            r = w[y] if w is not None else _ONE
        else:
            t = self.targets[i]
            q = []
            qabs = []
            for c in range(C):
                tc = one_m_eps * t[c]
                sc = smooth if finite[c] else _ZERO
                wc = w[c] if w is not None else _ONE
                q.append(wc * (tc + sc))
                qabs.append(abs(wc) * (abs(tc) + sc))
            r = _ONE

        terms = []
        loss_scale = _ZERO
        for c in range(C):
            qc = q[c]
            if not qc and qc == qc:
                continue  # 0 * (+inf) = 0: a class without target mass contributes nothing.
            nlp = st.logs - d[c]
            terms.append(qc * nlp)
            if finite[c]:
                loss_scale += qabs[c] * nlp
        zr = z * r
        if z:
            terms.append(zr * st.lse * st.lse)
            loss_scale += 3 * abs(zr) * st.lse_abs * st.lse_abs
        loss = mpmath.fsum(terms)
        if not want_grad:
            return loss, loss_scale, None, None, None

        A = mpmath.fsum(q)
        A_abs = mpmath.fsum(qabs)
        if z:
            Ap = A + 2 * zr * st.lse
            Ap_abs = A_abs + 2 * abs(zr) * st.lse_abs
        else:
            Ap, Ap_abs = A, A_abs
        grad, gscale, cancel = [], [], []
        for j in range(C):
            pj = st.p[j]
            pa = pj * Ap
            grad.append(pa - q[j])
            gscale.append(pj * Ap_abs + qabs[j])
            cancel.append(abs(pa) + abs(q[j]))
        return loss, loss_scale, grad, gscale, cancel

    def row(self, i, loss_factor, grad_factor, want_grad):
        """Exact (loss, grad list, cancel-scale list) of row i; grad entries are NOT yet multiplied by
        grad_factor."""
        C = self.C
        x = self.rows[i]
        if self.ignored(i):
            z = [_ZERO] * C
            return _ZERO, z, list(z)
        prep = _prep_row(x)
        if not isinstance(prep, _Prep):
            n = [_NAN] * C
            return _NAN, n, list(n)
        guard = 10 + max(C, 1).bit_length()
        lthr = _threshold(loss_factor, self.target_bits)
        gthr = _threshold(grad_factor, self.target_bits) if want_grad else None

        def evaluate():
            loss, lscale, grad, gscale, cancel = self.evaluate_row(i, prep, want_grad)
            checks = [(loss, lscale, lthr)]
            if want_grad:
                checks.extend((g, s, gthr) for g, s in zip(grad, gscale))
            return (loss, grad, cancel), checks

        return _adaptive(evaluate, self.target_bits, guard)


def _reduce_loss(pb, losses):
    with mpmath.workprec(pb.target_bits + 64):
        if pb.reduction == "none":
            return _result(_obj_array(losses, pb.loss_shape))
        total = mpmath.fsum(losses)
        if pb.reduction == "sum":
            return total
        if not pb.denominator:
            return _NAN if pb.empty_mean == "nan" else _ZERO
        return total / pb.denominator


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0, *, axis=-1, z_loss=0.0, empty_mean="nan", dps=60):
    """Exact softmax cross-entropy loss.

    Parameters
    ----------
    input : array_like
        Logits, float32/float64 (or an object array of mpf, used exactly); the class axis is `axis`.
    target : array_like
        Integer class indices with the shape of `input` without `axis`, or floating class
        probabilities with the shape of `input` (decided by the dtype kind).
    weight : array_like, optional
        Class weights of shape ``(C,)`` (finite, non-negative).
    ignore_index : int, optional
        Index targets equal to this are ignored (loss 0, excluded from the mean).
    reduction : {"mean", "sum", "none"}, optional
        Reduction over rows.
    label_smoothing : float, optional
        Smoothing mass ``eps`` in [0, 1], spread over the ``C_eff`` classes with finite logits.
    axis : int, optional
        Class axis of `input`.
    z_loss : float, optional
        Coefficient of the ``r * lse**2`` auxiliary term.
    empty_mean : {"nan", "zero"}, optional
        Result of ``"mean"`` when its denominator is 0.
    dps : int, optional
        Decimal digits of working precision (use 50 or more).

    Returns
    -------
    mpf or numpy.ndarray of mpf
        A plain mpf for ``"mean"`` / ``"sum"``; for ``"none"`` an object array with the shape of
        `input` without `axis` (a plain mpf if that shape is ``()``).

    Raises
    ------
    ValueError
        On inconsistent shapes, out-of-range index targets or invalid option values.
    """
    pb = _Problem(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss,
                  empty_mean, dps)
    loss_factor = None
    if reduction == "mean" and pb.denominator:
        with mpmath.workprec(64):
            loss_factor = _ONE / pb.denominator
    losses = [pb.row(i, loss_factor, None, False)[0] for i in range(len(pb.rows))]
    return _reduce_loss(pb, losses)


def cross_entropy_grad(input, target, weight=None, ignore_index=-100, reduction="mean",
                       label_smoothing=0.0, *, axis=-1, z_loss=0.0, empty_mean="nan",
                       grad_output=None, dps=60, return_scale=False):
    """Exact gradient of ``(cross_entropy(...) * grad_output).sum()`` with respect to `input`.

    Parameters
    ----------
    input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss, empty_mean, dps
        As for :func:`cross_entropy`.
    grad_output : array_like or float, optional
        Upstream gradient ``g`` (default 1): for ``reduction="none"`` an array broadcastable to the
        loss's shape, otherwise a scalar.
    return_scale : bool, optional
        Also return the magnitude of the two terms that cancel in each element,
        ``|factor_i| * (|p_j (A + 2 z_loss r lse)| + |q_j|)`` with ``factor_i`` the multiplier of row
        ``i`` (``g_i``, ``g``, or ``g / denominator``).  Soft-target gradients are accurate relative
        to this scale rather than to the (possibly tiny) gradient itself.

    Returns
    -------
    grad : numpy.ndarray of mpf
        Same shape as `input`.  Ignored rows are 0; rows with NaN, ``+inf`` or only ``-inf`` logits
        are NaN (times the factor); for ``"mean"`` with a zero denominator the whole gradient is 0.
    scale : numpy.ndarray of mpf
        Only when `return_scale` is true; same shape as `grad`.
    """
    pb = _Problem(input, target, weight, ignore_index, reduction, label_smoothing, axis, z_loss,
                  empty_mean, dps)
    n = len(pb.rows)
    C = pb.C
    if grad_output is None:
        g = None
    else:
        ga = np.asarray(grad_output)
        if reduction == "none":
            try:
                ga = np.broadcast_to(ga, pb.loss_shape)
            except ValueError:
                raise ValueError(f"grad_output must be broadcastable to the loss shape "
                                 f"{pb.loss_shape}; got {ga.shape}") from None
            g = list(_to_mpf_array(ga, "grad_output").ravel())
        else:
            if ga.size != 1:
                raise ValueError(f"grad_output must be a scalar for reduction={reduction!r}; "
                                 f"got shape {ga.shape}")
            g = _to_mpf_array(ga, "grad_output").ravel()[0]

    zero_rows = [[_ZERO] * C for _ in range(n)]
    if reduction == "mean" and not pb.denominator:
        grads, scales = zero_rows, [list(r) for r in zero_rows]
    else:
        with mpmath.workprec(pb.target_bits + 64):
            if reduction == "none":
                factors = g if g is not None else [_ONE] * n
            else:
                f = g if g is not None else _ONE
                if reduction == "mean":
                    f = f / pb.denominator
                factors = [f] * n
        loss_factor = None
        if reduction == "mean":
            with mpmath.workprec(64):
                loss_factor = _ONE / pb.denominator
        grads, scales = [], []
        for i in range(n):
            fi = factors[i]
            _, gr, cancel = pb.row(i, loss_factor, fi, True)
            if pb.ignored(i):
                grads.append(gr)
                scales.append(cancel)
                continue
            # The factor multiplies an exact value: one rounding at a precision above the target.
            with mpmath.workprec(pb.target_bits + 16):
                grads.append([fi * v for v in gr])
                scales.append([abs(fi) * v for v in cancel])
    grad = _unrows(grads, pb.shape, pb.axis)
    if return_scale:
        return grad, _unrows(scales, pb.shape, pb.axis)
    return grad


# --------------------------------------------------------------------------------------------------
# Binary family: BCE with logits, sigmoid focal loss, BCE from probabilities, CE from class
# probabilities.  Elementwise (or per row) closed forms; no value returned here is a difference of
# larger terms except the soft-target gradients, which come with their cancellation scale.  One
# evaluation at target_bits + _BIN_GUARD bits is therefore exact to the contract's needs.

_BIN_GUARD = 24


def _bin_prec(dps):
    return libmp.dps_to_prec(_check_dps(dps)) + _BIN_GUARD


def _softplus(x):
    """log(1 + e^x); exact limits at +-inf."""
    if x == _INF:
        return _INF
    if x == _NINF:
        return _ZERO
    return mpmath.log1p(mpmath.exp(x))


def _sigmoid(x):
    if x == _INF:
        return _ONE
    if x == _NINF:
        return _ZERO
    return _ONE / (_ONE + mpmath.exp(-x))


def _isnan(v):
    return v != v


def _times(c, v):
    """c * v with 0 * inf = 0: a term whose coefficient is 0 contributes nothing."""
    if not c and not _isnan(c):
        return _ZERO
    return c * v


def _upstream_times(f, v):
    """An upstream factor f times a derivative v: 0 * inf = 0 as for any zero coefficient, but a NaN
    derivative (a NaN input) stays NaN, as the kernels give it; _NO_TERM is 0 whatever f is."""
    if v is _NO_TERM:
        return _ZERO
    return v if _isnan(v) else _times(f, v)


def _bin_elementwise_inputs(input, target, weights, ignore_index, what="input"):
    """Exact mpf arrays of input and target and of each optional weight broadcast to the input."""
    x = _to_mpf_array(input, what)
    t = _to_mpf_array(target, "target")
    if t.shape != x.shape:
        raise ValueError(f"target must have the input's shape {x.shape}; got {t.shape}")
    out = []
    for name, w in weights:
        if w is None:
            out.append(None)
            continue
        wa = _to_mpf_array(w, name)
        try:
            out.append(np.broadcast_to(wa, x.shape))
        except ValueError:
            raise ValueError(f"{name} of shape {wa.shape} does not broadcast to {x.shape}") from None
    ign = None if ignore_index is None else _exact_mpf(ignore_index)
    return x, t, out, ign


def _bin_reduce(losses, shape, kept, reduction, empty_mean, prec):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    if empty_mean not in ("nan", "zero"):
        raise ValueError(f"empty_mean must be 'nan' or 'zero'; got {empty_mean!r}")
    with mpmath.workprec(prec + 64):
        if reduction == "none":
            return _result(_obj_array(losses, shape))
        total = mpmath.fsum(losses)
        if reduction == "sum":
            return total
        if not kept:
            return _NAN if empty_mean == "nan" else _ZERO
        return total / kept


def _bin_factors(grad_output, reduction, shape, kept, prec):
    """Per-element upstream factors (g, g/denominator) for the gradient of (loss * g).sum()."""
    n = int(np.prod(shape)) if shape else 1
    with mpmath.workprec(prec + 64):
        if reduction == "none":
            if grad_output is None:
                return [_ONE] * n
            ga = np.broadcast_to(_to_mpf_array(np.asarray(grad_output), "grad_output"), shape)
            return list(ga.ravel())
        ga = np.asarray(grad_output if grad_output is not None else 1.0)
        if ga.size != 1:
            raise ValueError(f"grad_output must be a scalar for reduction={reduction!r}; got shape {ga.shape}")
        g = _to_mpf_array(ga, "grad_output").ravel()[0]
        if reduction == "mean":
            g = g / kept if kept else _ZERO
        return [g] * n


def _bce_logits_elem(x, y, w, q, want_grad):
    """(loss, grad, cancellation scale) of w[(1-y) sp(x) + q y sp(-x)]."""
    if _isnan(x):
        return _NAN, _NAN, _NAN
    a, b = _ONE - y, q * y
    loss = _times(w, _times(a, _softplus(x)) + _times(b, _softplus(-x)))
    if not want_grad:
        return loss, None, None
    if not w or (not a and not b):
        return loss, _NO_TERM, _NO_TERM
    s1, s2 = _times(a, _sigmoid(x)), _times(b, _sigmoid(-x))
    return loss, w * (s1 - s2), w * (abs(s1) + abs(s2))


def _finish_grads(vals, factors, shape, prec, return_scale):
    # a zero upstream factor is a zero coefficient: 0 * inf = 0 (an infinite derivative of BCE from
    # probabilities at p = 0 < y), as cross_entropy_from_probs_grad and the kernels have it; NaN stays
    with mpmath.workprec(prec):
        grads = [_upstream_times(f, g) for f, (g, _) in zip(factors, vals)]
        scales = [_upstream_times(abs(f), s) for f, (_, s) in zip(factors, vals)]
    g = _obj_array(grads, shape)
    if return_scale:
        return g, _obj_array(scales, shape)
    return g


def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction="mean", *,
                                     ignore_index=None, empty_mean="nan", dps=60):
    """Exact sigmoid binary cross-entropy from logits (torch semantics, plus Paddle's ignore_index).

    ``loss_i = w_i [(1 - y_i) softplus(x_i) + q_i y_i softplus(-x_i)]`` with ``w`` = `weight` and
    ``q`` = `pos_weight` broadcast to the input (1 when absent), ``0 * inf = 0``.  Elements whose target
    equals `ignore_index` are 0 and leave the mean's denominator (the count of kept elements); a NaN
    logit gives NaN.

    Returns an object array of mpf for ``reduction="none"`` (a plain mpf for a 0-d input), else an mpf.
    """
    prec = _bin_prec(dps)
    x, t, (w, q), ign = _bin_elementwise_inputs(input, target, [("weight", weight), ("pos_weight", pos_weight)],
                                                ignore_index)
    losses, kept = [], 0
    with mpmath.workprec(prec):
        for i, (xi, yi) in enumerate(zip(x.ravel(), t.ravel())):
            if ign is not None and yi == ign:
                losses.append(_ZERO)
                continue
            kept += 1
            wi = w.ravel()[i] if w is not None else _ONE
            qi = q.ravel()[i] if q is not None else _ONE
            losses.append(_bce_logits_elem(xi, yi, wi, qi, False)[0])
    return _bin_reduce(losses, x.shape, kept, reduction, empty_mean, prec)


def binary_cross_entropy_with_logits_grad(input, target, weight=None, pos_weight=None, reduction="mean", *,
                                          ignore_index=None, empty_mean="nan", grad_output=None, dps=60,
                                          return_scale=False):
    """Exact gradient of ``(binary_cross_entropy_with_logits(...) * grad_output).sum()``.

    ``d/dx_i = f_i w_i [(1 - y_i) sigmoid(x_i) - q_i y_i sigmoid(-x_i)]`` with ``f_i`` the upstream
    factor (``grad_output``, divided by the kept count for ``"mean"``; 0 when nothing is kept).  With
    `return_scale`, also ``|f_i| w_i [(1 - y_i) sigmoid(x_i) + q_i y_i sigmoid(-x_i)]``, the magnitude of
    the two terms that cancel for soft targets.  An element without a term (ignored, a zero weight, both
    target masses 0) has gradient 0 under any factor, NaN and +-inf included.
    """
    prec = _bin_prec(dps)
    x, t, (w, q), ign = _bin_elementwise_inputs(input, target, [("weight", weight), ("pos_weight", pos_weight)],
                                                ignore_index)
    kept = sum(1 for yi in t.ravel() if ign is None or yi != ign)
    factors = _bin_factors(grad_output, reduction, x.shape, kept, prec)
    vals = []
    with mpmath.workprec(prec):
        for i, (xi, yi) in enumerate(zip(x.ravel(), t.ravel())):
            if ign is not None and yi == ign:
                vals.append((_NO_TERM, _NO_TERM))
                continue
            wi = w.ravel()[i] if w is not None else _ONE
            qi = q.ravel()[i] if q is not None else _ONE
            _, g, s = _bce_logits_elem(xi, yi, wi, qi, True)
            vals.append((g, s))
    return _finish_grads(vals, factors, x.shape, prec, return_scale)


def _focal_elem(x, y, alpha, gamma, want_grad):
    """(loss, grad, scale) of torchvision's sigmoid focal loss for one element."""
    if _isnan(x):
        return _NAN, _NAN, _NAN
    a = alpha * y + (_ONE - alpha) * (_ONE - y) if alpha >= 0 else _ONE
    sp, sm = _sigmoid(x), _sigmoid(-x)
    ce = _times(_ONE - y, _softplus(x)) + _times(y, _softplus(-x))
    u = _times(_ONE - y, sp) + _times(y, sm)
    U = _ONE if not gamma else (u ** gamma if u else _ZERO)
    loss = _times(a, _times(U, ce)) if U else _ZERO
    if not want_grad:
        return loss, None, None
    g1 = _times(_ONE - y, sp) - _times(y, sm)
    # W = sigmoid(x) sigmoid(-x) / u, written without the division where y is 0 or 1
    if y == 1:
        W = sp
    elif y == 0:
        W = sm
    else:
        W = sp * sm / u
    g2 = _ZERO if (not gamma or not W or not ce) else gamma * ce * W * (_ONE - 2 * y)
    g2abs = abs(g2)
    grad = _times(a, U * (g1 + g2)) if U else _ZERO
    scale = _times(a, U * (u + g2abs)) if U else _ZERO
    return loss, grad, scale


def _check_focal(alpha, gamma):
    alpha, gamma = _exact_mpf(float(alpha)), _exact_mpf(float(gamma))
    if not (gamma >= 0 and mpmath.isfinite(gamma)):
        raise ValueError(f"gamma must be finite and >= 0; got {gamma}")
    if not (alpha <= 1 and mpmath.isfinite(alpha)):
        raise ValueError(f"alpha must be <= 1 (negative: no weighting); got {alpha}")
    return alpha, gamma


def sigmoid_focal_loss(input, target, alpha=0.25, gamma=2.0, reduction="none", *, ignore_index=None,
                       empty_mean="nan", dps=60):
    """Exact sigmoid focal loss with torchvision's semantics.

    ``loss = alpha_t ce (1 - p_t)**gamma`` with ``ce`` the BCE with logits, ``p = sigmoid(x)``,
    ``p_t = p y + (1 - p)(1 - y)``, ``alpha_t = alpha y + (1 - alpha)(1 - y)`` (1 when ``alpha < 0``) and
    ``0**0 = 1``.  ``"mean"`` divides by the number of (kept) elements.
    """
    prec = _bin_prec(dps)
    alpha, gamma = _check_focal(alpha, gamma)
    x, t, _, ign = _bin_elementwise_inputs(input, target, [], ignore_index)
    losses, kept = [], 0
    with mpmath.workprec(prec):
        for xi, yi in zip(x.ravel(), t.ravel()):
            if ign is not None and yi == ign:
                losses.append(_ZERO)
                continue
            kept += 1
            losses.append(_focal_elem(xi, yi, alpha, gamma, False)[0])
    return _bin_reduce(losses, x.shape, kept, reduction, empty_mean, prec)


def sigmoid_focal_loss_grad(input, target, alpha=0.25, gamma=2.0, reduction="none", *, ignore_index=None,
                            empty_mean="nan", grad_output=None, dps=60, return_scale=False):
    """Exact gradient of ``(sigmoid_focal_loss(...) * grad_output).sum()`` with respect to `input`.

    ``d/dx = alpha_t u**gamma [(1-y) s(x) - y s(-x) + gamma ce W (1 - 2y)]``, ``u = 1 - p_t``,
    ``W = s(x) s(-x) / u``.  With `return_scale`, also ``|f| alpha_t u**gamma (u + gamma ce W |1 - 2y|)``,
    the magnitude of the terms that cancel for soft targets.
    """
    prec = _bin_prec(dps)
    alpha, gamma = _check_focal(alpha, gamma)
    x, t, _, ign = _bin_elementwise_inputs(input, target, [], ignore_index)
    kept = sum(1 for yi in t.ravel() if ign is None or yi != ign)
    factors = _bin_factors(grad_output, reduction, x.shape, kept, prec)
    vals = []
    with mpmath.workprec(prec):
        for xi, yi in zip(x.ravel(), t.ravel()):
            if ign is not None and yi == ign:
                vals.append((_NO_TERM, _NO_TERM))
                continue
            _, g, s = _focal_elem(xi, yi, alpha, gamma, True)
            vals.append((g, s))
    return _finish_grads(vals, factors, x.shape, prec, return_scale)


class _ProbMode:
    """The three log conventions of losses from probabilities (see binary_cross_entropy)."""

    def __init__(self, eps, log_clamp):
        self.eps = None if eps is None else _exact_mpf(float(eps))
        self.clamp = None if log_clamp is None else _exact_mpf(float(log_clamp))
        if self.eps is not None and not (0 <= self.eps <= 0.5):
            raise ValueError(f"eps must be in [0, 0.5]; got {eps!r}")
        if self.clamp is not None and not (self.clamp <= 0 and mpmath.isfinite(self.clamp)):
            raise ValueError(f"log_clamp must be finite and <= 0; got {log_clamp!r}")
        if self.clamp is not None:
            # log p < c iff p < e^c, log(1 - p) < c iff p > 1 - e^c: decided exactly, not on the rounded
            # logs (log1p(-p) = -p - p^2/2 - ... rounds to c itself for p = -c ~ 1e-300, though it lies
            # below c: the term is clamped, its derivative 0)
            self.p_clamped_below = _exp_exact_bound(self.clamp, mpmath.exp)
            self.p_clamped_above = _exp_exact_bound(self.clamp, lambda v: -mpmath.expm1(v))

    def logs(self, p):
        """(log p_c, log(1 - p_c), d log p_c live, d log(1 - p_c) live) for the clipped/clamped p_c."""
        if self.eps is not None and p < self.eps:
            return mpmath.log(self.eps), mpmath.log1p(-self.eps), False, False
        # 1 - p and the clip 1 - eps in exact arithmetic: at the working precision 1 - 1e-300 is 1, and
        # log(1 - (1 - eps)) would be log 0 instead of log eps
        if self.eps is not None and mpmath.fsub(_ONE, p, exact=True) < self.eps:
            return mpmath.log1p(-self.eps), mpmath.log(self.eps), False, False
        lp = mpmath.log(p) if p else _NINF
        l1p = mpmath.log1p(-p) if p != 1 else _NINF
        live_p = live_1p = True
        if self.clamp is not None:
            if p < self.p_clamped_below:
                lp, live_p = self.clamp, False
            if p > self.p_clamped_above:
                l1p, live_1p = self.clamp, False
        return lp, l1p, live_p, live_1p


def _exp_exact_bound(c, f):
    """A number that compares with every double p as f(c) does, for f(c) = e^c or 1 - e^c (c <= 0 a double):
    f(c) itself for c = 0 (1 or 0); otherwise f(c) is irrational (Lindemann), never a double, and is
    evaluated at rising precision until the doubles nearest it are seen to lie on either side; the bound
    returned is then halfway between them (an exact comparison with any double gives f(c)'s answer)."""
    if c == 0:
        return f(c)
    prec = 128
    while True:
        with mpmath.workprec(prec):
            r = f(c)
        # r within 2^(2 - prec) of f(c), relatively: the doubles just below and above r (float() rounds
        # faithfully) enclose f(c) when neither lies within that distance of r (differences taken exactly)
        near = float(r)
        below = near if mpf(near) < r else float(np.nextafter(near, -np.inf))
        above = near if mpf(near) > r else float(np.nextafter(near, np.inf))
        tol = mpmath.ldexp(abs(r), 2 - prec)
        if (mpf(near) != r and mpmath.fsub(r, below, exact=True) > tol and
                mpmath.fsub(above, r, exact=True) > tol):
            return mpmath.ldexp(mpmath.fadd(below, above, exact=True), -1)
        prec *= 2


def _bce_prob_elem(p, y, w, mode, want_grad):
    if _isnan(p):
        return _NAN, _NAN, _NAN
    lp, l1p, live_p, live_1p = mode.logs(p)
    loss = _times(w, _times(y, -lp) + _times(_ONE - y, -l1p))
    if not want_grad:
        return loss, None, None
    no_t0, no_t1 = not y or not live_p or not w, y == 1 or not live_1p or not w
    if no_t0 and no_t1:
        return loss, _NO_TERM, _NO_TERM
    t0 = _ZERO if no_t0 else (w * y / p if p else _INF)
    t1 = _ZERO if no_t1 else (w * (_ONE - y) / (_ONE - p) if p != 1 else _INF)
    return loss, t1 - t0, t1 + t0


def _check_probs(x, what="input"):
    for v in x.ravel():
        if not _isnan(v) and not (0 <= v <= 1):
            raise ValueError(f"{what} probabilities must be in [0, 1]; got {v}")


def binary_cross_entropy(input, target, weight=None, reduction="mean", *, eps=None, log_clamp=None, dps=60):
    """Exact binary cross-entropy from probabilities.

    ``loss_i = w_i [-y_i log p_i - (1 - y_i) log(1 - p_i)]`` with ``0 * inf = 0`` and ``-log 0 = inf``.
    `eps`: ``p`` clipped to ``[eps, 1 - eps]`` (real numbers) first, Keras-style.  `log_clamp`: each log
    replaced by ``max(log, log_clamp)`` (torch's BCELoss: -100).  ``"mean"`` divides by the element count.
    """
    prec = _bin_prec(dps)
    mode = _ProbMode(eps, log_clamp)
    x, t, (w,), _ = _bin_elementwise_inputs(input, target, [("weight", weight)], None)
    _check_probs(x)
    losses = []
    with mpmath.workprec(prec):
        for i, (pi, yi) in enumerate(zip(x.ravel(), t.ravel())):
            wi = w.ravel()[i] if w is not None else _ONE
            losses.append(_bce_prob_elem(pi, yi, wi, mode, False)[0])
    return _bin_reduce(losses, x.shape, len(losses), reduction, "nan", prec)


def binary_cross_entropy_grad(input, target, weight=None, reduction="mean", *, eps=None, log_clamp=None,
                              grad_output=None, dps=60, return_scale=False):
    """Exact gradient of ``(binary_cross_entropy(...) * grad_output).sum()`` with respect to `input`.

    ``f_i w_i [(1 - y_i)/(1 - p_i) - y_i / p_i]`` on the pieces that still depend on ``p`` (a clipped
    or clamped log contributes 0); ``p = 0 < y`` gives ``-inf``, ``p = 1 > y`` gives ``+inf``.
    `return_scale`: ``|f_i| w_i [(1 - y_i)/(1 - p_i) + y_i/p_i]`` (soft targets cancel).  An element
    without a live term (a zero weight, or no piece depending on ``p``) is 0 under any factor, NaN and
    +-inf included.
    """
    prec = _bin_prec(dps)
    mode = _ProbMode(eps, log_clamp)
    x, t, (w,), _ = _bin_elementwise_inputs(input, target, [("weight", weight)], None)
    _check_probs(x)
    factors = _bin_factors(grad_output, reduction, x.shape, x.size, prec)
    vals = []
    with mpmath.workprec(prec):
        for i, (pi, yi) in enumerate(zip(x.ravel(), t.ravel())):
            wi = w.ravel()[i] if w is not None else _ONE
            _, g, s = _bce_prob_elem(pi, yi, wi, mode, True)
            vals.append((g, s))
    return _finish_grads(vals, factors, x.shape, prec, return_scale)


class _ProbRows:
    """Rows, targets, weights and denominator of cross_entropy_from_probs."""

    def __init__(self, input, target, weight, ignore_index, axis, eps):
        self.mode = _ProbMode(eps, None)
        x = _to_mpf_array(input, "input")
        _check_probs(x)
        self.rows, self.shape, self.axis = _rows(x, axis)
        C = self.shape[-1]
        self.C = C
        self.loss_shape = self.shape[:-1]
        t = np.asarray(target)
        self.w = None if weight is None else list(_to_mpf_array(np.asarray(weight), "weight"))
        if t.dtype.kind in "iu":
            self.is_index = True
            if t.shape != self.loss_shape:
                raise ValueError(f"index target must have shape {self.loss_shape}; got {t.shape}")
            self.targets = [int(v) for v in t.ravel().tolist()]
            self.ignore_index = int(ignore_index)
            for v in self.targets:
                if v != self.ignore_index and not 0 <= v < C:
                    raise ValueError(f"target {v} is out of range for {C} classes")
            kept = [y for y in self.targets if y != self.ignore_index]
            with mpmath.workprec(256):
                self.denominator = mpmath.fsum([self.w[y] if self.w else _ONE for y in kept])
        else:
            self.is_index = False
            if t.shape != x.shape:
                raise ValueError(f"probability target must have the input's shape {x.shape}; got {t.shape}")
            tm = np.moveaxis(_to_mpf_array(t, "target"), self.axis, -1)
            self.targets = [list(r) for r in tm.reshape(-1, C)] if C else [[] for _ in self.rows]
            self.ignore_index = None
            self.denominator = _exact_mpf(len(self.rows))

    def row(self, i, want_grad):
        """(loss, grads) of row i, grads before the upstream factor."""
        C, r = self.C, self.rows[i]
        if self.is_index and self.targets[i] == self.ignore_index:
            return _ZERO, [_NO_TERM] * C
        if any(_isnan(v) for v in r):
            return _NAN, [_NAN] * C
        if self.is_index:
            y = self.targets[i]
            q = [_ZERO] * C
            q[y] = self.w[y] if self.w else _ONE
        else:
            q = [(self.w[c] if self.w else _ONE) * self.targets[i][c] for c in range(C)]
        terms, grads = [], []
        for c in range(C):
            lp, _, live, _ = self.mode.logs(r[c])
            terms.append(_times(q[c], -lp))
            if want_grad:
                if not q[c] or not live:
                    grads.append(_NO_TERM)
                else:
                    grads.append(-q[c] / r[c] if r[c] else _NINF)
        return mpmath.fsum(terms), grads


def cross_entropy_from_probs(input, target, weight=None, ignore_index=-100, reduction="mean", *, axis=-1,
                             eps=None, empty_mean="nan", dps=60):
    """Exact cross-entropy from class probabilities (torch's ``nll_loss(log(p))`` for index targets).

    Per row: ``w_y (-log p_y)`` (index targets) or ``sum_c w_c t_c (-log p_c)`` (probability targets),
    ``0 * inf = 0``; `eps` clips ``p`` to ``[eps, 1 - eps]`` first (Keras).  A row with a NaN is NaN;
    ignored rows are 0.  ``"mean"``: divided by ``sum w_y`` over kept rows (index) or the row count.
    """
    prec = _bin_prec(dps)
    pb = _ProbRows(input, target, weight, ignore_index, axis, eps)
    with mpmath.workprec(prec):
        losses = [pb.row(i, False)[0] for i in range(len(pb.rows))]
    if reduction != "mean":
        return _bin_reduce(losses, pb.loss_shape, len(losses), reduction, empty_mean, prec)
    if not pb.denominator:
        return _bin_reduce([], (0,), 0, "mean", empty_mean, prec)
    total = _bin_reduce(losses, pb.loss_shape, len(losses), "sum", empty_mean, prec)
    with mpmath.workprec(prec + 64):
        return total / pb.denominator


def cross_entropy_from_probs_grad(input, target, weight=None, ignore_index=-100, reduction="mean", *,
                                  axis=-1, eps=None, empty_mean="nan", grad_output=None, dps=60):
    """Exact gradient of ``(cross_entropy_from_probs(...) * grad_output).sum()``: ``-f q_j / p_j``.

    0 where ``q_j = 0`` or ``p_j`` is clipped, and on ignored rows, whatever ``f`` is (NaN and +-inf
    included); ``-inf`` where ``p_j = 0 < q_j``.  No cancellation.
    """
    prec = _bin_prec(dps)
    pb = _ProbRows(input, target, weight, ignore_index, axis, eps)
    n = len(pb.rows)
    with mpmath.workprec(prec + 64):
        if reduction == "none":
            f = [_ONE] * n if grad_output is None else list(
                np.broadcast_to(_to_mpf_array(np.asarray(grad_output), "grad_output"), pb.loss_shape).ravel())
        else:
            g = _exact_mpf(float(np.asarray(grad_output))) if grad_output is not None else _ONE
            if reduction == "mean":
                g = g / pb.denominator if pb.denominator else _ZERO
            f = [g] * n
    # a mean with nothing to average is a constant: its gradient is 0 everywhere, NaN rows included
    empty = reduction == "mean" and not pb.denominator
    out = []
    with mpmath.workprec(prec):
        for i in range(n):
            _, gr = pb.row(i, True)
            out.append([_ZERO if empty else _upstream_times(f[i], v) for v in gr])
    return _unrows(out, pb.shape, pb.axis)


# --------------------------------------------------------------------------------------------------
# Correct rounding


def _round_one(v, p, emin, emax):
    """Round an mpf to the nearest (ties to even) value of a binary format; returns a Python float."""
    if v != v:
        return math.nan
    if v == _INF:
        return math.inf
    if v == _NINF:
        return -math.inf
    sign, man, exp, bc = v._mpf_
    if not man:
        return 0.0
    e = exp + bc - 1
    qmin = emin - p + 1
    q = max(e - p + 1, qmin)
    if exp >= q:
        n = man << (exp - q)
    else:
        shift = q - exp
        if shift > bc + 1:
            n = 0  # |v| < 2**(q-2): below half the spacing, including exponents far below any format.
        else:
            n = man >> shift
            rem = man - (n << shift)
            half = 1 << (shift - 1)
            if rem > half or (rem == half and n & 1):
                n += 1
    if n and n.bit_length() + q > emax + 1:
        return -math.inf if sign else math.inf
    out = math.ldexp(float(n), q)  # n < 2**(p+1): exactly representable, so exact
    return -out if sign else out


def rounded(values, dtype):
    """Correctly round exact values to a floating-point format (round to nearest, ties to even).

    Parameters
    ----------
    values : mpf, float or array_like (object array of mpf)
        Exact values, e.g. the result of any function of this module.
    dtype : dtype-like
        ``numpy.float32`` or ``numpy.float64`` (``numpy.float16`` and ``ml_dtypes.bfloat16`` are accepted too).

    Returns
    -------
    numpy scalar or numpy.ndarray of `dtype`
        Each value rounded once, directly to `dtype` (no double rounding through float64):
        gradual underflow to subnormals, overflow to ``±inf``, NaN and infinities preserved, and a
        negative value that rounds to zero gives ``-0.0``.
    """
    dt = np.dtype(dtype)
    p, emin, emax = _format(dt)
    arr = np.asarray(values, dtype=object)
    flat = [_round_one(_exact_mpf(v), p, emin, emax) for v in arr.ravel().tolist()]
    out = np.array(flat, dtype=np.float64).astype(dt).reshape(arr.shape)
    if out.ndim == 0:
        return out[()]
    return out
