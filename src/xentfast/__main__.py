"""`python -m xentfast`: self-check and demo on embedded default data.

Runs the fused cross-entropy kernel on a deterministic batch that mixes ordinary rows with the cases the
peers get wrong (confident rows, masked classes, ties, huge logits, ignored rows), checks a sample of rows
against the mpmath reference, and times the kernel against the plain NumPy expression.  Exit status 1
if any measured error exceeds the documented bound.
"""

import argparse
import sys
import time

import numpy as np

import xentfast
from xentfast import reference
from xentfast.testing import max_ulp_error, naive_cross_entropy_with_grad

# The documented bounds (README, docstrings): per-row loss and index-target gradient, in ULPs.
BOUNDS = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}


HARD_ROWS = 7  # rows 0-6 of default_batch


def default_batch(n=4096, c=1000, dtype=np.float32, seed=20261130):
    """The embedded workload: ordinary logits plus one of each hard case near the top of the batch."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    y = rng.integers(0, c, size=n)
    x[0, y[0]] = x[0].max() + 30        # confident and correct: loss ~ 1e-13, not 0
    x[1, y[1]] = x[1].max() + 100       # so confident that float32 p_y - 1 would be exactly 0
    x[2, ::3] = -np.inf                 # masked vocabulary (target kept visible)
    x[2, y[2]] = 1.0
    x[3, :] = 7.0                       # all tied: loss = log C
    x[4] *= 1e4                         # huge logits
    x[5, y[5]] = x[5].min() - 50        # confidently wrong
    y[6] = -100                         # ignored row
    return x, y


def sample_rows(n, k=16):
    """The hard rows plus an even spread of ordinary ones."""
    rows = np.unique(np.concatenate([np.arange(HARD_ROWS), np.linspace(HARD_ROWS, n - 1, k - HARD_ROWS).astype(int)]))
    return rows[rows < n]


def median_time(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def copy_bandwidth(nbytes=1 << 27, repeats=5):
    """This machine's copy bandwidth in bytes/s (read + write counted), best of `repeats`, for arrays of
    `nbytes`: the workload's own size, so that the copy reads from where the kernel reads (the embedded
    batch, 16 or 32 MB, may sit in a large last-level cache, and a copy from memory made the kernel look
    faster than its floor)."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / min(median_time(lambda: np.copyto(dst, src), 1) for _ in range(repeats))


def integrations():
    """(name, status) of every optional integration: what a user of this install can switch to."""
    import importlib.metadata
    import importlib.util

    def version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    rows = []
    for module, dist, what in (("xentfast.torch", "torch", "PyTorch custom ops with autograd"),
                               ("xentfast.jax", "jax", "JAX custom_vjp functions"),
                               (None, "cupy", "CuPy arrays on the GPU kernels"),
                               (None, "ml_dtypes", "bfloat16 NumPy arrays")):
        if module is not None and importlib.util.find_spec(module) is None:
            continue
        ver = version(dist) or (version("cupy-cuda12x") if dist == "cupy" else None)
        label = module or dist
        rows.append((label, f"{what}: available ({dist} {ver})" if ver else f"{what}: {dist} not installed"))
    return rows


def check(dtype, n, c, n_threads):
    x, y = default_batch(n, c, dtype)
    loss, grad = xentfast.cross_entropy_with_grad(x, y, reduction="none", n_threads=n_threads)
    rows = sample_rows(n)
    exact_loss = reference.cross_entropy(x[rows], y[rows], reduction="none")
    exact_grad = reference.cross_entropy_grad(x[rows], y[rows], reduction="none")
    loss_err, _ = max_ulp_error(loss[rows], exact_loss, dtype)
    grad_err, _ = max_ulp_error(grad[rows], exact_grad, dtype)
    t_xf = median_time(lambda: xentfast.cross_entropy_with_grad(x, y, n_threads=n_threads))
    t_np = median_time(lambda: naive_cross_entropy_with_grad(x, y))
    return loss_err, grad_err, t_xf, t_np, len(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m xentfast", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: all)")
    args = ap.parse_args(argv)
    if args.rows < HARD_ROWS or args.classes < 1:
        ap.error(f"--rows must be at least {HARD_ROWS} (the embedded hard cases) and --classes at least 1")

    xentfast.show_config()
    print()
    print("integrations:")
    for label, status in integrations():
        print(f"  {label:>15}: {status}")
    print()
    print(f"fused cross-entropy + gradient on the embedded batch ({args.rows} x {args.classes}):")
    print(f"{'dtype':>8} {'rows checked':>12} {'loss ULP':>9} {'grad ULP':>9} {'bound':>6} "
          f"{'xentfast s':>11} {'x floor':>8} {'numpy s':>9} {'speed-up':>9}")
    ok = True
    for dtype in (np.float32, np.float64):
        loss_err, grad_err, t_xf, t_np, k = check(dtype, args.rows, args.classes, args.threads)
        bound = BOUNDS[np.dtype(dtype)]
        ok &= loss_err <= bound and grad_err <= bound
        nbytes = args.rows * args.classes * np.dtype(dtype).itemsize
        bandwidth = copy_bandwidth(max(nbytes, 1 << 20))   # a tiny batch: a copy still long enough to time
        floor = 2 * nbytes / bandwidth
        print(f"{np.dtype(dtype).name:>8} {k:>12} {loss_err:>9.2f} {grad_err:>9.2f} {bound:>6.0f} "
              f"{t_xf:>11.4f} {t_xf / floor:>8.1f} {t_np:>9.4f} {t_np / t_xf:>8.2f}x")
    print(f"x floor: time / (logits read once + gradient written once at this machine's copy bandwidth "
          f"for arrays of the batch's size, NumPy's one-thread copy: {bandwidth / 1e9:.1f} GB/s for float64)")
    print()
    print("self-check:", "OK, every sampled error within its bound" if ok else "FAILED: a bound was exceeded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
