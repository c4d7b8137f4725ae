"""The plain-call lanes (_core/_xent.pyx, _core/_binary.pyx): the most common small calls computed at C
level, which must give the general path's bits for every input, and leave every unusual call (and every
error) to the general path."""
import inspect
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xentfast as xf
from xentfast import _threads
from xentfast._core import _binary, _xent
from xentfast import reference as ref
from xentfast.testing import binary_logits, binary_targets, index_targets, logits, max_ulp_error

LANES = [
    (xf.cross_entropy, _xent.plain_cross_entropy),
    (xf.cross_entropy_with_grad, _xent.plain_cross_entropy_with_grad),
    (xf.binary_cross_entropy_with_logits, _binary.plain_binary_cross_entropy_with_logits),
    (xf.binary_cross_entropy_with_logits_with_grad, _binary.plain_binary_cross_entropy_with_logits_with_grad),
]
# log_softmax, softmax and logsumexp: one lane (_plain_family), no labels and no reduction
FAMILY_LANES = [
    (xf.log_softmax, _xent.plain_log_softmax),
    (xf.softmax, _xent.plain_softmax),
    (xf.logsumexp, _xent.plain_logsumexp),
]
DTYPES = [np.float32, np.float64]
REDUCTIONS = ["none", "mean", "sum"]
ids = lambda d: np.dtype(d).name  # noqa: E731


def _general(public):
    """The public function without its decorator: always the general path."""
    return public.__wrapped__


def _same_bits(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            _same_bits(u, v)
        return
    assert type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
    assert np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8))


@pytest.mark.parametrize("public, lane", LANES + FAMILY_LANES, ids=lambda f: getattr(f, "__name__", ""))
def test_a_lane_takes_its_public_functions_signature(public, lane):
    # the decorator hands the caller's arguments to both; a parameter the lane lacked or defaulted
    # otherwise would change what a call means
    want = inspect.signature(public).parameters
    got = inspect.signature(lane).parameters
    assert [(p.name, p.kind, p.default) for p in got.values()] == [
        (p.name, p.kind, p.default) for p in want.values()]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_softmax_lane_gives_the_general_paths_bits(dtype, reduction, data):
    x = data.draw(logits(dtype, max_rows=40, max_classes=60))
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1])
    y = data.draw(index_targets(x.shape[1], x.shape[:1]))
    kw = dict(reduction=reduction, ignore_index=-100)
    lane_loss = _xent.plain_cross_entropy(x, y, **kw)
    general = _general(xf.cross_entropy)(x, y, **kw)
    if lane_loss is not NotImplemented:
        _same_bits(lane_loss, general)
    _same_bits(xf.cross_entropy(x, y, **kw), general)
    out = np.empty_like(x)
    fused = _xent.plain_cross_entropy_with_grad(x, y, out=out, **kw)
    want = _general(xf.cross_entropy_with_grad)(x, y, **kw)
    if fused is not NotImplemented:
        assert fused[1] is out
        _same_bits(fused, want)
    _same_bits(xf.cross_entropy_with_grad(x, y, **kw), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_binary_lane_gives_the_general_paths_bits(dtype, reduction, data):
    x = data.draw(binary_logits(dtype))
    t = data.draw(binary_targets(x.shape, dtype))
    lane_loss = _binary.plain_binary_cross_entropy_with_logits(x, t, reduction=reduction)
    general = _general(xf.binary_cross_entropy_with_logits)(x, t, reduction=reduction)
    if lane_loss is not NotImplemented:
        _same_bits(lane_loss, general)
    _same_bits(xf.binary_cross_entropy_with_logits(x, t, reduction=reduction), general)
    fused = _binary.plain_binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction)
    want = _general(xf.binary_cross_entropy_with_logits_with_grad)(x, t, reduction=reduction)
    if fused is not NotImplemented:
        _same_bits(fused, want)
    _same_bits(xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction=reduction), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_the_lanes_take_ordinary_small_calls(dtype, reduction):
    """Not vacuous: the ordinary calls of the benchmarks go through the lanes, with any thread count."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 300)).astype(dtype)
    y = rng.integers(0, 300, 32)
    t = (rng.random((32, 300)) < 0.5).astype(dtype)
    for n_threads in (None, 1, 2, -1):
        assert _xent.plain_cross_entropy(x, y, reduction=reduction, n_threads=n_threads) is not NotImplemented
        assert _xent.plain_cross_entropy_with_grad(x, y, reduction=reduction, n_threads=n_threads,
                                                   out=np.empty_like(x)) is not NotImplemented
        assert _binary.plain_binary_cross_entropy_with_logits(x, t, reduction=reduction,
                                                              n_threads=n_threads) is not NotImplemented
        assert _binary.plain_binary_cross_entropy_with_logits_with_grad(
            x, t, reduction=reduction, n_threads=n_threads) is not NotImplemented


def _lanes_take_it(loss_pair, grad_pair, args, **kw):
    """The lanes of a loss and of its _with_grad (LANES entries) take the call, with the general path's
    bits (the gradient into the caller's `out`)."""
    (public, lane), (public_grad, lane_grad) = loss_pair, grad_pair
    got = lane(*args, **kw)
    assert got is not NotImplemented
    _same_bits(got, _general(public)(*args, **kw))
    out = np.empty_like(args[0])
    fused = lane_grad(*args, out=out, **kw)
    assert fused is not NotImplemented and fused[1] is out
    _same_bits(fused, _general(public_grad)(*args, **kw))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(4100, 10), (257, 129), (130, _xent.GROUP_MAX_C), (130, _xent.GROUP_MAX_C + 1),
                                   (40, 1000), (9, 5000), (4, 2 * _xent.BLOCK + 1)], ids=str)
