"""JAX drop-ins for optax's cross-entropy losses, computed by xentfast's kernels.

Replace ``optax.losses`` (or ``optax``) by ``xentfast.jax`` in the call::

    import xentfast.jax as xfj
    loss = xfj.softmax_cross_entropy_with_integer_labels(logits, labels)   # per example, as in optax

The functions take optax's arguments and return what optax returns (per-example losses, no reduction),
work under ``jit``, ``vmap``, first-order reverse mode (``grad``, ``value_and_grad``, ``vjp``) and
their compositions, and give the bits of xentfast's NumPy functions.  This module is imported only on
request: xentfast builds and imports without JAX.

Limits (optax has none of them): no second derivative (``grad`` of ``grad``, ``hessian``: the backward
is a kernel call without a derivative of its own, and JAX says so) and no forward mode (``jvp``,
``jacfwd``: a ``custom_vjp`` has none).  Under ``shard_map`` the backward's output is not marked as
varying over the mesh axis, so a gradient through it fails unless ``check_vma=False``, whether ``grad``
is taken inside the ``shard_map`` or around it (the data-parallel pattern); ``pmap`` works.  Under
``jit`` with sharded inputs the gradient comes back replicated.  Labels given as NumPy arrays or Python
numbers are range-checked as given, before JAX converts them (with x64 off JAX wraps int64 to int32, and
optax then reads ``2**32 + 1`` as class 1; here it gives NaN); but a NumPy array passed as an argument
into ``jit`` arrives already converted, and is checked as JAX holds it.  ``jax.export`` refuses the FFI
custom calls, which carry no compatibility guarantee (the callback paths export neither).  A ``where`` mask must broadcast
against the batch shape from the left, as NumPy broadcasts; optax also inserts a missing class axis.

Design
(a) One kernel, one answer.  The forward is xentfast's NumPy function with ``reduction="none"``, so the
    loss is bitwise what ``xentfast.cross_entropy`` returns for the same rows, and its error bound is the
    README's per-row bound (float32: 2 ULP, float64: 4 ULP).
(b) What the forward saves: its inputs (the logits and the labels, after masking), nothing else.  A loss
    is usually computed from logits the graph holds anyway, so nothing of size N x C is added.  The
    backward runs the kernel's gradient with the per-row cotangent as ``grad_output``: the gradient
    carries one rounding of the upstream factor (the README's bound + 1).  Saving the fused gradient of
    the forward instead would keep a second N x C array alive between the passes and round twice (once
    in the kernel, once when the cotangent multiplies it).
(c) How XLA reaches the kernel, in order of preference (``CALLBACK`` names the path in use; it is read
    when a function is traced):
    ``"ffi"``: XLA FFI handlers (``xentfast._core._xla_ffi``) that call the same C kernels from inside
    the XLA program, with no Python and no copy.  They are compiled only when jaxlib's FFI headers are
    installed at build time, and loaded only with the jaxlib whose headers built them or a newer one
    (XLA refuses handlers built against a newer FFI API, and registering such handlers has left the CPU
    backend unable to start); they are registered on first use.  CPU only.  The minimum jaxlib is the
    one that built them: ``xentfast._core._xla_ffi.JAXLIB_VERSION`` (0.10.2, FFI API 0.3, for the
    build tested here).  A pip install builds in isolation, without jaxlib, so it has no handlers;
    ``pip install --no-build-isolation`` with jax installed builds them.
    ``"buffer_callback"``: ``jax.experimental.buffer_callback`` (jax 0.10.2 has it): Python sees XLA's
    buffers without a copy and the kernel writes the gradient straight into XLA's output buffer.
    ``"pure_callback"``: copies every input and output through NumPy; the fallback of last resort.
    (Tested with jax 0.10.2; the callbacks need ``vmap_method``, which the jax changelog dates to 0.4.34.)
    On an accelerator backend the callbacks move the data through host memory.  Measured on 2 shared,
    busy vCPUs (load 3-4) against the bare NumPy calls the callbacks make (benchmarks/bench_jax_dropin.py,
    jit, float32, integer labels; 1 OpenMP thread for steadier numbers):

        time over the bare calls     8 x 16 fwd / value_and_grad     4096 x 1000 fwd / value_and_grad
        ffi                          -25-50 us / -60-100 us          within noise (~11 / ~30 ms)
        buffer_callback              +15-50 us / +30-90 us           within noise
        pure_callback                +0.15-0.35 ms / +0.3-0.66 ms    +3.7-4 ms / +7-14 ms (logits copied)

    At 8 x 16 the FFI path takes optax's time (0.95-1.15x): no Python runs, not even the NumPy API's
    argument checks (~20 us a call, which the bare calls pay).  The callback itself costs ~2 us; jit's
    dispatch floor is ~7 us.  At 4096 x 1000 the kernel is the cost, and it is what separates xentfast
    from optax (2.5-3.5x slower here: every row is evaluated without cancellation, in double).
(d) vmap: ``vmap_method="broadcast_all"``.  The kernels treat every leading axis as rows, so a batched
    call is one kernel call on more rows, not a loop.
(e) Errors.  Everything static (dtypes, shapes, ``axis``, ``where``, ``z_loss``) is checked before
    tracing reaches a callback, and raises naming the argument.  Data cannot be checked before the
    kernel under ``jit``, and JAX's callback contract forbids raising inside a callback, so invalid
    data gives NaN, as JAX's out-of-bounds gathers do: an integer label outside ``[0, C)`` on a kept
    row, or a binary label outside ``[0, 1]`` (or NaN), makes that loss NaN and its gradient 0.
(f) Half precision.  float16 and bfloat16 logits are widened to float32 (exact) and the loss is
    returned in float32: the bound then holds for the half-precision values as given, where a bfloat16
    loss near 10 would carry a quantum of 0.0625.  The gradient comes back in the logits' dtype, rounded
    from the float32 kernel's result: so the bits are those of the NumPy functions on the widened
    float32 array, not of the NumPy functions on the half array (which widen to float64 and round once):
    a bfloat16 gradient entry may differ from those by one bfloat16 ULP (1 in 32000 measured), a loss
    by one float32 ULP.
(g) Label gradients.  ``softmax_cross_entropy`` and ``sigmoid_binary_cross_entropy`` are differentiable
    in their labels, as optax's are: ``-g * log_softmax(x)`` (xentfast's log_softmax) and ``-g * x`` (the
    exact derivative of the binary loss in ``y``), each product rounded once, next to the kernels (see
    (h)).  They are computed only when the labels are being differentiated (symbolic zeros tell the
    forward which inputs are perturbed).
(h) Subnormals.  XLA runs its CPU threads with denormals flushed to zero (x86: MXCSR's FTZ and DAZ),
    and callbacks and FFI handlers run on those threads: unguarded, a subnormal loss, probability or
    gradient comes back as 0 (float32 logits ``[0, -100]``, target 0: loss 3.8e-44, a float32 subnormal;
    XLA's flags give 0).
    The FFI handlers clear the flags on every thread that runs a kernel and restore them after; the
    callbacks run under the same guard (``_core/fp_ieee.h``, x86 and aarch64), which the NumPy API
    itself also applies.  Whatever XLA itself computes from the results
    (a mean, an optimizer step) is flushed as XLA always does.

Deliberate differences from optax 0.2.8 (everything else is optax's semantics):

* integer labels outside ``[0, C)`` give NaN with gradient 0 (optax: NaN with the softmax as gradient,
  and a negative label wraps around, ``-1`` meaning the last class, as NumPy indexing does);
* ``sigmoid_binary_cross_entropy`` labels outside ``[0, 1]`` give NaN (optax evaluates its formula,
  which can return a negative loss);
* a ``where`` that masks a row's own label class gives ``+inf`` for that row (the label has probability
  0 among the kept classes); optax returns the logsumexp of the kept classes minus the masked logit;
* the labels gradient of ``softmax_cross_entropy`` is 0 on classes masked by ``where`` (optax: NaN);
* labels of ``softmax_cross_entropy`` are cast to the logits' dtype and must broadcast to the logits'
  shape (optax lets ``labels * log_probs`` promote and broadcast both ways);
* ``where`` must be boolean; half-precision logits give a float32 loss ((f));
* ``z_loss`` is an extra (PaLM's auxiliary loss, as in xentfast.cross_entropy);
* a label mass of 0 on a ``-inf`` logit contributes 0 (``0 * inf = 0``): ``softmax_cross_entropy`` of
  ``[[0, -inf, 1]]`` against ``[[.5, 0, .5]]`` is 0.8133 with a finite gradient (optax: NaN);
* a ``+inf`` logit makes its row NaN (no softmax exists), also with integer labels on another class
  (optax: ``+inf``), as torch and ``xentfast.cross_entropy``.
"""

