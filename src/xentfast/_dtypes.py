"""Half precision: which dtypes count as float16 / bfloat16, and the one rounding of a result to them.

Design
(a) Half inputs are widened to float64, exactly (every float16 and bfloat16 value is a double), and run
    through the float64 kernels.  Those are within 4 ULP of double, i.e. within 4 * 2^-29 of a float32 ULP
    and 4 * 2^-42 (float16) or 4 * 2^-45 (bfloat16) of a half ULP, so one final rounding leaves every
    output within 0.5 ULP plus a negligible term of its exact value (of the cancellation scale, for the
    gradients whose two terms cancel, as README's bounds measure them): inside the 1-ULP half contract with
    room for the reductions' 4 ULP of double as well.  Losses, logsumexp and log_softmax come back in
    float32 (a bfloat16 loss near 10 has a spacing of 0.0625; float16 overflows at 65504); gradients and
    softmax, which live in [-|w|, |w|] and [0, 1], come back in the input's dtype.
(b) bfloat16 is ml_dtypes' user dtype (kind 'V', char 'E'), recognised by identity with
    ``ml_dtypes.bfloat16``.  ml_dtypes is looked up in ``sys.modules`` and never imported here: an array
    cannot carry that dtype unless ml_dtypes has been imported (JAX and CuPy import it too), so when the
    module is absent no bfloat16 array exists and nothing needs it.
(c) ml_dtypes' float64 -> bfloat16 cast goes through float32 and rounds twice (1 + 2^-8 + 2^-40 gives 1.0,
    not 1 + 2^-7).  That would still meet the 1-ULP contract, but :func:`round_to` rounds once: it rounds
    to float32 *to odd* (truncate, then set the last bit when anything was dropped) and lets the cast to
    bfloat16 round to nearest from there.  float32 carries 16 more bits than bfloat16 at every exponent
    (the two share their exponent range, subnormals included), and rounding to odd with two or more
    extra bits followed by rounding to nearest is a correct rounding (Boldo & Melquiond, "When double
    rounding is odd", 2005).  NumPy's and CUDA's float64 -> float16 casts round once already.
"""

import sys

import numpy as np

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def bfloat16():
    """``numpy.dtype(ml_dtypes.bfloat16)`` if ml_dtypes has been imported, else None (see (b))."""
    ml = sys.modules.get("ml_dtypes")
    bf = getattr(ml, "bfloat16", None)
    return None if bf is None else np.dtype(bf)


def is_bfloat16(dt):
    bf = getattr(sys.modules.get("ml_dtypes"), "bfloat16", None)
    return bf is not None and np.dtype(dt).type is bf


def is_half(dt):
    """float16, or ml_dtypes' bfloat16."""
    return np.dtype(dt) == _F16 or is_bfloat16(dt)


def is_real(dt):
    """A dtype whose values are real numbers xentfast reads: integers and floats of any width, bfloat16 too."""
    return np.dtype(dt).kind in "fiu" or is_bfloat16(dt)


def loss_dtype(dt):
    """The dtype of losses, logsumexp and log_softmax for inputs of `dt` (see (a))."""
    if dt is _F32 or dt is _F64:  # NumPy's own instances: the common case, without the half lookups
        return dt
    return _F32 if is_half(dt) else np.dtype(dt)


def round_to(a, dt):
    """`a` (float64, NumPy or CuPy) rounded once, to nearest, ties to even, to `dt` (see (c))."""
    dt = np.dtype(dt)
    if a.dtype == dt:
        return a
    with np.errstate(over="ignore"):  # beyond the format's range is +-inf, as it should be
        if not is_bfloat16(dt):
            return a.astype(dt)
        f = a.astype(np.float32)
    back = f.astype(np.float64)
    bits = f.view(np.uint32)
    # round to odd: where nearest went away from zero, step back one float32 towards zero (the bit pattern
    # of a float orders magnitudes, for either sign, and float32 inf - 1 is FLT_MAX), then make the last
    # bit sticky for every inexact value (NaN included: its bits stay a NaN)
    bits = bits - (abs(back) > abs(a)).astype(np.uint32)
    bits |= (back != a).astype(np.uint32)
    return bits.view(np.float32).astype(dt)