def test_the_softmax_lane_takes_larger_calls(dtype, reduction, shape):
    """Above PLAIN_MAX_ELEMENTS the softmax lane takes short rows side by side and longer ones through
    softmax_xent's row driver, on the threads xentfast._threads would start, with the general path's
    bits; the rows the groups hand back (NaN, +inf, all -inf, a spread beyond the exponentials) and
    ignored rows included.  Rows of 1024 float32 (256 on the avx512 path) or 2048 float64 classes and more
    write their gradient pending (streaming stores into a mapped `out`)."""
    n, c = shape
    assert n * c >= 2 * _xent.LANE_MIN_ELEMENTS_PER_THREAD
    rng = np.random.default_rng(n)
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    y = rng.integers(0, c, n)
    if n > 3:                    # a lone row stays: a mean with nothing to average is the general path's
        x[1, 0], x[2, -1], x[3] = np.nan, np.inf, -np.inf
        y[::5] = -100
    x[n - 1, 0] = 800.0 if n - 1 > 3 else x[n - 1, 0]
    for n_threads in (None, 1, 2, 3, -1):
        _lanes_take_it(LANES[0], LANES[1], (x, y), reduction=reduction, n_threads=n_threads)


def test_the_softmax_lane_leaves_few_long_rows_to_the_general_path():
    # fewer rows than threads, rows beyond a block, a call large enough for two threads: the general path
    # splits (row, block) tasks (_use_phased), which the lane does not
    x = np.zeros((1, 70000))
    y = np.zeros(1, dtype=np.int64)
    assert _xent.use_phased(1, x.shape[1], 2, False, True) and _xent.use_phased(1, x.shape[1], 2, False, False)
    assert _xent.plain_cross_entropy(x, y, n_threads=2) is NotImplemented
    assert _xent.plain_cross_entropy_with_grad(x, y, n_threads=2) is NotImplemented
    assert _xent.plain_cross_entropy(x, y, n_threads=1) is not NotImplemented
    # one float32 row too short for a fused split on two threads runs on one, in the lane (its forward
    # pass alone is split)
    x = np.random.default_rng(2).standard_normal((1, 40000)).astype(np.float32)
    assert not _xent.use_phased(1, x.shape[1], 2, True, True) and _xent.use_phased(1, x.shape[1], 2, True, False)
    assert _xent.plain_cross_entropy(x, y, n_threads=2) is NotImplemented
    fused = _xent.plain_cross_entropy_with_grad(x, y, n_threads=2)
    assert fused is not NotImplemented
    _same_bits(fused, _general(xf.cross_entropy_with_grad)(x, y, n_threads=2))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(256, 256), (3, 70001)], ids=str)
