"""Benchmark of the CUDA twin (issue 5), run once on a GPU machine by benchmarks/gpu_check.sh.

Prints one table: per shape and kernel variant, the time of a fused cross-entropy forward + backward
(mean reduction), the fraction of the measured device copy bandwidth it reaches (bytes that must move:
the logits read once, the gradient written once), and the ratio to torch.nn.functional.cross_entropy
forward + backward on the same GPU.  Every xentfast variant is also checked bit for bit against the CPU
kernels on a few rows of the same data.

xentfast rows:  "kernel" times _cuda.softmax_xent alone; "call" adds what api.py does around it for
reduction='mean' (denominator and double-double sum of the row losses, two device syncs), through the
_cuda wrappers; "api" times xentfast.cross_entropy_with_grad on CuPy arrays when api.py dispatches them.

Narrower runs: XF_BENCH_SHAPES="NxC,..." (float32 shapes), XF_BENCH_VARIANTS="label;label" (labels of
VARIANTS), XF_BENCH_BINARY=0 (no binary-family rows), XF_BENCH_REPS (timed runs per median, 10).
"""

import contextlib
import os
import sys
import time

import numpy as np

SHAPES = [(8192, 128256), (32768, 32000), (131072, 4096)]
if os.environ.get("XF_BENCH_SHAPES"):  # e.g. "131072x4096,65536x8192": other shapes (float32)
    SHAPES = [tuple(int(v) for v in shape.split("x")) for shape in os.environ["XF_BENCH_SHAPES"].split(",")]
# (label, environment); every variant compiles its own module once (NVRTC, ~2 s)
# "72 regs": the cross-entropy kernel without its 64-register bound (kernels.cu, XF_CU_XENT_MIN_BLOCKS)
VARIANTS = [
    ("cpu-order", {}),
    ("cpu-order nt=64", {"XENTFAST_CUDA_THREADS": "64"}),
    ("cpu-order nt=128", {"XENTFAST_CUDA_THREADS": "128"}),
    ("cpu-order nt=256", {"XENTFAST_CUDA_THREADS": "256"}),
    ("cpu-order nt=512", {"XENTFAST_CUDA_THREADS": "512"}),
    ("cpu-order 72 regs", {"XENTFAST_CUDA_XENT_MIN_BLOCKS": "1"}),
    ("cpu-order global row", {"XENTFAST_CUDA_CACHE_ROW": "0"}),
    ("cpu-order cached row", {"XENTFAST_CUDA_CACHE_ROW": "1"}),
    ("tree-order", {"XENTFAST_CUDA_ORDER": "tree"}),
]
if os.environ.get("XF_BENCH_VARIANTS"):  # e.g. "cpu-order;cpu-order cached row": only these labels
    VARIANTS = [v for v in VARIANTS if v[0] in os.environ["XF_BENCH_VARIANTS"].split(";")]
REPS = int(os.environ.get("XF_BENCH_REPS", "10"))