import functools
import itertools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from . import api as _api
from . import api_binary as _api_binary
from ._core._xent import fp_ieee_enter as _fp_ieee_enter, fp_ieee_leave as _fp_ieee_leave

try:
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # older jax: the copying callback
    _buffer_callback = None

__all__ = [
    "softmax_cross_entropy",
    "softmax_cross_entropy_with_integer_labels",
    "sigmoid_binary_cross_entropy",
    "CALLBACK",
]


def _version(text):
    """(major, minor, patch) of a version string, ignoring any suffix ("0.10.2.dev1" -> (0, 10, 2))."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def _load_ffi():
    """The compiled FFI handlers, or None.  XLA accepts handlers built against its own FFI API version or
    an older one; a newer one is refused, and registering it has been seen to leave the CPU backend unable
    to start.  So the handlers are used only with the jaxlib whose headers built them, or a newer one."""
    try:
        from ._core import _xla_ffi
    except ImportError:  # built without jaxlib's FFI headers: the callbacks serve
        return None
    import jaxlib
    if _version(jaxlib.__version__) < _version(_xla_ffi.JAXLIB_VERSION):
        return None
    return _xla_ffi


_ffi = _load_ffi()
_ffi_registered = False

CALLBACK = "ffi" if _ffi is not None else "buffer_callback" if _buffer_callback is not None else "pure_callback"
_CALLBACKS = ("ffi", "buffer_callback", "pure_callback")

# The label that tells the kernel to skip a row (loss 0, gradient 0 whatever the row holds): rows masked
# by `where` and rows whose label is invalid.  Every user label reaching the kernel is in [0, C).
_SKIP = -1


def _ignore_index_for(y):
    """_SKIP for labels; probability targets take only the API's default (they have no label to skip)."""
    return _SKIP if y.dtype.kind in "iu" else _api._DEFAULT_IGNORE_INDEX


