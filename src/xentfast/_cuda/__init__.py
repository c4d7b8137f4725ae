"""GPU twin of the CPU kernels: launch wrappers over CuPy arrays.

The kernels live in three CUDA sources (package data, read through :mod:`importlib.resources`):
``kernels.cu`` (the softmax family), ``binary.cu`` (the binary family) and ``reduce.cu`` (dd_sum and the
`mean` denominator).  They include the SAME headers as the CPU kernels, so CPU and GPU evaluate the same
operations in the same order and agree bit for bit (kernels.cu, design (a)-(e); binary.cu (a)-(d);
reduce.cu (a)).

Design
(a) Lazy: importing this module imports neither CuPy nor NVRTC.  ``import xentfast`` works without
    CuPy, without a driver and without a GPU; :func:`gpu_available` probes the device safely.
(b) Compilation: once per (device, source, dtype, build option), on first use, through NVRTC
    (:mod:`._nvrtc`), with ``-std=c++17 -I<include> -I<_core> --fmad=false -ftz=false --maxrregcount=128
    -arch=sm_XX``, and for kernels.cu ``-DXF_CU_XENT_MIN_BLOCKS=2`` (the cross-entropy kernel held to 64
    registers) (reduce.cu has no storage type: one module per device).  Not through
    ``cupy.RawModule(code=...)``: CuPy appends ``-ftz=true`` after the caller's options and NVRTC honours
    the last one, which flushes subnormal float32 inputs and outputs (kernels.cu (e)).  The cubin is
    loaded with ``cupy.RawModule(path=...)``.
(c) Cache key: the code handed to NVRTC starts with ``// sha256=<digest>``, the digest of every header
    under include/xentfast and _core (the two ``-I`` directories) plus the source itself (CuPy's disk
    cache and ours would otherwise miss edits of ``-I`` headers); the on-disk cubin is keyed by that
    digest, the options, the architecture and the NVRTC version (``$XENTFAST_CUDA_CACHE_DIR``, default
    ``~/.cache/xentfast/cuda``).
(d) Launch wrappers mirror ``xentfast._core._xent`` and ``xentfast._core._binary`` (same signatures, CuPy
    arrays, current stream; ``n_threads`` is accepted and ignored).  Validation is the caller's
    (xentfast.api, xentfast.api_binary), as for the CPU modules; here only cheap attribute checks (type,
    dtype, dimensions, sizes, device) guard against a wrong pointer or an out-of-range index reaching a
    kernel.  Nothing synchronizes except what returns a Python number (dd_sum, target_weight_sum); their
    ``*_device`` forms return CuPy arrays, so a caller can batch the one device-to-host copy.
(e) Launch shape: a block of nt threads per row (kernels.cu (b)); nt never changes the bits.
    ``XENTFAST_CUDA_THREADS`` (a power of two in [32, 512]) and ``XENTFAST_CUDA_CACHE_ROW`` (0 / 1:
    keep the row in shared memory; by default rows of at most _CACHE_ROW_MAX_BYTES) override the
    defaults, for benchmarking; so do
    ``XENTFAST_CUDA_ORDER=tree`` (kernels.cu (g): an order whose bits may differ from the CPU's) and
    ``XENTFAST_CUDA_XENT_MIN_BLOCKS=1`` (the cross-entropy kernel without its 64-register bound).
"""

import hashlib
import importlib.resources
import json
import os
import sys
import tempfile
import threading

import numpy as np

__all__ = [
    "gpu_available",
    "is_cupy_array",
    "kernel_source",
    "compile_options",
    "summation_order",
    "xent_min_blocks",
    "name_expressions",
    "softmax_xent",
    "softmax_family",
    "elementwise",
    "ce_probs",
    "OP_BCE_LOGITS",
    "OP_FOCAL",
    "OP_BCE_PROB",
    "dd_sum",
    "dd_sum_device",
    "target_weight_sum",
    "target_weight_sum_device",
]

