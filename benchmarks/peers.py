"""The implementations xentfast is measured against, all computing mean softmax cross-entropy + gradient.

Each factory returns a zero-argument callable doing forward + backward on the given data, or None when the
peer is not installed.  Threads: every peer gets the same count (set by the caller).
"""
import numpy as np

import xentfast
from xentfast.testing import naive_cross_entropy_with_grad


def xentfast_fused(x, y, n_threads):
    out = np.empty_like(x)
    return lambda: xentfast.cross_entropy_with_grad(x, y, out=out, n_threads=n_threads)


def xentfast_forward(x, y, n_threads):
    return lambda: xentfast.cross_entropy(x, y, n_threads=n_threads)


def numpy_fused(x, y, n_threads=None):
    """The plain NumPy expression a user would write (NumPy's own threading is not configurable here)."""
    return lambda: naive_cross_entropy_with_grad(x, y)


def torch_fused(x, y, n_threads):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(n_threads)
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)

    def run():
        xr = xt.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(xr, yt)
        loss.backward()
        return loss, xr.grad

    return run


def copy_bandwidth(nbytes=1 << 28, repeats=5):
    """Measured copy bandwidth in bytes/s (read + write counted), best of `repeats`."""
    import time

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best