# ---------------------------------------------------------------------------------------------------
# host side: NumPy arrays in, the kernel's results out (into XLA's buffer when there is one)


def _host_xent_fwd(x, y, *, z, out):
    loss = _api.cross_entropy(x, y, ignore_index=_ignore_index_for(y), reduction="none", z_loss=z)
    if out is None:
        return loss
    out[...] = loss


def _host_xent_bwd(g, x, y, *, z, out):
    # the fused call: bitwise the gradient of cross_entropy_backward, and written straight into `out`
    _, dx = _api.cross_entropy_with_grad(x, y, ignore_index=_ignore_index_for(y), reduction="none", z_loss=z,
                                         grad_output=g, out=out)
    return dx


def _host_xent_dt(g, x, *, out):
    # d loss / d t_c = lse - x_c = -log_softmax(x)_c, with or without z-loss; one rounding of the product
    with np.errstate(all="ignore"):  # masked classes: 0 * -inf, replaced by 0 outside
        dt = -(g[..., None] * _api.log_softmax(x))
    if out is None:
        return dt
    out[...] = dt


def _host_bce_fwd(x, y, *, out):
    loss = _api_binary.binary_cross_entropy_with_logits(x, y, reduction="none")
    if out is None:
        return loss
    out[...] = loss


def _host_bce_bwd(g, x, y, *, out):
    _, dx = _api_binary.binary_cross_entropy_with_logits_with_grad(x, y, reduction="none", grad_output=g,
                                                                   out=out)
    return dx


def _host_bce_dy(g, x, *, out):
    # the loss (1 - y) softplus(x) + y softplus(-x) is linear in y, with slope exactly -x
    with np.errstate(all="ignore"):
        dy = -(g * x)
    if out is None:
        return dy
    out[...] = dy


