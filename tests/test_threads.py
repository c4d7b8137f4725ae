"""Determinism: bitwise identical results for any thread count, any task split, fused or separate."""
import platform

import numpy as np
import pytest

import xentfast as xf
from xentfast._core import _xent

THREADS = [1, 2, 3, 8]


def _problem(dtype, n, c, seed, prob=False):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 4).astype(dtype)
    x[0, 5] = -np.inf                  # a masked class
    x[1, :] = x[1, 0]                   # a tie row
    x[n - 1, 7] = 60.0                  # a confident row
    if prob:
        t = rng.random((n, c)).astype(dtype)
        return x, t / t.sum(axis=1, keepdims=True)
    y = rng.integers(0, c, size=n)
    y[n // 2] = -100
    return x, y


OPTIONS = [
    dict(),
    dict(weight="w", label_smoothing=0.1),
    dict(z_loss=1e-3, reduction="sum"),
    dict(prob=True, label_smoothing=0.05),
]


def _call(f, dtype, shape, opts, n_threads, **extra):
    opts = dict(opts)
    prob = opts.pop("prob", False)
    x, t = _problem(dtype, *shape, seed=1, prob=prob)
    if opts.get("weight") == "w":
        opts["weight"] = np.linspace(0.5, 2.0, shape[1])
    return f(x, t, n_threads=n_threads, **opts, **extra)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("shape", [(64, 4096), (2, 70000), (5, 9001)], ids=str)
def test_thread_count_does_not_change_bits(dtype, opts, shape):
    if shape[0] == 2:
        # two long rows: some thread count takes the (row, block) split, whose per-thread minimum is
        # largest for a float32 gradient
        teams = [xf._threads.threads_for(nt, shape[0] * shape[1]) for nt in THREADS]
        assert any(_xent.use_phased(*shape, team, dtype == np.float32, True) for team in teams)
    results = [_call(xf.cross_entropy_with_grad, dtype, shape, opts, nt) for nt in THREADS]
    for loss, grad in results[1:]:
        assert np.array_equal(loss, results[0][0], equal_nan=True)
        assert np.array_equal(grad, results[0][1], equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_fused_equals_separate(dtype, opts):
    shape = (16, 3000)
    loss, grad = _call(xf.cross_entropy_with_grad, dtype, shape, opts, None)
    loss_only = _call(xf.cross_entropy, dtype, shape, opts, None)
    grad_only = _call(lambda *a, **k: xf.cross_entropy_backward(None, *a, **k), dtype, shape, opts, None)
    assert np.array_equal(loss, loss_only, equal_nan=True)
    assert np.array_equal(grad, grad_only, equal_nan=True)


def _row_path_and_split(x, y=None, t=None, w=None, eps=0.0, z=0.0, scale=1.0):
    """softmax_xent's row path and its (row, block) split of the same call on two threads, a
    (loss, gradient) pair each: index targets y or probability targets t, weights w or none."""
    prob = t is not None
    outs = []
    for force in (False, True):
        loss = np.empty(x.shape[0])
        grad = np.empty_like(x)
        with np.errstate(all="ignore"):
            _xent.softmax_xent(x, np.empty(0, dtype=np.int64) if prob else y,
                               t if prob else np.empty((0, 0), dtype=x.dtype), np.empty(0) if w is None else w,
                               -100, eps, z, np.empty(0), scale, loss, grad, 2, not prob, prob, w is not None,
                               False, True, force)
        outs.append((loss, grad))
    return outs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("prob", [False, True, "negative"])
def test_phased_split_equals_row_path(dtype, prob):
    # the (row, block) task split must merge blocks in the same order as a thread walking the row, and
    # decide as the row path whether a row's loss terms add plainly (float32 probability targets all
    # >= 0, xf_terms_plain): "negative" puts one negative target in the second block of some rows
    n, c = 6, 2 * _xent.BLOCK + 333
    x, t = _problem(dtype, n, c, seed=7, prob=bool(prob))
    if prob == "negative":
        t[::2, _xent.BLOCK + 5] = -0.25
    w = np.linspace(0.1, 3.0, c)
    outs = _row_path_and_split(x, None if prob else t, t if prob else None, w, eps=0.1, z=1e-3, scale=0.5)
    assert np.array_equal(outs[0][0], outs[1][0], equal_nan=True)
    assert np.array_equal(outs[0][1], outs[1][1], equal_nan=True)


@pytest.mark.parametrize("m", [2.0**20, 1.0, 2.0**-60])
def test_exact_differences_take_the_split_s_bits(m):
    # float32 rows whose differences m - x_j are all exact in double (xf_row_diffs_exact) take -log p_j as
    # (m - x_j) + log S on the row path, without TwoSum's error term; the (row, block) split always adds
    # it.  Each row: the max m (the target), a logit at m - delta (log S ~ e^-delta, near a quarter of an
    # ULP of m for the first deltas), one at x = -(1 + 2^-23) m 2^-gap, the rest masked (-inf, no mass), so
    # that x's smoothing term is nearly all of the loss.  m + |x| needs gap + 24 bits: exact up to gap 29
    # (the row test takes gaps up to 28 relative to the largest magnitude), inexact from 30 on, where
    # TwoSum's error (up to half an ULP of m) added to log S moves the rounding: the row path must keep
    # it there.  Then subnormal and zero logits, and probability targets on rows without masks.
    c = 2 * _xent.BLOCK + 333
    ulp_m = m * 2.0**-52
    deltas = [-np.log(k * ulp_m) for k in (0.1, 0.2, 0.27, 0.35, 0.45)] + [3.0]
    rows = []
    for delta in deltas:
        for gap in range(26, 36):
            row = np.full(c, -np.inf, dtype=np.float32)
            row[0] = m
            row[c - 1] = m - delta
            row[_xent.BLOCK + 7] = -(1 + 2.0**-23) * m * 2.0**-gap
            rows.append(row)
    for small in (np.float32(1e-45), 0.0, -0.0):     # a subnormal, zeros
        row = rows[0].copy()
        row[_xent.BLOCK + 7] = small
        rows.append(row)
    x = np.array(rows)
    y = np.zeros(x.shape[0], dtype=np.int64)
    outs = _row_path_and_split(x, y, eps=0.3)
    assert np.isfinite(outs[0][0]).all()
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])
    rng = np.random.default_rng(3)
    xp = (rng.uniform(1.0, 2.0, size=(4, c)) * m).astype(np.float32)
    xp[1, 9] = np.float32(m * 2.0**-29)
    xp[2, 9] = np.float32(m * 2.0**-31)
    xp[3, 9] = 0.0
    t = rng.random((4, c)).astype(np.float32)
    outs = _row_path_and_split(xp, t=t / t.sum(axis=1, keepdims=True), eps=0.1)
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("ignore_index", [-100, 10**12, 2**63 - 1])
def test_the_phased_split_reads_nothing_at_an_ignored_rows_label(ignore_index):
    # an ignored row's label is the ignore value, never range-checked: the split once read the weight and
    # the logit at it (w[-100]; x[10**12] crashed).  One row on two threads takes the split.
    c = 70000
    x = np.random.default_rng(1).standard_normal((1, c))
    w = np.linspace(0.5, 2.0, c)
    y = np.array([ignore_index])
    assert _xent.use_phased(1, c, 2, False, True)
    loss, grad = xf.cross_entropy_with_grad(x, y, weight=w, ignore_index=ignore_index, reduction="none",
                                            n_threads=2)
    assert loss[0] == 0.0 and not grad.any()
    assert xf.cross_entropy(x, y, ignore_index=ignore_index, reduction="sum", n_threads=2) == 0.0
    # beside a row that is not ignored, the bits of the row path
    x2 = np.vstack([x, x[:, ::-1]])
    y2 = np.array([ignore_index, 5])
    got = xf.cross_entropy_with_grad(x2, y2, weight=w, ignore_index=ignore_index, reduction="sum", n_threads=3)
    want = xf.cross_entropy_with_grad(x2, y2, weight=w, ignore_index=ignore_index, reduction="sum", n_threads=1)
    assert got[0] == want[0] and got[1].tobytes() == want[1].tobytes()


