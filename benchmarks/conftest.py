import os

import numpy as np
import pytest

N_THREADS = int(os.environ.get("XENTFAST_BENCH_THREADS", "2"))


@pytest.fixture(scope="session")
def n_threads():
    return N_THREADS


_DATA = {}


def make_problem(n, c, dtype, seed=0):
    key = (n, c, np.dtype(dtype).name)
    if key not in _DATA:
        _DATA.clear()  # keep one (large) problem alive at a time
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, c), dtype=np.float64).astype(dtype) * 3
        y = rng.integers(0, c, size=n)
        _DATA[key] = (x, y)
    return _DATA[key]
