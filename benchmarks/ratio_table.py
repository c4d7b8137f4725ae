"""Print the issue's ratio table for this machine in one run, with the memory floor and a targets checklist.

For every target row: the median seconds of each implementation (xentfast, PyTorch, JAX, NumPy, all on the
same thread count, timed round by round in varying order so that they share the machine's load), the
memory floor (bytes that must move / copy bandwidth measured in this run), xentfast's time as a multiple
of it, each peer's time over xentfast's, and xentfast's 1-thread time over its N-thread time.  Then tiny
problems in microseconds per call against the NumPy expression, and the checklist of the issue's targets.

    python benchmarks/ratio_table.py                     # everything (5 to 10 minutes on 2 cores)
    python benchmarks/ratio_table.py --quick             # no shape above 10^7 elements (under a minute)
    python benchmarks/ratio_table.py --only binary       # rows whose label contains "binary"
    python benchmarks/ratio_table.py --markdown          # tables ready to paste in benchmarks/README.md
    python benchmarks/ratio_table.py --family --only soft logsumexp   # the softmax functions (no targets)
    python benchmarks/ratio_table.py --inputs --only 4096x1000       # masked, confident, padded rows beside plain ones
"""
import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402

# (family, N, C, dtype): the target shapes
ROWS = [
    ("fused", 8192, 32000, "float32"),
    ("fused", 2048, 128256, "float32"),
    ("fused", 4096, 1000, "float32"),
    ("fused", 4096, 1000, "float64"),
    ("forward", 8192, 32000, "float32"),
    ("forward", 2048, 128256, "float32"),
    ("forward", 4096, 1000, "float32"),
    ("forward", 4096, 1000, "float64"),
    ("binary", 65536, 256, "float32"),
    ("binary", 4096, 1000, "float32"),
]
# The softmax functions beside the losses (--family): no issue target, the README's claims about them
FAMILY_ROWS = [(name, n, c, "float32") for name in peers.SOFTMAX_FUNCTIONS
               for n, c in ((16384, 100), (8192, 256), (4096, 1000), (1024, 4096))]
FAMILY_ROWS += [(name, 4096, 1000, "float64") for name in peers.SOFTMAX_FUNCTIONS]
# and BCE from probabilities (loss and gradient)
FAMILY_ROWS += [("binary-probs", 4096, 1000, dtype) for dtype in ("float32", "float64")]
# The inputs that cost more than ordinary rows (--inputs): no issue target, the README's times for them;
# beside the plain 4096x1000 rows of ROWS (--inputs --only 4096x1000 shows them side by side)
INPUT_ROWS = [(f"{family}[{kind}]", 4096, 1000, dtype) for family in ("fused", "forward")
              for kind in peers.INPUT_KINDS for dtype in ("float32", "float64")
              if kind != "confident" or dtype == "float64"]
INPUT_ROWS += [(f"binary[{kind}]", 4096, 1000, dtype) for kind in peers.BINARY_INPUT_KINDS
               for dtype in ("float32", "float64")]
# N*C <= 10^4: xentfast against the NumPy expression only
TINY = [(family, n, c, "float32") for family in ("fused", "forward", "binary")
        for n, c in ((8, 100), (32, 300), (100, 100))]
TINY_SAMPLES, TINY_BATCH_S = 201, 0.0005
QUICK_MAX_ELEMENTS = 10**7
# The goals, each row's with the sections it applies to
GOAL_FLOOR = {"fused": 2.0, "forward": 1.5, "binary": 2.0}
LARGE_SOFTMAX = {(8192, 32000), (2048, 128256)}
PEERS = ("torch", "jax", "numpy")
PEER_NAMES = {"torch": "torch", "jax": "JAX", "numpy": "NumPy"}


def label(row):
    family, n, c, dtype = row
    return f"{family} {n}x{c} {dtype}"


def say(*parts):
    print(*parts, flush=True)


def load():
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


class Stat:
    def __init__(self, times, cpu, per_call=1):
        self.times = [t / per_call for t in times]
        self.median = statistics.median(self.times)
        self.n = len(times)
        self.cpu_per_wall = cpu / sum(times)


