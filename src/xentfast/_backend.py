"""Where a call runs: NumPy arrays on the CPU kernels, CuPy arrays on the CUDA twin.

Design
(a) Dispatch by array type, decided once per call from every array argument (:func:`for_call`): all
    NumPy (or plain sequences and scalars) -> :data:`CPU`; all CuPy, on one device -> the GPU backend;
    anything mixed -> ``TypeError`` naming the arguments on each side.  Plain Python scalars and lists
    take the side of the arrays.
(b) The validation code is the CPU path's, run on whichever arrays the call holds: the checks that look
    at data (label range, weights, NaN policy) are written once against the array's own module
    (``numpy`` or ``cupy``: :func:`xp`).  On the CPU each check raises at once.  On the GPU a check only
    records a device-side flag (:class:`Checks`); :meth:`Checks.fetch` copies every flag of the call,
    together with the few scalars the host needs (the mean's denominator), to the host in ONE transfer,
    and only a failing check pays for a second look that builds its message from host copies.  So a
    call costs one device -> host round trip before its kernels run, whatever it validates.
(c) Importing this module imports neither CuPy nor the CUDA module; nothing here touches a GPU until a
    CuPy array is passed.
(d) Any other array with ``__dlpack__`` (torch tensors, JAX arrays, ...) is read once, at the public
    function's entry (:func:`call_foreign`), by where it lives: ``__dlpack_device__()`` CPU -> NumPy
    (``np.from_dlpack``, zero-copy), CUDA -> CuPy (``cupy.from_dlpack``); from there (a) decides as for
    NumPy and CuPy arrays, so a torch tensor and a NumPy target mix on the CPU.  The results go back as
    ``input``'s kind: a torch tensor (``torch.from_dlpack``, zero-copy), a JAX array
    (``jax.numpy.asarray``, a copy: JAX arrays are immutable), else the ``__array_namespace__``'s
    ``from_dlpack``; an ``out=`` or in-place gradient is returned as the caller's own object.  Two
    exchanges DLPack cannot make are done by hand: bfloat16 (NumPy has no DLPack code for it), as its
    int16 bits viewed as ``ml_dtypes.bfloat16``, and JAX's bfloat16 through ``numpy.asarray``.  A torch
    tensor that requires grad is refused: DLPack would only export it detached, and a loss without its
    graph would be a silent wrong answer in a training loop; ``xentfast.torch`` has the autograd ops.
    NumPy reads a JAX array read-only, which is enough for inputs; ``inplace=True`` on one is refused.
"""

import contextlib
import sys

import numpy as np

from . import _dtypes
from ._core import _binary, _xent


def _cupy_module():
    return sys.modules.get("cupy")


def is_device_array(a):
    """Whether `a` is a ``cupy.ndarray`` (without importing CuPy: if it is not imported, nothing is one)."""
    for backend in _device_backends():
        if backend.owns(a):
            return True
    return False


def xp(a):
    """The array module of `a`: ``cupy`` for a CuPy array, else ``numpy``."""
    for backend in _device_backends():
        if backend.owns(a):
            return backend.xp
    return np


class Backend:
    """The array module and kernel modules of one side, and the few operations that differ."""

    def __init__(self, name, xp, softmax, binary, array_type, to_host, device_of=None):
        self.name = name
        self.xp = xp
        self.softmax = softmax        # launch functions with _xent's signatures
        self.binary = binary          # launch functions with _binary's signatures
        self.array_type = array_type  # the type an out= buffer must have
        self._to_host = to_host
        self._device_of = device_of

    @property
    def is_cpu(self):
        return self.xp is np

    def owns(self, a):
        return isinstance(a, self.array_type)

    def to_host(self, a):
        return self._to_host(a)

    def result(self, value, dtype):
        """A reduction's value as the caller's kind of 0-d result (NumPy scalar, or 0-d CuPy array)."""
        scalar = np.dtype(dtype).type
        if scalar is np.float64 or not abs(value) > _F32_MAX:
            # nothing to overflow (NaN included), so no errstate: entering one costs more than the rest
            v = scalar(value)
        else:
            with np.errstate(over="ignore"):
                v = scalar(value)
        return v if self.is_cpu else self.xp.asarray(v)

    def overlaps(self, a, b):
        """Whether two arrays may share memory.  NumPy answers exactly; on a device only the memory
        bounds are compared (CuPy's exact test sorts a pointer per element, a full-size job), so
        interleaved views that never touch count as overlapping there."""
        if self.is_cpu:
            return bool(np.shares_memory(a, b))
        return bool(self.xp.may_share_memory(a, b))

    @staticmethod
    def has_internal_overlap(a):
        """Whether two elements of `a` may share memory (a broadcast, stride-0 or as_strided view), judged
        from shape and strides: each axis, from the smallest stride up, must step past everything the
        axes before it span.  That suffices for disjoint elements; an interleaving of axes whose elements
        never meet counts as overlapping."""
        if a.size == 0:
            return False
        span = a.itemsize
        for stride, n in sorted((abs(st), n) for n, st in zip(a.shape, a.strides) if n > 1):
            if stride < span:
                return True
            span += stride * (n - 1)
        return False

    def device(self, a):
        """Context making `a`'s device current (allocations and launches land there)."""
        if self._device_of is None:
            return contextlib.nullcontext()
        return self._device_of(a)

    def checks(self, immediate=False):
        return Checks(self, immediate)


