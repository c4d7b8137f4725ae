"""Time per element over logit magnitudes, one thread: where do a kernel's intermediates turn subnormal?

An operation on a subnormal number is a microcode assist on x86 (~100-150 cycles per vector instruction;
subnormals are never flushed here), so a kernel whose intermediates pass through them at some magnitude
of the input runs several times slower there with the same bits.  For each magnitude c this times, on
one thread, with the same element count everywhere:

    bce / focal   x = +-c + noise in [-1, 1], targets 0, 1 (and 0.3 for BCE), fused loss and gradient
    ce            rows whose max is 0 and whose other classes lie at -c + noise: fused, forward only

and marks with '*' every cell whose call fed a subnormal to an operation (the CPU's denormal-operand flag,
where the CPU has one), and with '!' a time over twice the column's median.  With --torch, PyTorch's BCE
with logits and cross-entropy (forward and backward, `mean`, one thread: benchmarks/peers.py) get columns
beside xentfast's, on the same inputs.

    python benchmarks/magnitude_scan.py                       # every family, both dtypes (~4 minutes)
    python benchmarks/magnitude_scan.py --only bce --dtype float32 --torch
    python benchmarks/magnitude_scan.py --magnitudes 170 180 190 350 360
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import xentfast as xf
from xentfast._config import config
from xentfast._core import _scalar

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402

MAGNITUDES = [10, 50, 87, 103, 150, 180, 185, 240, 250, 300, 360, 370, 400, 500, 550, 600, 680, 700, 720,
              740, 760, 800, 1000, 1100, 1200, 1e4]


def _ns_per_element(call, n, repeats):
    call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best * 1e9 / n


def _columns(dtype, c, rows, classes, only, torch=False):
    """(label, call) pairs for magnitude c"""
    rng = np.random.default_rng(0)
    noise = rng.uniform(-1.0, 1.0, (rows, classes))
    out = np.empty((rows, classes), dtype)
    cols = []
    for sign in (-1, 1):
        x = (sign * c + noise).astype(dtype)
        for y_value in (0.0, 1.0, 0.3):
            y = np.full((rows, classes), y_value, dtype)
            if "bce" in only:
                cols.append((f"bce {sign:+d} y={y_value:g}", lambda x=x, y=y:
                             xf.binary_cross_entropy_with_logits_with_grad(x, y, out=out, n_threads=1)))
                if torch:
                    cols.append((f"torch {sign:+d} y={y_value:g}", peers.torch_binary(x, y, 1)))
            if "focal" in only and y_value != 0.3:
                cols.append((f"focal {sign:+d} y={y_value:g}", lambda x=x, y=y:
                             xf.sigmoid_focal_loss_with_grad(x, y, out=out, n_threads=1)))
    if "ce" in only:
        x = (-c + noise).astype(dtype)
        x[:, 0] = 0.0
        t = np.zeros(rows, np.int64)
        cols.append(("ce fused", lambda: xf.cross_entropy_with_grad(x, t, n_threads=1)))
        if torch:
            cols.append(("torch ce fused", peers.torch_fused(x, t, 1)))
        cols.append(("ce forward", lambda: xf.cross_entropy(x, t, n_threads=1)))
    return cols


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", default=["bce", "focal", "ce"], choices=["bce", "focal", "ce"])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    ap.add_argument("--magnitudes", nargs="+", type=float, default=MAGNITUDES)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="PyTorch's BCE and cross-entropy beside xentfast's")
    args = ap.parse_args(argv)
    if args.torch and peers.torch_binary(np.zeros(1, np.float32), np.zeros(1, np.float32), 1) is None:
        ap.error("--torch: PyTorch is not installed")
    n = args.rows * args.classes
    print(f"xentfast {xf.__version__} ({config()['cpu_code_path'].split()[0]} path), {args.rows}x{args.classes},"
          f" one thread, ns per element (best of {args.repeats}); '*': a subnormal operand, '!': over twice"
          " the column's median")
    for dtype in args.dtype:
        table = []
        for c in args.magnitudes:
            cells = []
            for label, call in _columns(np.dtype(dtype), c, args.rows, args.classes, args.only, args.torch):
                flagged = _scalar.consumes_subnormals(call)
                cells.append((label, _ns_per_element(call, n, args.repeats), flagged))
            table.append((c, cells))
        labels = [label for label, _, _ in table[0][1]]
        medians = [statistics.median(cells[k][1] for _, cells in table) for k in range(len(labels))]
        print(f"\n{dtype}")
        print(f"{'c':>8} " + " ".join(f"{label:>14}" for label in labels))
        for c, cells in table:
            text = []
            for k, (_, ns, flagged) in enumerate(cells):
                mark = ("*" if flagged else " ") + ("!" if ns > 2.0 * medians[k] else " ")
                text.append(f"{ns:12.2f}{mark}")
            print(f"{c:8g} " + " ".join(text))


if __name__ == "__main__":
    main()
