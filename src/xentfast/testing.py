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
  tiny magnitudes, ties, confident rows with gaps around the exp underflow edge, ``-inf`` masks; and for
  the binary family (:func:`binary_logits`, :func:`binary_targets`, :func:`unit_probabilities`,
  :func:`element_weights`, :func:`binary_xent_cases`): exact 0.0 and -0.0, +-tiny, both tails,
  +-large, +-inf, NaN, soft targets, broadcast weights.  Every strategy takes float32 and float64, and
  float16 and ``ml_dtypes.bfloat16`` for the half-precision inputs;
* :func:`check_conformance` -- the conformance kit: runs the adversarial case families of a loss on ANY
  implementation (forward and backward callables on NumPy arrays) and reports, per family, the max ULP
  error of loss and gradient against :mod:`xentfast.reference`, with the worst input.

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

from . import _dtypes, reference
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
    "upstream_scalars",
    "softmax_xent_cases",
    "XentCase",
    "naive_cross_entropy_with_grad",
    "binary_logits",
    "binary_targets",
    "unit_probabilities",
    "element_weights",
    "binary_xent_cases",
    "BinaryCase",
    "check_conformance",
    "ConformanceReport",
    "FamilyResult",
    "ElementwiseReference",
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
        ``numpy.float32`` or ``numpy.float64``; ``numpy.float16`` and ``ml_dtypes.bfloat16`` too.

    Returns
    -------
    mpf or numpy.ndarray of mpf
        ``2**(e - p + 1)`` for ``|x|`` in ``[2**e, 2**(e+1))`` (``p`` = 24 or 53; 11 for float16, 8 for
        bfloat16); below the smallest normal (and at 0) the subnormal spacing ``2**-149`` / ``2**-1074``
        (``2**-24`` float16, ``2**-133`` bfloat16).  ``ulp(±inf)`` is ``inf``
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
        if (a > 0) != (e > 0):
            return math.inf
        # compared exactly: abs(e) would round e to the context's 53 bits, and an exact value just past the
        # largest finite number (DBL_MAX + 2^970 - 2^917, a float64 loss the tests met) rounds back onto it
        if (e > max_finite) if a > 0 else (e < -max_finite):
            return 0.0
        # an exact value within the range: the infinity stands for the next number of the format past the
        # largest finite one, 2^(emax+1), which is what rounding with an unbounded exponent range gives
        # before it overflows; so an infinity where the exact value is DBL_MAX itself is 1 ulp off, and one
        # where it is DBL_MAX / 2 is 2^53 + 1 ulp off
        a = _pow2(emax + 1) if a > 0 else -_pow2(emax + 1)
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
        Format whose ulp is the unit (``numpy.float32`` or ``numpy.float64``; ``numpy.float16`` and
        ``ml_dtypes.bfloat16`` too).
    scale : array_like of mpf, optional
        If given, errors are measured in ``ulp(scale)`` instead of ``ulp(exact)`` -- for quantities
        that are differences of larger terms (e.g. soft-target gradients), where a relative bound
        on the tiny result is not meaningful.  Non-finite scale entries fall back to ``exact``.

    Returns
    -------
    numpy.ndarray of float64
        ``|actual - exact| / ulp``.  Special rules: exact NaN -> 0 if actual is NaN, else inf;
        exact ``±inf`` -> 0 if actual equals it, else inf; exact finite and actual NaN -> inf.  An
        actual infinity against a finite exact value of the other sign -> inf; of the same sign: 0 where
        the exact value lies beyond the format's largest finite number, else the infinity counts as
        ``±2**(emax+1)`` (2**1024 for float64, 2**128 for float32), the next number of the format's grid
        past the largest finite one (so the error is 1 ulp at the largest finite number itself).
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
    return dt if dt.kind == "f" or _dtypes.is_bfloat16(dt) else np.dtype(np.float64)


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


# float32 BCE's and focal loss's plain-double forms compute exp(-|x|) at |x| = 550 beyond it (binary.h,
# XF_BIN_FAST_EXP_MAX_ABS_X): 550 and the float above it, and 300 inside (exp(-|x|) far below float32's
# range)
_EDGES_32 = (15.0, 17.0, 20.0, 36.0, 88.0, 89.0, 103.0, 104.0, 300.0, 550.0, 550.00006)
_EDGES_64 = (20.0, 36.0, 37.0, 38.0, 709.0, 710.0, 745.0, 746.0, 1e5)