def _on_host(host, args, out, static):
    """host(*args) with IEEE subnormals on this thread, XLA's setting restored afterwards.

    XLA runs its CPU threads with denormals flushed (x86: MXCSR's FTZ and DAZ), and the callbacks run on
    those threads.  The NumPy API already clears the flags around its own kernels and arithmetic
    (xentfast.api); this covers the NumPy arithmetic the host functions add around it (the labels'
    gradients), with the same guard (_core/fp_ieee.h), on every platform it knows."""
    saved = _fp_ieee_enter()
    try:
        return host(*args, out=out, **static)
    finally:
        _fp_ieee_leave(saved)


def _readonly(buf):
    # buffer_callback hands out XLA's input buffers writeable; the kernels never write their inputs,
    # and this makes sure nothing here can
    a = np.asarray(buf).view()
    a.flags.writeable = False
    return a


# The FFI target of each host function; the static arguments become the handler's attributes.
_FFI_TARGETS = {
    _host_xent_fwd: "xentfast_xent_fwd",
    _host_xent_bwd: "xentfast_xent_bwd",
    _host_xent_dt: "xentfast_xent_dt",
    _host_bce_fwd: "xentfast_bce_fwd",
    _host_bce_bwd: "xentfast_bce_bwd",
    _host_bce_dy: "xentfast_bce_dy",
}


def _register_ffi():
    global _ffi_registered
    if not _ffi_registered:
        for name, capsule in _ffi.targets().items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        _ffi_registered = True


def _path():
    if CALLBACK not in _CALLBACKS:
        raise ValueError(f"xentfast.jax.CALLBACK: expected one of {', '.join(_CALLBACKS)}; got {CALLBACK!r}")
    if CALLBACK == "ffi":
        if _ffi is None:
            raise ValueError("xentfast.jax.CALLBACK: the FFI handlers were not built, or were built for a newer "
                             "jaxlib than this one")
        # the handlers are CPU code; on an accelerator the callbacks move the data through the host
        if jax.default_backend() != "cpu":
            return "buffer_callback" if _buffer_callback is not None else "pure_callback"
    if CALLBACK == "buffer_callback" and _buffer_callback is None:
        raise ValueError("xentfast.jax.CALLBACK: this jax has no jax.experimental.buffer_callback")
    return CALLBACK


def _call(host, result, *args, **static):
    """One kernel call from XLA, shape and dtype of the result given; `static` goes to `host` as is."""
    path = _path()
    if math.prod(result.shape) == 0:
        return jnp.zeros(result.shape, result.dtype)
    if path == "ffi":
        _register_ffi()
        attrs = {k: np.float64(v) for k, v in static.items()}
        return jax.ffi.ffi_call(_FFI_TARGETS[host], result, vmap_method="broadcast_all")(*args, **attrs)
    if path == "buffer_callback":

        def on_buffers(ctx, out, *bufs):
            _on_host(host, tuple(map(_readonly, bufs)), np.asarray(out), static)

        return _buffer_callback(on_buffers, result, vmap_method="broadcast_all")(*args)

    def on_arrays(*arrays):
        return _on_host(host, tuple(map(_readonly, arrays)), None, static)

    return jax.pure_callback(on_arrays, result, *args, vmap_method="broadcast_all")


# ---------------------------------------------------------------------------------------------------
# the differentiable operations: rows with the class axis last, masking already applied


def _like(a, shape=None):
    return jax.ShapeDtypeStruct(a.shape if shape is None else shape, a.dtype)


def _flag(b):
    # residuals carry the "is this input perturbed" bits in their structure (() or None), which stays
    # static under every transformation
    return () if b else None


@functools.lru_cache(maxsize=None)
def _xent_op(z, prob_targets):
    """custom_vjp of the per-row softmax cross-entropy for one z-loss coefficient.

    x: (..., C) logits; y: (...) int32 labels in [0, C) or _SKIP (int64 beyond 2**31 - 1 classes), or
    (..., C) probabilities of x's dtype."""

    @jax.custom_vjp
    def op(x, y):
        return _call(_host_xent_fwd, _like(x, x.shape[:-1]), x, y, z=z)

    def fwd(x, y):
        xv, yv = x.value, y.value
        res = (xv, yv, _flag(x.perturbed), _flag(prob_targets and y.perturbed))
        return _call(_host_xent_fwd, _like(xv, xv.shape[:-1]), xv, yv, z=z), res

    def bwd(res, g):
        x, y, want_dx, want_dy = res
        if isinstance(g, SymbolicZero):
            return None, None
        dx = _call(_host_xent_bwd, _like(x), g, x, y, z=z) if want_dx is not None else None
        dy = None
        if want_dy is not None:
            dy = _call(_host_xent_dt, _like(x), g, x)
        return dx, dy

    op.defvjp(fwd, bwd, symbolic_zeros=True)
    return op