def _family_rows(dtype, c, seed):
    # 12 rows of c classes: NaN, +inf, all -inf, -inf and finite masks, a dominant logit, a max past
    # the first block (c > BLOCK + 17; else the last entry), ties, a logsumexp that cancels
    # (log-probabilities), float64 sums of subnormal terms only, tiny logits
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((12, c)) * 3).astype(dtype)
    x[1, 7] = np.nan
    x[2, -1] = np.inf
    x[3] = -np.inf
    x[4, rng.random(c) < 0.3] = -np.inf
    x[5, rng.random(c) < 0.3] = dtype(-1e9)
    x[6, 3] = 200.0
    x[7, min(_xent.BLOCK + 17, c - 1)] = 30.0
    x[8, ::97] = x[8].max()
    x[9] = x[9] - np.logaddexp.reduce(x[9].astype(np.float64))
    x[10] = dtype(-745.0) if dtype == np.float64 else x[10]
    x[10, 0] = 0.0 if dtype == np.float64 else x[10, 0]
    x[11] = x[11] * dtype(1e-30)
    return x


@pytest.mark.parametrize("path", _xent.available_cpu_paths())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["logsumexp", "log_softmax", "softmax"])
def test_phased_split_of_the_softmax_family_equals_the_row_path(cpu_path_back, path, dtype, mode):
    # few long rows of logsumexp / log_softmax / softmax as (row, block) tasks (_softmax_family_phased):
    # the statistics merged in block order, the output block by block, the row path's bits (_family_rows)
    _xent.set_cpu_path(path)
    x = _family_rows(dtype, 2 * _xent.BLOCK + 333, seed=mode)
    n = x.shape[0]
    outs = []
    for force in (False, True):
        out = np.full_like(x, 7.0)
        lse = np.full(n, 7.0)
        with np.errstate(all="ignore"):
            _xent.softmax_family(x, out, lse, mode, 2, mode == 0, True, force)
        outs.append((out, lse))
    if mode == 0:
        assert outs[0][1].tobytes() == outs[1][1].tobytes()
    else:
        assert outs[0][0].tobytes() == outs[1][0].tobytes()
        assert not (outs[1][0] == 7.0).all(axis=1).any()