_F32_MAX = float(np.finfo(np.float32).max)


def _numpy_to_host(a):
    return np.asarray(a)


CPU = Backend("cpu", np, _xent, _binary, np.ndarray, _numpy_to_host)

_gpu = None
_extra_device_backends = []  # test doubles of a device backend (tests/test_dispatch_backend.py)


def _device_backends():
    if not _extra_device_backends and "cupy" not in sys.modules:
        return ()
    out = list(_extra_device_backends)
    cp = _cupy_module()
    if cp is not None:
        out.append(gpu())
    return out


def gpu():
    """The CuPy backend (CuPy must be importable)."""
    global _gpu
    if _gpu is None:
        import cupy

        from . import _cuda

        _gpu = Backend("cuda", cupy, _cuda, _cuda, cupy.ndarray, lambda a: a.get(),
                       lambda a: cupy.cuda.Device(a.device.id))
    return _gpu


def for_call(**arrays):
    """The backend of a call from its array arguments (see (a)); raises TypeError when they are mixed."""
    for backend in _device_backends():
        on_device = [name for name, a in arrays.items() if backend.owns(a)]
        if not on_device:
            continue
        on_host = [name for name, a in arrays.items() if isinstance(a, np.ndarray) and not backend.owns(a)]
        if on_host:
            raise TypeError(
                f"{', '.join(on_host)}: NumPy array(s) mixed with {backend.name} array(s) "
                f"({', '.join(on_device)}); pass every array on the same device (e.g. cupy.asarray)")
        devices = {name: _device_id(arrays[name]) for name in on_device}
        if len(set(devices.values())) > 1:
            where = ", ".join(f"{n} on device {d}" for n, d in devices.items())
            raise ValueError(f"arrays on different devices ({where}); move them to one device first")
        return backend
    return CPU


def _device_id(a):
    dev = getattr(a, "device", None)
    return getattr(dev, "id", None)


def device_of_call(args, kwargs):
    """The device context of the first device array among a call's arguments (a null context if none)."""
    for a in list(args) + list(kwargs.values()):
        for backend in _device_backends():
            if backend.owns(a):
                return backend.device(a)
    return contextlib.nullcontext()


class Checks:
    """Data checks of one call, see (b).

    ``require(bad, explain)``: `bad` is a boolean scalar of the call's array module saying the check
    failed; `explain()` raises the error (it may copy arrays to the host).  ``fetch(*values)`` runs the
    pending checks and returns the given device scalars as Python floats, in one transfer."""

    def __init__(self, backend, immediate=False):
        self.backend = backend
        self.immediate = immediate  # a helper called on its own: no batch to join, fetch at once
        self.flags = []
        self.explains = []

    def require(self, bad, explain):
        if self.backend.is_cpu:
            if bool(bad):
                explain()
                raise AssertionError("explain() must raise")  # pragma: no cover
            return
        self.flags.append(bad)
        self.explains.append(explain)
        if self.immediate:
            self.fetch()

    def fetch(self, *values):
        if self.backend.is_cpu:
            return [float(v) for v in values]
        if not self.flags and not values:
            return []
        xp = self.backend.xp
        parts = [xp.asarray(f, dtype=np.float64).reshape(1) for f in self.flags]
        parts += [xp.asarray(v, dtype=np.float64).reshape(1) for v in values]
        host = self.backend.to_host(xp.concatenate(parts)).tolist()
        flags, out = host[:len(self.flags)], host[len(self.flags):]
        for failed, explain in zip(flags, self.explains):
            if failed:
                explain()
                raise AssertionError("explain() must raise")  # pragma: no cover
        self.flags, self.explains = [], []
        return out


