"""The implementations xentfast is measured against, and the memory floor they are all judged by.

Three families of the speed issue, and the softmax functions beside them, one factory per (family,
implementation).  A factory takes the data and a thread count and returns a zero-argument callable that runs
one call, or None when that peer is not installed.

- ``FUSED``: mean softmax cross-entropy with index targets, loss and gradient in one call.
- ``FORWARD``: the same loss, forward only.
- ``BINARY``: mean sigmoid (binary) cross-entropy from logits with hard 0/1 targets, loss and gradient.
- ``binary-probs``: mean binary cross-entropy from probabilities (torch's ``binary_cross_entropy``), loss
  and gradient, on the sigmoid of BINARY's logits kept within [1e-6, 1 - 1e-6] (not an issue target).
- ``log_softmax``, ``softmax``, ``logsumexp`` along the last axis (not issue targets; the README's claims
  about them): the logits of ``make_problem``, its targets unused.

Threads.  xentfast takes ``n_threads`` per call and torch a process-wide ``torch.set_num_threads``.  NumPy's
element-wise loops are single-threaded whatever is asked.  JAX (XLA's CPU client, jax 0.10.2) sizes its
thread pool from the CPUs the process may run on when the client is created (the first JAX call), and no
flag changes that afterwards: ``--xla_cpu_multi_thread_eigen=false`` only concerns Eigen's matmul and
convolution kernels (the fusions here still ran on both cores), and ``intra_op_parallelism_threads`` is not
an XLA flag at all (after a valid ``--flag`` XLA ignores it without a word; on its own it is an error).  So
JAX gets N threads by restricting the process to N CPUs before the first JAX call: see ``limit_cpus``.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import xentfast
from xentfast.testing import naive_cross_entropy_with_grad


def limit_cpus(n_threads):
    """Restrict this process to its first ``n_threads`` allowed CPUs; return the CPUs it may now use.

    Call before the first JAX call (and before any thread pool starts): JAX cannot be told a thread count
    any other way.  Every other implementation is also given ``n_threads`` explicitly, so this only makes
    sure none of them (JAX, NumPy's BLAS, OpenMP's default) spreads over more cores than the others.  When
    fewer CPUs are allowed than asked for, nothing changes and the caller should say so.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) > n_threads:
        os.sched_setaffinity(0, allowed[:n_threads])
    return sorted(os.sched_getaffinity(0))


# ------------------------------------------------------------------------------------------------------
# Data

_DATA = {}


def _logits(rng, n, c, dtype):
    # Drawn in the target dtype: a float64 draw of 262M values would need 2 GiB more for nothing.
    x = rng.standard_normal((n, c), dtype=np.dtype(dtype))
    x *= 3
    return x


def _kept(key, build):
    """The problem under `key`, built on first use; one (large) problem is kept alive at a time."""
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = build()
    return _DATA[key]


def make_problem(n, c, dtype, seed=0):
    """Logits (N, C) ~ 3 N(0, 1) and index targets."""
    def build():
        rng = np.random.default_rng(seed)
        x = _logits(rng, n, c, dtype)
        return x, rng.integers(0, c, size=n)
    return _kept(("index", n, c, np.dtype(dtype).name), build)


def make_binary_problem(n, c, dtype, seed=0):
    """Logits (N, C) ~ 3 N(0, 1) and hard 0/1 targets of the same dtype and shape."""
    def build():
        rng = np.random.default_rng(seed)
        x = _logits(rng, n, c, dtype)
        return x, (rng.random((n, c), dtype=np.float32) < 0.5).astype(dtype)
    return _kept(("binary", n, c, np.dtype(dtype).name), build)