@functools.lru_cache(maxsize=None)
def _bce_op():
    """custom_vjp of the elementwise sigmoid cross-entropy; x and y of one shape, y in [0, 1]."""

    @jax.custom_vjp
    def op(x, y):
        return _call(_host_bce_fwd, _like(x), x, y)

    def fwd(x, y):
        xv, yv = x.value, y.value
        return _call(_host_bce_fwd, _like(xv), xv, yv), (xv, yv, _flag(x.perturbed), _flag(y.perturbed))

    def bwd(res, g):
        x, y, want_dx, want_dy = res
        if isinstance(g, SymbolicZero):
            return None, None
        dx = _call(_host_bce_bwd, _like(x), g, x, y) if want_dx is not None else None
        dy = _call(_host_bce_dy, _like(x), g, x) if want_dy is not None else None
        return dx, dy

    op.defvjp(fwd, bwd, symbolic_zeros=True)
    return op


# ---------------------------------------------------------------------------------------------------
# validation and layout, all static (shapes, dtypes, options): these raise at trace time


def _as_logits(logits):
    """Floating logits as a JAX array; float16/bfloat16 widened to float32 (exact)."""
    x = jnp.asarray(logits)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        hint = " (cast integers with .astype(jnp.float32) if they were meant as logits)" \
            if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else ""
        raise TypeError(f"logits: expected floating-point logits, got dtype {x.dtype}{hint}")
    if x.dtype not in (jnp.float32, jnp.float64):
        if jnp.finfo(x.dtype).bits > 32:
            raise TypeError(f"logits: dtype {x.dtype} is not supported; use float32 or float64")
        x = x.astype(jnp.float32)
    return x


def _class_axes(axis, ndim, allow_none):
    """`axis` (int, tuple of ints, or None for every axis) as a tuple of distinct axes in [0, ndim)."""
    if axis is None and allow_none:
        return tuple(range(ndim))
    many = isinstance(axis, tuple)
    try:
        axes = tuple(operator.index(a) for a in axis) if many else (operator.index(axis),)
    except TypeError:
        kinds = "an int, a tuple of ints or None" if allow_none else "an int or a tuple of ints"
        raise TypeError(f"axis: expected {kinds}; got {axis!r}") from None
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis: {a} is out of range for logits with {ndim} dimension(s)")
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis: repeated axis in {axis!r}")
    if not axes:
        raise ValueError("axis: an empty tuple names no class axis")
    return axes


def _classes_last(a, axes):
    """`a` with the class axes moved to the end, in the order given, and flattened into one."""
    batch = [i for i in range(a.ndim) if i not in axes]
    perm = batch + list(axes)
    if perm != list(range(a.ndim)):
        a = jnp.transpose(a, perm)
    batch_shape = tuple(a.shape[:len(batch)])
    return a.reshape(batch_shape + (math.prod(a.shape[len(batch):]),))


