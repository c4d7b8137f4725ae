"""pytest-benchmark groups for every target shape of the speed issue: xentfast against PyTorch, JAX and NumPy.

One group per (family, dtype, shape): compare within a group (same data, same thread count).  "xentfast-1t"
is xentfast on one thread, for the thread-scaling target.  The shapes above 10^7 elements are marked
``large`` and skipped unless XENTFAST_BENCH_LARGE=1; ``ratio_table.py`` prints the ratios and the floor.

    python -m pytest benchmarks -q                                    # 4096x1000 rows and tiny problems
    XENTFAST_BENCH_LARGE=1 python -m pytest benchmarks -q             # every shape (about 10 minutes)
    python -m pytest benchmarks -q -k "binary and jax"                # a selection
    python -m pytest benchmarks -q -k options                         # smoothing, soft targets, z-loss
    python -m pytest benchmarks -q -k torch_layout                    # (N, C, d1, d2) with axis=1
    python -m pytest benchmarks -q -k softmax_function                # log_softmax, softmax, logsumexp,
                                                                      # BCE from probabilities
"""
import numpy as np
import pytest

import peers
import xentfast
from ratio_table import FAMILY_ROWS, QUICK_MAX_ELEMENTS, ROWS, TINY

IMPLS = ["xentfast", "xentfast-1t", "torch", "jax", "numpy"]


def _row_id(row):
    family, n, c, dtype = row
    return f"{family}-{dtype}-{n}x{c}"


def _param(row):
    large = row[1] * row[2] > QUICK_MAX_ELEMENTS
    return pytest.param(row, id=_row_id(row), marks=[pytest.mark.large] if large else [])


def _callable(family, impl, a, b, n_threads):
    factory = peers.FAMILIES[family]["xentfast" if impl == "xentfast-1t" else impl]
    return factory(a, b, 1 if impl == "xentfast-1t" else n_threads)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_target_shape(benchmark, row, impl, n_threads):
    family, n, c, dtype = row
    a, b = peers.PROBLEMS[family](n, c, dtype)
    run = _callable(family, impl, a, b, n_threads)
    if run is None:
        pytest.skip(f"{impl} not installed")
    benchmark.group = _row_id(row)
    benchmark.extra_info["bytes_that_must_move"] = peers.BYTES[family](a, b)
    benchmark.extra_info["threads"] = 1 if impl == "xentfast-1t" else n_threads
    # the issue asks for the median of at least 5 runs after a warm-up
    rounds = 5 if n * c > QUICK_MAX_ELEMENTS else 10
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("row", [_param(r) for r in FAMILY_ROWS])
def test_softmax_function(benchmark, row, impl, n_threads):
    """log_softmax, softmax and logsumexp along the last axis (not issue targets; the README compares
    them with torch): xentfast returns a new array, as every peer does.  And BCE from probabilities (loss
    and gradient, FAMILY_ROWS), beside them for want of a family of its own."""
    test_target_shape(benchmark, row, impl, n_threads)


@pytest.mark.parametrize("impl", ["xentfast", "numpy"])
@pytest.mark.parametrize("row", TINY, ids=lambda r: "tiny-" + _row_id(r))
def test_tiny(benchmark, row, impl, n_threads):
    family, n, c, dtype = row
    a, b = peers.PROBLEMS[family](n, c, dtype)
    benchmark.group = "tiny-" + _row_id(row)
    # pytest-benchmark calibrates the number of calls per round itself at this size
    benchmark(_callable(family, impl, a, b, n_threads))


@pytest.mark.parametrize("impl", ["xentfast", "xentfast-1t", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(4096, 1000), (131072, 21)], ids=["4096x1000", "131072x21"])
@pytest.mark.parametrize("option", list(peers.OPTIONS))
def test_options(benchmark, option, shape, dtype, impl, n_threads):
    """Fused cross-entropy with label smoothing, probability targets or the z-loss: the paths beside plain
    index targets, against torch's, on long rows and on rows of few classes (the short-row groups; not an
    issue target; tracked, see README and benchmarks/README.md, 2026-12-07, sixth and seventh rounds)."""
    a, b = peers.OPTIONS[option][0](*shape, dtype)
    nt = 1 if impl == "xentfast-1t" else n_threads
    run = (peers.torch_option(option, a, b, nt) if impl == "torch"
           else peers.xentfast_option(option, a, b, nt))
    if run is None:
        pytest.skip(f"{impl} not installed")
    benchmark.group = f"options-{option}-{dtype}-{shape[0]}x{shape[1]}"
    benchmark.extra_info["threads"] = nt
    benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", ["xentfast", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_layout(benchmark, dtype, impl, n_threads):
    """Fused cross-entropy in torch's (N, C, d1, d2) layout, a segmentation batch 8x21x128x128 (xentfast:
    axis=1, read and written as it lies; benchmarks/README.md, 2026-12-07, fifth and eighth rounds)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 21, 128, 128)) * 3).astype(dtype)
    y = rng.integers(0, 21, size=(8, 128, 128))
    if impl == "torch":
        torch = peers._torch(n_threads)
        if torch is None:
            pytest.skip("torch not installed")
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)

        def run():
            xr = xt.detach().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(xr, yt)
            loss.backward()
            return loss, xr.grad
    else:
        out = np.empty_like(x)

        def run():
            return xentfast.cross_entropy_with_grad(x, y, axis=1, out=out, n_threads=n_threads)
    benchmark.group = f"torch-layout-{dtype}-8x21x128x128"
    benchmark.extra_info["threads"] = n_threads
    benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)
