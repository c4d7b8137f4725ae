"""Every CUDA kernel family once, on small odd shapes, for a memory checker (compute-sanitizer memcheck).

Run by benchmarks/gpu_check.sh under `compute-sanitizer --tool memcheck` where that tool is installed:
the shapes are chosen to end rows and grids off the kernels' tile edges (C = 1, 3, 1001, 40003; N = 1,
7), where an out-of-bounds read or write would live; the long rows also run cached in shared memory and
with the cross-entropy kernel's other register budget.  Each call is also compared with the CPU bit for
bit, so the script fails on a wrong number even where no checker runs.
"""

import os
import sys

import numpy as np


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def main():
    import cupy as cp

    import xentfast as xf

    # without CuPy's memory pool every array is its own device allocation, so a read just past an array's
    # end leaves the allocation and the checker sees it (inside a pooled block it would not)
    cp.cuda.set_allocator(None)
    rng = np.random.default_rng(7)
    failures = []
    calls = 0

    def check(name, fn, *args, **kw):
        nonlocal calls
        calls += 1
        want = fn(*args, **kw)
        got = fn(*(cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args),
                 **{k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            if not same_bits(w, cp.asnumpy(g)):
                failures.append(name)
                print("DIFFERS:", name)
                return

    for dtype in (np.float32, np.float64):
        for N, C in ((1, 1), (7, 3), (7, 1001), (3, 40003)):
            x = (rng.standard_normal((N, C)) * 5).astype(dtype)
            y = rng.integers(0, C, N)
            y[-1] = -100 if N > 1 else y[-1]
            w = rng.random(C) + 0.5
            tag = f"{np.dtype(dtype).name} {N}x{C}"
            check(f"cross_entropy_with_grad {tag}", xf.cross_entropy_with_grad, x, y, reduction="none")
            check(f"cross_entropy_with_grad weighted smoothed z_loss {tag}", xf.cross_entropy_with_grad, x, y,
                  w, label_smoothing=0.1, z_loss=1e-3, reduction="sum")
            p = np.exp(x - x.max(1, keepdims=True))
            p = (p / p.sum(1, keepdims=True)).astype(dtype)
            check(f"cross_entropy_with_grad probability targets {tag}", xf.cross_entropy_with_grad, x, p)
            for f in (xf.logsumexp, xf.log_softmax, xf.softmax):
                check(f"{f.__name__} {tag}", f, x)
            check(f"cross_entropy_from_probs_with_grad {tag}", xf.cross_entropy_from_probs_with_grad, p, y,
                  reduction="none")
            t = (rng.random((N, C)) > 0.5).astype(dtype)
            pw = (rng.random(C) + 0.5).astype(dtype)
            check(f"bce_with_logits_with_grad {tag}", xf.binary_cross_entropy_with_logits_with_grad, x, t,
                  pos_weight=pw, reduction="none")
            check(f"bce_with_logits_with_grad mean {tag}", xf.binary_cross_entropy_with_logits_with_grad, x, t)
            check(f"sigmoid_focal_loss_with_grad {tag}", xf.sigmoid_focal_loss_with_grad, x, t)
            q = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(dtype)
            check(f"binary_cross_entropy_with_grad {tag}", xf.binary_cross_entropy_with_grad, q, t,
                  reduction="sum")
    # the long rows again with each row cached in shared memory (past the default 48 KB: the kernels'
    # opt-in) and the 72-register build of the cross-entropy kernel
    for env_name, value in (("XENTFAST_CUDA_CACHE_ROW", "1"), ("XENTFAST_CUDA_XENT_MIN_BLOCKS", "1")):
        os.environ[env_name] = value
        for dtype in (np.float32, np.float64):
            x = (rng.standard_normal((3, 40003)) * 5).astype(dtype)
            y = rng.integers(0, 40003, 3)
            tag = f"{np.dtype(dtype).name} 3x40003 {env_name}={value}"
            check(f"cross_entropy_with_grad z_loss {tag}", xf.cross_entropy_with_grad, x, y, z_loss=1e-3)
            check(f"log_softmax {tag}", xf.log_softmax, x)
            check(f"logsumexp {tag}", xf.logsumexp, x)
        del os.environ[env_name]
    print(f"{calls} calls on the GPU, {len(failures)} with other bits than the CPU's")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