XF_BLOCK = 4096          # classes per block (xent_kernels.h)
XF_LANES = 8             # lanes per block (xent_kernels.h)
_SIZEOF_ROWMAX = 40      # sizeof(xf_rowmax): 5 eight-byte fields (tests/test_cuda.py checks it)
_MAX_THREADS = 512       # XF_CU_MAX_THREADS in kernels.cu
_DEFAULT_SMEM = 48 * 1024
_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_NULL = np.uint64(0)     # an absent array: a NULL pointer argument
SOURCES = ("kernels.cu", "binary.cu", "reduce.cu")
XF_DDSUM_BLOCK = 1024    # elements per dd_sum block (xentfast/ddsum.h)
_TREE_THREADS = 1024     # XF_CU_TREE_THREADS in reduce.cu
_ELEM_THREADS = 256      # threads per block of the elementwise kernels
_ELEMENTWISE_THREADS = 128  # threads_for grows a row's threads past its chains only up to this (see there)
# Rows of at most this many bytes are kept in shared memory by default (kernels.cu: cache_row; same bits):
# read from global memory once instead of three times, while short enough that the blocks resident per
# multiprocessor stay many.  H200, float32, 2 GiB of logits (benchmarks/README.md, GPU), cached against
# global, ms: 1024 classes 11.12 / 11.14, 2048 8.42 / 9.61, 4096 7.91 / 9.58, 8192 8.53 / 7.95 (32 KB
# rows: now slower), 16384 10.83 / 7.56, 32000 48.6 / 12.2.
_CACHE_ROW_MAX_BYTES = 16 * 1024
_ROW_THREADS = 128       # threads per block of the dd_sum block partials (a thread per partial)
_CE_TEAM = 32            # threads per row of xf_ce_probs_kernel (binary.cu XF_CU_CE_TEAM)
_CE_ROWS = 4             # rows per CUDA block of xf_ce_probs_kernel (binary.cu XF_CU_CE_ROWS)

# the ops of xentfast._core._binary (binary.cu XF_CU_OP_*)
OP_BCE_LOGITS = 0
OP_FOCAL = 1
OP_BCE_PROB = 2
_OPS = (OP_BCE_LOGITS, OP_FOCAL, OP_BCE_PROB)


# ---------------------------------------------------------------------------------------------------
# availability


def _cupy():
    import cupy

    return cupy


def gpu_available():
    """True if CuPy imports and sees at least one CUDA device (``import cupy`` alone succeeds without one)."""
    try:
        import cupy
    except Exception:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def is_cupy_array(a):
    """Whether `a` is a ``cupy.ndarray``, without importing CuPy (no CuPy imported: it cannot be one)."""
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(a, cp.ndarray)


# ---------------------------------------------------------------------------------------------------
# source, options, compilation


def _pkg():
    return importlib.resources.files("xentfast")


def _dir(*parts):
    path = _pkg().joinpath(*parts)
    try:
        return os.fspath(path)
    except TypeError:
        raise RuntimeError(f"xentfast is not installed as plain files ({path!r}); the CUDA kernels need "
                           "their headers on disk for NVRTC's -I") from None


def _headers():
    """(name, bytes) of every header the kernels may include (the -I directories), in a fixed order."""
    out = []
    for sub in (("include", "xentfast"), ("_core",)):
        d = _pkg().joinpath(*sub)
        for entry in sorted(d.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".h"):
                out.append(("/".join(sub + (entry.name,)), entry.read_bytes()))
    return out


def _source_name(source):
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return source


def kernel_source(source="kernels.cu"):
    """(code, digest): `source` (one of SOURCES) prefixed by ``// sha256=<digest>`` of the headers and
    the source."""
    kernel = _pkg().joinpath("_cuda", _source_name(source)).read_bytes()
    h = hashlib.sha256()
    for name, data in _headers() + [(f"_cuda/{source}", kernel)]:
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    digest = h.hexdigest()
    return f"// sha256={digest}\n" + kernel.decode(), digest