# ---------------------------------------------------------------------------------------------------
# arrays of other libraries, through DLPack: see (d)

_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13


def is_foreign(a):
    """Whether `a` is an array xentfast reads through DLPack: it has ``__dlpack__`` and is neither NumPy's
    nor a device backend's own."""
    return (not isinstance(a, (np.ndarray, np.generic)) and hasattr(a, "__dlpack__")
            and not is_device_array(a))


# argument types that are never a device array nor read through DLPack (exact types: subclasses of
# ndarray, such as a test's stand-in device array, take the general path)
_PLAIN_TYPES = frozenset({np.ndarray, int, float, bool, str, type(None), list, tuple})


def plain_call(args, kwargs):
    """Whether every argument of a call is a NumPy array, a Python scalar, a string, None or a sequence:
    such a call runs on the CPU with no device context and nothing to import, decided without looking
    for device backends."""
    for a in args:
        if type(a) not in _PLAIN_TYPES:
            return False
    for a in kwargs.values():
        if type(a) not in _PLAIN_TYPES:
            return False
    return True


def _holds_masked(a, masked_type):
    """Whether `a` is a masked array or a list or tuple with one somewhere inside (np.asarray of
    [masked, ...] drops the masks as silently as np.asarray of the array itself).  Looks no deeper than
    NumPy's dimension limit (np.asarray raises beyond it) and without recursion."""
    pending = [(a, 0)]
    while pending:
        v, depth = pending.pop()
        if isinstance(v, masked_type):
            return True
        if not isinstance(v, (list, tuple)) or depth > _MAX_NESTING:
            continue
        # the element types first, at C speed: a list of numbers (Python's or NumPy's scalars), the
        # common case, ends here
        kinds = set(map(type, v))
        if all(issubclass(k, _SCALAR_BASES) for k in kinds):
            continue
        pending.extend((e, depth + 1) for e in v if isinstance(e, (masked_type, list, tuple)))
    return False


# np.generic holds NumPy's scalars (np.float64, ...), never a masked array (np.ma.masked is an ndarray)
_SCALAR_BASES = (int, float, complex, np.generic)
_MAX_NESTING = 64


def masked_argument(signature, args, kwargs):
    """(name, is a sequence) of the first argument that is a NumPy masked array or a list holding one, or
    None: reading it as an array would silently use the values under its mask.  Nothing to look for until
    numpy.ma has been imported (no masked array can exist before)."""
    ma = sys.modules.get("numpy.ma")
    if ma is None or not any(_holds_masked(a, ma.MaskedArray) for a in (*args, *kwargs.values())):
        return None
    bound = signature.bind_partial(*args, **kwargs).arguments
    return next((name, isinstance(a, (list, tuple))) for name, a in bound.items()
                if _holds_masked(a, ma.MaskedArray))


def may_hold_masked(args, kwargs):
    """Whether a plain call (plain_call) needs masked_argument: numpy.ma is loaded and an argument is a
    list or a tuple (a plain call's arrays are exact ndarrays, never masked)."""
    if "numpy.ma" not in sys.modules:
        return False
    return (any(isinstance(a, (list, tuple)) for a in args)
            or any(isinstance(a, (list, tuple)) for a in kwargs.values()))


def ragged_argument(signature, args, kwargs):
    """The name of the first list or tuple argument NumPy cannot make an array of (None if none)."""
    for name, a in signature.bind_partial(*args, **kwargs).arguments.items():
        if isinstance(a, (list, tuple)):
            try:
                np.asarray(a)
            except ValueError:
                return name
    return None


def has_foreign(args, kwargs):
    for a in args:
        if is_foreign(a):
            return True
    for a in kwargs.values():
        if is_foreign(a):
            return True
    return False


def _kind(a):
    t = type(a)
    return f"{t.__module__.split('.')[0]}.{t.__name__}"


def _torch_tensor(a):
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(a, torch.Tensor) else None


def _jax_array(a):
    jax = sys.modules.get("jax")
    return jax if jax is not None and isinstance(a, jax.Array) else None


def _ml_dtypes(name):
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"{name}: reading a bfloat16 array needs ml_dtypes (pip install ml_dtypes)") from None
    return ml_dtypes


