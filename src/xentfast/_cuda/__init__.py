"""GPU twin of the softmax-family kernels: launch wrappers over CuPy arrays.

The kernels live in ``kernels.cu`` (package data, read through :mod:`importlib.resources`) and include
the SAME numerics headers as the CPU kernels, so CPU and GPU evaluate the same operations in the same
order and agree bit for bit (kernels.cu, design (a)-(e)).

Design
(a) Lazy: importing this module imports neither CuPy nor NVRTC.  ``import xentfast`` works without
    CuPy, without a driver and without a GPU; :func:`gpu_available` probes the device safely.
(b) Compilation: once per (device, dtype), on first use, through NVRTC (:mod:`._nvrtc`), with
    ``-std=c++17 -I<include> --fmad=false -ftz=false --maxrregcount=128 -arch=sm_XX``.  Not through
    ``cupy.RawModule(code=...)``: CuPy appends ``-ftz=true`` after the caller's options and NVRTC honours
    the last one, which flushes subnormal float32 inputs and outputs (kernels.cu (e)).  The cubin is
    loaded with ``cupy.RawModule(path=...)``.
(c) Cache key: the code handed to NVRTC starts with ``// sha256=<digest>``, the digest of every header
    under include/xentfast plus kernels.cu (CuPy's disk cache and ours would otherwise miss
    edits of ``-I`` headers); the on-disk cubin is keyed by that digest, the options, the architecture
    and the NVRTC version (``$XENTFAST_CUDA_CACHE_DIR``, default ``~/.cache/xentfast/cuda``).
(d) Launch wrappers mirror ``xentfast._core._xent`` (same signatures, CuPy arrays, current stream;
    ``n_threads`` is accepted and ignored).  Validation is the caller's (xentfast.api), as for the CPU
    module; here only cheap attribute checks guard against a wrong pointer reaching a kernel.
(e) Launch shape: a block of nt threads per row (kernels.cu (b)); nt never changes the bits.
    ``XENTFAST_CUDA_THREADS`` (a power of two in [32, 512]) and ``XENTFAST_CUDA_CACHE_ROW`` (0 / 1:
    keep the row in shared memory) override the defaults, for benchmarking; so does
    ``XENTFAST_CUDA_ORDER=tree`` (kernels.cu (g): a faster order whose bits may differ from the CPU's).
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
    "name_expressions",
    "softmax_xent",
    "softmax_family",
    "dd_sum",
    "target_weight_sum",
]

XF_BLOCK = 4096          # classes per block (xent_kernels.h)
XF_LANES = 8             # lanes per block (xent_kernels.h)
_SIZEOF_ROWMAX = 40      # sizeof(xf_rowmax): 5 eight-byte fields (tests/test_cuda.py checks it)
_MAX_THREADS = 512       # XF_CU_MAX_THREADS in kernels.cu
_DEFAULT_SMEM = 48 * 1024
_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_NULL = np.uint64(0)     # an absent array: a NULL pointer argument


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
    """(name, bytes) of every header the kernels may include, in a fixed order."""
    out = []
    for sub in (("include", "xentfast"),):
        d = _pkg().joinpath(*sub)
        for entry in sorted(d.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".h"):
                out.append(("/".join(sub + (entry.name,)), entry.read_bytes()))
    return out


def kernel_source():
    """(code, digest): kernels.cu prefixed by ``// sha256=<digest>`` of the headers and kernels.cu."""
    kernel = _pkg().joinpath("_cuda", "kernels.cu").read_bytes()
    h = hashlib.sha256()
    for name, data in _headers() + [("_cuda/kernels.cu", kernel)]:
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


def compile_options():
    """NVRTC options without ``-arch`` (kernels.cu (e) says why each is there)."""
    # --maxrregcount=128 is what __launch_bounds__(512) allows anyway; without it ptxas (NVRTC 12.9) held
    # the float32 cross-entropy kernel to 64 registers and spilled (tests/test_cuda.py reports the counts)
    opts = ("-std=c++17", f"-I{_dir('include')}", "--fmad=false",
            "-ftz=false", "--maxrregcount=128")
    if summation_order() == "tree":
        opts += ("-DXF_CU_TREE_ORDER=1",)
    return opts


def name_expressions(dtype):
    t = _DTYPES[np.dtype(dtype)]
    return (f"xf_softmax_xent_kernel<{t}>", f"xf_softmax_family_kernel<{t}>", "xf_dd_sum_kernel",
            "xf_target_weight_sum_kernel")


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