@contextlib.contextmanager
def env(values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def timed(fn, reps=REPS, warmup=2):
    """Median seconds of fn() over reps runs, CUDA events on the current stream (fn may sync)."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(times))


def copy_bandwidth():
    import cupy as cp

    src = cp.ones(1 << 30, dtype=cp.float32)  # 4 GiB
    dst = cp.empty_like(src)
    t = timed(lambda: dst.__setitem__(Ellipsis, src))
    bw = 2 * src.nbytes / t
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return bw


def xf_runner(x, y):
    """Closures timing the _cuda kernel alone and the whole mean-reduction call."""
    import cupy as cp

    from xentfast._cuda import dd_sum, softmax_xent, target_weight_sum

    N, C = x.shape
    loss = cp.empty(N, dtype=cp.float64)
    grad = cp.empty_like(x)
    e64, e2 = cp.empty(0, dtype=cp.float64), cp.empty((0, 0), dtype=x.dtype)

    def kernel(scale=1.0 / N):
        softmax_xent(x, y, e2, e64, -100, 0.0, 0.0, e64, scale, loss, grad, 1, True, False, False, False, True)

    def call():
        den = target_weight_sum(y, e64, -100, False, C)
        kernel(1.0 / den)
        hi, lo = dd_sum(loss)
        return cp.asarray(np.float32(hi / den + lo / den))

    return kernel, call, loss, grad


def check_bits(x, y, grad, loss, rows=4):
    """The GPU's first rows against the CPU kernels (kernel(scale=1/N) must have run last)."""
    import cupy as cp

    from xentfast._core import _xent

    N, C = x.shape
    xh, yh = cp.asnumpy(x[:rows]), cp.asnumpy(y[:rows])
    lc, gc = np.empty(rows), np.empty_like(xh)
    e = np.empty(0)
    _xent.softmax_xent(xh, yh, np.empty((0, 0), xh.dtype), e, -100, 0.0, 0.0, e, 1.0 / N, lc, gc, 1,
                       True, False, False, False, True)
    lg, gg = cp.asnumpy(loss[:rows]), cp.asnumpy(grad[:rows])
    same_l = np.array_equal(lg.view(np.int64), lc.view(np.int64))
    same_g = np.array_equal(gg.view(np.int32), gc.view(np.int32))
    if same_l and same_g:
        return "same bits"
    d = np.abs(gg.view(np.int32).astype(np.int64) - gc.view(np.int32).astype(np.int64))
    return f"DIFFERS (loss {'ok' if same_l else 'differs'}, grad max {d.max()} ulp, {np.count_nonzero(d)} entries)"


def torch_time(x_cp, y_cp, loss_name="cross_entropy"):
    """(seconds, torch version) of torch.nn.functional.<loss_name> forward + gradient on the same data,
    or (None, why not)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, "torch not importable"
    if not torch.cuda.is_available():
        return None, "torch without CUDA"
    loss_fn = getattr(F, loss_name)
    xt = torch.as_tensor(x_cp, device="cuda").detach().requires_grad_(True)
    yt = torch.as_tensor(y_cp, device="cuda")

    def step():
        loss = loss_fn(xt, yt)
        (g,) = torch.autograd.grad(loss, xt)
        return g

    t = timed(step)
    del xt, yt
    torch.cuda.empty_cache()
    return t, torch.__version__


def api_time(x, y):
    import cupy as cp

    import xentfast as xf

    try:
        out = xf.cross_entropy_with_grad(x[:2], y[:2])
        if not isinstance(out[1], cp.ndarray):
            return None
    except Exception as exc:
        print(f"api on CuPy arrays FAILED: {type(exc).__name__}: {exc}")
        return None
    return timed(lambda: xf.cross_entropy_with_grad(x, y))


BINARY_SHAPE = (65536, 1024)


def binary_rows(bw):
    """BCE with logits fused (mean), the public API on CuPy arrays against torch, and CPU bits."""
    import cupy as cp

    import xentfast as xf

    N, C = BINARY_SHAPE
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((N, C), dtype=cp.float32) * 4
    t = (rng.random((N, C), dtype=cp.float32) > 0.5).astype(cp.float32)
    must_move = 3 * x.nbytes  # logits and targets read, gradient written
    out = []
    for reduction in ("mean", "none"):
        try:
            f = lambda: xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction)
            loss, grad = f()
            lc, gc = xf.binary_cross_entropy_with_logits_with_grad(cp.asnumpy(x[:64]), cp.asnumpy(t[:64]),
                                                                   reduction="none")
            lg, gg = xf.binary_cross_entropy_with_logits_with_grad(x[:64], t[:64], reduction="none")
            same = (np.array_equal(cp.asnumpy(lg).view(np.int32), lc.view(np.int32))
                    and np.array_equal(cp.asnumpy(gg).view(np.int32), gc.view(np.int32)))
            tt = timed(f)
            out.append((f"api bce_with_logits_with_grad {reduction}", tt, must_move / tt / bw,
                        "same bits as CPU" if same else "DIFFERS from CPU"))
        except Exception as exc:
            out.append((f"api bce_with_logits_with_grad {reduction}", None, None,
                        f"FAILED: {type(exc).__name__}: {exc}"))
    ttorch, torch_info = torch_time(x, t, "binary_cross_entropy_with_logits")
    out.append(("torch BCE-with-logits fwd+bwd", ttorch, must_move / ttorch / bw if ttorch else None, torch_info))
    return [(N, C, label, tm, frac, (ttorch / tm) if (ttorch and tm) else None, note)
            for label, tm, frac, note in out]


def main():
    import cupy as cp

    import xentfast._cuda as xc

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    bw = copy_bandwidth()
    print(f"device: {name}, cc {dev.compute_capability}, cupy {cp.__version__}; measured copy bandwidth "
          f"{bw / 1e12:.2f} TB/s (read + write of 4 GiB)")
    from xentfast._cuda import _nvrtc

    print(f"NVRTC {_nvrtc.version()} from {_nvrtc.library_path()}")
    rows = []

    def add(row):  # printed as it comes too: a run cut short by its time limit still reports
        rows.append(row)
        print(f"  {row[0]}x{row[1]} {row[2]}: " + (f"{row[3] * 1e3:.3f} ms" if row[3] else "-") + f"  {row[6]}",
              flush=True)
    for N, C in SHAPES:
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((N, C), dtype=cp.float32) * 3
        y = rng.integers(0, C, N, dtype=cp.int64)
        must_move = 2 * x.nbytes
        t_torch, torch_info = torch_time(x, y)
        for label, values in VARIANTS:
            if values.get("XENTFAST_CUDA_CACHE_ROW") == "1" and C * 4 + 64 * 1024 > 227 * 1024:
                continue  # the row cannot stay in shared memory
            with env(values):
                try:
                    kernel, call, loss, grad = xf_runner(x, y)
                    t0 = time.perf_counter()
                    kernel()
                    cp.cuda.Device().synchronize()
                    first = time.perf_counter() - t0
                    t_k = timed(kernel)
                    bits = check_bits(x, y, grad, loss)
                    t_c = timed(call)
                    nt = xc.threads_for(C)
                except Exception as exc:  # report and go on: one run, one table
                    add((N, C, label, None, None, None, f"FAILED: {type(exc).__name__}: {exc}"))
                    continue
                for what, t in (("kernel", t_k), ("call", t_c)):
                    ratio = (t_torch / t) if t_torch else None
                    note = f"nt={nt}; {bits}" + (f"; first launch {first:.2f}s" if what == "kernel" else "")
                    add((N, C, f"{label} {what}", t, must_move / t / bw, ratio, note))
                del kernel, call, loss, grad
                cp.get_default_memory_pool().free_all_blocks()
        t_api = api_time(x, y)
        if t_api:
            add((N, C, "api cross_entropy_with_grad", t_api, must_move / t_api / bw,
                         t_torch / t_api if t_torch else None, "public API on CuPy arrays"))
        add((N, C, "torch F.cross_entropy fwd+bwd", t_torch, must_move / t_torch / bw if t_torch else None,
                     1.0 if t_torch else None, torch_info))
        del x, y
        cp.get_default_memory_pool().free_all_blocks()

    if os.environ.get("XF_BENCH_BINARY", "1") != "0":
        for row in binary_rows(bw):
            add(row)
    print(f"\n{'shape':>14} {'variant':34} {'ms':>8} {'of copy BW':>10} {'x torch':>8}  notes")
    for N, C, label, t, frac, ratio, note in rows:
        ms = f"{t * 1e3:8.3f}" if t else f"{'-':>8}"
        fr = f"{frac * 100:9.1f}%" if frac else f"{'-':>10}"
        rt = f"{ratio:8.2f}" if ratio else f"{'-':>8}"
        print(f"{f'{N}x{C}':>14} {label:34} {ms} {fr} {rt}  {note}")


if __name__ == "__main__":
    sys.exit(main())