def _import(a, name):
    """`a` as a NumPy (CPU) or CuPy (CUDA) array sharing its memory where the exchange allows."""
    torch = _torch_tensor(a)
    if torch is not None:
        if a.requires_grad:
            raise TypeError(
                f"{name}: the torch.Tensor requires grad, and xentfast's array functions record no autograd "
                f"graph; use xentfast.torch (ops with backward formulas), or pass {name}.detach() for values only")
        if a.is_neg():
            # a lazy negation (x.conj().imag, torch._neg_view): DLPack exports the storage without it, so
            # every value would be read with the wrong sign
            raise TypeError(f"{name}: the torch.Tensor has its negative bit set (a lazy negation, as from "
                            f".conj().imag); pass {name}.resolve_neg()")
        if a.dtype == torch.bfloat16:
            return _import(a.view(torch.int16), name).view(_ml_dtypes(name).bfloat16)
    try:
        device_type = int(a.__dlpack_device__()[0])
    except Exception as exc:
        raise TypeError(f"{name}: cannot tell where the {_kind(a)} lives (__dlpack_device__: {exc})") from exc
    if device_type == _DL_CPU:
        try:
            return np.from_dlpack(a)
        except Exception as exc:
            # JAX bfloat16 has no DLPack exchange with NumPy; its own conversion gives ml_dtypes.bfloat16
            if _jax_array(a) is None:
                raise TypeError(f"{name}: NumPy cannot read the {_kind(a)} through DLPack ({exc})") from exc
            return np.asarray(a)
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        try:
            import cupy
        except ImportError:
            raise TypeError(f"{name}: a {_kind(a)} on a CUDA device needs CuPy (pip install cupy-cuda12x)") from None
        return cupy.from_dlpack(a)
    raise TypeError(f"{name}: the {_kind(a)} is on DLPack device type {device_type}; xentfast runs on the CPU "
                    f"(NumPy) and on CUDA devices (CuPy)")


def _exporter(original):
    """The function that hands a NumPy or CuPy result back as `original`'s kind (see (d))."""
    if not is_foreign(original):
        return None
    torch = _torch_tensor(original)
    if torch is not None:
        def to_torch(v):
            a = xp(v).asarray(v)            # a NumPy scalar becomes a 0-d array, as torch returns
            if _dtypes.is_bfloat16(a.dtype):
                return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
            return torch.from_dlpack(a)
        return to_torch
    jax = _jax_array(original)
    if jax is not None:
        import jax.numpy as jnp

        def to_jax(v):
            return jnp.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else jnp.from_dlpack(v)
        return to_jax
    namespace = getattr(original, "__array_namespace__", None)
    if namespace is None:
        return None
    ns = namespace()

    def to_namespace(v):
        a = xp(v).asarray(v)
        try:
            return ns.from_dlpack(a)
        except (BufferError, TypeError, ValueError, RuntimeError):
            return ns.asarray(a)   # a dtype DLPack cannot carry (bfloat16)
    return to_namespace


def _export(value, to_kind, imported):
    if isinstance(value, tuple):
        return tuple(_export(v, to_kind, imported) for v in value)
    hit = imported.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]                       # out= or the in-place input: the caller's own object
    return value if to_kind is None else to_kind(value)


def call_foreign(fn, signature, args, kwargs):
    """Call public function `fn` with its DLPack arguments read as NumPy or CuPy arrays, and hand the
    results back as ``input``'s kind (see (d))."""
    bound = signature.bind(*args, **kwargs)
    imported = {}   # id(local array) -> (local array, the caller's object)
    for name, value in bound.arguments.items():
        if is_foreign(value):
            local = _import(value, name)
            imported[id(local)] = (local, value)
            bound.arguments[name] = local
        elif name == "out" and value is not None:
            # a NumPy or CuPy out= beside a foreign input comes back as itself, not as a view of input's kind
            imported[id(value)] = (value, value)
    original = bound.arguments.get("input")
    original = imported.get(id(original), (None, original))[1]
    inplace = bound.arguments.get("inplace", False)
    # a non-bool inplace goes on to the function's own check, which names it (`if` of an array would not)
    if isinstance(inplace, (bool, np.bool_)) and inplace and is_foreign(original):
        local = bound.arguments["input"]
        if not getattr(local.flags, "writeable", True):
            raise ValueError(f"input: inplace=True, but the {_kind(original)} can only be read (JAX arrays are "
                             f"immutable); use the returned gradient instead")
    with device_of_call(bound.args, bound.kwargs):
        result = fn(*bound.args, **bound.kwargs)
    return _export(result, _exporter(original), imported)
