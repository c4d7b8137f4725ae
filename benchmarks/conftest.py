import os

import pytest

import peers

N_THREADS = int(os.environ.get("XENTFAST_BENCH_THREADS", "2"))
# The large shapes move 1-2 GiB per array and take minutes with the slow peers, so they are
# opted into rather than run by every `pytest benchmarks`.
LARGE = os.environ.get("XENTFAST_BENCH_LARGE", "") not in ("", "0")

# Before any JAX call: JAX's thread count is the number of CPUs the process may run on.
peers.limit_cpus(N_THREADS)


def pytest_configure(config):
    config.addinivalue_line("markers", "large: one of the issue's large shapes (run with XENTFAST_BENCH_LARGE=1)")


def pytest_collection_modifyitems(config, items):
    if LARGE:
        return
    skip = pytest.mark.skip(reason="large shape: set XENTFAST_BENCH_LARGE=1 to run it")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def n_threads():
    return N_THREADS