def round_orders(n):
    """Orders of n callables, one per round, in which each callable follows each other one about equally
    often (the rows of a Williams design: for even n each ordered pair is adjacent exactly once in n rounds,
    for odd n twice in 2n).  A plain rotation keeps the cyclic order, so every callable would always follow
    the same one: xentfast's N-thread call always came right after NumPy's single-thread one, which had left
    the other cores idle, and an idle core of these VMs takes milliseconds to run a thread again
    (benchmarks/README.md, "the order of the calls")."""
    base = [0]
    for j in range(1, n):
        base.append((j + 1) // 2 if j % 2 else n - j // 2)
    rows = [[(b + i) % n for b in base] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def run_interleaved(fns, repeats, slow_repeats, slow_s, per_call=None, row_s=0.0, max_repeats=None):
    """Median of each callable's timed runs, timed round by round in varying order after one warm-up each.

    A peer whose first timed run takes more than ``slow_s`` stops after ``slow_repeats`` runs, so that the
    slow peers at the large shapes do not dominate the run time; xentfast itself always gets ``repeats``.
    After ``repeats`` rounds, more rounds follow while the row has taken less than ``row_s`` seconds, up to
    ``max_repeats``: the short rows' medians then rest on 15-25 runs instead of 5, where one slow run
    (a busy core) moved a median far enough to flip a verdict.  Rounds stop only at the end of a whole
    cycle of round_orders (10 rounds for 5 callables), so that each callable followed each other one
    equally often; ``max_repeats`` is rounded up to a whole cycle.  ``per_call``: how many calls each
    callable makes (tiny problems are timed in batches), to report the time of one.
    """
    names = list(fns)
    per_call = per_call or {}
    orders = round_orders(len(names))
    cycle = len(orders)
    max_repeats = -(-max(repeats, max_repeats or repeats) // cycle) * cycle
    for name in names:
        fns[name]()  # warm-up: page faults, thread pools, JAX's compilation
    times = {name: [] for name in names}
    cpu = {name: 0.0 for name in names}
    wanted = dict.fromkeys(names, max_repeats)
    start = time.perf_counter()
    for r in range(max_repeats):
        if r >= repeats and r % cycle == 0 and time.perf_counter() - start >= row_s:
            break
        for name in (names[i] for i in orders[r % len(orders)]):
            if len(times[name]) >= wanted[name]:
                continue
            c0 = time.process_time()
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
            if r == 0 and not name.startswith("xentfast") and times[name][0] > slow_s * per_call.get(name, 1):
                wanted[name] = min(repeats, slow_repeats)
    return {name: Stat(times[name], cpu[name], per_call.get(name, 1)) for name in names}


def batched(fn, target_s):
    """A callable making k calls of ``fn``, k chosen so one batch takes about ``target_s``; and k."""
    fn()
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.005:
        fn()
        k += 1
    k = max(1, int(target_s / ((time.perf_counter() - t0) / k)))

    def run():
        for _ in range(k):
            fn()

    return run, k


def measure_row(row, args):
    family, n, c, dtype = row
    a, b = peers.PROBLEMS[family](n, c, dtype)
    factories = peers.FAMILIES[family]
    out = np.empty_like(a) if family.split("[")[0] != "forward" else None
    fns = {"xentfast": factories["xentfast"](a, b, args.threads, out=out)}
    if args.threads > 1:
        fns["xentfast-1t"] = factories["xentfast"](a, b, 1, out=out)
    for name in PEERS:
        fn = factories[name](a, b, args.threads)
        if fn is not None:
            fns[name] = fn
    stats = run_interleaved(fns, args.repeats, args.slow_repeats, args.slow_s, row_s=args.row_s,
                            max_repeats=args.max_repeats)
    nbytes = peers.BYTES[family](a, b)
    del fns, a, b, out
    peers.drop_problems()
    gc.collect()
    return stats, nbytes


def measure_tiny(row, args):
    family, n, c, dtype = row
    a, b = peers.PROBLEMS[family](n, c, dtype)
    factories = peers.FAMILIES[family]
    fns, per_call = {}, {}
    # Many short batches rather than a few long ones: on a shared machine a long batch always includes
    # the time the process waited for a core, whereas the median of short ones is the time of a call.
    for name in ("xentfast", "numpy"):
        fns[name], per_call[name] = batched(factories[name](a, b, args.threads), TINY_BATCH_S)
    stats = run_interleaved(fns, TINY_SAMPLES, TINY_SAMPLES, float("inf"), per_call)
    peers.drop_problems()
    return stats


def fmt_s(t):
    return f"{t:.4g}"


def table(headers, rows, markdown):
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    say("\n".join(lines))


def versions():
    found = [f"Python {platform.python_version()}", f"NumPy {np.__version__}"]
    for mod in ("torch", "jax", "optax"):
        try:
            found.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            found.append(f"{mod} not installed")
    return ", ".join(found)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads for every implementation (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per implementation (default 5)")
    ap.add_argument("--slow-repeats", type=int, default=3,
                    help="timed runs for a peer slower than --slow-s per call (default 3); never xentfast")
    ap.add_argument("--slow-s", type=float, default=2.0, help="see --slow-repeats (default 2.0 s)")
    ap.add_argument("--row-s", type=float, default=3.0,
                    help="after --repeats rounds, keep timing a row while it has taken less (default 3.0 s)")
    ap.add_argument("--max-repeats", type=int, default=25,
                    help="rounds per row at most, rounded up to whole cycles of the order design (default 25)")
    ap.add_argument("--quick", action="store_true", help=f"only shapes of at most {QUICK_MAX_ELEMENTS:.0e} elements")
    ap.add_argument("--only", metavar="SUBSTRING", nargs="+",
                    help="only rows whose label contains one of them (e.g. 'binary', '128256', 'float64', 'tiny')")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--family", action="store_true",
                    help="also log_softmax, softmax and logsumexp at 100-4096 classes and BCE from probabilities "
                    "(not issue targets: no checklist entries)")
    ap.add_argument("--inputs", action="store_true",
                    help="also the inputs that cost more than ordinary rows: 30 %% of the classes masked (-inf or "
                    "-1e9), float64 rows with the target 800 above the rest, binary elements padded by -1e4 or -inf "
                    "(not issue targets)")
    args = ap.parse_args(argv)

    # Before torch or JAX starts a thread: JAX's thread count is the number of CPUs the process may use.
    cpus = peers.limit_cpus(args.threads)
    rows = [r for r in ROWS + (FAMILY_ROWS if args.family else []) + (INPUT_ROWS if args.inputs else [])
            if not (args.quick and r[1] * r[2] > QUICK_MAX_ELEMENTS)]
    tiny = list(TINY)
    if args.only:
        rows = [r for r in rows if any(s in label(r) for s in args.only)]
        tiny = [r for r in tiny if any(s in "tiny " + label(r) for s in args.only)]

    import xentfast
    from xentfast._config import config

    bullet = "- " if args.markdown else ""
    say(f"{bullet}{datetime.datetime.now().isoformat(timespec='minutes')}, {cpu_model()}, "
        f"{len(cpus) if cpus else os.cpu_count()} CPUs for this process")
    say(f"{bullet}{versions()}, xentfast {xentfast.__version__} ({config()['cpu_code_path'].split()[0]} path)")
    say(f"{bullet}threads: {args.threads} for xentfast (n_threads), torch (set_num_threads) and JAX (the "
        f"process's CPUs: {peers.jax_threads()}); NumPy's element-wise loops use one")
    if cpus is not None and len(cpus) < args.threads:
        say(f"{bullet}WARNING: only {len(cpus)} CPUs for {args.threads} threads: JAX gets {len(cpus)}")
    say(f"{bullet}at start: {load()}")
    busy_at_start = os.getloadavg()[0] >= 1.0

    bw = {}
    for k in sorted({1, args.threads}):
        bw[k] = [peers.copy_bandwidth(k)]

    results = {}
    if rows:
        say("\nTimings (median, min-max, and CPU time / wall time: about the number of busy cores):")
        if args.markdown:
            say("\n```text")
    for row in rows:
        say(f"[{label(row)}]  {load()}")
        stats, nbytes = measure_row(row, args)
        results[row] = (stats, nbytes)
        for name, st in stats.items():
            say(f"    {name:<12} n={st.n}  median {fmt_s(st.median)} s  [{fmt_s(min(st.times))}, "
                f"{fmt_s(max(st.times))}]  cpu/wall {st.cpu_per_wall:.2f}")
    tiny_results = {}
    if tiny:
        say(f"Tiny problems  {load()}")
    for row in tiny:
        tiny_results[row] = measure_tiny(row, args)
    if args.markdown and rows:
        say("```")

    for k in bw:
        bw[k].append(peers.copy_bandwidth(k))
    best_bw = max(max(v) for v in bw.values())
    say(f"\n{bullet}at end: {load()}")
    if busy_at_start:
        say(f"{bullet}NOTE: the load average was 1 or more before this run started: other processes were using "
            "the cores. Implementations timed in the same rounds shared that load, so their ratios compare; "
            "absolute times, 'x floor' and the 1-thread/N-thread speedup are pessimistic.")
    for k, v in bw.items():
        say(f"{bullet}copy bandwidth, {k} thread{'s' if k > 1 else ''} (read + write, 512 MiB arrays): "
            f"{v[0] / 1e9:.1f} GB/s at start, {v[1] / 1e9:.1f} GB/s at end")
    say(f"{bullet}floor = bytes that must move / {best_bw / 1e9:.1f} GB/s (the best copy above). Bytes: fused = "
        "logits read + gradient written + targets read; forward = logits + targets read; binary = logits "
        "and targets read + gradient written" + ("; log_softmax, softmax = logits read + output written; "
                                                 "logsumexp = logits read" if args.family else ""))

    checks = []
    if results:
        slow_note = False
        headers = ["row", "floor s", "xentfast s", "x floor"]
        if args.threads > 1:
            headers += ["1 thread s", f"1t/{args.threads}t"]
        for p in PEERS:
            headers += [f"{PEER_NAMES[p]} s", f"{PEER_NAMES[p]}/xentfast"]
        lines = []
        for row, (stats, nbytes) in results.items():
            family, n, c, dtype = row
            xf = stats["xentfast"].median
            floor = nbytes / best_bw
            line = [label(row), fmt_s(floor), fmt_s(xf), f"{xf / floor:.2f}"]
            target = family in GOAL_FLOOR
            if target:
                checks.append((f"{label(row)}: xentfast / floor", xf / floor, "<=", GOAL_FLOOR[family]))
            if args.threads > 1:
                t1 = stats["xentfast-1t"].median
                line += [fmt_s(t1), f"{t1 / xf:.2f}"]
                if target:
                    checks.append((f"{label(row)}: 1 thread / {args.threads} threads", t1 / xf, ">=",
                                   0.9 * args.threads))
            ratios = {}
            for p in PEERS:
                if p not in stats:
                    line += ["-", "-"]
                    continue
                st = stats[p]
                mark = "*" if st.n < args.repeats else ""
                slow_note = slow_note or bool(mark)
                ratios[p] = st.median / xf
                line += [fmt_s(st.median) + mark, f"{ratios[p]:.2f}"]
            lines.append(line)
            goals = {}
            if family == "fused" and (n, c) in LARGE_SOFTMAX:
                goals = {"jax": 4.0, "torch": 10.0}
            elif family == "fused":
                goals = {"torch": 3.0, "jax": 1.5}
            elif family == "binary":
                goals = {"torch": 5.0}
            for p, goal in goals.items():
                checks.append((f"{label(row)}: {PEER_NAMES[p]} / xentfast", ratios.get(p), ">=", goal))
        say("\nRatio table (times are medians; 'x floor' = xentfast / floor; 'peer/xentfast' > 1: xentfast "
            "is faster):\n")
        table(headers, lines, args.markdown)
        if slow_note:
            say(f"\n* median of {args.slow_repeats} runs, not the row's full count: this peer took more than "
                f"{args.slow_s} s per call.")

    if tiny_results:
        lines = []
        for row, stats in tiny_results.items():
            xf, npy = stats["xentfast"].median, stats["numpy"].median
            lines.append([label(row), f"{xf * 1e6:.1f}", f"{min(stats['xentfast'].times) * 1e6:.1f}",
                          f"{npy * 1e6:.1f}", f"{min(stats['numpy'].times) * 1e6:.1f}", f"{npy / xf:.2f}"])
            checks.append((f"tiny {label(row)}: NumPy / xentfast", npy / xf, ">=", 1.0))
        say(f"\nTiny problems (N*C <= 10^4), microseconds per call, median (and fastest) of "
            f"{TINY_SAMPLES} batches of about {TINY_BATCH_S * 1e3:g} ms, interleaved; 'NumPy/xentfast' (of the "
            "medians) > 1: xentfast is faster:\n")
        table(["row", "xentfast us", "min", "NumPy us", "min", "NumPy/xentfast"], lines, args.markdown)

    if checks:
        met = 0
        lines = []
        for what, value, op, goal in checks:
            if value is None:
                verdict, shown = "n/a (peer not installed)", "-"
            else:
                ok = value <= goal if op == "<=" else value >= goal
                met += ok
                verdict, shown = ("met" if ok else "NOT MET"), f"{value:.2f}"
            lines.append([what, shown, f"{op} {goal:g}", verdict])
        say("\nTargets:\n")
        table(["target", "measured", "goal", "verdict"], lines, args.markdown)
        say(f"\n{met} of {len(checks)} targets met.")


if __name__ == "__main__":
    main()