def _fmt_consts(dtype):
    """Per format: Hypothesis width, magnitudes, the row strategy's confident gaps, and the binary family's
    tail and edges (where sigmoid rounds to 1 and where exp underflows to the subnormals and to 0)."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        return dict(width=32, huge=3e38, max=float(np.finfo(np.float32).max),
                    tiny=float(np.finfo(np.float32).smallest_subnormal),
                    normal=float(np.finfo(np.float32).smallest_normal), moderate=1e5,
                    gaps=(87.0, 88.0, 89.0, 103.0, 104.0), gap_max=100.0, tail=100.0, edges=_EDGES_32)
    if dt == np.float64:
        return dict(width=64, huge=1e300, max=float(np.finfo(np.float64).max),
                    tiny=float(np.finfo(np.float64).smallest_subnormal),
                    normal=float(np.finfo(np.float64).smallest_normal), moderate=1e5,
                    gaps=(709.0, 710.0, 745.0), gap_max=700.0, tail=740.0, edges=_EDGES_64)
    # Half inputs give float32 losses and half gradients, so the gaps and edges sit at both formats' exp
    # underflow thresholds: float16 reaches 2^-14 and 2^-24 near gaps of 9.7 and 16.6, float32 and
    # bfloat16 underflow near 87-104; sigmoid rounds to 1 in float16 from ~7.6, in bfloat16 from ~5.5
    if dt == np.float16:
        return dict(width=16, huge=6e4, max=float(np.finfo(np.float16).max), tiny=2.0**-24, normal=2.0**-14,
                    moderate=1e4, gaps=(9.0, 10.0, 16.0, 17.0, 18.0, 87.0, 88.0, 103.0, 104.0), gap_max=100.0,
                    tail=100.0, edges=(5.0, 8.0, 9.0, 10.0, 16.0, 17.0, 18.0, 88.0, 89.0, 103.0, 104.0))
    if _dtypes.is_bfloat16(dt):
        # Hypothesis draws no bfloat16: elements are drawn as float32 within bfloat16 bounds and rounded
        return dict(width=32, huge=3e38, max=float(_dtypes.round_to(np.array(3.4e38), dt).astype(np.float64)),
                    tiny=2.0**-133, normal=2.0**-126, moderate=1e5,
                    gaps=(87.0, 88.0, 89.0, 92.0, 93.0, 103.0, 104.0), gap_max=100.0, tail=100.0,
                    edges=(5.0, 6.0, 15.0, 17.0, 20.0, 36.0, 88.0, 89.0, 92.0, 93.0, 103.0, 104.0))
    raise ValueError(f"strategies support float16, bfloat16 (ml_dtypes), float32 and float64; got {dt}")


def _arrays(dtype, shape, elements):
    """``hnp.arrays`` of `dtype`; bfloat16, which Hypothesis cannot hold, is drawn as float32 and rounded
    (bounds given as bfloat16 values stay bounds)."""
    from hypothesis.extra import numpy as hnp

    dt = np.dtype(dtype)
    if not _dtypes.is_bfloat16(dt):
        return hnp.arrays(dt, shape, elements=elements)
    return hnp.arrays(np.float32, shape, elements=elements).map(lambda a: a.astype(dt))


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
    m = c["moderate"]
    huge = st.one_of(fl(-c["huge"], c["huge"]),
                     st.sampled_from([cast(v) for v in (c["huge"], -c["huge"], c["max"], -c["max"], m, -m)]))
    moderate = st.one_of(fl(-m, m), st.sampled_from([m, -m, 1e4, -1e4]))
    tiny = st.one_of(
        st.sampled_from([cast(v) for v in (0.0, -0.0, c["tiny"], -c["tiny"], c["normal"],
                                           -c["normal"], 1e-30, -1e-30)]),
        fl(-1e-30, 1e-30))
    specials = [0.0, -0.0, 1.0, -1.0, c["huge"], -c["huge"], c["tiny"], 1e-30, m, -m]
    if allow_neginf:
        specials.append(-math.inf)
    mixed = st.one_of(ordinary, huge, tiny, st.sampled_from([cast(v) for v in specials]))

    def arr(elements):
        return _arrays(dtype, n, elements)

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
        ``numpy.float32`` or ``numpy.float64``; ``numpy.float16`` and ``ml_dtypes.bfloat16`` too (the
        gaps then also sit at the half format's own underflow edges).
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


def upstream_scalars(large=False):
    """Hypothesis strategy for a scalar ``grad_output`` of a ``mean`` or ``sum``.

    Parameters
    ----------
    large : bool, optional
        Also draw 1e30 and -2**70, which magnify whatever a kernel rounds before applying the factor
        (a subnormal weight, an underflowed power).  Not for cross_entropy: under subnormal class
        weights and label smoothing such a factor makes gradient entries whose two terms both overflow
        (a documented limit, README).

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Python floats: ordinary factors (1, 0.5, 3), subnormal ones of either sign, and NaN.  Divided
        by a mean's denominator, a subnormal factor keeps only a few bits; weights, ``pos_weight`` or
        ``1/p`` can then multiply that rounding back into normal numbers.  NaN checks the NaN rule of
        the README's special values: NaN wherever the factor multiplies a term, 0 where no term is left.
    """
    from hypothesis import strategies as st

    return st.sampled_from([1.0, 0.5, 3.0, 5e-324, -3e-320, 1.1e-310, math.nan]
                           + ([1e30, -2.0**70] if large else []))


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
                row = draw(_arrays(dt, C, unit)).astype(np.float64)
                if kind == "zeros":
                    row[draw(hnp.arrays(np.bool_, C, elements=st.booleans()))] = 0.0
                if kind == "unnormalized":
                    row *= 2.0
                elif row.sum() > 0:
                    row /= row.sum()
                out[i] = row.astype(dt)
        return out.reshape(shp)

    return build()


def _weight_specials(dt):
    """Exact weight values drawn beside the uniform ones: 0, 1, 0.5, 2, 1e-3, and 2^40 and 2^-40 where
    the dtype holds them (not float16), so that weights far from 1 are drawn at all."""
    cast = _caster(dt)
    far = [v for v in (2.0**40, 2.0**-40) if cast(v) == v]
    return [cast(v) for v in (0.0, 1.0, 0.5, 2.0, 1e-3)] + far


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

    dt = np.dtype(dtype)
    w = _fmt_consts(dt)["width"]
    el = st.one_of(st.sampled_from(_weight_specials(dt)), st.floats(0.0, 10.0, width=w))
    return st.one_of(_arrays(dt, int(n_classes), el),
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
        which is -100, -1 or a valid class) or a probability target ``(rows, C)`` (with
        `ignore_index` -100), weights None or
        ``(C,)``, smoothing 0 or in [2^-900, 1] and z_loss in {0, 1e-4, 1e-2, 1}.
    """
    from hypothesis import strategies as st

    dt = np.dtype(dtype)

    @st.composite
    def build(draw):
        x = draw(logits(dt, **logits_kwargs))
        n, C = x.shape
        weight = draw(st.one_of(st.none(), class_weights(C, dt)))
        # smoothing below 2^-900 is refused by the API (xentfast.api._MIN_SMOOTHING); draw right at it too
        eps = draw(st.one_of(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0, 2.0**-900]),
                             st.floats(2.0**-900, 1.0)))
        z = draw(st.sampled_from([0.0, 0.0, 1e-4, 1e-2, 1.0]))
        ii_choices = [-100, -1] + ([0, C - 1] if C else [])
        ignore_index = draw(st.sampled_from(ii_choices))
        if C > 0 and draw(st.booleans()):
            target = draw(prob_targets(x.shape, dt))
            ignore_index = -100  # the only one the API takes with probability targets, as torch
        else:
            target = draw(index_targets(C, (n,), ignore_index=ignore_index, argmax_of=x))
        return XentCase(x, target, weight, float(eps), int(ignore_index), float(z))

    return build()