def _broadcast(a, shape, name, what):
    try:
        ok = np.broadcast_shapes(a.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {a.shape} does not broadcast to {what} {tuple(shape)}")
    return jnp.broadcast_to(a, shape)


def _masks(where, shape, axes):
    """(class mask or None, row mask or None) from optax's `where`, laid out like the kernel's rows.

    optax's rule: a `where` with fewer dimensions than the logits gets the class axes inserted, then
    broadcasts.  A mask that does not vary along the class axes only selects rows, and then the logits
    need no masking at all (no N x C pass)."""
    if where is None:
        return None, None
    w = jnp.asarray(where)
    if w.dtype != jnp.bool_:
        raise TypeError(f"where: expected a boolean mask, got dtype {w.dtype}")
    given = w.shape
    try:
        if w.ndim != len(shape):
            w = jnp.expand_dims(w, axes)
        ok = np.broadcast_shapes(w.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"where: shape {given} does not broadcast to the logits' shape {tuple(shape)} (a mask "
                         f"with fewer dimensions gets the class axes inserted first, as in optax)")
    w = w.reshape((1,) * (len(shape) - w.ndim) + w.shape)
    if all(w.shape[a] == 1 for a in axes):
        return None, jnp.broadcast_to(_classes_last(w, axes)[..., 0], _batch_shape(shape, axes))
    cls = _classes_last(jnp.broadcast_to(w, shape), axes)
    return cls, jnp.any(cls, axis=-1)


def _batch_shape(shape, axes):
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _check_z_loss(z_loss):
    if isinstance(z_loss, jax.core.Tracer):
        raise TypeError("z_loss: expected a Python number (the coefficient is static); got a traced value")
    try:
        z = float(z_loss)
    except (TypeError, ValueError):
        raise TypeError(f"z_loss: expected a real number, got {z_loss!r}") from None
    if not (math.isfinite(z) and z >= 0):
        raise ValueError(f"z_loss: must be finite and >= 0; got {z_loss!r}")
    return z


def _check_classes(x, axis):
    """`axis` as the caller wrote it: -1 is named -1, not the normalized 1."""
    if x.shape[-1] == 0:
        named = "every axis" if axis is None else f"axis={axis!r}"
        raise ValueError(f"logits: the class axis ({named}) has length 0; at least one class is needed")


def _nan_where(bad, loss):
    return jnp.where(bad, jnp.asarray(jnp.nan, loss.dtype), loss)


# ---------------------------------------------------------------------------------------------------
# public functions

_ERROR_BOUND = """
    Error bound
    -----------
    The loss is bitwise the NumPy function's ``reduction='none'`` result for the same rows: <= 2 ULP
    (float32), <= 4 ULP (float64) of the exact value of the rounded inputs (for float16/bfloat16 logits:
    the float32 bound, the widening being exact).  Gradient: the README's bounds + 1 ULP, the rounding
    of the upstream (per-row) cotangent."""


def softmax_cross_entropy_with_integer_labels(logits, labels, axis=-1, where=None, *, z_loss=0.0):
    z = _check_z_loss(z_loss)
    x = _as_logits(logits)
    axes = _class_axes(axis, x.ndim, allow_none=False)
    shape = x.shape
    host = _host_labels(labels)
    if host is not None and host.dtype.kind in "iu":
        C = int(np.prod([shape[a] for a in axes], dtype=np.int64))
        # out-of-range host labels become -1 before JAX sees them, so none wraps into a class
        host_valid = (host >= 0) & (host < C)
        labels = np.where(host_valid, host, -1).astype(np.int64 if host.dtype.kind == "u" else host.dtype)
    try:
        y = jnp.asarray(labels)
    except OverflowError as e:        # a Python int beyond int64 (NumPy made an object array of it)
        raise ValueError(f"labels: {e}; class indices must fit in 64 bits") from None
    if not jnp.issubdtype(y.dtype, jnp.integer):
        raise TypeError(f"labels: expected integer class indices, got dtype {y.dtype} "
                        f"(softmax_cross_entropy takes class probabilities)")
    batch = _batch_shape(shape, axes)
    y = _broadcast(y, batch, "labels", "the logits' shape without the class axis")
    cls, keep = _masks(where, shape, axes)
    x = _classes_last(x, axes)
    _check_classes(x, axis)
    C = x.shape[-1]
    if cls is not None:
        x = jnp.where(cls, x, jnp.asarray(-jnp.inf, x.dtype))
    wide = C > np.iinfo(np.int32).max
    if wide and not jax.config.jax_enable_x64 and jnp.iinfo(y.dtype).max > np.iinfo(np.int32).max:
        # the kernel then takes int32 labels, and a label from 2**31 on would wrap into a wrong class
        raise ValueError(f"labels: {y.dtype} labels for a class axis of {C} classes (more than 2**31 - 1) "
                         f"need 64-bit labels: enable jax_enable_x64, or pass int32 labels")
    # on the labels' own dtype, before any cast could wrap a huge or unsigned value into range; C as that
    # dtype too (a Python int beyond int32 would not convert under x64's absence)
    valid = y >= 0
    if C <= jnp.iinfo(y.dtype).max:
        valid &= y < jnp.asarray(C, y.dtype)
    use = valid if keep is None else valid & keep
    bad = ~valid if keep is None else ~valid & keep
    # int64 only where x64 is on: without it JAX truncates an int64 request to int32 with a UserWarning,
    # and the check above has left labels that fit int32
    yk = jnp.where(use, y.astype(jnp.int64 if wide and jax.config.jax_enable_x64 else jnp.int32), _SKIP)
    loss = _xent_op(z, False)(x, yk)
    return _nan_where(bad, loss)


softmax_cross_entropy_with_integer_labels.__doc__ = f"""Softmax cross-entropy from logits and integer labels (optax's).

    Parameters
    ----------
    logits : array, float32 or float64 (float16/bfloat16 computed in float32)
        Unnormalized log-probabilities.
    labels : integer array
        Class indices in ``[0, C)``, the logits' shape without the class axes (broadcast to it).  With a
        tuple ``axis``, a label is a flat index into the ``logits[axis]`` slice, as in optax.
    axis : int or tuple of ints, default -1
        The class axis or axes.
    where : boolean array, optional
        Elements to include, the batch shape (a row mask) or the logits' shape (a class mask), as in
        optax.  Rows with no kept class give 0 and gradient 0; masked classes take no part.
    z_loss : float >= 0, keyword-only, default 0
        Adds ``z_loss * logsumexp(row)**2`` per row (PaLM's auxiliary loss).  An xentfast extra.

    Returns
    -------
    loss : array, the logits' shape without the class axes (float32 for half-precision logits)
    {_ERROR_BOUND}

    Notes
    -----
    Loss per row ``lse - x_y + z_loss lse**2``, evaluated without cancellation (see
    :func:`xentfast.cross_entropy`).  A label outside ``[0, C)`` on a kept row gives NaN and gradient 0
    (optax: NaN and the softmax; a negative label wraps).  A ``where`` that masks the label's own class
    gives ``+inf`` (optax: logsumexp of the kept classes minus the masked logit).

    Examples
    --------
    >>> import jax.numpy as jnp, xentfast.jax as xfj
    >>> xfj.softmax_cross_entropy_with_integer_labels(jnp.array([[30.0, 0.0]]), jnp.array([0]))  # doctest: +SKIP
    Array([9.357623e-14], dtype=float32)
    """


def softmax_cross_entropy(logits, labels, axis=-1, where=None, *, z_loss=0.0):
    z = _check_z_loss(z_loss)
    x = _as_logits(logits)
    axes = _class_axes(axis, x.ndim, allow_none=True)
    shape = x.shape
    t = jnp.asarray(labels)
    if not (jnp.issubdtype(t.dtype, jnp.floating) or jnp.issubdtype(t.dtype, jnp.integer)
            or t.dtype == jnp.bool_):
        raise TypeError(f"labels: expected real class probabilities, got dtype {t.dtype}")
    t = _broadcast(t.astype(x.dtype), shape, "labels", "the logits' shape")
    cls, keep = _masks(where, shape, axes)
    x = _classes_last(x, axes)
    _check_classes(x, axis)
    t = _classes_last(t, axes)
    if cls is not None:
        x = jnp.where(cls, x, jnp.asarray(-jnp.inf, x.dtype))
        t = jnp.where(cls, t, jnp.zeros((), t.dtype))
    if keep is not None:
        # a row with nothing kept is a constant 0; finite stand-ins keep its (zero) gradient finite
        x = jnp.where(keep[..., None], x, jnp.zeros((), x.dtype))
        t = jnp.where(keep[..., None], t, jnp.zeros((), t.dtype))
    loss = _xent_op(z, True)(x, t)
    return loss if keep is None else jnp.where(keep, loss, jnp.zeros((), loss.dtype))


softmax_cross_entropy.__doc__ = f"""Softmax cross-entropy from logits and class probabilities (optax's function).

    Parameters
    ----------
    logits : array, float32 or float64 (float16/bfloat16 computed in float32)
        Unnormalized log-probabilities.
    labels : array
        Class probabilities (one-hot or soft; any real values are accepted, as in optax), broadcast to the
        logits' shape and cast to their dtype.
    axis : int, tuple of ints or None, default -1
        The class axis or axes; None: every axis (one distribution, a scalar loss).
    where : boolean array, optional
        Elements to include, the batch shape (a row mask) or the logits' shape (a class mask), as in
        optax.  Rows with no kept class give 0 and gradient 0; masked classes take no part.
    z_loss : float >= 0, keyword-only, default 0
        Adds ``z_loss * logsumexp(row)**2`` per row (PaLM's auxiliary loss).  An xentfast extra.

    Returns
    -------
    loss : array, the logits' shape without the class axes (float32 for half-precision logits)
    {_ERROR_BOUND}
    The labels' gradient is ``-g * log_softmax(x)``: xentfast's log_softmax (2 / 4 ULP) times the
    cotangent (one rounding).

    Notes
    -----
    Loss per row ``sum_c t_c (lse - x_c) + z_loss lse**2`` with ``0 * inf = 0``, evaluated without
    cancellation (see :func:`xentfast.cross_entropy`); gradient ``p_j (sum_c t_c + 2 z_loss lse) - t_j``.
    """


def _host_labels(labels):
    """`labels` as a NumPy array of the values given, or None where JAX holds them (a jax.Array, a tracer,
    a list holding tracers) or NumPy would make objects of them.  With x64 off, jnp.asarray rounds a float64
    label to float32 and wraps an int64 one to int32 (``2**32 + 1`` would be class 1), and a Python int
    beyond int32 does not convert at all: a range check must see the host's values first."""
    if isinstance(labels, jax.Array):
        return None
    try:
        host = np.asarray(labels)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None
    return None if host.dtype == object else host


def sigmoid_binary_cross_entropy(logits, labels):
    x = _as_logits(logits)
    y = jnp.asarray(labels)
    if not (jnp.issubdtype(y.dtype, jnp.floating) or jnp.issubdtype(y.dtype, jnp.integer)
            or y.dtype == jnp.bool_):
        raise TypeError(f"labels: expected real values in [0, 1], got dtype {y.dtype}")
    # the labels' own values are checked, not their cast (as xentfast.api_binary does): float32 logits
    # would turn a float64 label of 1 + 1e-9 into 1
    host = _host_labels(labels)
    if host is not None:
        ok = jnp.asarray((host >= 0) & (host <= 1))
    else:
        ok = (y >= 0) & (y <= 1)     # False for NaN
    y = y.astype(x.dtype)
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"labels: shape {y.shape} does not broadcast with the logits' shape {x.shape}") from None
    x, y, ok = jnp.broadcast_to(x, shape), jnp.broadcast_to(y, shape), jnp.broadcast_to(ok, shape)
    loss = _bce_op()(x, jnp.where(ok, y, jnp.zeros((), y.dtype)))
    return _nan_where(~ok, loss)


