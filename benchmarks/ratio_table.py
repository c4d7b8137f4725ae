"""Print the ratio table for this machine in one run: median times, ratios to xentfast, memory floor.

    python benchmarks/ratio_table.py [--threads 2] [--repeats 5] [--quick]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402
from conftest import make_problem  # noqa: E402


def median_time(fn, repeats):
    fn()  # warm-up (page faults, thread pool start)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    args = ap.parse_args(argv)
    shapes = [(4096, 1000)] if args.quick else [(4096, 1000), (8192, 32000)]
    bw = peers.copy_bandwidth()
    print(f"copy bandwidth: {bw / 1e9:.1f} GB/s (read+write), threads: {args.threads}")
    print(f"{'shape':>12} {'dtype':>8} {'impl':>9} {'median s':>10} {'x floor':>8} {'vs xentfast':>11}")
    for shape in shapes:
        for dtype in ("float32", "float64"):
            x, y = make_problem(*shape, dtype)
            floor = 2 * x.nbytes / bw  # logits read once + gradient written once
            base = None
            for name, factory in (("xentfast", peers.xentfast_fused), ("numpy", peers.numpy_fused),
                                  ("torch", peers.torch_fused)):
                run = factory(x, y, args.threads)
                if run is None:
                    continue
                t = median_time(run, args.repeats)
                base = base or t
                print(f"{shape[0]:>5}x{shape[1]:<6} {dtype:>8} {name:>9} {t:>10.4f} {t / floor:>8.1f} "
                      f"{t / base:>10.2f}x")


if __name__ == "__main__":
    main()