def make_prob_problem(n, c, dtype, seed=0):
    """make_binary_problem's targets and the sigmoid of its logits within [1e-6, 1 - 1e-6], so that no
    peer's log meets 0 (torch clamps its logs at -100, the plain expressions do not)"""
    def build():
        x, t = make_binary_problem(n, c, dtype, seed)
        p = np.clip(1.0 / (1.0 + np.exp(-x.astype(np.float64))), 1e-6, 1.0 - 1e-6)
        return p.astype(dtype), t
    return _kept(("probs", n, c, np.dtype(dtype).name), build)


def make_soft_problem(n, c, dtype, seed=0):
    """Logits as make_problem and probability targets (Dirichlet(1) rows) of the same dtype."""
    def build():
        rng = np.random.default_rng(seed)
        x = _logits(rng, n, c, dtype)
        return x, rng.dirichlet(np.ones(c), n).astype(dtype)
    return _kept(("soft", n, c, np.dtype(dtype).name), build)


# Inputs that cost xentfast more than ordinary rows (README, Benchmarks, "Inputs that cost more"), as
# families "<family>[<kind>]" beside the plain ones (ratio_table.py --inputs): make_problem's rows with
# 30 % of the classes masked (never a row's target) by -inf or by a finite mask, or with each row's
# target logit raised 800 above the others (float64: every other exponential underflows to 0, and the
# sum is taken a second time 2^600 larger)
INPUT_KINDS = ("-inf masks", "-1e9 masks", "confident")
# and the binary family's: make_binary_problem's elements with a share of them padded (target 0) by the
# logit -1e4, beyond float64's fast form (|x| <= 500; float32's takes every finite logit): a chunk of 64
# with up to 6 such elements redoes them after its fast loop, one with more selects per element.  (-inf
# padding costs xentfast the same, but the peers' formulas give NaN there: benchmarks/README.md,
# seventeenth round, has its times.)
BINARY_INPUT_KINDS = {"-1e4 padding 2 %": (-1e4, 0.02), "-1e4 padding 30 %": (-1e4, 0.3)}


def make_input_problem(kind):
    def make(n, c, dtype, seed=0):
        def build():
            rng = np.random.default_rng(seed)
            x = _logits(rng, n, c, dtype)
            y = rng.integers(0, c, size=n)
            if kind == "confident":
                x[np.arange(n), y] += 800
            else:
                masked = rng.random((n, c)) < 0.3
                masked[np.arange(n), y] = False
                x[masked] = -np.inf if kind == "-inf masks" else -1e9
            return x, y
        return _kept((kind, n, c, np.dtype(dtype).name), build)
    make.__doc__ = f"make_problem's rows, {kind} (see INPUT_KINDS)"
    return make


def make_binary_input_problem(kind):
    pad, share = BINARY_INPUT_KINDS[kind]

    def make(n, c, dtype, seed=0):
        def build():
            x, t = make_binary_problem(n, c, dtype, seed)
            x, t = x.copy(), t.copy()
            padded = np.random.default_rng(seed + 1).random((n, c)) < share
            x[padded] = pad
            t[padded] = 0
            return x, t
        return _kept((kind, n, c, np.dtype(dtype).name), build)
    make.__doc__ = f"make_binary_problem's elements, {kind} (see BINARY_INPUT_KINDS)"
    return make


def drop_problems():
    _DATA.clear()


# ------------------------------------------------------------------------------------------------------
# Bytes that must move, per family (the numerator of the memory floor)

def fused_bytes(x, y):
    """Logits read once, gradient written once, targets read once (the scalar loss is negligible)."""
    return 2 * x.nbytes + y.nbytes


def forward_bytes(x, y):
    """Logits read once, targets read once: the forward pass writes nothing of size N*C."""
    return x.nbytes + y.nbytes


def binary_bytes(x, t):
    """Logits and targets read once, gradient written once."""
    return x.nbytes + t.nbytes + x.nbytes