def test_the_binary_lane_takes_larger_calls(dtype, reduction, shape):
    """Above PLAIN_MAX_ELEMENTS the binary lane runs its blocks on the threads xentfast._threads would
    start (a last partial block included), with the general path's bits; soft targets, NaN and +-inf
    logits included.  A target outside [0, 1] anywhere still leaves the call to the general path."""
    rng = np.random.default_rng(shape[1])
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    x.flat[[5, 900, 40000]] = np.nan, np.inf, -np.inf
    t = np.where(rng.random(shape) < 0.5, rng.random(shape), rng.random(shape) < 0.5).astype(dtype)
    for n_threads in (None, 1, 2, 3, -1):
        _lanes_take_it(LANES[2], LANES[3], (x, t), reduction=reduction, n_threads=n_threads)
    bad = t.copy()
    bad.flat[-1] = 1.5
    assert _binary.plain_binary_cross_entropy_with_logits(x, bad, n_threads=2) is NotImplemented


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("bad_value", [1.5, "after_one", -1e-45, -np.inf, np.inf, np.nan], ids=repr)
def test_the_binary_lane_finds_one_bad_target_among_ordinary_elements(dtype, bad_value):
    """The float32 kernel checks the targets inside its fast-form test (binary_blocks.h): one bad target
    in a block of otherwise ordinary elements, at a block's first, middle or last element, beyond the
    first block, on one thread or two, must still leave the call to the general path, whose error names
    the target, with out= too."""
    shape = (300, 1000)
    assert shape[0] * shape[1] >= 2 * _xent.LANE_MIN_ELEMENTS_PER_THREAD  # on the threads asked for
    rng = np.random.default_rng(7)
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    t = (rng.random(shape) < 0.5).astype(dtype)
    if bad_value == "after_one":
        bad_value = np.nextafter(dtype(1), dtype(2))
    # -1e-45 is the negative subnormal -2^-149 in float32
    assert not (0 <= dtype(bad_value) <= 1)
    block = _binary.BLOCK
    for index in (0, block - 1, 5 * block, 5 * block + block // 2, 77 * block - 1, t.size - 1):
        bad = t.copy()
        bad.flat[index] = bad_value
        for n_threads in (1, 2):
            for reduction in REDUCTIONS:
                assert _binary.plain_binary_cross_entropy_with_logits(
                    x, bad, reduction=reduction, n_threads=n_threads) is NotImplemented
                assert _binary.plain_binary_cross_entropy_with_logits_with_grad(
                    x, bad, reduction=reduction, n_threads=n_threads) is NotImplemented
        with pytest.raises(ValueError, match=r"^target: values must be in \[0, 1\]"):
            xf.binary_cross_entropy_with_logits_with_grad(x, bad, out=np.empty_like(x), n_threads=2)
        with pytest.raises(ValueError, match=r"^target: values must be in \[0, 1\]"):
            xf.binary_cross_entropy_with_logits(x, bad, reduction="none", n_threads=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_family_lane_gives_the_general_paths_bits(dtype, data):
    x = data.draw(logits(dtype, max_rows=40, max_classes=60))
    n_threads = data.draw(st.sampled_from([None, 1, 2]))
    for public, lane in FAMILY_LANES:
        want = _general(public)(x, n_threads=n_threads)
        got = lane(x, n_threads=n_threads)
        assert got is not NotImplemented or x.size == 0
        if got is not NotImplemented:
            _same_bits(got, want)
        _same_bits(public(x, n_threads=n_threads), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("shape", [(4100, 10), (257, 129), (130, 160), (130, 161), (130, _xent.GROUP_MAX_C + 1),
                                   (40, 5000), (3, 7, 50), (70,)], ids=str)
def test_the_family_lane_takes_every_size(dtype, shape):
    """Short rows side by side (160 and 161: softmax's groups' limit on the avx2 path and beyond it; 257:
    beyond every group), long rows, more
    than two dimensions and one, on the threads xentfast._threads would start; the rows the groups hand
    back (NaN, +inf, all -inf, a spread beyond the exponentials) included: the general path's bits."""
    rng = np.random.default_rng(shape[-1])
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] > 64:
        rows[5, 0], rows[17, -1], rows[40] = np.nan, np.inf, -np.inf
        rows[63, 0] = 800.0
        rows[50, : shape[-1] // 2] = -np.inf
    for n_threads in (None, 1, 2, 3, -1):
        for public, lane in FAMILY_LANES:
            got = lane(x, n_threads=n_threads)
            assert got is not NotImplemented
            _same_bits(got, _general(public)(x, n_threads=n_threads))
    assert _xent.plain_softmax(x, axis=x.ndim - 1) is not NotImplemented


def test_the_family_lane_leaves_every_other_call_to_the_general_path():
    x = np.random.default_rng(5).standard_normal((8, 10))
    swapped = x.astype(x.dtype.newbyteorder())
    for _, lane in FAMILY_LANES:
        for kw in (dict(axis=0), dict(axis=True), dict(axis=np.int64(-1)), dict(n_threads=0), dict(n_threads=True),
                   dict(n_threads=2**70)):
            assert lane(x, **kw) is NotImplemented, kw
        for xs in (x.astype(np.float16), x.T, x[:, :0], x[:0], np.float64(1.0), x.tolist(), swapped):
            assert lane(xs) is NotImplemented
    # and the public functions give the general path's answer (or its error) there
    _same_bits(xf.log_softmax(swapped), _general(xf.log_softmax)(swapped))
    _same_bits(xf.softmax(x.T), _general(xf.softmax)(x.T))
    with pytest.raises(ValueError, match="axis"):
        xf.logsumexp(np.float64(1.0))


def test_the_lanes_start_the_threads_the_general_path_would():
    assert _xent.LANE_MIN_ELEMENTS_PER_THREAD == _threads.MIN_ELEMENTS_PER_THREAD
    for n_elements in (2 * _threads.MIN_ELEMENTS_PER_THREAD, 5 * _threads.MIN_ELEMENTS_PER_THREAD - 1, 10**7):
        for n_threads in (None, 1, 2, 3, 64, -1, -2, -100):
            assert _xent.lane_threads(n_threads, n_elements) == _threads.threads_for(n_threads, n_elements)
    # beyond long long: the general path's (it raises nothing either, and starts the same threads)
    assert _xent.lane_threads(2**70, 10**6) == 0
    x = np.zeros((4096, 10))
    assert _xent.plain_cross_entropy(x, np.zeros(4096, dtype=np.int64), n_threads=2**70) is NotImplemented
    _same_bits(xf.cross_entropy(x, np.zeros(4096, dtype=np.int64), n_threads=2**70),
               xf.cross_entropy(x, np.zeros(4096, dtype=np.int64)))


def test_the_lanes_leave_every_other_call_to_the_general_path():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 10))
    y = rng.integers(0, 10, 8)
    t = rng.random((8, 10))
    big = np.zeros((200, 200))
    others = [
        dict(weight=np.ones(10)), dict(label_smoothing=0.1), dict(z_loss=1e-4), dict(axis=0),
        dict(nan_policy="raise"), dict(empty_mean="bad"), dict(reduction="avg"), dict(n_threads=0),
        dict(n_threads=True), dict(ignore_index=2**70), dict(ignore_index=np.int64(3)),
    ]
    for kw in others:
        assert _xent.plain_cross_entropy(x, y, **kw) is NotImplemented, kw
    for xs, ys in ((x.astype(np.float16), y), (x.T.copy().T, y), (x, y.astype(np.int32)), (x[:, :0], y),
                   (x, np.where(np.arange(8) == 2, 10, y)), (x, y[:4]),
                   (x.tolist(), y)):
        assert _xent.plain_cross_entropy(xs, ys) is NotImplemented
    assert _xent.plain_cross_entropy(x, np.full(8, -100), reduction="mean") is NotImplemented
    for kw in (dict(grad_output=2.0), dict(inplace=True), dict(out=np.empty((8, 10), np.float32)),
               dict(out=x), dict(out=np.empty((10, 8))), dict(out=np.empty((8, 20))[:, ::2])):
        assert _xent.plain_cross_entropy_with_grad(x, y, **kw) is NotImplemented, kw
    for kw in (dict(weight=np.ones(10)), dict(pos_weight=np.ones(10)), dict(ignore_index=0.5),
               dict(nan_policy="raise"), dict(reduction=None)):
        assert _binary.plain_binary_cross_entropy_with_logits(x, t, **kw) is NotImplemented, kw
    for xs, ts in ((x, t.astype(np.float32)), (x, t * 2), (x, np.where(t < 0.5, np.nan, t)), (x[0, 0], t[0, 0]),
                   (big, big + 2), (x, t[:4])):
        assert _binary.plain_binary_cross_entropy_with_logits(xs, ts) is NotImplemented
    for kw in (dict(grad_output=np.ones((8, 10)), reduction="none"), dict(inplace=True), dict(out=x)):
        assert _binary.plain_binary_cross_entropy_with_logits_with_grad(x, t, **kw) is NotImplemented, kw


def test_errors_still_come_from_the_public_functions():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"^target: labels must be in \[0, 3\) or equal ignore_index=-100; "
                                         r"found 3 at index \[1\]"):
        xf.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="out: overlaps input"):
        xf.cross_entropy_with_grad(x, np.array([0, 1]), out=x)
    with pytest.raises(TypeError, match="cross_entropy.. got an unexpected keyword argument 'weights'"):
        xf.cross_entropy(x, np.array([0, 1]), weights=None)
    with pytest.raises(ValueError, match=r"^target: "):
        xf.binary_cross_entropy_with_logits(x, np.full((2, 3), 1.5))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_the_general_paths_rare_cases_are_its_own(dtype):
    """Nothing to average, a binary sum of tiny losses (the lane keeps no per-element losses to rerun),
    a mean beyond DBL_MAX: the lanes return NotImplemented and the public function gives the general
    path's value.  float32 BCE has no tiny sums since its plain-double form took every finite logit
    (binary.h: exp(-550) stands in beyond 550, a loss of 2^-793 at least): there the lane answers, with
    the general path's bits."""
    confident = np.array([[0.0, -720.0, -725.0]] * 5, dtype=dtype)
    tiny_losses = (np.full((3, 4), 745.0, dtype=dtype), np.ones((3, 4), dtype=dtype))
    cases = [
        (_xent.plain_cross_entropy, xf.cross_entropy, (confident, np.full(5, -100)), dict(reduction="mean")),
    ]
    if dtype is np.float64:
        huge = np.full(4, np.finfo(np.float64).max)
        cases.append((_binary.plain_binary_cross_entropy_with_logits, xf.binary_cross_entropy_with_logits,
                      tiny_losses, dict(reduction="mean")))
        cases.append((_binary.plain_binary_cross_entropy_with_logits, xf.binary_cross_entropy_with_logits,
                      (huge, np.zeros(4)), dict(reduction="mean")))
    else:
        lane = _binary.plain_binary_cross_entropy_with_logits(*tiny_losses, reduction="mean")
        assert lane is not NotImplemented and lane == 0
        _same_bits(lane, _general(xf.binary_cross_entropy_with_logits)(*tiny_losses, reduction="mean"))
    for lane, public, args, kw in cases:
        assert lane(*args, **kw) is NotImplemented
        _same_bits(public(*args, **kw), _general(public)(*args, **kw))


