"""CPU code paths: every path this CPU runs gives the same bits as the baseline path.

The build never contracts a*b+c into an fma, so wider vectors change only how many lanes run at once.
Bitwise equality here means every accuracy, determinism and validation test holds on every path.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xentfast as xf
from xentfast._core import _xent
from xentfast.testing import logits, softmax_xent_cases

PATHS = _xent.available_cpu_paths()


@pytest.fixture(scope="module")
def restore_path():
    before = _xent.cpu_path()
    yield
    _xent.set_cpu_path(before)


def _on_each_path(fn):
    results = {}
    for path in PATHS:
        _xent.set_cpu_path(path)
        results[path] = fn()
    return results


def _assert_same(results):
    base = results["baseline"]
    for path, res in results.items():
        for a, b in zip(res, base):
            assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), path


def test_baseline_is_always_available():
    assert PATHS[0] == "baseline"


def test_unknown_path_is_refused(restore_path):
    with pytest.raises(ValueError, match="XENTFAST_CPU"):
        _xent.set_cpu_path("avx9000")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
def test_paths_agree_bitwise_on_adversarial_cases(restore_path, dtype, data):
    case = data.draw(softmax_xent_cases(dtype))
    kw = dict(weight=case.weight, ignore_index=case.ignore_index, label_smoothing=case.label_smoothing,
              z_loss=case.z_loss, reduction="none")
    _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(case.logits, case.target, **kw)))
    x = data.draw(logits(dtype, allow_nan=True, allow_posinf=True))
    _assert_same(_on_each_path(lambda: (xf.log_softmax(x), xf.softmax(x), xf.logsumexp(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_agree_bitwise_on_long_rows(restore_path, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 3 * _xent.BLOCK + 5)) * 30).astype(dtype)
    x[0, 7] = 800.0
    y = rng.integers(0, x.shape[1], size=6)
    _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(x, y, reduction="none", n_threads=2)))