def summation_order():
    """``"cpu"`` (default: the CPU's order, same bits, kernels.cu (c)) or ``"tree"`` (kernels.cu (g), for
    benchmarks), from ``XENTFAST_CUDA_ORDER``."""
    order = os.environ.get("XENTFAST_CUDA_ORDER", "cpu") or "cpu"
    if order not in ("cpu", "tree"):
        raise ValueError(f"XENTFAST_CUDA_ORDER: expected 'cpu' or 'tree', got {order!r}")
    return order


def xent_min_blocks():
    """Blocks of 512 threads the cross-entropy kernel must fit per multiprocessor (kernels.cu,
    XF_CU_XENT_MIN_BLOCKS: 2, the default, holds it to 64 registers; 1 lets it take 72 and fit fewer
    blocks), from ``XENTFAST_CUDA_XENT_MIN_BLOCKS``.  Never changes the bits."""
    value = os.environ.get("XENTFAST_CUDA_XENT_MIN_BLOCKS", "2") or "2"
    if value not in ("1", "2"):
        raise ValueError(f"XENTFAST_CUDA_XENT_MIN_BLOCKS: expected 1 or 2, got {value!r}")
    return int(value)


def _build_variant(source):
    """The environment's choices that select a build of `source`: (summation order, the cross-entropy
    kernel's blocks per multiprocessor, None for the sources without that kernel)."""
    return summation_order(), (xent_min_blocks() if _source_name(source) == "kernels.cu" else None)


def compile_options(source="kernels.cu"):
    """NVRTC options of `source` without ``-arch`` (kernels.cu (e) says why each is there)."""
    # --maxrregcount=128 is what __launch_bounds__(512) allows anyway (kernels without a minimum block
    # count: the cross-entropy kernel's XF_CU_XENT_MIN_BLOCKS sets its own bound); tests/test_cuda.py
    # reports the counts
    opts = ("-std=c++17", f"-I{_dir('include')}", f"-I{_dir('_core')}", "--fmad=false",
            "-ftz=false", "--maxrregcount=128")
    order, min_blocks = _build_variant(source)
    if order == "tree":
        opts += ("-DXF_CU_TREE_ORDER=1",)
    if min_blocks is not None:
        opts += (f"-DXF_CU_XENT_MIN_BLOCKS={min_blocks}",)
    return opts


def name_expressions(dtype, source="kernels.cu"):
    """The kernels of `source` instantiated for `dtype` (reduce.cu: none depends on it)."""
    t = _DTYPES[np.dtype(dtype)]
    if _source_name(source) == "kernels.cu":
        return (f"xf_softmax_xent_kernel<{t}>", f"xf_xent_z_exact_kernel<{t}>", f"xf_softmax_family_kernel<{t}>",
                f"xf_lse_exact_kernel<{t}>")
    if source == "binary.cu":
        return tuple(f"xf_bin_elementwise_kernel<{t}, {op}>" for op in _OPS) + (f"xf_ce_probs_kernel<{t}>",)
    return ("xf_ddsum_blocks_kernel", "xf_ddsum_tree_kernel", "xf_target_weight_sum_kernel")