def _confident_rows(dtype, n_rows=64, n_classes=300, gap=800.0, seed=5):
    """Rows whose other logits lie ~`gap` below the target's (losses exactly 0 at 800), one ignored."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, n_classes)) * 3).astype(dtype)
    y = rng.integers(0, n_classes, n_rows)
    x[np.arange(n_rows), y] += dtype(gap)
    y[3] = -100
    return x, y


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_sum_of_zero_losses_is_the_lanes_own(dtype, reduction):
    """Rows whose other logits lie ~800 below the target's have losses of exactly 0: their sum needs no
    tiny-terms rerun (the general path sums zeros as they are), so the lanes keep the call, with the
    general path's bits, instead of running the kernel and then leaving it to the general path, which
    ran it again.  The binary lane likewise, for logits ~800 on their targets' side."""
    x, y = _confident_rows(dtype)
    assert not np.any(xf.cross_entropy(x, y, reduction="none"))
    _lanes_take_it(LANES[0], LANES[1], (x, y), reduction=reduction)
    xb = np.where(x > 0, dtype(800), dtype(-800))
    tb = (xb > 0).astype(dtype)
    assert not np.any(xf.binary_cross_entropy_with_logits(xb, tb, reduction="none"))
    _lanes_take_it(LANES[2], LANES[3], (xb, tb), reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(64, 300), (40, 3000)], ids=str)
