"""Fused softmax cross-entropy forward + backward: xentfast against NumPy and PyTorch, same threads.

Run:  python -m pytest benchmarks -q --benchmark-group-by=group   (ratios: compare within a group)
"""
import pytest

import peers
from conftest import make_problem

SHAPES = [(4096, 1000), (8192, 32000)]
DTYPES = ["float32", "float64"]
IMPLS = {
    "xentfast": peers.xentfast_fused,
    "numpy": peers.numpy_fused,
    "torch": peers.torch_fused,
}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fused_fwd_bwd(benchmark, impl, dtype, shape, n_threads):
    x, y = make_problem(*shape, dtype)
    run = IMPLS[impl](x, y, n_threads)
    if run is None:
        pytest.skip(f"{impl} not installed")
    benchmark.group = f"xent-fwd-bwd-{dtype}-{shape[0]}x{shape[1]}"
    rounds = 3 if shape[0] * shape[1] > 10**7 else 10
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