# --------------------------------------------------------------------------------------------------
# The baseline a user would write


def naive_cross_entropy_with_grad(x, y, ignore_index=-100):
    """Mean softmax cross-entropy and its gradient as the plain NumPy expression (max-shifted), over the
    rows whose label is not ``ignore_index`` (torch's mean; those rows get a zero gradient).

    The speed baseline of ``python -m xentfast`` and of ``benchmarks/``, and an example of the textbook
    formulas the accuracy contract improves on: ``log S`` (0 for confident rows) and ``p_y - 1``.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    kept = y != ignore_index
    rows = np.flatnonzero(kept)
    y_kept = y[rows]
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    loss = (np.log(s[rows, 0]) + m[rows, 0] - x[rows, y_kept]).mean()
    g = e / s
    g[rows, y_kept] -= 1
    g[~kept] = 0
    g /= rows.size
    return loss, g


# --------------------------------------------------------------------------------------------------
# Binary family: Hypothesis strategies


def _binary_specials(dtype):
    c = _fmt_consts(dtype)
    edges = c["edges"]
    out = [0.0, -0.0, c["tiny"], -c["tiny"], c["normal"], -c["normal"], 1e-30, -1e-30, c["huge"], -c["huge"],
           c["max"], -c["max"]]
    for e in edges:
        out += [e, -e]
    return out


def binary_logits(dtype=np.float64, shape=None, max_size=48, allow_nan=True, allow_inf=True):
    """Hypothesis strategy for elementwise logits: exactly 0.0 and -0.0, +-tiny, the tails (confident
    right and wrong), the exp under/overflow edges, +-large, +-inf and NaN, mixed in one array.

    Parameters
    ----------
    dtype : dtype-like
        ``numpy.float32`` or ``numpy.float64``; ``numpy.float16`` and ``ml_dtypes.bfloat16`` too.
    shape : tuple of int, optional
        Exact shape (default: 1-D or 2-D with at most `max_size` elements).
    allow_nan, allow_inf : bool
        Whether NaN / +-inf may appear.
    """
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    dt = np.dtype(dtype)
    c = _fmt_consts(dt)
    cast = _caster(dt)
    w = c["width"]
    tail = c["tail"]

    def fl(lo, hi):
        return st.floats(cast(lo), cast(hi), width=w, allow_nan=False, allow_infinity=False)

    specials = [cast(v) for v in _binary_specials(dt)]
    if allow_inf:
        specials += [math.inf, -math.inf]
    el = st.one_of(fl(-8.0, 8.0), fl(-tail, tail), fl(-1e-20, 1e-20), st.sampled_from(specials),
                   fl(-c["huge"], c["huge"]))
    if allow_nan:
        el = st.one_of(el, st.just(math.nan))
    shp = st.just(tuple(shape)) if shape is not None else hnp.array_shapes(min_dims=1, max_dims=2, min_side=1,
                                                                            max_side=max(1, max_size // 4))
    return shp.flatmap(lambda s: _arrays(dt, s, el))


def binary_targets(shape, dtype=np.float64, soft=None):
    """Hypothesis strategy for targets in [0, 1] of `shape`: hard {0, 1} or soft (0.5, tiny, 1 - tiny,
    uniform, subnormal).  ``soft=None`` draws either kind, per array."""
    from hypothesis import strategies as st

    dt = np.dtype(dtype)
    w = _fmt_consts(dt)["width"]
    cast = _caster(dt)
    hard = st.sampled_from([0.0, 1.0])
    soft_el = st.one_of(st.floats(0.0, 1.0, width=w),
                        st.sampled_from([cast(v) for v in (0.0, 1.0, 0.5, 0.25, 1e-30, 1 - 2**-24, 1e-7)]))
    if soft is None:
        kinds = st.sampled_from([False, True])
    else:
        kinds = st.just(bool(soft))
    return kinds.flatmap(lambda s: _arrays(dt, tuple(shape), soft_el if s else hard))


def unit_probabilities(shape, dtype=np.float64):
    """Hypothesis strategy for probabilities in [0, 1]: exact 0 and 1, subnormals, tiny, 1 - tiny, 1e-7 and
    1 - 1e-7 (Keras's clip edges), exp(-100) (torch's log clamp) and uniform values."""
    from hypothesis import strategies as st

    dt = np.dtype(dtype)
    c = _fmt_consts(dt)
    cast = _caster(dt)
    w = c["width"]
    specials = [0.0, 1.0, c["tiny"], c["normal"], 1e-30, 1e-7, 1 - 1e-7, math.exp(-100.0), 0.5, 1 - 2**-24,
                1 - 2**-53 if w == 64 else 1 - 2**-24]
    el = st.one_of(st.floats(0.0, 1.0, width=w), st.sampled_from([cast(v) for v in specials]))
    return _arrays(dt, tuple(shape), el)


def element_weights(shape, dtype=np.float64):
    """Hypothesis strategy for weights that broadcast to `shape`: None, a scalar, the last axis, or the
    full shape; values in [0, 10] with exact 0, 1, 0.5, 2 and 1e-3, and 2^40 and 2^-40 (not float16)."""
    from hypothesis import strategies as st

    dt = np.dtype(dtype)
    w = _fmt_consts(dt)["width"]
    el = st.one_of(st.sampled_from(_weight_specials(dt)), st.floats(0.0, 10.0, width=w))
    shapes = [(), tuple(shape), tuple(shape[-1:]) if shape else ()]
    return st.one_of(st.none(), st.sampled_from(shapes).flatmap(lambda s: _arrays(dt, s, el)))


class BinaryCase(NamedTuple):
    """One elementwise problem drawn by :func:`binary_xent_cases`."""

    logits: np.ndarray
    target: np.ndarray
    weight: np.ndarray | None
    pos_weight: np.ndarray | None
    ignore_index: float | None


def binary_xent_cases(dtype=np.float64, soft=None, **logits_kwargs):
    """Hypothesis strategy for complete BCE-with-logits problems: logits (:func:`binary_logits`),
    targets (:func:`binary_targets`, some replaced by `ignore_index`), weight and pos_weight
    (:func:`element_weights`) and ignore_index in {None, -100, -1}."""
    from hypothesis import strategies as st

    dt = np.dtype(dtype)

    @st.composite
    def build(draw):
        x = draw(binary_logits(dt, **logits_kwargs))
        t = draw(binary_targets(x.shape, dt, soft=soft))
        w = draw(element_weights(x.shape, dt))
        q = draw(element_weights(x.shape, dt))
        ii = draw(st.sampled_from([None, None, -100, -1]))
        if ii is not None and t.size:
            mask = draw(st.lists(st.booleans(), min_size=t.size, max_size=t.size))
            t = t.copy()
            t.reshape(-1)[np.array(mask)] = ii
        return BinaryCase(x, t, w, q, ii)

    return build()


# --------------------------------------------------------------------------------------------------
# The conformance kit: any implementation of a loss, measured against xentfast.reference


class ElementwiseReference:
    """A user-defined exact elementwise loss for :func:`check_conformance`.

    Parameters
    ----------
    loss : callable
        ``loss(x, y, **params) -> mpf`` for one element, on mpf arguments (params: the element's values
        of the implementation's array parameters, e.g. ``pos_weight``).
    grad : callable
        ``grad(x, y, **params) -> mpf``, the exact derivative of `loss` in ``x``.
    name : str
        Shown in the report.

    Computed at 120 bits (no cancellation is expected in a hand-written reference; results are
    compared at 24/53 bits).
    """

    def __init__(self, loss, grad, name="custom reference"):
        self.loss_fn, self.grad_fn, self.name = loss, grad, name

    def _apply(self, fn, x, t, params):
        xs = reference._to_mpf_array(x, "input").ravel()
        ts = reference._to_mpf_array(t, "target").ravel()
        ps = {k: reference._to_mpf_array(np.broadcast_to(v, np.shape(x)), k).ravel() for k, v in params.items()}
        with mpmath.workprec(120):
            out = [fn(xs[i], ts[i], **{k: v[i] for k, v in ps.items()}) for i in range(xs.size)]
        return reference._obj_array(out, np.shape(x))

    def loss(self, x, t, **params):
        return self._apply(self.loss_fn, x, t, params)

    def grad(self, x, t, **params):
        return self._apply(self.grad_fn, x, t, params), None


class _NamedReference:
    """Reference losses of xentfast.reference in the checker's calling convention."""

    def __init__(self, name):
        self.name = f"xentfast.reference.{name}"
        self.key = name

    def loss(self, x, t, **p):
        r = reference
        if self.key == "binary_cross_entropy_with_logits":
            return r.binary_cross_entropy_with_logits(x, t, p.get("weight"), p.get("pos_weight"), reduction="none")
        if self.key == "sigmoid_focal_loss":
            return r.sigmoid_focal_loss(x, t, p.get("alpha", 0.25), p.get("gamma", 2.0), reduction="none")
        if self.key == "binary_cross_entropy":
            return r.binary_cross_entropy(x, t, p.get("weight"), reduction="none", eps=p.get("eps"),
                                          log_clamp=p.get("log_clamp"))
        if self.key == "cross_entropy":
            return r.cross_entropy(x, t, p.get("weight"), reduction="none")
        if self.key == "cross_entropy_from_probs":
            return r.cross_entropy_from_probs(x, t, p.get("weight"), reduction="none", eps=p.get("eps"))
        raise ValueError(self.key)

    def grad(self, x, t, **p):
        """(exact gradient, cancellation scale or None)."""
        r = reference
        if self.key == "binary_cross_entropy_with_logits":
            return r.binary_cross_entropy_with_logits_grad(x, t, p.get("weight"), p.get("pos_weight"),
                                                           reduction="none", return_scale=True)
        if self.key == "sigmoid_focal_loss":
            return r.sigmoid_focal_loss_grad(x, t, p.get("alpha", 0.25), p.get("gamma", 2.0), reduction="none",
                                             return_scale=True)
        if self.key == "binary_cross_entropy":
            return r.binary_cross_entropy_grad(x, t, p.get("weight"), reduction="none", eps=p.get("eps"),
                                               log_clamp=p.get("log_clamp"), return_scale=True)
        if self.key == "cross_entropy":
            return r.cross_entropy_grad(x, t, p.get("weight"), reduction="none", return_scale=True)
        if self.key == "cross_entropy_from_probs":
            return r.cross_entropy_from_probs_grad(x, t, p.get("weight"), reduction="none", eps=p.get("eps")), None
        raise ValueError(self.key)


def _suite_binary_logits(rng, dt, n):
    f32 = dt == np.float32
    tail_hi = 40.0 if f32 else 700.0
    big = [1e5, 1e30, float(np.finfo(dt).max)] + ([] if f32 else [1e300])
    hard = lambda m: rng.integers(0, 2, m).astype(dt)  # noqa: E731
    fams = {}
    x = (rng.standard_normal(n) * 4).astype(dt)
    fams["ordinary"] = dict(x=x, t=hard(n))
    fams["zero logits"] = dict(x=np.array([0.0, -0.0] * (n // 2), dtype=dt),
                               t=rng.choice([0.0, 1.0, 0.3, 0.5], n - n % 2).astype(dt))
    m = n // 2
    xc = rng.uniform(10.0, tail_hi, n).astype(dt)
    fams["confident correct"] = dict(x=np.concatenate([xc[:m], -xc[m:]]),
                                     t=np.concatenate([np.ones(m), np.zeros(n - m)]).astype(dt))
    fams["confident wrong"] = dict(x=np.concatenate([-xc[:m], xc[m:]]),
                                   t=np.concatenate([np.ones(m), np.zeros(n - m)]).astype(dt))
    xb = (rng.choice(big, n) * rng.choice([-1.0, 1.0], n)).astype(dt)
    fams["large"] = dict(x=xb, t=hard(n))
    tiny = float(np.finfo(dt).smallest_subnormal)
    fams["tiny"] = dict(x=(rng.choice([tiny, 1e-30, 1e-10, float(np.finfo(dt).smallest_normal)], n)
                           * rng.choice([-1.0, 1.0], n)).astype(dt), t=hard(n))
    fams["infinities"] = dict(x=rng.choice([np.inf, -np.inf], n).astype(dt), t=hard(n))
    fams["soft targets"] = dict(x=(rng.standard_normal(n) * 6).astype(dt), t=rng.random(n).astype(dt), soft=True)
    q = rng.choice([0.0, 1.0, 0.3, 3.0, 9.7], n) * rng.uniform(0.5, 1.5, n)
    fams["pos_weight"] = dict(x=(rng.standard_normal(n) * 4).astype(dt), t=hard(n),
                              params=dict(pos_weight=q.astype(dt)))
    fams["weight"] = dict(x=(rng.standard_normal(n) * 4).astype(dt), t=hard(n),
                          params=dict(weight=(rng.random(n) * 10).astype(dt)))
    # the inputs of Paddle's TestSigmoidCrossEntropyWithLogitsOp4: logit(U(0,1)), soft labels, q ~ U(0,1)
    u = rng.uniform(0.0, 1.0, n)
    fams["soft targets, pos_weight"] = dict(x=np.log(u / (1 - u)).astype(dt), t=rng.random(n).astype(dt),
                                            params=dict(pos_weight=rng.random(n).astype(dt)), soft=True)
    return fams


def _suite_focal(rng, dt, n):
    base = _suite_binary_logits(rng, dt, n)
    fams = {k: dict(v, params=dict(alpha=0.25, gamma=2.0))
            for k, v in base.items() if k not in ("pos_weight", "weight", "soft targets, pos_weight")}
    x = (rng.standard_normal(n) * 4).astype(dt)
    t = rng.integers(0, 2, n).astype(dt)
    fams["gamma 0 (weighted BCE)"] = dict(x=x, t=t, params=dict(alpha=0.25, gamma=0.0))
    fams["gamma 0.5, no alpha"] = dict(x=x, t=t, params=dict(alpha=-1.0, gamma=0.5))
    # gamma amplifies every relative error of u = 1 - p_t (u^gamma = exp(gamma log u)), and soft targets
    # within 1e-3 of 0 or 1 make u's two terms of very different size
    xs = (rng.choice([-1.0, 1.0], n) * np.exp(rng.uniform(np.log(1e-3), np.log(40.0), n))).astype(dt)
    near = np.exp(rng.uniform(np.log(1e-20 if dt == np.float64 else 1e-12), np.log(1e-3), n))
    ts = np.where(rng.random(n) < 0.5, near, 1.0 - near).astype(dt)
    fams["gamma 20, soft targets near 0 and 1"] = dict(x=xs, t=ts, params=dict(alpha=0.6, gamma=20.0), soft=True)
    fams["gamma 12, soft targets"] = dict(x=(rng.standard_normal(n) * 6).astype(dt), t=rng.random(n).astype(dt),
                                          params=dict(alpha=-1.0, gamma=12.0), soft=True)
    return fams


def _suite_bce_probs(rng, dt, n):
    f32 = dt == np.float32
    lo = -100.0 if f32 else -700.0
    hard = lambda m: rng.integers(0, 2, m).astype(dt)  # noqa: E731
    fams = {}
    fams["ordinary"] = dict(x=rng.uniform(0.01, 0.99, n).astype(dt), t=hard(n))
    fams["near 0"] = dict(x=np.exp(rng.uniform(lo, -5.0, n)).astype(dt), t=hard(n))
    fams["near 1"] = dict(x=(1 - np.exp(rng.uniform(-16.0 if f32 else -36.0, -5.0, n))).astype(dt), t=hard(n))
    fams["exact 0 and 1"] = dict(x=rng.choice([0.0, 1.0], n).astype(dt), t=hard(n))
    fams["soft targets"] = dict(x=rng.random(n).astype(dt), t=rng.random(n).astype(dt), soft=True)
    fams["weight"] = dict(x=rng.random(n).astype(dt), t=hard(n), params=dict(weight=(rng.random(n) * 10).astype(dt)))
    return fams


def _suite_softmax(rng, dt, n, probs=False):
    f32 = dt == np.float32
    C = 8
    rows = max(4, n // 4)
    fams = {}
    x = (rng.standard_normal((rows, C)) * 3).astype(dt)
    y = rng.integers(0, C, rows)
    fams["ordinary"] = dict(x=x, t=y)
    xc = x.copy()
    gaps = rng.uniform(15.0, 100.0 if f32 else 700.0, rows)
    xc[np.arange(rows), y] = xc.max(axis=1) + gaps
    fams["confident correct"] = dict(x=xc.astype(dt), t=y)
    xw = x.copy()
    xw[np.arange(rows), y] = xw.min(axis=1) - gaps
    fams["confident wrong"] = dict(x=xw.astype(dt), t=y)
    fams["ties"] = dict(x=np.zeros((rows, C), dtype=dt), t=y)
    xm = x.copy()
    xm[:, ::3] = -np.inf
    ym = np.where(y % 3 == 0, 1, y)
    fams["masked classes (-inf)"] = dict(x=xm, t=ym)
    fams["large logits"] = dict(x=(rng.standard_normal((rows, C)) * 1e4).astype(dt), t=y)
    if probs:
        from .reference import rounded
        out = {}
        for k, v in fams.items():
            with np.errstate(all="ignore"):
                p = rounded(reference.softmax(v["x"]), dt)
            out[k] = dict(x=np.asarray(p, dtype=dt), t=v["t"])
        return out
    return fams


_SUITES = {
    "binary_cross_entropy_with_logits": _suite_binary_logits,
    "sigmoid_focal_loss": _suite_focal,
    "binary_cross_entropy": _suite_bce_probs,
    "cross_entropy": _suite_softmax,
    "cross_entropy_from_probs": lambda rng, dt, n: _suite_softmax(rng, dt, n, probs=True),
}


class FamilyResult(NamedTuple):
    """One case family of a conformance run."""

    family: str
    n: int
    loss_ulp: float
    grad_ulp: float
    loss_worst: dict
    grad_worst: dict
    passed: bool
    error: str = ""


class ConformanceReport:
    """Result of :func:`check_conformance`: per case family, the max ULP error of the loss and the gradient
    with the worst input.  ``str(report)`` is a table; ``report.passed`` is True when every family is
    within the bound; ``report[family]`` gives a :class:`FamilyResult`."""

    def __init__(self, loss, reference_name, dtype, bound, results):
        self.loss, self.reference_name, self.dtype, self.bound = loss, reference_name, np.dtype(dtype), bound
        self.results = results

    @property
    def passed(self):
        return all(r.passed for r in self.results)

    @property
    def failures(self):
        return [r for r in self.results if not r.passed]

    def __getitem__(self, family):
        for r in self.results:
            if r.family == family:
                return r
        raise KeyError(family)

    def __str__(self):
        lines = [f"conformance of {self.loss} against {self.reference_name}, {self.dtype.name}, "
                 f"bound {self.bound:g} ULP", f"  {'family':28s} {'n':>4s} {'loss ULP':>11s} {'grad ULP':>11s}  verdict"]
        for r in self.results:
            verdict = "ok" if r.passed else ("ERROR " + r.error if r.error else "FLAGGED")
            lines.append(f"  {r.family:28s} {r.n:4d} {r.loss_ulp:11.4g} {r.grad_ulp:11.4g}  {verdict}")
        for r in self.failures:
            for what, worst in (("loss", r.loss_worst), ("gradient", r.grad_worst)):
                if worst and worst.get("ulp", 0) > self.bound:
                    lines.append(f"  worst {what} in {r.family!r}: " + ", ".join(
                        f"{k}={_fmt_worst(v)}" for k, v in worst.items()))
        return "\n".join(lines)

    __repr__ = __str__

    def assert_conforms(self):
        """Raise AssertionError with the table when a family exceeds the bound."""
        if not self.passed:
            raise AssertionError(str(self))


def _fmt_worst(v):
    if isinstance(v, mpf):
        return mpmath.nstr(v, 17)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, np.floating):
        return repr(float(v))
    return repr(v)


def _worst(err, x, t, params, actual, exact, scale, rowwise):
    """The worst element and what produced it: the element's input, or its whole row for row losses."""
    if err.size == 0:
        return {}
    k = int(np.argmax(err))
    idx = np.unravel_index(k, err.shape)
    xr, tr = np.asarray(x), np.asarray(t)
    where = idx[:1] if rowwise else idx
    out = {"ulp": float(err.ravel()[k]), "index": tuple(int(i) for i in idx), "input": xr[where].tolist(),
           "target": tr[where[:tr.ndim]].tolist()}
    for name, v in params.items():
        if np.ndim(v) and np.shape(v) == err.shape:
            out[name] = np.asarray(v)[idx].item()
        elif not np.ndim(v):
            out[name] = v
    out["actual"] = np.asarray(actual).ravel()[k].item()
    out["exact"] = np.asarray(exact, dtype=object).ravel()[k]
    if scale is not None:
        out["scale"] = np.asarray(scale, dtype=object).ravel()[k]
    return out


def check_conformance(forward, backward=None, loss="binary_cross_entropy_with_logits", dtype=np.float64, *,
                      max_ulp=None, families=None, size=32, seed=0, reference=None):
    """Run the adversarial suite of `loss` on any implementation and measure it against the exact reference.

    Parameters
    ----------
    forward : callable
        ``forward(input, target, **params) -> losses`` on NumPy arrays, unreduced: one loss per element
        (binary losses) or per row (``cross_entropy``, ``cross_entropy_from_probs``; class axis last,
        index targets).  ``params`` are only passed by the families that use them: ``weight``,
        ``pos_weight`` (arrays of the input's shape), ``alpha``, ``gamma`` (floats).
    backward : callable, optional
        ``backward(input, target, **params) -> d(sum of losses)/d input``, the input's shape.  Without
        it only the loss is checked.
    loss : str
        The suite and (unless `reference` is given) the reference: ``"binary_cross_entropy_with_logits"``
        (torch semantics), ``"sigmoid_focal_loss"`` (torchvision), ``"binary_cross_entropy"`` (from
        probabilities), ``"cross_entropy"`` (softmax, logits), ``"cross_entropy_from_probs"``.
    dtype : float32 or float64
        Dtype of the generated inputs and unit of the ULP errors.
    max_ulp : float, optional
        Bound for a family to pass (default: xentfast's contract, 2 ULP float32, 4 ULP float64).
        Gradients of soft-target families are measured in ulps of the sum of the magnitudes of the terms
        that cancel, every other value relative to itself.
    families : list of str, optional
        Run only these families.
    size : int
        Elements (rows x 8 classes for the softmax losses) per family.
    seed : int
        Seed of the generated inputs (the special values are fixed).
    reference : ElementwiseReference, optional
        Another exact definition of the loss (for an implementation whose semantics differ from
        xentfast's, e.g. an older formula): its own forward is then the standard its backward is held to.

    Returns
    -------
    ConformanceReport
        Per family the max ULP errors of loss and gradient and the worst inputs; exceptions raised by
        the implementation are recorded as failures, not propagated.

    Notes
    -----
    Finite differences would be the wrong oracle: at a tolerance loose enough for their own truncation
    and cancellation error they pass gradients that are off by O(1/n) in absolute terms (Paddle's
    sigmoid_cross_entropy_with_logits, issue #64226, passed its op test at max_relative_error=0.005).
    Here every value is compared with the exact derivative, in ULPs.
    """
    if loss not in _SUITES:
        raise ValueError(f"loss: expected one of {', '.join(map(repr, _SUITES))}; got {loss!r}")
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype: the conformance suites are float32 and float64; got {dt}")
    bound = float(max_ulp) if max_ulp is not None else (2.0 if dt == np.float32 else 4.0)
    ref = reference if reference is not None else _NamedReference(loss)
    suite = _SUITES[loss](np.random.default_rng(seed), dt, int(size))
    if families is not None:
        unknown = set(families) - set(suite)
        if unknown:
            raise ValueError(f"families: unknown {sorted(unknown)}; this suite has {sorted(suite)}")
        suite = {k: v for k, v in suite.items() if k in families}
    results = []
    for fam, case in suite.items():
        x, t, params, soft = case["x"], case["t"], case.get("params", {}), case.get("soft", False)
        try:
            with np.errstate(all="ignore"):
                got_loss = np.asarray(forward(x.copy(), t.copy(), **params))
                got_grad = np.asarray(backward(x.copy(), t.copy(), **params)) if backward is not None else None
        except Exception as exc:  # a crash is a finding, recorded like an error
            results.append(FamilyResult(fam, int(np.size(t)), math.inf, math.inf, {}, {}, False,
                                        f"{type(exc).__name__}: {exc}"))
            continue
        with np.errstate(all="ignore"):
            exact_loss = ref.loss(x, t, **params)
            lerr = ulp_error(got_loss.astype(np.float64) if got_loss.dtype != object else got_loss,
                             exact_loss, dt)
            rowwise = loss in ("cross_entropy", "cross_entropy_from_probs")
            lworst = _worst(lerr, x, t, params, got_loss, exact_loss, None, rowwise)
            gerr, gworst = np.zeros(0), {}
            if got_grad is not None:
                exact_grad, scale = ref.grad(x, t, **params)
                gerr = ulp_error(got_grad.astype(np.float64), exact_grad, dt, scale=scale if soft else None)
                gworst = _worst(gerr, x, t, params, got_grad, exact_grad, scale if soft else None, rowwise)
        lmax = float(lerr.max()) if lerr.size else 0.0
        gmax = float(gerr.max()) if gerr.size else 0.0
        results.append(FamilyResult(fam, int(np.size(t)), lmax, gmax, lworst, gworst,
                                    lmax <= bound and gmax <= bound))
    return ConformanceReport(loss, ref.name, dt, bound, results)