def test_tiny_losses_are_rerun_scaled_by_the_lane(dtype, reduction, shape):
    """Rows whose losses all lie below 2^-969 but are not all 0: the lane takes the losses again 2^600
    larger, as the general path does (_Problem.reduce), with its bits, instead of leaving the call to
    the general path (which ran the kernel twice more).  The rerun is what makes the result right: the
    losses as first rounded, each on the subnormal grid, sum to a value several ULPs off."""
    x, y = _confident_rows(dtype, *shape, gap=0.0)
    x[np.arange(shape[0]), y] = 0.0
    others = np.arange(shape[1]) != y[:, None]
    x[others] = dtype(-725.0) - np.abs(x[others])       # losses ~ C e^-725: subnormal, rounded
    rows = xf.cross_entropy(x.astype(np.float64), y, reduction="none")   # float32's round to 0
    assert np.any(rows) and np.all(rows < 2.0**-969)
    _lanes_take_it(LANES[0], LANES[1], (x, y), reduction=reduction)
    got = xf.cross_entropy(x, y, reduction=reduction)
    want = ref.cross_entropy(x, y, reduction=reduction)
    assert max_ulp_error(got, want)[0] <= 1
    if dtype is np.float64:
        # without the rerun: each row loss (times the mean's 2^-k, a power of two >= 1/den) rounded once
        # onto the subnormal grid, then summed and divided exactly
        kept = y != -100
        k = math.frexp(kept.sum())[1] if reduction == "mean" else 0
        exact_rows = ref.cross_entropy(x, y, reduction="none")[kept]
        as_rounded = sum(mpmath.mpf(float(mpmath.ldexp(v, -k))) for v in exact_rows)
        if reduction == "mean":
            as_rounded = as_rounded * 2**k / kept.sum()
        assert max_ulp_error(np.float64(as_rounded), want)[0] > 1


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_small_sum_of_losses_not_all_tiny_is_the_lanes_own(reduction):
    """One row loss above 2^-969 among zeros: a sum small enough for _sum_and_tiny's second look, but not
    every term tiny, so no rerun; the lane keeps it with the general path's bits (its mean's scaling by
    2^(k - e) after the division, which rounds once where hi / den alone would underflow)."""
    x, y = _confident_rows(np.float64, n_rows=3000, n_classes=40)
    x[7] = -800.0
    x[7, 0] = 0.0
    x[7, 1] = -669.0                    # loss e^-669 ~ 2^-965.2
    y[7] = 0
    rows = xf.cross_entropy(x, y, reduction="none")
    assert 2.0**-969 < rows.max() < 2.0**-960 and np.count_nonzero(rows) == 1
    _lanes_take_it(LANES[0], LANES[1], (x, y), reduction=reduction)
    assert xf.cross_entropy(x, y, reduction=reduction) == _general(xf.cross_entropy)(x, y, reduction=reduction)