def _cache_dir():
    d = os.environ.get("XENTFAST_CUDA_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "xentfast", "cuda")
    try:
        os.makedirs(d, exist_ok=True)
        return d
    except OSError:
        d = os.path.join(tempfile.gettempdir(), f"xentfast-cuda-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(d, exist_ok=True)
        return d


def _write_atomic(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _arch_for(cc):
    """('sm_XX', 'cubin') when NVRTC has SASS for compute capability cc, else PTX for the newest virtual
    architecture not above it (the driver JIT-compiles it)."""
    from . import _nvrtc

    archs = _nvrtc.supported_archs()
    if cc in archs:
        return f"sm_{cc}", "cubin"
    lower = [a for a in archs if a <= cc]
    if not lower:
        raise RuntimeError(f"NVRTC {_nvrtc.version()} cannot compile for compute capability {cc}")
    return f"compute_{max(lower)}", "ptx"


def build_module_file(dtype, cc, source="kernels.cu"):
    """Compile (or find in the disk cache) the kernels of `source` for `dtype` and compute capability `cc`
    (e.g. 90).  Returns (path of the cubin/PTX file, {name expression: mangled name}).  Needs NVRTC, not
    a GPU."""
    from . import _nvrtc

    code, digest = kernel_source(source)
    if source == "reduce.cu":
        dtype = np.float64  # no storage type: one module
    arch, target = _arch_for(int(cc))
    opts = compile_options(source) + (f"-arch={arch}",)
    names = name_expressions(dtype, source)
    key = hashlib.sha256(json.dumps([digest, [o for o in opts if not o.startswith("-I")], names,
                                     list(_nvrtc.version()), target]).encode()).hexdigest()[:32]
    stem = os.path.join(_cache_dir(), f"xentfast-{source[:-3]}-{np.dtype(dtype).name}-{arch}-{key}")
    path, meta = f"{stem}.{target}", f"{stem}.json"
    if os.path.exists(path) and os.path.exists(meta):
        try:
            with open(meta) as f:
                lowered = json.load(f)
        except (OSError, ValueError):
            lowered = {}
        if set(lowered) == set(names):
            return path, lowered
    res = _nvrtc.compile(code, source, opts, names, target)
    _write_atomic(path, res.code)
    _write_atomic(meta, json.dumps(res.lowered).encode())
    return path, res.lowered


class _Module:
    def __init__(self, path, lowered):
        cp = _cupy()
        self.raw = cp.RawModule(path=path)
        self.lowered = lowered
        self.kernels = {}
        self.smem_set = {}

    def kernel(self, expr):
        k = self.kernels.get(expr)
        if k is None:
            k = self.kernels[expr] = self.raw.get_function(self.lowered[expr])
        return k


_modules = {}
_lock = threading.Lock()


def _module(dtype, source="kernels.cu"):
    """The compiled module of `source` for `dtype` on the current device (compiled on first use, then
    cached)."""
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    if source == "reduce.cu":
        dtype = np.float64  # no storage type: one module per device
    # the choices that select a build, not compile_options() itself (~30 us of resource lookups a call)
    key = (dev, source, np.dtype(dtype).name) + _build_variant(source)
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                cc = int(cp.cuda.Device(dev).compute_capability)
                mod = _modules[key] = _Module(*build_module_file(dtype, cc, source))
    return mod


# ---------------------------------------------------------------------------------------------------
# launch configuration


def _n_blocks(C):
    return -(-C // XF_BLOCK)


def threads_for(C):
    """Threads per row: enough for every (block, lane) chain; where the chains are fewer than 128, more
    for the elementwise steps (~16 elements per thread), up to 128 in all; a power of two in [32, 512].
    Never changes the bits.

    The sum steps use one thread per chain (8 per 4096 classes) and leave the rest idle, so threads
    beyond the chains only pay in the max and gradient steps while they take room on the multiprocessor
    from other rows.  On an H200 (benchmarks/README.md, GPU), 32768x32000 float32 (64 chains) took
    12.1-12.6 ms with 128 threads against 14.1-14.7 with 256 (two runs), 131072x4096 (8 chains) 9.4
    against 12.0, and 8192x128256 (256 chains, so 256 threads either way) was within 2 % for 64-256."""
    env = os.environ.get("XENTFAST_CUDA_THREADS")
    if env:
        nt = int(env)
        if nt < 32 or nt > _MAX_THREADS or nt & (nt - 1):
            raise ValueError(f"XENTFAST_CUDA_THREADS: expected a power of two in [32, {_MAX_THREADS}], got {env}")
        return nt
    chains = XF_LANES * _n_blocks(C)
    nt = 32
    while nt < min(chains, _MAX_THREADS):
        nt *= 2
    while nt < _ELEMENTWISE_THREADS and nt * 16 < C:
        nt *= 2
    return nt


def smem_bytes(nt, C, itemsize, cache_row):
    """Dynamic shared memory of a launch: 8 * xf_cu_scratch_doubles(nt, C) (+ the row with cache_row)."""
    nb = _n_blocks(C)
    doubles = max(nt * (_SIZEOF_ROWMAX // 8), 4 * XF_LANES * nb) + 4 * nb
    return 8 * doubles + (C * itemsize if cache_row else 0)


def _smem_limit():
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    try:
        return int(cp.cuda.Device(dev).attributes["MaxSharedMemoryPerBlockOptin"])
    except Exception:
        pass
    try:
        return int(cp.cuda.runtime.deviceGetAttribute(97, dev))  # cudaDevAttrMaxSharedMemoryPerBlockOptin
    except Exception:
        return _DEFAULT_SMEM


def _launch_config(C, itemsize):
    nt = threads_for(C)
    env = os.environ.get("XENTFAST_CUDA_CACHE_ROW", "")
    cache = env != "0" if env else C * itemsize <= _CACHE_ROW_MAX_BYTES
    limit = _smem_limit()
    smem = smem_bytes(nt, C, itemsize, cache)
    if cache and smem > limit:
        cache, smem = False, smem_bytes(nt, C, itemsize, False)
    if smem > limit:
        raise ValueError(f"input: rows of {C} classes need {smem} bytes of shared memory per block, more than "
                         f"this GPU's {limit}; split rows are not implemented yet")
    return nt, int(cache), smem


def _launch(mod, expr, grid, block, args, smem=0):
    """Launch one kernel of `mod`.  Past the default 48 KB of dynamic shared memory a launch fails
    (CUDA_ERROR_INVALID_VALUE) unless that kernel opted in first; the opt-in is per kernel, so it is
    made here, for whichever kernel is launched, not once per launch configuration."""
    if smem > _DEFAULT_SMEM and mod.smem_set.get(expr, 0) < smem:
        with _lock:  # two threads raising one kernel's limit: the larger value must win
            if mod.smem_set.get(expr, 0) < smem:
                mod.kernel(expr).max_dynamic_shared_size_bytes = smem
                mod.smem_set[expr] = smem
    mod.kernel(expr)(grid, block, args, shared_mem=smem)


def _grid(N):
    return min(N, 2**31 - 1)


_sm_counts = {}


def _sm_count(dev):
    n = _sm_counts.get(dev)
    if n is None:
        try:
            n = int(_cupy().cuda.Device(dev).attributes["MultiProcessorCount"])
        except Exception:
            n = 32
        n = _sm_counts[dev] = max(1, n)
    return n


def _flat_grid(n, threads, dev):
    """Blocks of a grid-stride launch over n items: enough to fill the device, never more than needed."""
    return max(1, min(-(-n // threads), 32 * _sm_count(dev), 2**31 - 1))


def _check_size(a, name, size):
    if a.size != size:
        raise ValueError(f"{name}: expected {size} elements, got shape {a.shape}")
    return a


def _check(a, name, dtype=None, ndim=None, device=None):
    cp = _cupy()
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray, got {type(a).__name__}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")
    if device is not None and a.device.id != device:
        raise ValueError(f"{name}: on device {a.device.id}, expected device {device}")
    return a


# ---------------------------------------------------------------------------------------------------
# launch wrappers (signatures of xentfast._core._xent)


def softmax_xent(x, y, t, w, ignore_index, eps, z, row_scale, scale, loss, grad, n_threads, has_y, has_t,
                 has_w, has_row_scale, has_grad, force_phased=False, loss_scale=1.0):
    """Row losses into `loss` (float64, (N,)) and, when has_grad, the gradient into `grad` (may be `x`).

    As ``_xent.softmax_xent`` for CuPy arrays on the current device and stream; arrays flagged absent
    may be placeholders and are passed as NULL.  `n_threads` and `force_phased` are ignored."""
    _check(x, "x", ndim=2)
    N, C = x.shape
    dev = x.device.id
    _check(loss, "loss", np.float64, 1, dev)
    if has_y:
        _check(y, "y", np.int64, 1, dev)
    if has_t:
        _check(t, "t", x.dtype, 2, dev)
    if has_w:
        _check(w, "w", np.float64, 1, dev)
    if has_row_scale:
        _check(row_scale, "row_scale", np.float64, 1, dev)
    if has_grad:
        _check(grad, "grad", x.dtype, 2, dev)
    if N == 0 or C == 0:
        return
    with _cupy().cuda.Device(dev):
        mod = _module(x.dtype)
        nt, cache, smem = _launch_config(C, x.dtype.itemsize)
        # z-loss rows that need the exact logsumexp are flagged here and redone by a second kernel (kernels.cu)
        z_redo = _cupy().zeros(N, dtype=np.uint8) if z != 0 else None
        args = (x, y if has_y else _NULL, t if has_t else _NULL, w if has_w else _NULL,
                row_scale if has_row_scale else _NULL, loss, grad if has_grad else _NULL, np.int64(N), np.int64(C),
                np.int64(ignore_index), np.float64(eps), np.float64(z), np.float64(scale), np.float64(loss_scale),
                np.int32(cache), z_redo if z_redo is not None else _NULL)
        _launch(mod, f"xf_softmax_xent_kernel<{_DTYPES[x.dtype]}>", (_grid(N),), (nt,), args, smem)
        if z_redo is not None:
            _launch(mod, f"xf_xent_z_exact_kernel<{_DTYPES[x.dtype]}>", (_grid(N),), (nt,), args, smem)


def softmax_family(x, out, lse, mode, n_threads, has_lse):
    """mode 0: logsumexp only (into lse, float64); 1: log_softmax into out; 2: softmax into out."""
    _check(x, "x", ndim=2)
    N, C = x.shape
    dev = x.device.id
    if mode != 0:
        _check(out, "out", x.dtype, 2, dev)
    if has_lse:
        _check(lse, "lse", np.float64, 1, dev)
    if N == 0 or C == 0:
        return
    cp = _cupy()
    with cp.cuda.Device(dev):
        mod = _module(x.dtype)
        nt, cache, smem = _launch_config(C, x.dtype.itemsize)
        # rows whose logsumexp cancels are flagged here and recomputed by a second kernel (kernels.cu)
        redo = cp.empty(N, dtype=np.uint8) if has_lse else None
        args = (x, out if mode != 0 else _NULL, lse if has_lse else _NULL, redo if has_lse else _NULL, np.int64(N),
                np.int64(C), np.int32(mode), np.int32(cache))
        _launch(mod, f"xf_softmax_family_kernel<{_DTYPES[x.dtype]}>", (_grid(N),), (nt,), args, smem)
        if has_lse:
            mod.kernel(f"xf_lse_exact_kernel<{_DTYPES[x.dtype]}>")(
                (min(-(-N // 128), 65535),), (128,), (x, lse, redo, np.int64(N), np.int64(C)))


def elementwise(op, x, t, w, w_div, w_mod, pw, pw_div, pw_mod, g, scale, has_ignore, ignore, alpha, gamma, clip,
                eps, clamp, log_clamp, loss_d, loss_o, grad, n_threads, has_w, has_pw, has_g, has_loss_d, has_loss_o,
                has_grad, loss_k=0.0, part=None, g32=None, clamp_lo=0.0, clamp_hi=1.0):
    """One pass of an elementwise binary loss (op: OP_BCE_LOGITS, OP_FOCAL, OP_BCE_PROB), as
    ``_binary.elementwise`` for CuPy arrays on the current device and stream, with its parameters (the
    front end passes them by position).

    x, t: 1-D, float32 or float64; weights (float64) are addressed as w[(i // div) % mod]; arrays flagged
    absent may be placeholders and are passed as NULL; `grad` may be `x` (inplace); losses are written
    times 2**loss_k.  `n_threads` is ignored.  `part` (the CPU's in-kernel sum) and `g32` (float32 upstream
    factors) must be None here: the front end asks for neither on a device (reduce.cu sums loss_d, and
    the upstream factors come in float64)."""
    if clamp and not (0.0 < clamp_lo <= 1.0 and 0.0 <= clamp_hi < 1.0):
        raise ValueError(f"clamp_lo, clamp_hi: the thresholds of log_clamp={log_clamp!r} are needed "
                         f"(xentfast.api_binary._clamp_thresholds); got {clamp_lo!r}, {clamp_hi!r}")
    if part is not None or g32 is not None:
        raise ValueError("part, g32: CPU-only arguments (the front end passes None for device arrays)")
    if op not in _OPS:
        raise ValueError(f"op: expected one of {_OPS}, got {op!r}")
    _check(x, "x", ndim=1)
    if x.dtype not in _DTYPES:
        raise TypeError(f"x: expected float32 or float64, got {x.dtype}")
    n = x.size
    dev = x.device.id
    _check_size(_check(t, "t", x.dtype, 1, dev), "t", n)
    for has, a, name, div, mod in ((has_w, w, "w", w_div, w_mod), (has_pw, pw, "pw", pw_div, pw_mod)):
        if has:
            _check(a, name, np.float64, 1, dev)
            if div < 1 or mod < 1 or mod > a.size:
                raise ValueError(f"{name}: div={div}, mod={mod} do not address its {a.size} elements")
    if has_g:
        _check_size(_check(g, "g", np.float64, 1, dev), "g", n)
    if has_loss_d:
        _check_size(_check(loss_d, "loss_d", np.float64, 1, dev), "loss_d", n)
    if has_loss_o:
        _check_size(_check(loss_o, "loss_o", x.dtype, 1, dev), "loss_o", n)
    if has_grad:
        _check_size(_check(grad, "grad", x.dtype, 1, dev), "grad", n)
    if n == 0:
        return
    with _cupy().cuda.Device(dev):
        mod = _module(x.dtype, "binary.cu")
        expr = f"xf_bin_elementwise_kernel<{_DTYPES[x.dtype]}, {int(op)}>"
        args = (x, t, w if has_w else _NULL, np.int64(w_div if has_w else 1), np.int64(w_mod if has_w else 1),
                pw if has_pw else _NULL, np.int64(pw_div if has_pw else 1), np.int64(pw_mod if has_pw else 1),
                g if has_g else _NULL, np.float64(scale), np.int32(bool(has_ignore)), np.float64(ignore),
                np.float64(alpha), np.float64(gamma), np.int32(bool(clip)), np.float64(eps), np.int32(bool(clamp)),
                np.float64(log_clamp), np.float64(clamp_lo), np.float64(clamp_hi),
                loss_d if has_loss_d else _NULL, loss_o if has_loss_o else _NULL,
                grad if has_grad else _NULL, np.int64(n), np.float64(loss_k))
        mod.kernel(expr)((_flat_grid(n, _ELEM_THREADS, dev),), (_ELEM_THREADS,), args)


def ce_probs(p, y, t, w, ignore_index, row_scale, scale, clip, eps, loss, grad, n_threads, has_y, has_t, has_w,
             has_row_scale, has_grad, loss_k=0.0):
    """Row losses (float64, times 2**loss_k) of cross-entropy from class probabilities `p` (N, C) into
    `loss` and, when has_grad, the gradient into `grad` (may be `p`), as ``_binary.ce_probs`` for CuPy
    arrays on the current device and stream.  Index targets `y` must be range-checked (the caller's).
    A warp per row (binary.cu (d)).  `n_threads` is ignored."""
    _check(p, "p", ndim=2)
    if p.dtype not in _DTYPES:
        raise TypeError(f"p: expected float32 or float64, got {p.dtype}")
    N, C = p.shape
    dev = p.device.id
    _check_size(_check(loss, "loss", np.float64, 1, dev), "loss", N)
    if has_y:
        _check_size(_check(y, "y", np.int64, 1, dev), "y", N)
    if has_t:
        _check_size(_check(t, "t", p.dtype, 2, dev), "t", N * C)
    if has_w:
        _check_size(_check(w, "w", np.float64, 1, dev), "w", C)
    if has_row_scale:
        _check_size(_check(row_scale, "row_scale", np.float64, 1, dev), "row_scale", N)
    if has_grad:
        _check_size(_check(grad, "grad", p.dtype, 2, dev), "grad", N * C)
    if N == 0 or C == 0:
        return
    with _cupy().cuda.Device(dev):
        mod = _module(p.dtype, "binary.cu")
        expr = f"xf_ce_probs_kernel<{_DTYPES[p.dtype]}>"
        args = (p, y if has_y else _NULL, t if has_t else _NULL, w if has_w else _NULL, np.int64(ignore_index),
                row_scale if has_row_scale else _NULL, np.float64(scale), np.int32(bool(clip)), np.float64(eps),
                loss, grad if has_grad else _NULL, np.int64(N), np.int64(C), np.float64(loss_k))
        mod.kernel(expr)((_flat_grid(N, _CE_ROWS, dev),), (_CE_TEAM * _CE_ROWS,), args)


def tree_threads(nb):
    """Threads of the dd_sum tree launch for nb partials: a power of two in [32, 1024], about one per
    merge of the first level.  Never changes the bits."""
    nt = 32
    while nt < _TREE_THREADS and 2 * nt < nb:
        nt *= 2
    return nt


def dd_sum_device(v):
    """Double-double sum of a float64 CuPy vector, as ``_xent.dd_sum`` (the same bits: the fixed shape of
    xentfast/ddsum.h): a 2-element float64 CuPy array (hi, lo), on v's device, computed on the current
    stream without synchronizing."""
    cp = _cupy()
    _check(v, "v", np.float64, 1)
    dev = v.device.id
    with cp.cuda.Device(dev):
        n = v.size
        if n == 0:
            return cp.zeros(2, dtype=np.float64)
        out = cp.empty(2, dtype=np.float64)
        nb = -(-n // XF_DDSUM_BLOCK)
        part = cp.empty(2 * nb, dtype=np.float64)
        mod = _module(np.float64, "reduce.cu")
        mod.kernel("xf_ddsum_blocks_kernel")((_flat_grid(nb, _ROW_THREADS, dev),), (_ROW_THREADS,),
                                             (v, np.int64(n), np.int64(nb), part))
        mod.kernel("xf_ddsum_tree_kernel")((1,), (tree_threads(nb),), (part, np.int64(nb), out))
        return out


def dd_sum(v):
    """Double-double sum of a float64 CuPy vector, as ``_xent.dd_sum``: (hi, lo) floats with the CPU's
    bits.  Reading the result synchronizes the stream (see dd_sum_device)."""
    hi, lo = dd_sum_device(v).get().tolist()
    return hi, lo


def target_weight_sum_device(y, w, ignore_index, has_w, C):
    """Sum of w[y_i] over rows with y_i != ignore_index (1 per row without weights), as
    ``_xent.target_weight_sum`` (same bits), as a 1-element float64 CuPy array computed on the current
    stream without synchronizing.  Labels outside [0, C) that are not ignore_index are skipped, so none
    reads outside `w` (the API rejects them anyway)."""
    cp = _cupy()
    _check(y, "y", np.int64, 1)
    if has_w:
        _check_size(_check(w, "w", np.float64, 1, y.device.id), "w", C)
    with cp.cuda.Device(y.device.id):
        out = cp.zeros(1, dtype=np.float64)
        if y.size == 0:
            return out
        if not has_w:
            # a sum of ones is the count of kept rows: every partial sum is an integer below 2^53, exact
            # in any order, so a parallel sum has the serial kernel's bits without its one thread's
            # walk over every label (~0.1 us a row)
            kept = (y != np.int64(ignore_index)) & (y >= 0) & (y < np.int64(C))
            return kept.sum(dtype=np.float64).reshape(1)
        _module(np.float64, "reduce.cu").kernel("xf_target_weight_sum_kernel")(
            (1,), (1,), (y, w if has_w else _NULL, np.int64(y.size), np.int64(ignore_index), np.int64(C), out))
        return out


def target_weight_sum(y, w, ignore_index, has_w, C):
    """target_weight_sum_device as a Python float (synchronizes the stream)."""
    return float(target_weight_sum_device(y, w, ignore_index, has_w, C).get()[0])