def build_module_file(dtype, cc):
    """Compile (or find in the disk cache) the kernels for `dtype` and compute capability `cc` (e.g. 90).
    Returns (path of the cubin/PTX file, {name expression: mangled name}).  Needs NVRTC, not a GPU."""
    from . import _nvrtc

    code, digest = kernel_source()
    arch, target = _arch_for(int(cc))
    opts = compile_options() + (f"-arch={arch}",)
    names = name_expressions(dtype)
    key = hashlib.sha256(json.dumps([digest, [o for o in opts if not o.startswith("-I")], names,
                                     list(_nvrtc.version()), target]).encode()).hexdigest()[:32]
    stem = os.path.join(_cache_dir(), f"xentfast-{np.dtype(dtype).name}-{arch}-{key}")
    path, meta = f"{stem}.{target}", f"{stem}.json"
    if os.path.exists(path) and os.path.exists(meta):
        try:
            with open(meta) as f:
                lowered = json.load(f)
        except (OSError, ValueError):
            lowered = {}
        if set(lowered) == set(names):
            return path, lowered
    res = _nvrtc.compile(code, "kernels.cu", opts, names, target)
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


def _module(dtype):
    """The compiled module for `dtype` on the current device (compiled on first use, then cached)."""
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    key = (dev, np.dtype(dtype).name, summation_order())
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                cc = int(cp.cuda.Device(dev).compute_capability)
                mod = _modules[key] = _Module(*build_module_file(dtype, cc))
    return mod


# ---------------------------------------------------------------------------------------------------
# launch configuration


def _n_blocks(C):
    return -(-C // XF_BLOCK)


def threads_for(C):
    """Threads per row: enough for every (block, lane) chain, and at least ~16 elements per thread for
    the elementwise steps, a power of two in [32, 512].  Never changes the bits."""
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
    while nt < 256 and nt * 16 < C:
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


def _launch_config(mod, expr, C, itemsize):
    nt = threads_for(C)
    cache = os.environ.get("XENTFAST_CUDA_CACHE_ROW", "0") not in ("", "0")
    limit = _smem_limit()
    smem = smem_bytes(nt, C, itemsize, cache)
    if cache and smem > limit:
        cache, smem = False, smem_bytes(nt, C, itemsize, False)
    if smem > limit:
        raise ValueError(f"input: rows of {C} classes need {smem} bytes of shared memory per block, more than "
                         f"this GPU's {limit}; split rows are not implemented yet")
    if smem > _DEFAULT_SMEM and mod.smem_set.get(expr, 0) < smem:
        mod.kernel(expr).max_dynamic_shared_size_bytes = smem
        mod.smem_set[expr] = smem
    return nt, int(cache), smem


def _grid(N):
    return min(N, 2**31 - 1)


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
        expr = f"xf_softmax_xent_kernel<{_DTYPES[x.dtype]}>"
        nt, cache, smem = _launch_config(mod, expr, C, x.dtype.itemsize)
        args = (x, y if has_y else _NULL, t if has_t else _NULL, w if has_w else _NULL,
                row_scale if has_row_scale else _NULL, loss, grad if has_grad else _NULL, np.int64(N), np.int64(C),
                np.int64(ignore_index), np.float64(eps), np.float64(z), np.float64(scale), np.float64(loss_scale),
                np.int32(cache))
        mod.kernel(expr)((_grid(N),), (nt,), args, shared_mem=smem)


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
    with _cupy().cuda.Device(dev):
        mod = _module(x.dtype)
        expr = f"xf_softmax_family_kernel<{_DTYPES[x.dtype]}>"
        nt, cache, smem = _launch_config(mod, expr, C, x.dtype.itemsize)
        args = (x, out if mode != 0 else _NULL, lse if has_lse else _NULL, np.int64(N), np.int64(C),
                np.int32(mode), np.int32(cache))
        mod.kernel(expr)((_grid(N),), (nt,), args, shared_mem=smem)


def dd_sum(v):
    """Double-double sum of a float64 CuPy vector in index order, as ``_xent.dd_sum``: (hi, lo) floats.

    One thread on the device (the order is the CPU's); reading the result synchronizes the stream."""
    cp = _cupy()
    _check(v, "v", np.float64, 1)
    with cp.cuda.Device(v.device.id):
        out = cp.zeros(2, dtype=np.float64)
        _module(np.float64).kernel("xf_dd_sum_kernel")((1,), (1,), (v, np.int64(v.size), out))
        hi, lo = out.get().tolist()
    return hi, lo


def target_weight_sum(y, w, ignore_index, has_w):
    """Sum of w[y_i] over rows with y_i != ignore_index (1 per row without weights), as
    ``_xent.target_weight_sum``; labels must be range-checked.  Synchronizes the stream."""
    cp = _cupy()
    _check(y, "y", np.int64, 1)
    if has_w:
        _check(w, "w", np.float64, 1, y.device.id)
    with cp.cuda.Device(y.device.id):
        out = cp.zeros(1, dtype=np.float64)
        _module(np.float64).kernel("xf_target_weight_sum_kernel")(
            (1,), (1,), (y, w if has_w else _NULL, np.int64(y.size), np.int64(ignore_index), out))
        return float(out.get()[0])
