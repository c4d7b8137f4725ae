import os

import pytest
from fake_device import device  # noqa: F401  (the stand-in device backend's fixture)
from hypothesis import HealthCheck, settings

# deadline=None: the mpmath reference is slow and its cost varies with the drawn shapes.
settings.register_profile(
    "dev", deadline=None, print_blob=True, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# CI: derandomized (a failure reproduces from the log alone) and sized for 2 cores.
settings.register_profile(
    "ci", deadline=None, print_blob=True, derandomize=True, max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "thorough", deadline=None, print_blob=True, max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("XENTFAST_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _cpu_kernels_restored():
    from xentfast._core import _xent
    before = _xent.cpu_path()
    yield _xent
    _xent.set_cpu_path(before)
    _xent.set_output_stores("auto")


@pytest.fixture
def cpu_path_back():
    """The CPU kernels' module (xentfast._core._xent); its path (set_cpu_path) and kind of stores
    (set_output_stores) are restored after the test."""
    yield from _cpu_kernels_restored()


@pytest.fixture(scope="module")
def cpu_path_back_module():
    """cpu_path_back, restored after the module: Hypothesis's tests cannot take a function-scoped
    fixture (it would not be reset between their examples)."""
    yield from _cpu_kernels_restored()


def _gpu_available():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (or no CuPy): GPU tests not run")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # CI sets XENTFAST_REQUIRE_PEERS=1: the cross-checks against torch, JAX/optax and the bfloat16 dtype
    # must run there, not skip
    if os.environ.get("XENTFAST_REQUIRE_PEERS", "0") not in ("", "0"):
        import importlib
        for peer in ("torch", "jax", "optax", "ml_dtypes"):
            try:
                importlib.import_module(peer)
            except ImportError as exc:
                raise pytest.UsageError(f"XENTFAST_REQUIRE_PEERS=1 but {peer} is not importable: {exc}")
