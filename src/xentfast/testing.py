"""Testing kit: ulp-error measurement against :mod:`xentfast.reference`, and Hypothesis strategies.

The accuracy contract of xentfast is stated in ulps of the output format.  This module measures it:

* :func:`ulp` -- spacing of float32/float64 numbers at a value (subnormal spacing below the smallest
  normal, so flushing a tiny result to zero is a large error, not a small one);
* :func:`ulp_error` / :func:`max_ulp_error` / :func:`assert_ulp_close` -- elementwise error of a
  computed array against exact :class:`mpmath.mpf` values, with the special-value rules of xsf's
  extended relative error (NaN must match NaN, infinities must match exactly, an exact value beyond
  the format's range may be returned as the correctly signed infinity);
* Hypothesis strategies (:func:`logits`, :func:`index_targets`, :func:`prob_targets`,
  :func:`class_weights`, :func:`softmax_xent_cases`) that generate small adversarial inputs: huge and
  tiny magnitudes, ties, confident rows with gaps around the exp underflow edge, ``-inf`` masks.

Hypothesis is a test dependency: it is imported only when a strategy is built, so the ulp tools work
without it.

Examples
--------
>>> import numpy as np
>>> from xentfast import reference as ref
>>> from xentfast.testing import assert_ulp_close
>>> x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
>>> mine = my_log_softmax(x)                                  # doctest: +SKIP
>>> assert_ulp_close(mine, ref.log_softmax(x), max_ulp=2, inputs={"x": x})   # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mpmath
import numpy as np
from mpmath import libmp, mpf

from .reference import _exact_mpf, _format, _round_one, rounded

__all__ = [
    "ulp",
    "ulp_error",
    "max_ulp_error",
    "assert_ulp_close",
    "logits",
    "index_targets",
    "prob_targets",
    "class_weights",
    "softmax_xent_cases",
    "XentCase",
    "naive_cross_entropy_with_grad",
]

_MP = mpmath.mp
_INF = _MP.make_mpf(libmp.finf)
_NINF = _MP.make_mpf(libmp.fninf)
_NAN = _MP.make_mpf(libmp.fnan)


def _pow2(n):
    return _MP.make_mpf((0, 1, int(n), 1))


# --------------------------------------------------------------------------------------------------
# ulps


def _ulp_one(v, p, emin):
    if v != v:
        return _NAN
    if v == _INF or v == _NINF:
        return _INF
    _, man, exp, bc = v._mpf_
    qmin = emin - p + 1
    if not man:
        return _pow2(qmin)
    return _pow2(max(exp + bc - 1 - p + 1, qmin))


def ulp(x, dtype):
    """Spacing of the floating-point numbers of `dtype` at ``|x|``.

    Parameters
    ----------
    x : mpf, float or array_like
        Value(s), converted exactly.
    dtype : dtype-like
        ``numpy.float32`` or ``numpy.float64``.

    Returns
    -------
    mpf or numpy.ndarray of mpf
        ``2**(e - p + 1)`` for ``|x|`` in ``[2**e, 2**(e+1))`` (``p`` = 24 or 53); below the smallest
        normal (and at 0) the subnormal spacing ``2**-149`` / ``2**-1074``.  ``ulp(±inf)`` is ``inf``
        and ``ulp(nan)`` is ``nan``.  Exact powers of two, independent of mpmath's precision.
    """
    p, emin, _ = _format(dtype)
    if isinstance(x, mpf) or np.ndim(x) == 0 and not isinstance(x, np.ndarray):
        return _ulp_one(_exact_mpf(x), p, emin)
    arr = np.asarray(x, dtype=object) if not isinstance(x, np.ndarray) or x.dtype != object else x
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [_ulp_one(_exact_mpf(v), p, emin) for v in arr.ravel().tolist()]
    return out


def _to_float(v):
    """mpf -> float64 without OverflowError for astronomically large or small exponents."""
    return _round_one(v, 53, -1022, 1023)


def _error_one(a, e, s, p, emin, emax, max_finite):
    """ulp error of float `a` against exact mpf `e`, measured in ulp(s)."""
    a_nan = a != a
    if e != e:
        return 0.0 if a_nan else math.inf
    if e == _INF or e == _NINF:
        return 0.0 if a == e else math.inf
    if a_nan:
        return math.inf
    if a == _INF or a == _NINF:
        if abs(e) > max_finite and (a > 0) == (e > 0):
            return 0.0
        return math.inf
    if s is None or s != s or s == _INF or s == _NINF:
        s = e
    u = _ulp_one(s, p, emin)
    # 64 bits are plenty for an error estimate, and a rounded subtraction stays cheap even when the
    # operands' exponents differ by ~1e300 (an exact one would not).
    diff = mpmath.fsub(a, e, prec=64)
    _, man, exp, bc = u._mpf_
    q = abs(diff) * _MP.make_mpf((0, 1, -exp, 1)) if man else abs(diff)
    return _to_float(q)


def ulp_error(actual, exact, dtype, scale=None):
    """Elementwise error of `actual` against exact values, in ulps of `dtype`.

    Parameters
    ----------
    actual : array_like
        Computed floating-point values (converted exactly).
    exact : mpf, float or array_like of mpf
        Exact values, e.g. from :mod:`xentfast.reference`; broadcast against `actual`.
    dtype : dtype-like
        Format whose ulp is the unit (``numpy.float32`` or ``numpy.float64``).
    scale : array_like of mpf, optional
        If given, errors are measured in ``ulp(scale)`` instead of ``ulp(exact)`` -- for quantities
        that are differences of larger terms (e.g. soft-target gradients), where a relative bound
        on the tiny result is not meaningful.  Non-finite scale entries fall back to ``exact``.

    Returns
    -------
    numpy.ndarray of float64
        ``|actual - exact| / ulp``.  Special rules: exact NaN -> 0 if actual is NaN, else inf;
        exact ``±inf`` -> 0 if actual equals it, else inf; exact finite and actual NaN or infinite
        -> inf, except that an exact value beyond the format's largest finite number may be returned
        as the infinity of the same sign (error 0).
    """
    p, emin, emax = _format(dtype)
    max_finite = _MP.make_mpf(libmp.from_man_exp((1 << p) - 1, emax - p + 1))
    a = np.asarray(actual)
    if a.dtype != object:
        a = a.astype(np.float64)
    e = np.asarray(exact, dtype=object)
    if scale is None:
        a, e = np.broadcast_arrays(a, e)
        s = None
    else:
        a, e, s = np.broadcast_arrays(a, e, np.asarray(scale, dtype=object))
    out = np.empty(a.shape, dtype=np.float64)
    flat_a = a.ravel().tolist()
    flat_e = e.ravel().tolist()
    flat_s = s.ravel().tolist() if s is not None else [None] * len(flat_a)
    out.reshape(-1)[:] = [
        _error_one(_exact_mpf(av), _exact_mpf(ev), None if sv is None else _exact_mpf(sv),
                   p, emin, emax, max_finite)
        for av, ev, sv in zip(flat_a, flat_e, flat_s)
    ]
    return out


def _default_dtype(actual, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    dt = np.asarray(actual).dtype
    return dt if dt.kind == "f" else np.dtype(np.float64)


def max_ulp_error(actual, exact, dtype=None, scale=None):
    """Largest ulp error and where it occurs.

    Parameters
    ----------
    actual, exact, scale
        As for :func:`ulp_error`.
    dtype : dtype-like, optional
        Defaults to the dtype of `actual` (float64 if that is not a floating dtype).

    Returns
    -------
    max_err : float
        The largest error (0.0 for empty inputs).
    index : tuple of int or None
        Index of the (first) largest error in the broadcast shape; None for empty inputs.
    """
    err = ulp_error(actual, exact, _default_dtype(actual, dtype), scale)
    if err.size == 0:
        return 0.0, None
    k = int(np.argmax(err))
    return float(err.ravel()[k]), tuple(int(i) for i in np.unravel_index(k, err.shape))


def _fmt_float(v):
    f = float(v)
    if math.isfinite(f):
        return f"{v!r} = {f!r} ({f.hex()})"
    return repr(v)


def _fmt_input(name, value, idx, out_shape):
    """The part of an input array relevant to the element at `idx` of an output of `out_shape`.

    Leading axes shared with the output are indexed (an input of the output's rank, such as the
    logits of a gradient, shows the element's whole row); an input that only lines up with the
    trailing axes (such as class weights) is shown whole.
    """
    arr = np.asarray(value)
    if arr.ndim == 0:
        return f"    {name} = {value!r}"
    k = min(arr.ndim, len(idx))
    if arr.ndim == len(idx) and arr.ndim >= 2:
        k -= 1
    prefix_ok = arr.shape[:k] == tuple(out_shape[:k])
    trailing = arr.ndim < len(out_shape) and arr.shape == tuple(out_shape[len(out_shape) - arr.ndim:])
    sub = tuple(idx[:k]) if prefix_ok and not (trailing and k == arr.ndim) else ()
    part = arr[sub] if sub else arr
    with np.printoptions(floatmode="unique", threshold=4096, linewidth=120):
        text = np.array2string(np.asarray(part), separator=", ")
    where = f"[{', '.join(map(str, sub))}]" if sub else ""
    text = text.replace("\n", "\n      ")
    return f"    {name}{where} = {text}"


def assert_ulp_close(actual, exact, max_ulp, dtype=None, scale=None, inputs=None, err_msg=""):
    """Assert that `actual` is within `max_ulp` ulps of the exact values everywhere.

    Parameters
    ----------
    actual : array_like
        Computed values.
    exact : mpf or array_like of mpf
        Exact values (e.g. from :mod:`xentfast.reference`).
    max_ulp : float
        Largest allowed error, in ulps.
    dtype : dtype-like, optional
        Unit format; defaults to the dtype of `actual`.
    scale : array_like of mpf, optional
        Measure errors in ``ulp(scale)`` instead of ``ulp(exact)`` (see :func:`ulp_error`).
    inputs : dict of str to array_like, optional
        Inputs to print for the worst element: for each array, the row at the worst index (for an
        array of the same rank as the output, e.g. logits vs. their gradient, the row containing
        the element).
    err_msg : str, optional
        Appended to the failure message.

    Raises
    ------
    AssertionError
        If any error exceeds `max_ulp`; the message gives the number of failures, the worst index,
        the actual value (repr and hex), the exact value (25 digits), its ulp error, and the inputs.
    """
    dt = _default_dtype(actual, dtype)
    err = ulp_error(actual, exact, dt, scale)
    bad = err > max_ulp
    nbad = int(np.count_nonzero(bad))
    if not nbad:
        return
    k = int(np.argmax(err))
    idx = tuple(int(i) for i in np.unravel_index(k, err.shape))
    a = np.broadcast_to(np.asarray(actual), err.shape)[idx]
    e = np.broadcast_to(np.asarray(exact, dtype=object), err.shape)[idx]
    lines = [
        f"Not within {max_ulp} ulp ({dt.name}): {nbad} of {err.size} elements exceed the bound.",
        f"  worst at index {idx}: {err[idx]:.6g} ulp",
        f"    actual = {_fmt_float(a)}",
        f"    exact  = {mpmath.nstr(_exact_mpf(e), 25)}",
        f"    exact rounded to {dt.name} = {_fmt_float(rounded(e, dt))}",
    ]
    if scale is not None:
        s = np.broadcast_to(np.asarray(scale, dtype=object), err.shape)[idx]
        lines.append(f"    scale  = {mpmath.nstr(_exact_mpf(s), 25)}")
    if inputs:
        lines.append("  inputs:")
        lines.extend(_fmt_input(name, value, idx, err.shape) for name, value in inputs.items())
    if err_msg:
        lines.append(err_msg)
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------------------------------
# Hypothesis strategies


def _fmt_consts(dtype):
    dt = np.dtype(dtype)
    if dt == np.float32:
        return dict(width=32, huge=3e38, max=float(np.finfo(np.float32).max),
                    tiny=float(np.finfo(np.float32).smallest_subnormal),
                    normal=float(np.finfo(np.float32).smallest_normal),
                    gaps=(87.0, 88.0, 89.0, 103.0, 104.0), gap_max=100.0)
    if dt == np.float64:
        return dict(width=64, huge=1e300, max=float(np.finfo(np.float64).max),
                    tiny=float(np.finfo(np.float64).smallest_subnormal),
                    normal=float(np.finfo(np.float64).smallest_normal),
                    gaps=(709.0, 710.0, 745.0), gap_max=700.0)
    raise ValueError(f"strategies support float32 and float64; got {dt}")


def _caster(dtype):
    """Round a Python float to the nearest value of `dtype` (Hypothesis insists on exact elements)."""
    t = np.dtype(dtype).type

    def cast(v):
        with np.errstate(over="ignore"):
            return float(t(v))

    return cast


def _class_counts(lo, hi):
    """Counts in [lo, hi], biased to 1, 2 and 2**k - 1, 2**k, 2**k + 1 (k <= 6)."""
    from hypothesis import strategies as st

    special = sorted({n for k in range(1, 7) for n in (2**k - 1, 2**k, 2**k + 1)} | {1, 2})
    special = [n for n in special if lo <= n <= hi]
    anyn = st.integers(lo, hi)
    return st.one_of(st.sampled_from(special), anyn) if special else anyn


_ROW_KINDS = ("ordinary", "huge", "moderate", "tiny", "ties", "confident", "outlier", "mask",
              "constant", "mixed")


def _row_strategy(dtype, n, allow_neginf):
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    c = _fmt_consts(dtype)
    w = c["width"]

    cast = _caster(dtype)

    def fl(lo, hi):
        return st.floats(cast(lo), cast(hi), width=w, allow_nan=False, allow_infinity=False)

    ordinary = fl(-20.0, 20.0)
    huge = st.one_of(fl(-c["huge"], c["huge"]),
                     st.sampled_from([cast(v) for v in (c["huge"], -c["huge"], c["max"], -c["max"],
                                                        1e5, -1e5)]))
    moderate = st.one_of(fl(-1e5, 1e5), st.sampled_from([1e5, -1e5, 1e4, -1e4]))
    tiny = st.one_of(
        st.sampled_from([cast(v) for v in (0.0, -0.0, c["tiny"], -c["tiny"], c["normal"],
                                           -c["normal"], 1e-30, -1e-30)]),
        fl(-1e-30, 1e-30))
    specials = [0.0, -0.0, 1.0, -1.0, c["huge"], -c["huge"], c["tiny"], 1e-30, 1e5, -1e5]
    if allow_neginf:
        specials.append(-math.inf)
    mixed = st.one_of(ordinary, huge, tiny, st.sampled_from([cast(v) for v in specials]))

    def arr(elements):
        return hnp.arrays(dtype, n, elements=elements)

    @st.composite
    def row(draw):
        kind = draw(st.sampled_from(_ROW_KINDS))
        if kind == "huge":
            return draw(arr(huge))
        if kind == "moderate":
            return draw(arr(moderate))
        if kind == "tiny":
            return draw(arr(tiny))
        if kind == "mixed":
            return draw(arr(mixed))
        if kind == "constant":
            return np.full(n, draw(mixed.filter(lambda v: v != -math.inf)), dtype=dtype)
        x = draw(arr(ordinary))
        if kind == "ties" and n >= 2:
            k = draw(st.integers(2, n))
            pos = draw(st.permutations(range(n)))[:k]
            top = max(float(np.max(x)), draw(ordinary))
            x[list(pos)] = top
        elif kind in ("confident", "outlier"):
            gap = draw(st.one_of(fl(20.0, c["gap_max"]), st.sampled_from(c["gaps"])))
            i = draw(st.integers(0, n - 1))
            others = np.delete(x, i)
            with np.errstate(over="ignore"):
                if kind == "confident":
                    # One dominant logit: the exact gradient at the target is -(1 - p), down to exp(-gap).
                    x[i] = dtype(float(np.max(others)) + gap) if n > 1 else x[i]
                else:
                    # One logit far below the rest: its probability sits at the exp underflow edge.
                    x[i] = dtype(float(np.min(others)) - gap) if n > 1 else x[i]
        elif kind == "mask" and allow_neginf:
            if draw(st.integers(0, 7)) == 0:
                x[:] = -np.inf  # all -inf rows occasionally (loss NaN, logsumexp -inf)
            else:
                mask = draw(hnp.arrays(np.bool_, n, elements=st.booleans()))
                mask[draw(st.integers(0, n - 1))] = False
                x[mask] = -np.inf
        return x

    return row()


def logits(dtype=np.float64, shape=None, min_classes=1, max_classes=40, max_rows=12,
           allow_nan=False, allow_posinf=False, allow_neginf=True, min_rows=1):
    """Hypothesis strategy for adversarial logits arrays.

    Parameters
    ----------
    dtype : dtype-like, optional
        ``numpy.float32`` or ``numpy.float64``.
    shape : tuple of int, optional
        Exact shape, class axis last (default: ``(rows, classes)`` drawn from the bounds below).
    min_classes, max_classes : int, optional
        Bounds on the number of classes; counts 1, 2, ``2**k - 1``, ``2**k``, ``2**k + 1`` are favoured.
    max_rows, min_rows : int, optional
        Bounds on the number of rows.
    allow_nan, allow_posinf : bool, optional
        Occasionally put NaN / ``+inf`` entries into rows.
    allow_neginf : bool, optional
        Allow ``-inf`` entries (masks), including occasional all ``-inf`` rows.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        C-contiguous arrays of `dtype`.  Each row has its own kind: ordinary values in [-20, 20],
        huge magnitudes, moderately huge (1e5), tiny (subnormals, signed zeros, 1e-30), tied maxima,
        a confident logit above the rest by a gap in [20, 700] (f64) / [20, 100] (f32) or exactly at
        the exp underflow edge, a logit that far below the rest, ``-inf`` masks, constant rows, and
        mixtures of all of them.
    """
    from hypothesis import strategies as st

    dt = np.dtype(dtype)
    _fmt_consts(dt)

    @st.composite
    def build(draw):
        if shape is None:
            n_rows = draw(st.integers(min_rows, max_rows))
            n_cls = draw(_class_counts(min_classes, max_classes))
            out_shape = (n_rows, n_cls)
        else:
            out_shape = tuple(int(s) for s in shape)
            n_cls = out_shape[-1] if out_shape else 1
            n_rows = int(np.prod(out_shape[:-1])) if out_shape else 1
        x = np.empty((n_rows, n_cls), dtype=dt)
        if n_cls:
            row = _row_strategy(dt.type, n_cls, allow_neginf)
            for i in range(n_rows):
                x[i] = draw(row)
                if allow_nan and draw(st.integers(0, 9)) == 0:
                    x[i, draw(st.integers(0, n_cls - 1))] = np.nan
                if allow_posinf and draw(st.integers(0, 9)) == 0:
                    x[i, draw(st.integers(0, n_cls - 1))] = np.inf
        return np.ascontiguousarray(x.reshape(out_shape))

    return build()


def index_targets(n_classes, shape, ignore_index=-100, dtype=np.int64, allow_ignore=True,
                  argmax_of=None):
    """Hypothesis strategy for integer class-index targets.

    Parameters
    ----------
    n_classes : int
        Number of classes ``C``; targets are in ``[0, C)``.
    shape : int or tuple of int
        Shape of the target array (the logits' shape without the class axis).
    ignore_index : int, optional
        Value mixed in for ignored rows when `allow_ignore`.
    dtype : dtype-like, optional
        Integer dtype.
    allow_ignore : bool, optional
        Whether `ignore_index` may appear.
    argmax_of : array_like, optional
        Logits with class axis last and leading shape `shape`; the row's argmax is then a favoured
        target (the confident-and-correct case, where ``p_y - 1`` cancels).

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Arrays of `dtype` and `shape`, biased towards classes 0 and ``C - 1`` and the argmax.
    """
    from hypothesis import strategies as st

    C = int(n_classes)
    shp = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    size = int(np.prod(shp))
    if C <= 0 and not allow_ignore:
        raise ValueError("no valid target: n_classes is 0 and ignore_index is not allowed")
    amax = None
    if argmax_of is not None and C > 0:
        a = np.asarray(argmax_of, dtype=np.float64).reshape(size, C)
        with np.errstate(invalid="ignore"):
            amax = np.argmax(np.where(np.isnan(a), -np.inf, a), axis=-1)

    choices = []
    if C > 0:
        choices += ["any", "first", "last"]
        if amax is not None:
            choices += ["argmax", "argmax"]
    if allow_ignore:
        choices.append("ignore")

    @st.composite
    def build(draw):
        out = np.empty(size, dtype=dtype)
        for i in range(size):
            kind = draw(st.sampled_from(choices))
            if kind == "any":
                v = draw(st.integers(0, C - 1))
            elif kind == "first":
                v = 0
            elif kind == "last":
                v = C - 1
            elif kind == "argmax":
                v = int(amax[i])
            else:
                v = ignore_index
            out[i] = v
        return out.reshape(shp)

    return build()


def prob_targets(shape, dtype=np.float64):
    """Hypothesis strategy for probability (soft) targets.

    Parameters
    ----------
    shape : tuple of int
        Shape of the target (same as the logits; class axis last).
    dtype : dtype-like, optional
        Floating dtype.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Non-negative arrays whose rows are one-hot, uniform, randomly normalized, normalized with
        exact zeros, or not normalized at all (sums in [0, C*2]).
    """
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    dt = np.dtype(dtype)
    w = _fmt_consts(dt)["width"]
    shp = tuple(int(s) for s in shape)
    C = shp[-1] if shp else 1
    n_rows = int(np.prod(shp[:-1])) if shp else 1
    unit = st.floats(0.0, 1.0, width=w)

    @st.composite
    def build(draw):
        out = np.zeros((n_rows, C), dtype=dt)
        if C == 0:
            return out.reshape(shp)
        for i in range(n_rows):
            kind = draw(st.sampled_from(["onehot", "uniform", "random", "zeros", "unnormalized"]))
            if kind == "onehot":
                out[i, draw(st.integers(0, C - 1))] = 1
            elif kind == "uniform":
                out[i] = dt.type(1.0 / C)
            else:
                row = draw(hnp.arrays(dt, C, elements=unit)).astype(np.float64)
                if kind == "zeros":
                    row[draw(hnp.arrays(np.bool_, C, elements=st.booleans()))] = 0.0
                if kind == "unnormalized":
                    row *= 2.0
                elif row.sum() > 0:
                    row /= row.sum()
                out[i] = row.astype(dt)
        return out.reshape(shp)

    return build()


def class_weights(n_classes, dtype=np.float64):
    """Hypothesis strategy for class-weight vectors.

    Parameters
    ----------
    n_classes : int
        Length ``C``.
    dtype : dtype-like, optional
        Floating dtype.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Finite, non-negative arrays of shape ``(C,)``, often containing exact zeros and ones.
    """
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    dt = np.dtype(dtype)
    w = _fmt_consts(dt)["width"]
    cast = _caster(dt)
    el = st.one_of(st.sampled_from([cast(v) for v in (0.0, 1.0, 0.5, 2.0, 1e-3)]),
                   st.floats(0.0, 10.0, width=w))
    return st.one_of(hnp.arrays(dt, int(n_classes), elements=el),
                     st.just(np.ones(int(n_classes), dtype=dt)))


class XentCase(NamedTuple):
    """One cross-entropy problem drawn by :func:`softmax_xent_cases` (unpacks as a tuple)."""

    logits: np.ndarray
    target: np.ndarray
    weight: np.ndarray | None
    label_smoothing: float
    ignore_index: int
    z_loss: float


def softmax_xent_cases(dtype=np.float64, **logits_kwargs):
    """Hypothesis strategy for complete cross-entropy problems with consistent shapes.

    Parameters
    ----------
    dtype : dtype-like, optional
        Floating dtype of logits, probability targets and weights.
    **logits_kwargs
        Passed to :func:`logits` (e.g. ``max_rows``, ``allow_nan``).

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        :class:`XentCase` tuples ``(logits, target, weight, label_smoothing, ignore_index, z_loss)``:
        2-D logits ``(rows, C)``, an index target ``(rows,)`` (possibly containing `ignore_index`,
        which is -100, -1 or a valid class) or a probability target ``(rows, C)``, weights None or
        ``(C,)``, smoothing in [0, 1] and z_loss in {0, 1e-4, 1e-2, 1}.
    """
    from hypothesis import strategies as st

    dt = np.dtype(dtype)

    @st.composite
    def build(draw):
        x = draw(logits(dt, **logits_kwargs))
        n, C = x.shape
        weight = draw(st.one_of(st.none(), class_weights(C, dt)))
        eps = draw(st.one_of(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0]), st.floats(0.0, 1.0)))
        z = draw(st.sampled_from([0.0, 0.0, 1e-4, 1e-2, 1.0]))
        ii_choices = [-100, -1] + ([0, C - 1] if C else [])
        ignore_index = draw(st.sampled_from(ii_choices))
        if C > 0 and draw(st.booleans()):
            target = draw(prob_targets(x.shape, dt))
        else:
            target = draw(index_targets(C, (n,), ignore_index=ignore_index, argmax_of=x))
        return XentCase(x, target, weight, float(eps), int(ignore_index), float(z))

    return build()


# --------------------------------------------------------------------------------------------------
# The baseline a user would write


def naive_cross_entropy_with_grad(x, y):
    """Mean softmax cross-entropy and its gradient as the plain NumPy expression (max-shifted).

    The speed baseline of ``python -m xentfast`` and of ``benchmarks/``, and an example of the textbook
    formulas the accuracy contract improves on: ``log S`` (0 for confident rows) and ``p_y - 1``.
    """
    x = np.asarray(x)
    rows = np.arange(x.shape[0])
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    loss = (np.log(s[:, 0]) + m[:, 0] - x[rows, y]).mean()
    g = e / s
    g[rows, y] -= 1
    g /= x.shape[0]
    return loss, g
