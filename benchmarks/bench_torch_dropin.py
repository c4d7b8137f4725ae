"""Per-call cost of xentfast.torch against torch.nn.functional: forward + backward, median of repeats.

    PYTHONPATH=src python benchmarks/bench_torch_dropin.py

Prints microseconds per call for a tiny batch (where the Python dispatch of the custom ops dominates)
and a (4096, 1000) float32 batch (where the kernels do), for cross-entropy and BCE with logits, plus
the NumPy-level calls the ops make (the drop-ins' default reduction='mean': the reduced forward, then
the backward for a scalar upstream gradient), so the cost of the torch layer reads off as the difference.
"""
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import xentfast
import xentfast.torch as xt


def _median_us(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _fwd_bwd(loss_fn, x, t):
    def run():
        xr = x.detach().requires_grad_()
        loss_fn(xr, t).backward()
    return run


def _numpy_pair(fwd, bwd, x, t):
    xn, tn = x.numpy(), t.numpy()
    g = np.ones((), dtype=xn.dtype)

    def run():
        fwd(xn, tn, reduction="mean")
        bwd(g, xn, tn, reduction="mean")
    return run


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, xentfast {xentfast.__version__}")
    print(f"{'case':34s} {'xentfast.torch':>15s} {'torch.F':>10s} {'NumPy API':>10s}   (us per fwd+bwd, median)")
    for (n, c), repeats in (((8, 16), 400), ((4096, 1000), 15)):
        x = torch.randn(n, c)
        y = torch.randint(0, c, (n,))
        tb = torch.rand(n, c)
        cases = (
            ("cross_entropy", xt.cross_entropy, F.cross_entropy, y,
             _numpy_pair(xentfast.cross_entropy, xentfast.cross_entropy_backward, x, y)),
            ("binary_cross_entropy_with_logits", xt.binary_cross_entropy_with_logits,
             F.binary_cross_entropy_with_logits, tb,
             _numpy_pair(xentfast.binary_cross_entropy_with_logits,
                         xentfast.binary_cross_entropy_with_logits_backward, x, tb)),
        )
        for name, ours, theirs, t, raw in cases:
            a = _median_us(_fwd_bwd(ours, x, t), repeats)
            b = _median_us(_fwd_bwd(theirs, x, t), repeats)
            r = _median_us(raw, repeats)
            print(f"{name[:22]:22s} ({n},{c})".ljust(34) + f" {a:15.0f} {b:10.0f} {r:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