@pytest.mark.parametrize("path", _xent.available_cpu_paths())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [300, 1000, _xent.BLOCK + 18, 3 * _xent.BLOCK + 5])
@pytest.mark.parametrize("mode", [1, 2], ids=["log_softmax", "softmax"])
def test_the_familys_logsumexp_beside_its_rows_is_logsumexps(cpu_path_back, path, dtype, c, mode):
    # softmax's row kernel skips log S where nothing reads it (job.log_s_unused, set only without a
    # logsumexp output): asked for one beside the rows, a call gets logsumexp's bits, and the rows are
    # those of the call without it, on the row path and in the phased split
    _xent.set_cpu_path(path)
    x = _family_rows(dtype, c, seed=c + mode)
    n = x.shape[0]
    want_lse = np.full(n, 7.0)
    want_out = np.full_like(x, 7.0)
    with np.errstate(all="ignore"):
        _xent.softmax_family(x, np.empty((0, 0), dtype=dtype), want_lse, 0, 1, True, False)
        _xent.softmax_family(x, want_out, np.empty(0), mode, 1, False, False)
        for force in (False, True):
            out, lse = np.full_like(x, 7.0), np.full(n, 7.0)
            _xent.softmax_family(x, out, lse, mode, 1, True, False, force)
            assert np.array_equal(lse.view(np.uint8), want_lse.view(np.uint8)), force
            assert np.array_equal(out.view(np.uint8), want_out.view(np.uint8)), force
    # the comparison has teeth: finite logsumexps (the cancelling row's near 0) and NaN rows
    assert np.isfinite(want_lse).sum() >= 8 and abs(want_lse[9]) < 1e-3 and np.isnan(want_lse[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extra", [0, 1], ids=["at-the-limit", "beyond"])
def test_rows_beyond_the_scratch_limit_equal_the_phased_split(dtype, extra):
    # rows of more than SCRATCH_MAX_CLASSES classes get no scratch row (xf_xent_wants_scratch: it would be
    # mapped afresh every call) and evaluate their exponentials again; rows at the limit keep them there
    # (and, long as they are, leave their gradient pending).  Either way the phased split's bits.
    n, c = 2, _xent.SCRATCH_MAX_CLASSES + extra
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    x[1, 5] = 40.0
    outs = _row_path_and_split(x, np.array([7, c - 1]), scale=0.5)
    assert outs[0][0].tobytes() == outs[1][0].tobytes()
    assert outs[0][1].tobytes() == outs[1][1].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_rows_with_finite_masks_take_the_masked_form_with_the_general_forms_bits(dtype, weighted):
    # the row path gives rows whose far entries are a finite mask the masked normal form
    # (xf_row_mask_form); the phased split keeps the general form: the two must agree bit for bit, also
    # next to the band (708-746 below the max) where the row keeps the general form, and at 727, the test
    rng = np.random.default_rng(9)
    n, c = 12, _xent.BLOCK + 333
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    masks = [-1e9, -1e4, np.finfo(dtype).min, -np.inf, -746.5, -760.0, -720.0, -709.0, -727.0, -2000.0]
    for i, mv in enumerate(masks):
        x[i, rng.random(c) < 0.3] = dtype(x[i].max() + mv) if np.isfinite(mv) and mv > -1e4 else dtype(mv)
    x[10, :] = dtype(-1e9)
    x[10, 3] = 1.5                      # one kept class, the target below
    x[11, rng.random(c) < 0.3] = dtype(-1e9)
    x[11, 9] = dtype(x[11].max() - 740.0)   # one entry in the band: the general form
    y = rng.integers(0, c, n)
    y[10] = 3
    y[0] = int(np.argmin(x[0]))         # a masked target: loss ~1e9
    w = np.linspace(0.5, 2.0, c)
    outs = _row_path_and_split(x, y, w=w if weighted else None, scale=0.5)
    assert np.array_equal(outs[0][0], outs[1][0], equal_nan=True)
    assert np.array_equal(outs[0][1], outs[1][1], equal_nan=True)
    assert outs[0][0][0] > 1e8 and np.isfinite(outs[0][0]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_phased_split_equals_row_path_for_z_loss_rows_read_again(dtype):
    # rows whose z-loss logsumexp is recomputed from the row (xentfast/softmax_row.h, "logsumexp for the
    # z-loss"): where m + log S cancels (lse ~ 0) and where A + 2 z lse does (lse ~ -1, z = 0.5)
    rng = np.random.default_rng(8)
    n, c = 6, _xent.BLOCK + 77
    x = rng.standard_normal((n, c))
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    x[3:] -= 1.0 + np.geomspace(1e-9, 1e-3, 3)[:, None]
    x = x.astype(dtype)
    y = rng.integers(0, c, n)
    outs = _row_path_and_split(x, y, z=0.5)
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])
    fused = xf.cross_entropy_with_grad(x, y, reduction="none", z_loss=0.5)
    assert np.array_equal(fused[0], outs[0][0].astype(dtype)) and np.array_equal(fused[1], outs[0][1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", [dict(label_smoothing=0.1), dict(prob=True), dict(z_loss=1e-2, weight="w")],
                         ids=["smoothing", "probabilities", "z-loss"])
def test_inplace_equals_out_of_place_for_general_rows(dtype, opts):
    # float64 rows out of place keep the sum pass's exponentials for the gradient pass; in place they
    # cannot (the gradient buffer is the logits) and evaluate them again: the same doubles either way
    shape = (40, 1500)
    loss, grad = _call(xf.cross_entropy_with_grad, dtype, shape, opts, 2, reduction="none")
    opts_in = dict(opts)
    prob = opts_in.pop("prob", False)
    x, t = _problem(dtype, *shape, seed=1, prob=prob)
    if opts_in.get("weight") == "w":
        opts_in["weight"] = np.linspace(0.5, 2.0, shape[1])
    loss_in, grad_in = xf.cross_entropy_with_grad(x, t, reduction="none", inplace=True, n_threads=2, **opts_in)
    assert grad_in is x
    assert np.array_equal(loss_in, loss, equal_nan=True)
    assert np.array_equal(grad_in, grad, equal_nan=True)


def _far_simple_rows(c, seed):
    """float64 rows with index targets whose spread lies beyond the stored form's 600: finite masks
    (the masked normal form), an entry in the subnormal band (the general form), logits 650 to 1300
    below the max (the tiny-sum rescue), and rows whose probabilities are subnormal; each after an
    ordinary row (of the stored form: streamed from 2048 classes on the AVX paths)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((20, c)) * 3
    y = rng.integers(0, c, 20)
    far = x[1::2]                       # a view: the odd rows
    far[0, rng.random(c) < 0.3] = -1e9
    far[1, rng.random(c) < 0.3] = np.finfo(np.float64).min
    far[2, rng.random(c) < 0.3] = -1e9
    far[2, 11] = far[2].max() - 740.0
    far[3, 4] = far[3].max() + 650.0
    far[4, 8] = far[4].max() + 800.0
    far[5, c - 1] = far[5].max() + 1100.0
    far[6, 2] = far[6].max() + 1300.0
    far[7, rng.random(c) < 0.5] -= 720.0
    far[8, ::7] = -np.inf
    far[8, 1::7] = -1e9
    far[9, 5] = 1e300
    far[9, 6] = 1e300 - 2e284
    y[7], y[9], y[11], y[13] = 4, 8, c - 1, 3
    return x, y


@pytest.mark.parametrize("c", [1000, 2048 + 5])
@pytest.mark.parametrize("reduction, factor", [("none", None), ("sum", 1e300), ("mean", 1e-300)])
def test_inplace_equals_out_of_place_for_far_simple_rows(cpu_path_back, c, reduction, factor):
    # float64 simple rows beyond the stored form's spread keep the sum pass's exponentials in the
    # gradient buffer when it is not the logits (softmax_rows.h, xf_xent_row): the gradient pass reads
    # them, unless the row's probabilities are subnormal under a factor above 1 (grad_scaled), which
    # evaluates them again from x, scaled.  In place, the buffer is the logits and every row evaluates them
    # again: the same bits, every path, thread count and (row, block) split.  A grad_scaled row that
    # read the kept exponentials would differ here (the scaled form is what keeps its subnormal entries
    # exact under 1e300).
    x, y = _far_simple_rows(c, seed=c)
    kw = dict(reduction=reduction, grad_output=factor)
    want = xf.cross_entropy_with_grad(x, y, n_threads=1, **kw)
    assert np.count_nonzero(want[1]) > 0
    for path in _xent.available_cpu_paths():
        cpu_path_back.set_cpu_path(path)
        for nt in (1, 2):
            got = xf.cross_entropy_with_grad(x, y, n_threads=nt, **kw)
            inplace = x.copy()
            got_in = xf.cross_entropy_with_grad(inplace, y, n_threads=nt, inplace=True, **kw)
            assert got_in[1] is inplace
            for a, what in ((got, "out of place"), (got_in, "in place")):
                assert np.array_equal(a[0], want[0], equal_nan=True), (path, nt, what)
                assert np.array_equal(a[1], want[1], equal_nan=True), (path, nt, what)
    if reduction == "none":
        split = _row_path_and_split(x, y)
        for loss, grad in split:
            assert np.array_equal(loss, want[0], equal_nan=True)
            assert np.array_equal(grad, want[1], equal_nan=True)


@pytest.mark.parametrize("f", [xf.log_softmax, xf.softmax, xf.logsumexp])
def test_softmax_family_thread_count(f):
    x, _ = _problem(np.float64, 64, 4096, seed=3)
    ref = f(x, n_threads=1)
    for nt in THREADS[1:]:
        assert np.array_equal(f(x, n_threads=nt), ref, equal_nan=True)


def test_negative_n_threads_count_back_from_every_thread():
    # README: -k asks for every thread but k - 1 (scikit-learn's convention: -1 is None's count), never
    # fewer than one; 0 and bools are refused (tests/test_validation.py)
    from xentfast._core._openmp_helpers import omp_max_threads, openmp_enabled
    from xentfast._threads import effective_n_threads
    every = omp_max_threads() if openmp_enabled() else 1
    assert effective_n_threads(None) == effective_n_threads(-1) == every
    assert effective_n_threads(-2) == (max(1, every - 1) if openmp_enabled() else 1)
    assert effective_n_threads(-10**6) == 1
    x, y = _problem(np.float32, 256, 300, seed=4)
    loss, grad = xf.cross_entropy_with_grad(x, y, n_threads=1)
    for nt in (-1, -2, -10**6):
        got_loss, got_grad = xf.cross_entropy_with_grad(x, y, n_threads=nt)
        assert np.array_equal(got_loss, loss) and np.array_equal(got_grad, grad), nt


def test_mean_equals_mean_of_none():
    # the reduction sums double row losses in a fixed order, so `mean` is reproducible from `none` rows
    x, y = _problem(np.float64, 257, 100, seed=11)
    rows = xf.cross_entropy(x, y, reduction="none")
    kept = y != -100
    assert xf.cross_entropy(x, y, reduction="mean") == pytest.approx(rows[kept].sum() / kept.sum(), rel=1e-15)


def _short_rows(dtype, n, c, seed, ignore):
    """Rows of every kind the short-row groups meet: ordinary, ties (all equal, +0 and -0 among them, or
    the max at a few places), a NaN, +-inf,
    a spread beyond the unclamped exponentials, near-overflow logits, subnormal sums (float64's rescue),
    confident rows, finite masks (with an entry in the subnormal band), and labels ignored or pointing
    at the max."""
    rng = np.random.default_rng(seed)
    fmax = np.finfo(dtype).max
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    y = rng.integers(0, c, n)
    for i in range(n):
        kind, j = rng.integers(0, 18), rng.integers(0, c)
        row = x[i]
        if kind == 0:
            row[j] = np.nan
        elif kind == 1:
            row[j] = -np.inf
        elif kind == 2:
            row[j] = np.inf
        elif kind == 3:
            row[:] = row[0]
        elif kind == 4:
            row[:] = np.where(rng.random(c) < 0.5, 0.0, -0.0)
        elif kind == 5:
            row[j] = 710.0                        # beyond the unclamped exponentials' spread
        elif kind == 6:
            row[j] = fmax / 2
        elif kind == 7:
            row[:] = -650.0
            row[j] = 0.0                          # the others' exponentials subnormal (float64: rescued)
        elif kind == 8:
            y[i] = ignore
        elif kind == 9:
            y[i] = int(np.argmax(row))
        elif kind == 10:
            row[j] = 60.0
            y[i] = j
        elif kind == 11:
            row[y[i]] = -700.0
        elif kind == 12:
            row[rng.random(c) < 0.3] = dtype(-1e9)   # a finite mask (the float32 groups take it masked)
        elif kind == 13:
            row[j] = row.max() - 760.0            # far below, within the float64 rescue's 1200
        elif kind == 14:
            row[rng.random(c) < 0.3] = np.finfo(dtype).min
            row[j] = row.max() - 740.0            # and one in the band 708-746 below: the general form
        elif kind == 15:
            # the max at a few places among other values: the sum leaves out the first (its lane's 0.0),
            # and another one left out puts the 1.0 in another lane, which rounds differently
            row[rng.integers(0, c, 3)] = row.max()
    return x, y


# The classes up to which each path's short-row groups take ordinary rows (softmax_rows.h,
# XF_GROUP_C_LIMIT and XF_GROUP_FAMILY_MAX_C; README, "Threads and determinism"), per kind: logsumexp,
# log_softmax, softmax, cross-entropy forward, with its gradient, and those two with label smoothing and
# with probability targets (XF_GROUP_TERMS_MAX_C).  x86's baseline path takes none.
_GROUP_LIMITS = {
    ("avx512", np.float32): (512, 512, 448, 512, 448, 160, 160, 160, 160),
    ("avx512", np.float64): (240, 240, 160, 240, 160, 96, 96, 64, 64),
    ("avx2", np.float32): (256, 128, 144, 256, 144, 160, 144, 112, 112),
    ("avx2", np.float64): (64, 64, 80, 64, 80, 64, 80, 64, 64),
    ("baseline", np.float32): (0, 0, 0, 0, 0, 0, 0, 0, 0),
    ("baseline", np.float64): (0, 0, 0, 0, 0, 0, 0, 0, 0),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [8192, 8193, 9001])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_a_rows_results_do_not_depend_on_the_rows_after_it(cpu_path_back, path, dtype, c):
    """The row driver reads each row's next row during the row's sum pass and keeps that row's max
    lanes (softmax_rows.h, xf_next_max), which its own max pass then folds.  Each row's loss and
    gradient must be the ones it gets alone, whatever follows it: a max past the last whole chunk or at
    its end, NaN, +-inf and -inf in the lanes or past them, finite masks, ties and +-0 ties."""
    _xent.set_cpu_path(path)
    rng = np.random.default_rng(c)
    n = 16
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    whole = c // 64 * 64
    x[1, -1] = 40.0
    x[2, whole - 1] = 40.0
    x[3, c // 3] = np.nan
    x[4, -1] = np.nan
    x[5, -1] = np.inf
    x[6, ::5] = -np.inf
    x[7, -1] = -np.inf
    x[8, ::4] = -1e9
    x[9, :] = 0.0
    x[9, ::3] = -0.0
    x[10, :] = x[10, 0]
    x[11, 0] = 700.0
    x[12, c // 2] = np.inf
    y = rng.integers(0, c, n)
    y[13] = -100
    for n_threads in (1, 2):
        batch = xf.cross_entropy_with_grad(x, y, reduction="none", n_threads=n_threads)
        forward = xf.cross_entropy(x, y, reduction="none", n_threads=n_threads)
        for i in range(n):
            loss, grad = xf.cross_entropy_with_grad(x[i:i + 1], y[i:i + 1], reduction="none", n_threads=1)
            assert batch[0][i].tobytes() == loss[0].tobytes() == forward[i].tobytes(), (n_threads, i)
            assert batch[1][i].tobytes() == grad[0].tobytes(), (n_threads, i)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [100, 300, 513, 1000, 2051, 8192])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_the_forward_passs_rows_in_batches_equal_each_row_alone(cpu_path_back, path, dtype, c):
    """Without a gradient the row driver takes GROUP_ROWS rows a task and their logarithms side by side
    (softmax_rows.h, xf_xent_rows_forward, xf_rows_max_sum) once a call has enough rows of up to 8192
    classes, and so does logsumexp; so are the rows a short-row group hands back (here the odd ones, and
    every row beyond a path's group limit).  A call of one row goes through the row kernel
    alone.  Each row's result must be the bits it gets alone, whatever rows share its batch: ignored rows
    among them, NaN, +-inf, -inf and finite masks, ties, confident rows, a sum of subnormal terms, a
    batch of ignored rows only, a last partial batch; with weights, smoothing, the z-loss and probability
    targets."""
    _xent.set_cpu_path(path)
    rng = np.random.default_rng(c)
    n = 17 * _xent.GROUP_ROWS + 5
    x = (rng.standard_normal((n, c)) * rng.choice([0.1, 3.0, 40.0], size=(n, 1))).astype(dtype)
    x[3, c // 3] = np.nan
    x[5, -1] = np.inf
    x[6, ::5] = -np.inf
    x[8, ::4] = -1e9
    x[10, :] = x[10, 0]
    x[11, 0] = 700.0
    x[12, 7] = 1e4
    x[13, :] = -np.inf
    x[14] *= 1e-30
    x[15] = x[15] * 1e-3 - 720.0                               # subnormal terms (float64's rescued sum)
    x[15, 1] = 0.0
    y = rng.integers(0, c, n)
    y[[2, 9, n - 1]] = -100
    y[2 * _xent.GROUP_ROWS:3 * _xent.GROUP_ROWS] = -100     # a batch with no row to compute
    y[6] = 0                                                 # a target at -inf: loss +inf
    y[15] = 1                                                # its loss is that sum
    t = rng.random((n, c)).astype(dtype)
    t /= t.sum(axis=1, keepdims=True)
    w = np.linspace(0.25, 2.0, c)
    calls = [(y, {}), (y, dict(weight=w)), (y, dict(label_smoothing=0.1, weight=w)), (y, dict(z_loss=1e-3)),
             (t, {}), (t, dict(label_smoothing=0.05))]
    for target, opts in calls:
        alone = np.array([xf.cross_entropy(x[i:i + 1], target[i:i + 1], reduction="none", n_threads=1, **opts)[0]
                          for i in range(n)])
        # the comparison has teeth: rows of each kind were there
        assert np.isnan(alone).any() and np.isinf(alone).any() and np.isfinite(alone).sum() > n // 2
        for n_threads in (1, 2):
            batched = xf.cross_entropy(x, target, reduction="none", n_threads=n_threads, **opts)
            assert batched.tobytes() == alone.astype(batched.dtype).tobytes(), (opts, n_threads)
    for f in (xf.logsumexp, xf.log_softmax):
        alone = np.concatenate([np.atleast_1d(f(x[i:i + 1], n_threads=1)) for i in range(n)])
        assert np.isnan(alone).any() and np.isinf(alone).any()
        for n_threads in (1, 2):
            assert f(x, n_threads=n_threads).tobytes() == alone.tobytes(), (f, n_threads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_short_row_groups_take_ordinary_rows_up_to_their_limits(cpu_path_back, path, dtype):
    # the group-versus-row tests compare bits, which would pass with no row grouped; here every ordinary
    # row of a group is taken up to the path's limit and none beyond, for each kind of call
    if path == "baseline" and platform.machine().lower() not in ("x86_64", "amd64", "x86", "i386", "i686"):
        pytest.skip("the baseline path's limits are measured on x86 only")
    _xent.set_cpu_path(path)
    rng = np.random.default_rng(5)
    for kind, limit in enumerate(_GROUP_LIMITS[path, dtype]):
        for c in sorted({1, 2, 8, 31, 32, 33, 63, 64, 65, limit - 1, limit, limit + 1, 257, 513} - {-1, 0}):
            # offset from 0, so that no logsumexp cancels (such rows go back to the row path)
            x = (rng.standard_normal((_xent.GROUP_ROWS, c)) * 3 + 10).astype(dtype)
            want = (1 << _xent.GROUP_ROWS) - 1 if c <= limit else 0
            assert _xent.group_rows_taken(x, np.empty_like(x), kind) == want, (kind, c)
    # a row the groups cannot take (a NaN) is left to the row path, the others still taken
    x = (rng.standard_normal((_xent.GROUP_ROWS, 10)) * 3).astype(dtype)
    x[3, 4] = np.nan
    taken = _xent.group_rows_taken(x, np.empty_like(x), 3)
    assert taken == (0 if path == "baseline" else ((1 << _xent.GROUP_ROWS) - 1) & ~(1 << 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [1, 2, 7, 8, 9, 10, 17, 48, 49, 64, 65, 80, 81, 100, 101, 128, 129,
                               160, 161, 176, 177, 240, 241, 256, 257, 448, 449, 512, 513])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_short_row_groups_of_the_softmax_family_equal_the_row_path(cpu_path_back, path, dtype, c):
    # xf_short_rows_family: logsumexp, log_softmax and softmax of GROUP_ROWS rows side by side, with the
    # bits the row path gives each row; the rows it does not take (and a last partial group) through the
    # row path itself
    _xent.set_cpu_path(path)
    n = 50 * _xent.GROUP_ROWS + 3
    x, _ = _short_rows(dtype, n, c, seed=c, ignore=-100)
    # logsumexp: rows of log-probabilities, whose m + log S cancels (the row path's exact logsumexp), and
    # rows just off it
    with np.errstate(invalid="ignore"):           # the NaN and +-inf rows
        logp = x[::9] - np.logaddexp.reduce(x[::9].astype(np.float64), axis=1, keepdims=True)
    x_lse = x.copy()
    x_lse[::9] = np.where(np.arange(len(logp))[:, None] % 2, logp, logp + 1e-3)
    got, want = np.full(n, 7.0), np.full(n, 7.0)
    _xent.softmax_family(x_lse, np.empty((0, 0), dtype=dtype), got, 0, 1, True, True)
    _xent.softmax_family(x_lse, np.empty((0, 0), dtype=dtype), want, 0, 1, True, False)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.isnan(want).any() and (np.abs(want) < 1e-6).sum() > 10
    assert np.array_equal(xf.logsumexp(x_lse, n_threads=2).view(np.uint8), want.astype(dtype).view(np.uint8))
    for mode, public in ((1, xf.log_softmax), (2, xf.softmax)):
        got, want = np.full_like(x, 7.0), np.full_like(x, 7.0)
        _xent.softmax_family(x, got, np.empty(0), mode, 1, False, True)
        _xent.softmax_family(x, want, np.empty(0), mode, 1, False, False)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), mode
        # the comparison has teeth (rows the groups hand back were there); the API gives the same bits
        assert np.isnan(want).any() and np.isfinite(want).all(axis=1).sum() > n // 2
        assert np.array_equal(public(x, n_threads=2).view(np.uint8), want.view(np.uint8)), mode


def _groups_equal_rows(x, y, t, w, ignore, eps, z=0.0):
    """softmax_xent with and without the short-row groups, bit for bit: the losses alone (two loss scales),
    with a gradient, in place; a per-row upstream factor with an infinite entry (a coefficient the groups
    leave to the row kernel).  Index targets y, or probability targets t (y empty); z: the z-loss.  The same rows (and
    targets) as the columns of torch's layout (softmax_xent_channels: tiles of positions, the groups across
    them, on two threads) too.  Returns the losses of the call without a gradient at loss scale 1."""
    n, c = x.shape
    row_scale = np.geomspace(1e-3, 1e3, n)
    row_scale[5] = np.inf
    none2 = np.empty((0, 0), dtype=x.dtype)
    has_y = y.size > 0
    for loss_scale, grad_kind in ((0.5, None), (1.0, None), (1.0, "grad"), (0.25, "inplace")):
        outs = []
        for groups in (True, False):
            loss = np.empty(n)
            xx = x.copy()
            grad = {None: none2, "grad": np.full_like(x, 7.0), "inplace": xx}[grad_kind]
            _xent.softmax_xent(xx, y, t, w, ignore, eps, z, row_scale, 0.75, loss, grad, 1, has_y, not has_y,
                               w.size > 0, grad_kind is not None, grad_kind is not None, False, loss_scale, groups)
            outs.append((loss, grad))
        if c <= _xent.CHANNELS_MAX_CLASSES:
            loss = np.empty(n)
            columns = x.T.copy()[None]  # a copy also where x.T is contiguous (c = 1): the pass may be in place
            grad = {None: none2[None], "grad": np.full_like(columns, 7.0), "inplace": columns}[grad_kind]
            t_columns = t.T.copy()[None] if not has_y else none2[None]
            _xent.softmax_xent_channels(columns, y, t_columns, w, ignore, eps, z, row_scale, 0.75, loss, grad, 2,
                                        has_y, not has_y, w.size > 0, grad_kind is not None, grad_kind is not None,
                                        loss_scale)
            assert np.array_equal(loss, outs[1][0], equal_nan=True), grad_kind
            assert np.array_equal(grad[0].T if grad_kind else grad[0], outs[1][1], equal_nan=True), grad_kind
        assert np.array_equal(outs[0][0], outs[1][0], equal_nan=True), grad_kind
        assert np.array_equal(outs[0][1], outs[1][1], equal_nan=True), grad_kind
        if grad_kind is None and loss_scale == 1.0:
            plain_loss = outs[0][0]
    return plain_loss


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c,eps", [(c, eps) for eps in (0.0, 0.1) for c in (
    1, 2, 7, 8, 9, 10, 17, 32, 33, 48, 49, 64, 65, 79, 80, 81, 100, 128, 129, 144, 145, 160, 161, 208, 209, 240,
    241, 255, 256, 257, 448, 449, 512, 513)] + [(2, 1.0), (17, 1.0), (100, 1.0)])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted-ignore-3"])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_short_row_groups_equal_the_row_kernel(cpu_path_back, path, dtype, c, eps, weighted):
    # xf_short_rows puts GROUP_ROWS rows side by side and must give each row the row kernel's bits (loss, and
    # gradient in place or not, with a per-row upstream factor); the rows it does not take (and a last
    # partial group) go through the row kernel itself.  With label smoothing (xf_short_rows_terms_form)
    # the weights hold a zero (no smoothing mass) and one tiny enough for the terms pass's rare form
    _xent.set_cpu_path(path)
    n = 50 * _xent.GROUP_ROWS + 3
    ignore = 3 if weighted else -100
    x, y = _short_rows(dtype, n, c, seed=c, ignore=ignore)
    w = np.linspace(0.0, 3.0, c) if weighted else np.empty(0)
    if weighted and eps and c > 2:
        w[1] = 1e-300
    none2 = np.empty((0, 0), dtype=dtype)
    plain_loss = _groups_equal_rows(x, y, none2, w, ignore, eps)
    # the comparison has teeth: rows of each kind were there; and the API takes the same path
    assert np.isnan(plain_loss).any() and np.isfinite(plain_loss).sum() > n // 2
    weight = w if weighted else None
    api = xf.cross_entropy(x, y, weight=weight, ignore_index=ignore, reduction="none", label_smoothing=eps,
                           n_threads=2)
    with np.errstate(over="ignore"):  # float32 losses beyond FLT_MAX round to inf, in the API too
        assert np.array_equal(api, plain_loss.astype(dtype), equal_nan=True)
    api_loss, api_grad = xf.cross_entropy_with_grad(x, y, weight=weight, ignore_index=ignore, reduction="none",
                                                    label_smoothing=eps, n_threads=2)
    assert np.array_equal(api_loss, api, equal_nan=True)
    loss, grad = np.empty(n), np.empty_like(x)
    _xent.softmax_xent(x, y, none2, w, ignore, eps, 0.0, np.empty(0), 1.0, loss, grad, 1, True, False, weighted,
                       False, True, False, 1.0, False)
    assert np.array_equal(api_grad, grad, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [1, 2, 7, 17, 32, 33, 64, 65, 100, 160, 161])
@pytest.mark.parametrize("eps,prob", [(0.0, False), (0.1, False), (0.0, True)], ids=["z", "z-smoothing", "z-prob"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_short_row_groups_with_a_z_loss_equal_the_row_kernel(cpu_path_back, path, dtype, c, eps, prob, weighted):
    # the z-loss in the groups (xf_short_rows_terms_form with z != 0, the loss-terms pass only with
    # smoothing or probability targets): each row's loss and gradient with the row kernel's bits.  Rows
    # whose logsumexp the row kernel takes from the row again go back to it: m + log S near 0 (logits near
    # -log C), and A + 2 z r lse near 0 (z = 0.5, a unit mass: logits near -1 - log C, lse near -1)
    _xent.set_cpu_path(path)
    n = 40 * _xent.GROUP_ROWS + 5
    x, y = _short_rows(dtype, n, c, seed=c, ignore=-100)
    rng = np.random.default_rng(c + 7)
    for i in range(0, n, 9):
        x[i] = (-np.log(c) + rng.standard_normal(c) * 1e-3).astype(dtype)
    for i in range(4, n, 9):
        x[i] = (-1.0 - np.log(c) + rng.standard_normal(c) * 1e-3).astype(dtype)
    w = np.linspace(0.0, 3.0, c) if weighted else np.empty(0)
    t = _probability_rows(dtype, n, c, seed=c) if prob else np.empty((0, 0), dtype=dtype)
    targets = np.empty(0, dtype=np.int64) if prob else y
    for z in (1e-3, 0.5):
        losses = _groups_equal_rows(x, targets, t, w, -100, eps, z)
        assert np.isnan(losses).any() and np.isfinite(losses).sum() > n // 2
    # and the groups take such rows (without a NaN or a cancelling logsumexp) where their limits allow
    x = (rng.standard_normal((_xent.GROUP_ROWS, c)) * 3 + 10).astype(dtype)
    for kind, limit in ((9, _GROUP_LIMITS[path, dtype][5]), (10, _GROUP_LIMITS[path, dtype][6])):
        want = (1 << _xent.GROUP_ROWS) - 1 if c <= limit else 0
        assert _xent.group_rows_taken(x, np.empty_like(x), kind) == want, kind


def _probability_rows(dtype, n, c, seed):
    """Probability targets of every kind the short-row groups meet beside _short_rows's logits: random
    rows of the simplex, one-hot rows, zeros, rows summing above 1, a negative entry (float32 groups hand
    such a row back: the row kernel sums it compensated), a NaN, subnormal masses (the terms pass's rare
    form)."""
    rng = np.random.default_rng(seed + 1000)
    t = rng.random((n, c))
    t /= t.sum(axis=1, keepdims=True)
    for i in range(n):
        kind, j = rng.integers(0, 10), rng.integers(0, c)
        if kind == 0:
            t[i] = 0.0
            t[i, j] = 1.0
        elif kind == 1:
            t[i, j] = 0.0
        elif kind == 2:
            t[i] *= 3.0
        elif kind == 3:
            t[i, j] = -0.25
        elif kind == 4:
            t[i, j] = np.nan
        elif kind == 5:
            t[i, j] = 1e-310 if dtype == np.float64 else 1e-40
    return t.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [1, 2, 7, 10, 17, 33, 64, 65, 96, 97, 112, 113, 160, 161])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("path", _xent.available_cpu_paths())
def test_short_row_groups_of_probability_targets_equal_the_row_kernel(cpu_path_back, path, dtype, c, eps,
                                                                       weighted):
    # xf_short_rows with probability targets (xf_short_rows_terms_form's has_t): each row's loss and gradient
    # (in place or not, a per-row upstream factor, smoothing on top) with the row kernel's bits
    _xent.set_cpu_path(path)
    n = 40 * _xent.GROUP_ROWS + 5
    x, _ = _short_rows(dtype, n, c, seed=c, ignore=-100)
    t = _probability_rows(dtype, n, c, seed=c)
    w = np.linspace(0.0, 3.0, c) if weighted else np.empty(0)
    if weighted and c > 2:
        w[1] = 1e-300
    no_y = np.empty(0, dtype=np.int64)
    _groups_equal_rows(x, no_y, t, w, -100, eps)
    # and the API takes that path, one thread or two
    weight = w if weighted else None
    kw = dict(weight=weight, reduction="none", label_smoothing=eps)
    loss, grad = np.empty(n), np.empty_like(x)
    _xent.softmax_xent(x, no_y, t, w, -100, eps, 0.0, np.empty(0), 1.0, loss, grad, 1, False, True, weighted,
                       False, True, False, 1.0, False)
    for n_threads in (1, 2):
        api_loss, api_grad = xf.cross_entropy_with_grad(x, t, n_threads=n_threads, **kw)
        with np.errstate(over="ignore"):
            assert np.array_equal(api_loss, loss.astype(dtype), equal_nan=True)
        assert np.array_equal(api_grad, grad, equal_nan=True)
        assert np.array_equal(xf.cross_entropy(x, t, n_threads=n_threads, **kw), api_loss, equal_nan=True)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_the_reduction_sums_on_the_calls_threads(n_threads, monkeypatch):
    # the losses' double-double sum (dd_sum) starts every OpenMP thread by default; a call limited to
    # one thread started a team for it all the same (2^15 losses and more), which a user sharing the
    # machine between processes does not expect.  Both sums of a tiny mean are covered (the rerun).
    from xentfast import _backend
    from xentfast._threads import threads_for
    seen = []
    dd_sum = _xent.dd_sum

    def recording(v, *n_threads_given):
        seen.append(n_threads_given)
        return dd_sum(v, *n_threads_given)

    monkeypatch.setattr(_backend.CPU.softmax, "dd_sum", recording)
    rng = np.random.default_rng(5)
    n, c = 1 << 15, 8
    x = rng.standard_normal((n, c))
    y = rng.integers(0, c, n)
    confident = np.zeros((n, c))
    confident[:, 0] = 700.0            # row losses near 7e-304: the sum is taken again, scaled
    calls = [
        lambda: xf.cross_entropy(x, y, label_smoothing=0.1, n_threads=n_threads),
        lambda: xf.cross_entropy_with_grad(x, y, weight=np.ones(c), n_threads=n_threads),
        lambda: xf.cross_entropy(confident, np.zeros(n, np.int64), weight=np.ones(c), n_threads=n_threads),
        lambda: xf.binary_cross_entropy_with_logits(np.full((n, c), 700.0), np.ones((n, c)), n_threads=n_threads),
    ]
    for call, sums in zip(calls, (1, 1, 2, 2)):
        seen.clear()
        call()
        assert seen == [(threads_for(n_threads, n * c),)] * sums
