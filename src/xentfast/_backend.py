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
"""

import contextlib
import sys

import numpy as np

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
        with np.errstate(over="ignore"):
            v = np.dtype(dtype).type(value)
        return v if self.is_cpu else self.xp.asarray(v)

    def overlaps(self, a, b):
        """Whether two arrays may share memory.  NumPy answers exactly; on a device only the memory
        bounds are compared (CuPy's exact test sorts a pointer per element, a full-size job), so
        interleaved views that never touch count as overlapping there."""
        if self.is_cpu:
            return bool(np.shares_memory(a, b))
        return bool(self.xp.may_share_memory(a, b))

    def device(self, a):
        """Context making `a`'s device current (allocations and launches land there)."""
        if self._device_of is None:
            return contextlib.nullcontext()
        return self._device_of(a)

    def checks(self, immediate=False):
        return Checks(self, immediate)


def _numpy_to_host(a):
    return np.asarray(a)


CPU = Backend("cpu", np, _xent, _binary, np.ndarray, _numpy_to_host)

_gpu = None
_extra_device_backends = []  # test doubles of a device backend (tests/test_dispatch_backend.py)


def _device_backends():
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