def copy_bandwidth(n_threads=1, nbytes=1 << 29, repeats=5):
    """Copy bandwidth in bytes/s, read and write both counted, best of ``repeats``.

    The arrays (``nbytes`` each, 512 MiB by default) are larger than the last-level cache, so this is
    DRAM bandwidth.  With ``n_threads`` > 1 the copy is split into that many slices copied by Python
    threads (NumPy releases the GIL while copying), since one core alone may not saturate memory.
    """
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    bounds = np.linspace(0, src.size, n_threads + 1).astype(np.intp)

    def copy_slice(i):
        np.copyto(dst[bounds[i]:bounds[i + 1]], src[bounds[i]:bounds[i + 1]])

    best = float("inf")
    with ThreadPoolExecutor(n_threads) as pool:
        for _ in range(repeats + 1):  # the first copy also faults dst's pages in
            t0 = time.perf_counter()
            list(pool.map(copy_slice, range(n_threads)))
            best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def family_bytes(x, y):
    """log_softmax and softmax: logits read once, an output of their size written once."""
    return 2 * x.nbytes


def logsumexp_bytes(x, y):
    """Logits read once: one value per row written."""
    return x.nbytes


# ------------------------------------------------------------------------------------------------------
# xentfast

def xentfast_fused(x, y, n_threads, out=None):
    # A preallocated gradient buffer, as a training loop would pass: the time is the kernel's, not the
    # page faults of a fresh N*C array.  Callers timing several thread counts may share one.
    out = np.empty_like(x) if out is None else out
    return lambda: xentfast.cross_entropy_with_grad(x, y, out=out, n_threads=n_threads)


def xentfast_forward(x, y, n_threads, out=None):
    """``out`` is accepted for a uniform signature; the forward pass writes no N*C array."""
    return lambda: xentfast.cross_entropy(x, y, n_threads=n_threads)


def xentfast_binary(x, t, n_threads, out=None):
    out = np.empty_like(x) if out is None else out
    return lambda: xentfast.binary_cross_entropy_with_logits_with_grad(x, t, out=out, n_threads=n_threads)


def xentfast_bce_probs(p, t, n_threads, out=None):
    out = np.empty_like(p) if out is None else out
    return lambda: xentfast.binary_cross_entropy_with_grad(p, t, out=out, n_threads=n_threads)


def _xentfast_softmax_function(name):
    def factory(x, y, n_threads, out=None):
        """``out`` is accepted for a uniform signature: these functions return a new array."""
        fn = getattr(xentfast, name)
        return lambda: fn(x, n_threads=n_threads)
    return factory


# ------------------------------------------------------------------------------------------------------
# NumPy: the plain expressions a user would write (max-shifted, no overflow)

def naive_cross_entropy(x, y):
    rows = np.arange(x.shape[0])
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    return (lse - x[rows, y]).mean()


def naive_binary_cross_entropy_with_logits_with_grad(x, t):
    e = np.exp(-np.abs(x))
    loss = (np.maximum(x, 0) - x * t + np.log1p(e)).mean()
    # sigmoid(x) from exp(-|x|), so that no exponential overflows for large |x|
    g = np.where(x >= 0, 1, e) / (1 + e)
    g -= t
    g /= x.size
    return loss, g


def naive_binary_cross_entropy_with_grad(p, t):
    loss = -(t * np.log(p) + (1 - t) * np.log1p(-p)).mean()
    g = (p - t) / (p * (1 - p))
    g /= p.size
    return loss, g


def numpy_fused(x, y, n_threads=None):
    return lambda: naive_cross_entropy_with_grad(x, y)


def numpy_forward(x, y, n_threads=None):
    return lambda: naive_cross_entropy(x, y)


def numpy_binary(x, t, n_threads=None):
    return lambda: naive_binary_cross_entropy_with_logits_with_grad(x, t)


def numpy_bce_probs(p, t, n_threads=None):
    return lambda: naive_binary_cross_entropy_with_grad(p, t)


def naive_log_softmax(x):
    d = x - x.max(axis=1, keepdims=True)
    return d - np.log(np.exp(d).sum(axis=1, keepdims=True))


