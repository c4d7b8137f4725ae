"""Subnormal results survive a caller that flushes subnormals (torch.set_flush_denormal, XLA's threads),
and the caller's setting is restored afterwards (_core/fp_ieee.h, xentfast.api._on_input_device)."""
import numpy as np
import pytest

import xentfast as xf

torch = pytest.importorskip("torch")


@pytest.fixture
def flushing():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals: nothing to guard against")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _bits(values):
    return [np.atleast_1d(np.asarray(v)).copy().view(np.uint8) for v in values]


def _calls(n_threads):
    # every loss and gradient here is subnormal or has subnormal entries
    x = np.array([[0.0, -720.0, -725.0]] * 40)
    y = np.zeros(40, dtype=np.int64)
    xb = np.full((4, 300), 720.0)
    t = np.ones_like(xb)
    return [
        *xf.cross_entropy_with_grad(x, y, reduction="none", n_threads=n_threads),
        xf.cross_entropy(x, y, reduction="sum", n_threads=n_threads),
        xf.logsumexp(np.array([[-1e-320, -np.inf]]), n_threads=n_threads),
        # float32 from its bits: a conversion under flush-to-zero would flush the input itself
        xf.logsumexp(np.array([[0x80000400, 0xFF800000]], dtype=np.uint32).view(np.float32), n_threads=n_threads),
        xf.softmax(x, n_threads=n_threads),
        *xf.binary_cross_entropy_with_logits_with_grad(xb, t, reduction="none", n_threads=n_threads),
        xf.binary_cross_entropy_with_logits(xb, t, reduction="mean", n_threads=n_threads),
        # float32 means of the plain-call lanes (_core/_plain.pxd), rounded to a subnormal float32
        xf.cross_entropy(np.array([[88.0, 0.0]], np.float32), np.zeros(1, np.int64), n_threads=n_threads),
        xf.binary_cross_entropy_with_logits(np.full(3, -88.0, np.float32), np.zeros(3, np.float32),
                                            n_threads=n_threads),
        # the (row, block) split of one long row on two or three threads (fewer rows than threads), of the
        # losses and of the softmax family
        *xf.cross_entropy_with_grad(np.array([[0.0] + [-720.0] * 40000]), np.array([0]),
                                    n_threads=n_threads),
        xf.softmax(np.array([[0.0] + [-720.0] * 40000]), n_threads=n_threads),
    ]


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_subnormal_results_survive_a_flushing_caller(flushing, n_threads):
    torch.set_flush_denormal(False)
    want = _bits(_calls(n_threads))
    assert any(np.any(np.abs(np.asarray(v, dtype=np.float64)) < 2.0**-1022) for v in _calls(1))
    torch.set_flush_denormal(True)
    got = _bits(_calls(n_threads))
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"output {k} differs under flush-to-zero"


def test_the_callers_flush_setting_is_restored(flushing):
    xf.cross_entropy(np.zeros((2, 3)), np.zeros(2, dtype=np.int64))
    tiny = np.array([2.0**-1070])
    assert (tiny * 1.0)[0] == 0.0        # the caller still flushes after the call
