"""The cost of calling xentfast from JAX: xentfast.jax under jit against the bare kernel and optax.

    python benchmarks/bench_jax_dropin.py [--repeats N] [--shapes 8x16,4096x1000]

For each shape (float32 logits, integer labels), the median wall time of
  bare     the NumPy calls the JAX path makes: fwd = cross_entropy(reduction="none");
           value_and_grad = that plus cross_entropy_with_grad(grad_output=g), which allocates its
           gradient as XLA does
  ffi      xentfast.jax through its XLA FFI handlers (the default where they were built)
  buffer   xentfast.jax through jax.experimental.buffer_callback
  pure     xentfast.jax through jax.pure_callback (the fallback of last resort)
  optax    optax.losses.softmax_cross_entropy_with_integer_labels
all under jax.jit, on device-resident inputs, each result waited for, timed round-robin.
"value_and_grad" is of the mean loss.  "over bare" is the JAX time minus the bare time: what the callback
machinery costs.
"""
import argparse
import os
import statistics
import time

import numpy as np

import jax
import jax.numpy as jnp
import optax

import xentfast as xf
import xentfast.jax as xfj


def medians_us(fns, repeats):
    """Median time of each callable, timed round-robin: on a shared machine the load then weighs on
    every entry alike, and the differences stay meaningful while the absolute times drift."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e6 * statistics.median(ts) for name, ts in times.items()}


def jitted(loss_fn, y, mode):
    if mode == "fwd":
        f = jax.jit(lambda x: loss_fn(x, y))
    else:
        f = jax.jit(jax.value_and_grad(lambda x: loss_fn(x, y).mean()))
    return lambda x: jax.block_until_ready(f(x))


def traced_with(path, run, x):
    """`run` compiled with xentfast.jax.CALLBACK = path (the setting is read at trace time)."""
    saved = xfj.CALLBACK
    xfj.CALLBACK = path
    try:
        run(x)
    finally:
        xfj.CALLBACK = saved
    return lambda: run(x)


def available_paths():
    paths = ["ffi"] if xfj._ffi is not None else []
    if xfj._buffer_callback is not None:
        paths.append("buffer_callback")
    return paths + ["pure_callback"]


def bench_shape(n, c, repeats):
    rng = np.random.default_rng(0)
    xn = (4 * rng.standard_normal((n, c))).astype(np.float32)
    yn = rng.integers(0, c, n).astype(np.int32)
    g = np.full(n, 1.0 / n, np.float32)
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    paths = available_paths()
    rows = []
    for mode in ("fwd", "value_and_grad"):
        if mode == "fwd":
            def bare():
                xf.cross_entropy(xn, yn, reduction="none")
        else:
            def bare():
                xf.cross_entropy(xn, yn, reduction="none")
                xf.cross_entropy_with_grad(xn, yn, reduction="none", grad_output=g)
        fns = {"bare": bare}
        for path in paths:
            fns[path] = traced_with(path, jitted(xfj.softmax_cross_entropy_with_integer_labels, y, mode), x)
        fns["optax"] = traced_with(xfj.CALLBACK, jitted(optax.losses.softmax_cross_entropy_with_integer_labels,
                                                         y, mode), x)
        t = medians_us(fns, repeats)
        rows.append((mode, t.pop("bare"), t))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=0, help="timed calls per entry (default: by size)")
    ap.add_argument("--shapes", default="8x16,4096x1000")
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__}, optax {optax.__version__}, xentfast {xf.__version__}, "
          f"xentfast threads: {xf._threads.effective_n_threads()}, load average: "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    paths = available_paths()
    short = {"ffi": "ffi", "buffer_callback": "buffer", "pure_callback": "pure"}
    print(f"{'shape':>10} {'mode':>15} {'bare us':>9}"
          + "".join(f" {short[p] + ' us':>10} {'over bare':>10}" for p in paths)
          + f" {'optax us':>9} {paths[0] + '/optax':>12}")
    for shape in args.shapes.split(","):
        n, c = (int(v) for v in shape.split("x"))
        repeats = args.repeats or (2000 if n * c < 10**5 else 20)
        for mode, t_bare, t in bench_shape(n, c, repeats):
            cells = "".join(f" {t[p]:>10.1f} {t[p] - t_bare:>+10.1f}" for p in paths)
            print(f"{shape:>10} {mode:>15} {t_bare:>9.1f}{cells} {t['optax']:>9.1f} {t[paths[0]] / t['optax']:>11.2f}x")


if __name__ == "__main__":
    main()