def naive_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def naive_logsumexp(x):
    m = x.max(axis=1, keepdims=True)
    return np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]


def _numpy_softmax_function(name):
    expression = {"log_softmax": naive_log_softmax, "softmax": naive_softmax, "logsumexp": naive_logsumexp}[name]

    def factory(x, y, n_threads=None):
        return lambda: expression(x)
    return factory


# ------------------------------------------------------------------------------------------------------
# PyTorch (CPU): the functional losses, gradient through autograd's .backward()

def _torch(n_threads):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(n_threads)
    return torch


def _torch_loss_and_grad(loss_name):
    """A factory: torch.nn.functional.<loss_name>(input, target), mean, and its gradient by .backward()"""
    def factory(x, y, n_threads):
        torch = _torch(n_threads)
        if torch is None:
            return None
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        loss_fn = getattr(torch.nn.functional, loss_name)

        def run():
            xr = xt.detach().requires_grad_(True)
            loss = loss_fn(xr, yt)
            loss.backward()
            return loss, xr.grad

        return run
    return factory


torch_fused = _torch_loss_and_grad("cross_entropy")


# The options beside plain index targets: (problem, keyword arguments shared by xentfast and torch).
# z_loss is xentfast's own (torch has none: its peer adds z * logsumexp^2 by hand, as users do).
OPTIONS = {
    "smoothing": (make_problem, {"label_smoothing": 0.1}),
    "soft-targets": (make_soft_problem, {}),
    "z-loss": (make_problem, {"z_loss": 1e-4}),
}


def xentfast_option(option, x, y, n_threads, out=None):
    out = np.empty_like(x) if out is None else out
    kw = OPTIONS[option][1]
    return lambda: xentfast.cross_entropy_with_grad(x, y, out=out, n_threads=n_threads, **kw)


def torch_option(option, x, y, n_threads):
    torch = _torch(n_threads)
    if torch is None:
        return None
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    kw = dict(OPTIONS[option][1])
    z = kw.pop("z_loss", 0.0)

    def run():
        xr = xt.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(xr, yt, **kw)
        if z:
            loss = loss + z * torch.logsumexp(xr, dim=1).square().mean()
        loss.backward()
        return loss, xr.grad

    return run


def torch_forward(x, y, n_threads):
    torch = _torch(n_threads)
    if torch is None:
        return None
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def run():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(xt, yt)

    return run


def _torch_softmax_function(name):
    def factory(x, y, n_threads):
        torch = _torch(n_threads)
        if torch is None:
            return None
        fn, xt = getattr(torch, name), torch.from_numpy(x)

        def run():
            with torch.no_grad():
                return fn(xt, 1)

        return run
    return factory


torch_binary = _torch_loss_and_grad("binary_cross_entropy_with_logits")
torch_bce_probs = _torch_loss_and_grad("binary_cross_entropy")


# ------------------------------------------------------------------------------------------------------
# JAX (CPU) with optax's losses, jit-compiled once per shape and dtype

_JAX = {}


def _jax():
    """(jax, compiled functions) or None; float64 enabled, since the float64 rows need it."""
    if "jax" not in _JAX:
        try:
            import jax
            import jax.scipy.special
            import optax
        except ImportError:
            _JAX["jax"] = None
            return None
        jax.config.update("jax_enable_x64", True)

        def xent(x, y):
            return optax.softmax_cross_entropy_with_integer_labels(x, y).mean()

        def bce(x, t):
            return optax.sigmoid_binary_cross_entropy(x, t).mean()

        _JAX["jax"] = jax
        _JAX["log_softmax"] = jax.jit(lambda x, y: jax.nn.log_softmax(x, axis=-1))
        _JAX["softmax"] = jax.jit(lambda x, y: jax.nn.softmax(x, axis=-1))
        _JAX["logsumexp"] = jax.jit(lambda x, y: jax.scipy.special.logsumexp(x, axis=-1))
        _JAX["fused"] = jax.jit(jax.value_and_grad(xent))
        _JAX["forward"] = jax.jit(xent)
        _JAX["binary"] = jax.jit(jax.value_and_grad(bce))

        def bce_probs(p, t):
            # optax has no BCE from probabilities: the expression a user would write
            return -(t * jax.numpy.log(p) + (1 - t) * jax.numpy.log1p(-p)).mean()

        _JAX["binary-probs"] = jax.jit(jax.value_and_grad(bce_probs))
    return _JAX["jax"]