sigmoid_binary_cross_entropy.__doc__ = f"""Elementwise sigmoid cross-entropy from logits (optax's function).

    Parameters
    ----------
    logits : array, float32 or float64 (float16/bfloat16 computed in float32)
    labels : array
        Targets in ``[0, 1]`` (binary or soft), cast to the logits' dtype; logits and labels broadcast
        together, as in optax.

    Returns
    -------
    loss : array of the broadcast shape (float32 for half-precision logits)

    Error bound
    -----------
    The loss is bitwise ``xentfast.binary_cross_entropy_with_logits(..., reduction='none')``: <= 2 ULP
    (float32), <= 4 ULP (float64).  Gradient: the README's bounds + 1 ULP (the cotangent's rounding).
    The labels' gradient is ``-g * x``, the exact derivative times the cotangent (one rounding).

    Notes
    -----
    Per element ``(1 - y) softplus(x) + y softplus(-x)``, one ``exp(-|x|)`` for both terms: no
    cancellation in either tail (optax's ``-y log_sigmoid(x) - (1 - y) log_sigmoid(-x)`` gives NaN at
    ``x = +inf, y = 1``; xentfast gives 0).  Labels outside ``[0, 1]`` or NaN give NaN and gradient 0
    (optax evaluates its formula, which can be negative there); the range is that of the labels as given,
    before their cast (a float64 label of ``1 + 1e-9`` beside float32 logits is outside; a NumPy label
    passed into ``jit`` arrives as JAX's array, in float32 when x64 is off).
    """
