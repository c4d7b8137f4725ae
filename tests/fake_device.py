"""A stand-in device backend for the tests of device dispatch without a GPU.

Its arrays are ``DevArray``: a NumPy array that, like a CuPy array, refuses NumPy's module functions
(``np.moveaxis(a)``, ``np.isnan(a).any()`` through ``__array_function__``...), so a code path that forgets
the call's array module fails.  Its kernels are the CPU kernels, so every result must carry the NumPy
call's bits; its host transfers are counted, so the "one round trip before the kernels" rule can be checked.
The ``device`` fixture (registered in conftest.py) installs it and returns the transfer counter;
``same_bits`` checks that a result is a device array with the bits of the NumPy call.
"""
import contextlib
import types

import numpy as np
import pytest

from xentfast import _backend
from xentfast._core import _binary, _xent


class DevArray(np.ndarray):
    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} called on a device array (use the backend's array module)")


def _host(a):
    return a.view(np.ndarray) if isinstance(a, DevArray) else a


def _dev(a):
    return a.view(DevArray) if isinstance(a, np.ndarray) and not isinstance(a, DevArray) else a


def _unwrap(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(x) for x in v)
    return _host(v)


class Transfers:
    def __init__(self):
        self.count = 0
        self.before_kernel = []

    def to_host(self, a):
        self.count += 1
        return np.array(_host(a))


def _array_module():
    def wrap(name):
        f = getattr(np, name)

        def call(*args, **kwargs):
            out = f(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
            if isinstance(out, np.ndarray):
                # as np.asarray and cupy.asarray: the very array when nothing had to change
                a = args[0] if args else None
                same = (isinstance(a, DevArray) and out.dtype == a.dtype and out.shape == a.shape
                        and out.strides == a.strides and out.ctypes.data == a.ctypes.data)
                return args[0] if same else _dev(out)
            return out
        return call
    names = ["asarray", "ascontiguousarray", "moveaxis", "empty", "empty_like", "full", "zeros", "ones", "isnan",
             "isfinite", "isinf", "may_share_memory", "concatenate", "broadcast_to", "where", "count_nonzero", "max",
             "abs"]
    return types.SimpleNamespace(**{n: wrap(n) for n in names})


def _kernels(transfers):
    def host_call(f, record=False):
        def call(*args, **kwargs):
            if record:
                transfers.before_kernel.append(transfers.count)
            return f(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return call

    def dd_sum(v):
        transfers.count += 1          # the device version synchronizes and copies (hi, lo) back
        return _xent.dd_sum(_host(v))

    def target_weight_sum(*args):
        transfers.count += 1
        return _xent.target_weight_sum(*_unwrap(args))

    return types.SimpleNamespace(
        softmax_xent=host_call(_xent.softmax_xent, record=True),
        softmax_family=host_call(_xent.softmax_family, record=True),
        elementwise=host_call(_binary.elementwise, record=True),
        ce_probs=host_call(_binary.ce_probs, record=True),
        dd_sum=dd_sum,
        dd_sum_device=lambda v: _dev(np.array(_xent.dd_sum(_host(v)))),
        target_weight_sum=target_weight_sum,
        target_weight_sum_device=lambda *a: _dev(np.array([_xent.target_weight_sum(*_unwrap(a))])),
    )


@pytest.fixture
def device(monkeypatch):
    transfers = Transfers()
    kernels = _kernels(transfers)
    backend = _backend.Backend("fake-device", _array_module(), kernels, kernels, DevArray, transfers.to_host,
                               lambda a: contextlib.nullcontext())
    monkeypatch.setattr(_backend, "_extra_device_backends", [backend])
    return transfers


def same_bits(dev, ref, what):
    assert isinstance(dev, DevArray), f"{what}: returned {type(dev).__name__}, not the device kind"
    d, r = np.atleast_1d(np.asarray(_host(dev))), np.atleast_1d(np.asarray(ref))
    assert d.dtype == r.dtype and d.shape == r.shape, what
    assert np.array_equal(d.view(np.uint8), r.view(np.uint8)), what