def _jax_peer(kind, a, b):
    jax = _jax()
    if jax is None:
        return None
    # Device arrays made once, outside the timed call; every call waits for its results.
    ad, bd = jax.device_put(a), jax.device_put(b)
    fn = _JAX[kind]
    return lambda: jax.block_until_ready(fn(ad, bd))


def jax_fused(x, y, n_threads=None):
    """n_threads is not used: JAX's thread count is the process's CPU count (``limit_cpus``)."""
    return _jax_peer("fused", x, y)


def jax_forward(x, y, n_threads=None):
    return _jax_peer("forward", x, y)


def jax_binary(x, t, n_threads=None):
    return _jax_peer("binary", x, t)


def jax_bce_probs(p, t, n_threads=None):
    return _jax_peer("binary-probs", p, t)


def _jax_softmax_function(name):
    def factory(x, y, n_threads=None):
        return _jax_peer(name, x, y)
    return factory


def jax_threads():
    """The number of CPUs JAX's CPU client sizes its pool from (the process's affinity), or None."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


FUSED = {"xentfast": xentfast_fused, "torch": torch_fused, "jax": jax_fused, "numpy": numpy_fused}
FORWARD = {"xentfast": xentfast_forward, "torch": torch_forward, "jax": jax_forward, "numpy": numpy_forward}
BINARY = {"xentfast": xentfast_binary, "torch": torch_binary, "jax": jax_binary, "numpy": numpy_binary}
SOFTMAX_FUNCTIONS = ("log_softmax", "softmax", "logsumexp")
BINARY_PROBS = {"xentfast": xentfast_bce_probs, "torch": torch_bce_probs, "jax": jax_bce_probs,
                "numpy": numpy_bce_probs}
FAMILIES = {"fused": FUSED, "forward": FORWARD, "binary": BINARY, "binary-probs": BINARY_PROBS}
FAMILIES.update({name: {"xentfast": _xentfast_softmax_function(name), "torch": _torch_softmax_function(name),
                        "jax": _jax_softmax_function(name), "numpy": _numpy_softmax_function(name)}
                 for name in SOFTMAX_FUNCTIONS})
BYTES = {"fused": fused_bytes, "forward": forward_bytes, "binary": binary_bytes, "binary-probs": binary_bytes,
         "log_softmax": family_bytes,
         "softmax": family_bytes, "logsumexp": logsumexp_bytes}
PROBLEMS = {"fused": make_problem, "forward": make_problem, "binary": make_binary_problem,
            "binary-probs": make_prob_problem}
PROBLEMS.update({name: make_problem for name in SOFTMAX_FUNCTIONS})
for _base in ("fused", "forward"):
    for _kind in INPUT_KINDS:
        FAMILIES[f"{_base}[{_kind}]"] = FAMILIES[_base]
        BYTES[f"{_base}[{_kind}]"] = BYTES[_base]
        PROBLEMS[f"{_base}[{_kind}]"] = make_input_problem(_kind)
for _kind in BINARY_INPUT_KINDS:
    FAMILIES[f"binary[{_kind}]"] = FAMILIES["binary"]
    BYTES[f"binary[{_kind}]"] = BYTES["binary"]
    PROBLEMS[f"binary[{_kind}]"] = make_binary_input_problem(_kind)
