"""CPU code paths: every path this CPU runs gives the same bits as the baseline path.

The build never contracts a*b+c into an fma on its own; the explicit fused multiply-adds (xf_fma, the
exponentials' polynomials and range reductions) are the instruction on the avx2 and avx512 paths and an
exact emulation on the baseline path, so wider vectors and the instruction change only speed.  Bitwise
equality here means every accuracy, determinism and validation test holds on every path.
"""
import mmap
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xentfast as xf
from xentfast._core import _xent
from xentfast.testing import logits, softmax_xent_cases

PATHS = _xent.available_cpu_paths()


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


def test_unknown_path_is_refused(cpu_path_back_module):
    with pytest.raises(ValueError, match="XENTFAST_CPU"):
        _xent.set_cpu_path("avx9000")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
def test_paths_agree_bitwise_on_adversarial_cases(cpu_path_back_module, dtype, data):
    case = data.draw(softmax_xent_cases(dtype))
    kw = dict(weight=case.weight, ignore_index=case.ignore_index, label_smoothing=case.label_smoothing,
              z_loss=case.z_loss, reduction="none")
    _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(case.logits, case.target, **kw)))
    # the forward pass alone too: its short rows run side by side (xf_short_rows), as the fused ones do
    _assert_same(_on_each_path(lambda: (xf.cross_entropy(case.logits, case.target, **kw),)))
    x = data.draw(logits(dtype, allow_nan=True, allow_posinf=True))
    _assert_same(_on_each_path(lambda: (xf.log_softmax(x), xf.softmax(x), xf.logsumexp(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_agree_bitwise_on_long_rows(cpu_path_back_module, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 3 * _xent.BLOCK + 5)) * 30).astype(dtype)
    x[0, 7] = 800.0
    y = rng.integers(0, x.shape[1], size=6)
    _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(x, y, reduction="none", n_threads=2)))


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("n_classes", [460, _xent.BLOCK // 4 + 5, _xent.BLOCK // 2 + 3, _xent.BLOCK,
                                       3 * _xent.BLOCK + 7, 4 * _xent.BLOCK + 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_with_a_streamed_gradient_keep_the_bits(cpu_path_back_module, reduction, n_classes, dtype):
    # rows of 1024 classes and more (float32, from 256 on the avx512 path; float64 2048) keep their
    # exponentials in a scratch row and write the gradient by streaming stores on the AVX2 paths
    # (softmax_rows.h, XF_STREAMED_ROWS; xent_kernels.h, XF_STREAM_MIN_CLASSES_FOR), each row's gradient
    # while the next row of the same thread runs its sum pass (xf_pending_step); the baseline path writes
    # it in a pass of its own.
    # Every path, thread count, out= buffers starting 1, 5 and 15 elements past a 64-byte boundary and
    # inplace=True must give the same bits.  The row lengths: just past the avx512 path's short-row
    # groups (streamed there, not on the avx2 path), just past the avx2 path's threshold (a
    # quarter block, a partial last chunk; float64 rows that short are not streamed), just past it for
    # float64 (half a block), one block, a multiple of 64 (no partial chunk), and odd lengths that put
    # each row's start at another alignment.  The rows differ in where
    # their target lies (first entries, which fall in the unaligned head for some offsets, a group's
    # edges, the last partial chunk, last, ignored), and between them lie rows that stream nothing (NaN;
    # float64, a spread beyond the stored form's, which keeps its exponentials in the same scratch row;
    # float32 streams that one too)
    rng = np.random.default_rng(3)
    C = n_classes
    x = (rng.standard_normal((14, C)) * 20).astype(dtype)
    x[1, C - 1] = 300.0
    x[5, 9] = np.nan
    x[8, 100] = 1000.0
    y = np.array([0, C - 1, 17, C // 2, -100, 3, 2, 64 * 5 + 63, 64 * 7, -100, C - 9, C - 70, C - 64, 1])
    _xent.set_cpu_path("baseline")
    want = xf.cross_entropy_with_grad(x, y, reduction=reduction, n_threads=1)
    for path in PATHS:
        _xent.set_cpu_path(path)
        for n_threads in (1, 2):
            results = [xf.cross_entropy_with_grad(x, y, reduction=reduction, n_threads=n_threads)]
            for offset in (1, 5, 15):
                size = x.itemsize
                buf = np.empty(x.size + 64 // size, dtype)
                buf = buf[(-buf.ctypes.data // size + offset) % (64 // size):][:x.size].reshape(x.shape)
                assert buf.ctypes.data % 64 == (size * offset) % 64
                results.append(xf.cross_entropy_with_grad(x, y, reduction=reduction, n_threads=n_threads,
                                                          out=buf))
            inplace = x.copy()
            results.append(xf.cross_entropy_with_grad(inplace, y, reduction=reduction, n_threads=n_threads,
                                                      inplace=True))
            # into new pages the pending rows take ordinary stores (xf_memory_touched); forced here both ways
            for stores in ("streaming", "ordinary"):
                _xent.set_output_stores(stores)
                results.append(xf.cross_entropy_with_grad(x, y, reduction=reduction, n_threads=n_threads))
            _xent.set_output_stores("auto")
            for got in results:
                for a, b in zip(got, want):
                    assert np.array_equal(a, b, equal_nan=True), (path, n_threads)


@pytest.mark.parametrize("n_classes", [460, 1024 + 37, 2048 + 5, 4096 + 45, 8192, 8192 + 77])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_of_softmax_keep_the_bits(cpu_path_back_module, n_classes, dtype):
    # softmax runs as the gradient of a row without a target (_xent.pyx _softmax_family_row): from 1024
    # classes (float32, 256 on the avx512 path; float64 2048) each row's output goes out while the next row of the same thread
    # runs its sum pass, as the fused gradient's does, and from 8192 classes that sum pass reads the next
    # row's max ahead; the baseline path writes each row in a pass of its own.  Every path, thread count
    # and kind of store must give its bits (log_softmax's too, beside it), whatever lies between the rows:
    # NaN, +inf, masked classes (-inf, a finite mask), a spread beyond the unclamped exponentials, ties
    rng = np.random.default_rng(4)
    C = n_classes
    x = (rng.standard_normal((13, C)) * 20).astype(dtype)
    x[1, C - 1] = 300.0
    x[3, 9] = np.nan
    x[4, ::3] = -np.inf
    x[5, 17] = np.inf
    x[6, 100] = 1000.0
    x[7, :] = x[7, 0]
    x[9, ::5] = -1e9
    x[11, 0] = -np.inf
    _xent.set_cpu_path("baseline")
    want = (xf.log_softmax(x, n_threads=1), xf.softmax(x, n_threads=1))
    for path in PATHS:
        _xent.set_cpu_path(path)
        for stores in ("auto", "streaming", "ordinary"):
            _xent.set_output_stores(stores)
            for n_threads in (1, 2):
                got = (xf.log_softmax(x, n_threads=n_threads), xf.softmax(x, n_threads=n_threads))
                for a, b, what in zip(got, want, ("log_softmax", "softmax")):
                    assert np.array_equal(a, b, equal_nan=True), (what, path, stores, n_threads)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the page test is Linux's (mincore)")
def test_new_pages_are_told_from_mapped_ones():
    # a new array beyond the allocator's mmap threshold (glibc: at most 32 MiB) comes as pages no store has
    # touched; the long rows' pending output then takes ordinary stores (xf_memory_touched,
    # xf_row_scratch_new_output).  The test looks at the page a page in (the first holds the allocator's
    # header) and at the last; a fresh anonymous mapping stands for the new array here
    page = mmap.PAGESIZE
    with mmap.mmap(-1, 16 * page) as m:
        a = np.frombuffer(m, dtype=np.uint8)
        assert not _xent.memory_touched(a)
        a[page] = 1
        assert not _xent.memory_touched(a)   # the last page still new
        a[-1] = 1
        assert _xent.memory_touched(a)
        del a
    with mmap.mmap(-1, 16 * page) as m:
        b = np.frombuffer(m, dtype=np.uint8)
        b[0] = 1
        b[-1] = 1
        assert not _xent.memory_touched(b)   # the page a page in still new
        b[page] = 1
        assert _xent.memory_touched(b)
        del b
    with pytest.raises(ValueError, match="kind"):
        _xent.set_output_stores("fast")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_agree_bitwise_whatever_position_holds_the_special_entry(cpu_path_back_module, dtype):
    """Every row length up to 40 (the AVX2 max pass reads blocks below 8 entries one by one, 8 to 15 as
    two overlapping vectors, longer ones 16 at a time and the tail as vectors ending at the row's end),
    with a NaN, a -inf, a +inf or the row's unique max at every position: an entry the max pass skipped
    or misread changes the loss, the gradient or the softmax, on one path only."""
    rng = np.random.default_rng(1)
    specials = [np.nan, -np.inf, np.inf, 50.0, -0.0]
    for n in range(1, 41):
        x = np.repeat(rng.standard_normal((1, n)) * 3, n * len(specials), axis=0).astype(dtype)
        for s, value in enumerate(specials):
            x[np.arange(s * n, (s + 1) * n), np.arange(n)] = value
        y = rng.integers(0, n, size=x.shape[0])
        _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(x, y, reduction="none")))
        _assert_same(_on_each_path(lambda: (xf.cross_entropy(x, y, reduction="none"),)))
        _assert_same(_on_each_path(lambda: (xf.log_softmax(x), xf.softmax(x), xf.logsumexp(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_classes", [300, 333, 4096 + 45, 5000])
def test_paths_agree_bitwise_with_a_special_entry_in_a_long_row(cpu_path_back_module, dtype, n_classes):
    """Rows longer than the short-row groups take (so the row kernel's max pass reads them): a NaN, a -inf,
    a +inf, the unique max or a -0 at the edges of the avx512 unit's 32-float steps, of the 16-entry steps
    that follow them, of the tail vectors and of the 4096-class blocks.  A step that overwrote its running
    max or min instead of folding into it changes the loss, the gradient or the softmax on that path only
    (the avx512 loop's min overwritten fails here; the older test's rows of up to 40 classes go to the
    short-row groups and never reach that loop)."""
    rng = np.random.default_rng(2)
    c = n_classes
    positions = sorted({p for p in (0, 1, 15, 16, 31, 32, 33, 47, 63, 64, 65, 95, 96, c // 2, c - 33, c - 32,
                                    c - 17, c - 16, c - 9, c - 8, c - 1, 4095, 4096, 4097) if 0 <= p < c})
    specials = [np.nan, -np.inf, np.inf, 50.0, -0.0]
    base = rng.standard_normal(c) * 3
    x = np.repeat(base[None, :], len(positions) * len(specials), axis=0).astype(dtype)
    rows = np.arange(x.shape[0])
    x[rows, np.tile(positions, len(specials))] = np.repeat(specials, len(positions))
    y = rng.integers(0, c, size=x.shape[0])
    _assert_same(_on_each_path(lambda: xf.cross_entropy_with_grad(x, y, reduction="none")))
    _assert_same(_on_each_path(lambda: (xf.cross_entropy(x, y, reduction="none"),)))
    _assert_same(_on_each_path(lambda: (xf.log_softmax(x), xf.softmax(x), xf.logsumexp(x))))


def _block_max_expected(x):
    """NumPy's answer to the max pass: NaN-blind max, first index of it (0 if no entry is above -inf and
    none equals the max), NaN count, count above -inf, least entry above -inf"""
    seen = x[~np.isnan(x)]
    m = seen.max() if seen.size else -np.inf
    hits = np.flatnonzero(x == m)
    above = x[x > -np.inf]
    return (float(m), int(hits[0]) if hits.size else 0, int(np.isnan(x).sum()), int(above.size),
            float(above.min()) if above.size else np.inf)


def _block_max_rows(n, rng):
    """Rows of length n whose max repeats: small integers (ties everywhere), the max placed twice at the
    edges of the avx512 unit's steps (32 floats or 16 doubles) and the AVX2 unit's (16 floats), of the
    step after them and of the last vector that ends at the row's end, and at random; every entry equal, signed zeros alone, -inf and
    NaN around the max, +inf twice among them, and no entry above -inf."""
    rows = [rng.integers(-3, 4, n).astype(float) for _ in range(4)]
    edges = sorted({p for p in (0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 47, 48, n // 2, n - 33, n - 32, n - 17,
                                n - 16, n - 15, n - 9, n - 8, n - 7, n - 2, n - 1) if 0 <= p < n})
    for p in edges:
        for q in (q for q in edges if q > p):
            row = rng.standard_normal(n)
            row[[p, q]] = 9.0
            rows.append(row)
    for _ in range(4):
        row = rng.standard_normal(n)
        row[rng.choice(n, size=min(n, 3), replace=False)] = 9.0
        rows.append(row)
    zeros = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    masked = rng.standard_normal(n)
    masked[rng.random(n) < 0.5] = -np.inf
    masked[rng.random(n) < 0.2] = np.nan
    infinite = masked.copy()
    infinite[rng.choice(n, size=min(n, 2), replace=False)] = np.inf
    rows += [np.full(n, 2.5), zeros, np.where(rng.random(n) < 0.5, zeros, -np.inf), masked, infinite,
             np.full(n, -np.inf), np.full(n, np.nan), np.where(rng.random(n) < 0.5, np.nan, -np.inf)]
    return rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_max_pass_finds_the_first_index_of_the_max_on_every_path(cpu_path_back_module, dtype):
    """The max pass's statistics against NumPy's on every path, block by block: the avx512 unit and the
    AVX2 unit's floats find the first index of the max inside the pass (each lane keeping where its max
    last rose), the baseline path and the AVX2 unit's doubles by a scan after it.  Ties matter: the first index decides which exponential the sum leaves out, and a
    later tie there changes no result by much, so only this test sees it."""
    rng = np.random.default_rng(5)
    for n in [*range(1, 72), 95, 96, 97, 300, 333, 500, 1000, 4095, 4096]:
        for row in _block_max_rows(n, rng):
            x = np.ascontiguousarray(row, dtype=dtype)
            expected = _block_max_expected(x)
            for path in PATHS:
                _xent.set_cpu_path(path)
                got = _xent.block_max(x)
                assert got == expected, (path, n, got, expected)
    with pytest.raises(ValueError, match="x: a block holds"):
        _xent.block_max(np.zeros(_xent.BLOCK + 1, dtype=dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_agree_bitwise_on_rows_of_signed_zeros(cpu_path_back_module, dtype):
    """Rows whose max is a zero held by entries of both signs: the paths' max passes may return either
    zero (the avx512 unit reduces its lanes in another order), and no result may depend on which: where
    two zeros tie, log S >= log 2 absorbs the sign of m + log S and of x_j - m - log S."""
    rng = np.random.default_rng(6)
    rows = []
    for c in (3, 40, 300, 333, 500):
        for frac_masked in (0.0, 0.5, 0.9):
            for _ in range(4):
                row = np.where(rng.random(c) < 0.5, -0.0, 0.0)
                row[rng.random(c) < frac_masked] = -np.inf
                row[rng.integers(c)] = rng.choice([-0.0, 0.0])
                rows.append(row)
        x = np.array(rows[-12:], dtype=dtype)
        y = rng.integers(0, c, size=x.shape[0])
        for results in (_on_each_path(lambda: xf.cross_entropy_with_grad(x, y, reduction="none")),
                        _on_each_path(lambda: (xf.log_softmax(x), xf.softmax(x), xf.logsumexp(x)))):
            _assert_same(results)
            for path, res in results.items():
                for a, b in zip(res, results["baseline"]):
                    assert np.array_equal(np.signbit(a), np.signbit(b)), path


# ---- binary family ----------------------------------------------------------------------------------------
# The binary kernels follow the same path selection; here "same bits" is checked on the raw encodings
# (signed zeros and NaN payloads included).

from hypothesis.extra import numpy as hnp  # noqa: E402

from xentfast._core import _binary  # noqa: E402
from xentfast.testing import (binary_targets, binary_xent_cases, element_weights,  # noqa: E402
                              unit_probabilities)


def _bits(a):
    a = np.ascontiguousarray(np.asarray(a))
    return a.dtype, a.shape, a.tobytes()


def _assert_same_bits(results):
    base = results["baseline"]
    for path, res in results.items():
        for a, b in zip(res, base):
            assert _bits(a) == _bits(b), path


def test_binary_kernels_follow_the_selected_path(cpu_path_back_module):
    for path in PATHS:
        _xent.set_cpu_path(path)
        assert _binary.cpu_path() == path


FOCAL = st.tuples(st.sampled_from([0.25, -1.0, 0.0, 1.0, 0.7]), st.sampled_from([2.0, 0.0, 0.5, 1.0, 3.7]))
PROB_MODES = st.sampled_from([dict(), dict(eps=1e-7), dict(eps=0.1), dict(log_clamp=-100.0), dict(log_clamp=-5.0)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
def test_binary_paths_agree_bitwise_on_adversarial_cases(cpu_path_back_module, dtype, data):
    case = data.draw(binary_xent_cases(dtype))
    x, t = case.logits, case.target
    kw = dict(weight=case.weight, pos_weight=case.pos_weight, ignore_index=case.ignore_index)
    go = data.draw(hnp.arrays(dtype, x.shape, elements=st.floats(-4, 4, width=np.dtype(dtype).itemsize * 8)))
    _assert_same_bits(_on_each_path(lambda: (
        *xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction="none", **kw),
        xf.binary_cross_entropy_with_logits_backward(go, x, t, reduction="none", **kw),
        xf.binary_cross_entropy_with_logits(x, t, reduction="mean", **kw))))
    alpha, gamma = data.draw(FOCAL)
    y = np.where(t == case.ignore_index, 0, t).astype(dtype) if case.ignore_index is not None else t
    _assert_same_bits(_on_each_path(lambda: (
        *xf.sigmoid_focal_loss_with_grad(x, y, alpha, gamma, reduction="none"),
        xf.sigmoid_focal_loss_backward(go, x, y, alpha, gamma, reduction="none"),
        xf.sigmoid_focal_loss(x, y, alpha, gamma, reduction="sum"))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
def test_binary_prob_paths_agree_bitwise_on_adversarial_cases(cpu_path_back_module, dtype, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=10))
    p = data.draw(unit_probabilities(shape, dtype))
    t = data.draw(binary_targets(shape, dtype))
    w = data.draw(element_weights(shape, dtype))
    mode = data.draw(PROB_MODES)
    _assert_same_bits(_on_each_path(lambda: (
        *xf.binary_cross_entropy_with_grad(p, t, w, reduction="none", **mode),
        xf.binary_cross_entropy(p, t, w, reduction="mean", **mode))))
    rows = p.reshape(p.shape[0], -1)
    if rows.shape[1] > 1:
        y = np.argmax(rows, axis=1)
        _assert_same_bits(_on_each_path(lambda: xf.cross_entropy_from_probs_with_grad(rows, y, reduction="none")))


def _long_binary_problem(dtype, n=7 * (3 * 1024 + 5)):
    # several kernel blocks and a partial one, every kind of value mixed in
    rng = np.random.default_rng(11)
    x = rng.standard_normal(n) * rng.choice([1.0, 4.0, 30.0, 800.0], n)
    x[::17] = rng.choice([0.0, -0.0, 5e-324, 1e-300, 36.7, -745.5, 1e300, np.inf, -np.inf, np.nan], x[::17].size)
    t = rng.random(n)
    t[::2] = np.round(t[::2])
    t[::11] = rng.choice([1e-300, 5e-324, 1 - 2**-53], t[::11].size)
    t[::13] = -1
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(-1, 7), t.astype(dtype).reshape(-1, 7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_paths_agree_bitwise_on_long_arrays(cpu_path_back_module, dtype):
    x, t = _long_binary_problem(dtype)
    rng = np.random.default_rng(12)
    w = rng.random(7) * np.array([0, 1, 2, 1e-310, 1e300, 3, 1])
    q = rng.random((x.shape[0], 1)) * 3
    go = rng.standard_normal(x.shape).astype(dtype)
    y = np.where(t < 0, 0, t).astype(dtype)
    p = np.where(np.isnan(x), 0.5, 1 / (1 + np.exp(-np.clip(x.astype(np.float64), -700, 700)))).astype(dtype)

    def run():
        out = []
        for weights in (dict(), dict(weight=w, pos_weight=q)):
            out += xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction="none", ignore_index=-1,
                                                                 n_threads=2, **weights)
            out.append(xf.binary_cross_entropy_with_logits_backward(go, x, t, reduction="none", ignore_index=-1,
                                                                    n_threads=2, **weights))
            out += xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction="mean", ignore_index=-1,
                                                                 n_threads=2, **weights)
        for alpha, gamma in ((0.25, 2.0), (-1.0, 0.0), (0.7, 0.5)):
            out += xf.sigmoid_focal_loss_with_grad(x, y, alpha, gamma, reduction="none", n_threads=2)
            out += xf.sigmoid_focal_loss_with_grad(x, y, alpha, gamma, reduction="mean", n_threads=2)
        for mode in (dict(), dict(eps=1e-7), dict(log_clamp=-100.0)):
            for weight in (None, w):
                out += xf.binary_cross_entropy_with_grad(p, y, weight, reduction="none", n_threads=2, **mode)
                out += xf.binary_cross_entropy_with_grad(p, y, weight, reduction="sum", n_threads=2, **mode)
        return out

    _assert_same_bits(_on_each_path(run))
