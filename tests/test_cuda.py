"""The GPU twin (issue 5): compile checks, the host model of the CUDA kernels, and the GPU tests.

Without a GPU
  (a) nvcc  -- kernels.cu, binary.cu and reduce.cu compile for sm_90 (cubin, and host + device object)
      with no register spills, and their PTX holds no fused multiply-add but the header's explicit xf_fma
      (none at all with xf_fma emulated: --fmad=false) and no flush-to-zero instruction;
  (b) NVRTC -- the package's own run-time compile path (xentfast._cuda.build_module_file) builds each
      shipped source for sm_90 with the production options; a -ftz=true build is refused;
  (c) host model -- kernels.cu itself, compiled by g++ and run one "thread" at a time (kernels.cu (f)),
      gives the CPU kernels' bits on the contract's Hypothesis strategies and on long multi-block rows,
      for every block size; the counterfactual tree order (kernels.cu (g)) is measured against it.
      binary.cu and reduce.cu likewise (tests/cuda_model/binary_model.cpp): every op, option and dtype
      of xentfast._core._binary, in any element order; dd_sum's fixed tree (xentfast/ddsum.h) against
      the CPU's (thread-invariant) and against the exact sum;
With a GPU (marker ``gpu``; conftest skips them visibly without a device)
  (d) the CUDA kernels give the CPU's bits and meet the contract; inplace, streams, shared-memory opt-in,
      FTZ guard; the binary family and dd_sum; the public API's dispatch (xfail until api.py routes CuPy
      arrays to xentfast._cuda).
"""
import contextlib
import ctypes
import inspect
import math
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import xentfast
import xentfast as xf
from xentfast import _cuda, api_binary
from xentfast import reference as ref
from xentfast._core import _binary, _xent
from xentfast._cuda import _nvrtc
from xentfast.testing import (assert_ulp_close, binary_logits, binary_targets, binary_xent_cases, class_weights,
                              element_weights, index_targets, logits, prob_targets, softmax_xent_cases, ulp,
                              unit_probabilities)

PKG = Path(xentfast.__file__).resolve().parent
INCLUDES = [PKG / "include", PKG / "_core", PKG / "_cuda"]  # _core: the host model also builds the CPU side
MODEL_SRC = Path(__file__).resolve().parent / "cuda_model" / "host_model.cpp"
BINARY_MODEL_SRC = Path(__file__).resolve().parent / "cuda_model" / "binary_model.cpp"
DTYPES = [np.float32, np.float64]
BOUND = {np.dtype(np.float32): 2.0, np.dtype(np.float64): 4.0}

# explicit instantiations for nvcc (CuPy/NVRTC instantiate through name expressions instead)
INSTANTIATE = """#include "kernels.cu"
#define XF_INST(T) \\
template __global__ void xf_softmax_xent_kernel<T>(const T *, const long long *, const T *, const double *, \\
    const double *, double *, T *, long long, long long, long long, double, double, double, double, int, \\
    unsigned char *); \\
template __global__ void xf_xent_z_exact_kernel<T>(const T *, const long long *, const T *, const double *, \\
    const double *, double *, T *, long long, long long, long long, double, double, double, double, int, \\
    unsigned char *); \\
template __global__ void xf_softmax_family_kernel<T>(const T *, T *, double *, unsigned char *, long long, \\
    long long, int, int); \\
template __global__ void xf_lse_exact_kernel<T>(const T *, double *, const unsigned char *, long long, long long);
XF_INST(float)
XF_INST(double)
"""
BIN_INSTANTIATE = """#include "binary.cu"
#include "reduce.cu"
#define XF_BINST(T, OP) \
template __global__ void xf_bin_elementwise_kernel<T, OP>(const T *, const T *, const double *, long long, \
    long long, const double *, long long, long long, const double *, double, int, double, double, double, int, \
    double, int, double, double, double, double *, T *, T *, long long, double);
#define XF_CINST(T) \
template __global__ void xf_ce_probs_kernel<T>(const T *, const long long *, const T *, const double *, \
    long long, const double *, double, int, double, double *, T *, long long, long long, double);
XF_BINST(float, 0) XF_BINST(float, 1) XF_BINST(float, 2) XF_CINST(float)
XF_BINST(double, 0) XF_BINST(double, 1) XF_BINST(double, 2) XF_CINST(double)
"""
NVCC_UNITS = {"softmax": INSTANTIATE, "binary+reduce": BIN_INSTANTIATE}


# ---------------------------------------------------------------------------------------------------
# bit comparison


def _ordered(a):
    """Floats mapped to integers whose order and differences are those of the floats (ulp distance)."""
    a = np.asarray(a)
    i = a.view(np.int32 if a.dtype == np.float32 else np.int64).astype(np.int64)
    top = np.int64(0x7FFFFFFF if a.dtype == np.float32 else 0x7FFFFFFFFFFFFFFF)
    return np.where(i < 0, -(i & top), i)


def ulp_distance(a, b):
    """|a - b| in units in the last place of their dtype, elementwise; 0 where both are NaN."""
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(over="ignore"):
        d = np.abs(_ordered(a) - _ordered(b)).astype(np.float64)
    d[both_nan] = 0.0
    d[np.isnan(a) ^ np.isnan(b)] = np.inf
    return d


def assert_same_bits(actual, expected, what):
    """Equal values, zero signs included; NaN matches NaN (payloads differ between CPUs and GPUs)."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.dtype == e.dtype and a.shape == e.shape, (what, a.dtype, a.shape, e.dtype, e.shape)
    same = ((a == e) & (np.signbit(a) == np.signbit(e))) | (np.isnan(a) & np.isnan(e))
    if same.all():
        return
    bad = np.argwhere(~same)
    k = tuple(int(i) for i in bad[0])
    raise AssertionError(
        f"{what}: {len(bad)} of {a.size} entries differ from the CPU's bits; first at {k}: "
        f"{a[k]!r} ({float(a[k]).hex()}) vs CPU {e[k]!r} ({float(e[k]).hex()}), "
        f"{ulp_distance(a[k], e[k])} ulp apart")


# ---------------------------------------------------------------------------------------------------
# problems and backends (the CPU kernel, the host model, the GPU kernel), all at _xent's interface


class Args(NamedTuple):
    x: np.ndarray
    y: np.ndarray | None
    t: np.ndarray | None
    w: np.ndarray | None
    ignore_index: int
    eps: float
    z: float
    row_scale: np.ndarray | None
    scale: float
    loss_scale: float = 1.0


def args_from_case(case, row_scale=None, scale=1.0, loss_scale=1.0):
    """Kernel arguments as xentfast.api hands them over: contiguous rows, int64 labels, float64 weights."""
    x = np.ascontiguousarray(case.logits)
    if case.target.dtype.kind in "iu":
        y, t = np.ascontiguousarray(case.target, dtype=np.int64), None
    else:
        y, t = None, np.ascontiguousarray(case.target, dtype=x.dtype)
    w = None if case.weight is None else np.ascontiguousarray(case.weight, dtype=np.float64)
    return Args(x, y, t, w, case.ignore_index, case.label_smoothing, case.z_loss, row_scale, scale, loss_scale)


def _draw_args(data, dtype):
    case = data.draw(softmax_xent_cases(dtype), label="case")
    n = case.logits.shape[0]
    rs = data.draw(st.sampled_from([None, "random"]), label="row_scale")
    row_scale = None if rs is None else np.random.default_rng(n).uniform(-2, 2, n)
    scale = data.draw(st.sampled_from([1.0, 0.25, 1.0 / 3.0, 1e-300]), label="scale")
    loss_scale = data.draw(st.sampled_from([1.0, 0.5, 2.0**-10]), label="loss_scale")
    return args_from_case(case, row_scale, scale, loss_scale)


def _or(a, empty):
    return a if a is not None else empty


def cpu_xent(a, grad=True):
    N, C = a.x.shape
    loss = np.empty(N)
    g = np.empty_like(a.x) if grad else np.empty((0, 0), a.x.dtype)
    _xent.softmax_xent(a.x, _or(a.y, np.empty(0, np.int64)), _or(a.t, np.empty((0, 0), a.x.dtype)),
                       _or(a.w, np.empty(0)), a.ignore_index, a.eps, a.z, _or(a.row_scale, np.empty(0)), a.scale,
                       loss, g, 1, a.y is not None, a.t is not None, a.w is not None, a.row_scale is not None, grad,
                       **({} if a.loss_scale == 1.0 else {"loss_scale": a.loss_scale}))
    return loss, (g if grad else None)


def cpu_family(x, mode):
    N, C = x.shape
    out = np.empty_like(x) if mode else np.empty((0, 0), x.dtype)
    lse = np.empty(N)
    _xent.softmax_family(x, out, lse, mode, 1, True)
    return (out if mode else None), lse


def _sfx(dtype):
    return "f32" if np.dtype(dtype) == np.float32 else "f64"


def _ptr(a):
    return None if a is None else a.ctypes.data


class HostModel:
    """ctypes front end of tests/cuda_model/host_model.cpp."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        P, LL, D, I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double, ctypes.c_int
        for s in ("f32", "f64"):
            f = getattr(lib, f"xf_model_xent_{s}")
            f.restype, f.argtypes = None, [P] * 7 + [LL] * 3 + [D] * 4 + [I] * 3
            f = getattr(lib, f"xf_model_family_{s}")
            f.restype, f.argtypes = None, [P] * 3 + [LL] * 2 + [I] * 4
        lib.xf_model_scratch_bytes.restype, lib.xf_model_scratch_bytes.argtypes = LL, [I, LL]
        lib.xf_model_sizeof_rowmax.restype, lib.xf_model_sizeof_rowmax.argtypes = I, []

    def xent(self, a, grad=True, nt=64, cache_row=False, order=0, inplace=False):
        N, C = a.x.shape
        x = a.x.copy() if inplace else a.x
        loss = np.full(N, np.nan)
        g = (x if inplace else np.full_like(a.x, np.nan)) if grad else None
        getattr(self.lib, f"xf_model_xent_{_sfx(x.dtype)}")(
            _ptr(x), _ptr(a.y), _ptr(a.t), _ptr(a.w), _ptr(a.row_scale), _ptr(loss), _ptr(g), N, C,
            a.ignore_index, a.eps, a.z, a.scale, a.loss_scale, int(cache_row), nt, order)
        return loss, g

    def family(self, x, mode, nt=64, cache_row=False, order=0):
        N, C = x.shape
        out = np.full_like(x, np.nan) if mode else None
        lse = np.full(N, np.nan)
        getattr(self.lib, f"xf_model_family_{_sfx(x.dtype)}")(
            _ptr(x), _ptr(out), _ptr(lse), N, C, mode, int(cache_row), nt, order)
        return out, lse


def _build_model(tmp_path_factory, tree):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler: the host model of the CUDA kernels cannot be built")
    out = tmp_path_factory.mktemp("cuda_model") / f"host_model_{'tree' if tree else 'cpu'}.so"
    # the CPU kernels' arithmetic flags (setup.py): no contraction, no fast math
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-w",
           *[f"-I{d}" for d in INCLUDES], f"-DXF_CU_TREE_ORDER={int(tree)}", str(MODEL_SRC), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"host model build failed:\n{' '.join(cmd)}\n{r.stderr}"
    return HostModel(out)


@pytest.fixture(scope="session")
def host_model(tmp_path_factory):
    return _build_model(tmp_path_factory, tree=False)


@pytest.fixture(scope="session")
def tree_model(tmp_path_factory):
    return _build_model(tmp_path_factory, tree=True)


def order_sensitive(rng, N, C, dtype):
    """Rows of comparable exponentials (uniform logits in [0, 2)): every summation order rounds
    differently here, so equal bits are evidence of an equal order, not luck."""
    return (rng.random((N, C)) * 2).astype(dtype)


# ---------------------------------------------------------------------------------------------------
# (a) nvcc


def _nvcc():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA compile check did not run")
    return nvcc


# Every nvcc run of the checks below, by name: (arguments, unit, output file name).  Each is a compile
# of 2-30 s, about 110 s one after the other on 2 cores; the first check starts those of every selected
# check on a pool of one worker per core (nvcc_runs), so that the later checks find theirs done or under
# way, and a run of one check (-k) waits for its own compiles only.
_NVCC_CUBIN = ["-cubin", "-arch=sm_90", "--resource-usage", "--fmad=false", "--maxrregcount=128"]
NVCC_JOBS = {
    **{f"cubin-order{order}": (_NVCC_CUBIN + [f"-DXF_CU_TREE_ORDER={order}"], INSTANTIATE, "k.cubin")
       for order in (0, 1)},
    "cubin-binary": (_NVCC_CUBIN, BIN_INSTANTIATE, "k.cubin"),
    **{f"{kind}-{unit}": (args, src, out)
       for unit, src in sorted(NVCC_UNITS.items())
       for kind, args, out in (
           ("ptx-emulated-fma", ["--ptx", "-arch=sm_90", "--fmad=false", "-DXF_FMA_EMULATE=1"], "k.ptx"),
           ("ptx", ["--ptx", "-arch=sm_90", "--fmad=false"], "k.ptx"),
           ("ptx-default-fmad", ["--ptx", "-arch=sm_90"], "k.ptx"),
           ("object", ["-c", "-arch=sm_90", "--fmad=false"], "k.o"))},
}
# the jobs each check reads, from its parameters (a job missing here is still compiled, when first asked for)
NVCC_JOBS_OF_CHECK = {
    "test_nvcc_cubin_sm90_registers_and_spills": lambda order: [f"cubin-order{order}"],
    "test_nvcc_binary_and_reduce_cubin_sm90_no_spills": lambda: ["cubin-binary"],
    "test_nvcc_ptx_has_no_fma_and_no_ftz":
        lambda unit: [f"ptx-emulated-fma-{unit}", f"ptx-{unit}", f"ptx-default-fmad-{unit}"],
    "test_nvcc_host_and_device_object": lambda unit: [f"object-{unit}"],
}


def _run_nvcc_job(nvcc, args, unit, out, spawn_tries=3):
    src = out.parent / "instantiate.cu"
    src.write_text(unit)
    cmd = [nvcc, "-std=c++17", *[f"-I{d}" for d in INCLUDES], *args, "-o", str(out), str(src)]
    # A failure to start the process says nothing about the source: once in a fresh CI run (2026-12-07)
    # one of the jobs, spawned beside the others from the pool, failed with "[Errno 14] Bad address" for
    # nvcc itself and passed on every run after.  Starting again is harmless; nvcc's own failures (a
    # returncode) are never retried, and a spawn error that persists is raised.
    for attempt in range(spawn_tries):
        try:
            return cmd, subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent)
        except OSError:
            if attempt + 1 == spawn_tries:
                raise


class _NvccRuns(dict):
    """{job name: future of (command, completed process)}; a name not started yet starts when read."""

    def __init__(self, submit):
        super().__init__()
        self._submit = submit

    def __missing__(self, name):
        self[name] = self._submit(name)
        return self[name]


@pytest.fixture(scope="module")
def nvcc_runs(request, tmp_path_factory):
    """The compiles of every selected nvcc check, started at once."""
    nvcc = _nvcc()
    pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1))

    def submit(name):
        args, unit, out = NVCC_JOBS[name]
        return pool.submit(_run_nvcc_job, nvcc, args, unit, tmp_path_factory.mktemp("nvcc") / out)

    wanted = set()
    for item in request.session.items:
        jobs_of = NVCC_JOBS_OF_CHECK.get(getattr(item, "originalname", None))
        if jobs_of is not None:
            wanted.update(jobs_of(**(item.callspec.params if hasattr(item, "callspec") else {})))
    # the three longest (25-30 s each on this kind of machine) first: the others fill in around them
    order = ["cubin-order0", "object-softmax", "cubin-order1"]
    order += [name for name in NVCC_JOBS if name not in order]
    runs = _NvccRuns(submit)
    for name in order:
        if name in wanted:
            runs[name] = submit(name)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


def _nvcc_result(nvcc_runs, name):
    """The compile's output (stdout and stderr) and its output file, once it has succeeded."""
    cmd, r = nvcc_runs[name].result()
    assert r.returncode == 0, f"nvcc failed:\n{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr, Path(cmd[cmd.index("-o") + 1])


def parse_ptxas(log):
    """{kernel: (registers, spill stores, spill loads)} from ptxas -v / --resource-usage output."""
    out, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = [None, None, None]
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            out[name][1:] = [int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name][0] = int(m.group(1))
    return {k: tuple(v) for k, v in out.items()}


# kernels.cu, XF_CU_XENT_MIN_BLOCKS: the cross-entropy row kernel is held to 64 registers (4 blocks of 256
# threads per multiprocessor) and may spill this much, measured faster so on an H200 than spill-free at 72
XENT_KERNEL_REGISTERS, XENT_KERNEL_SPILL_BYTES = 64, 32


def _over_budget(usage, kernels):
    """{kernel: usage} of the row kernels that spill (the cross-entropy kernel: beyond its budget)."""
    def ok(k):
        regs, stores, loads = usage[k]
        if "xf_softmax_xent_kernel" in k:
            return regs <= XENT_KERNEL_REGISTERS and max(stores, loads) <= XENT_KERNEL_SPILL_BYTES
        return not (stores or loads)
    return {k: usage[k] for k in kernels if not ok(k)}


def _report(title, usage):
    print(f"\n{title}")
    for k, (regs, st_, ld) in sorted(usage.items()):
        where = f"{regs:4d} registers" if regs is not None else "(device function)"
        print(f"  {k:70s} {where}, spills {st_}/{ld} bytes")


@pytest.mark.nvcc
@pytest.mark.parametrize("order", [0, 1], ids=["cpu-order", "tree-order"])
def test_nvcc_cubin_sm90_registers_and_spills(nvcc_runs, order):
    log, _ = _nvcc_result(nvcc_runs, f"cubin-order{order}")
    usage = parse_ptxas(log)
    _report(f"nvcc -cubin -arch=sm_90 (XF_CU_TREE_ORDER={order}):", usage)
    kernels = [k for k in usage if "xf_softmax" in k]
    assert len(kernels) == 4, usage
    assert all(usage[k][0] is not None for k in kernels), log
    # the exact logsumexp of cancelling rows and the z-loss rows redone with it (rare paths, kernels of
    # their own and out-of-line functions with multi-word integer arrays) may use local memory; the row
    # kernels must stay within their budgets (_over_budget)
    exact = [k for k in usage if "xf_lse_exact_kernel" in k or "xf_lse_cancelling" in k or "z_exact" in k]
    assert len([k for k in exact if "kernel" in k]) == 4, usage
    if order == 0:  # the shipped configuration; the counterfactual is only reported
        assert not _over_budget(usage, kernels), f"registers or spills over budget: {_over_budget(usage, kernels)}"


@pytest.mark.nvcc
def test_nvcc_binary_and_reduce_cubin_sm90_no_spills(nvcc_runs):
    log, _ = _nvcc_result(nvcc_runs, "cubin-binary")
    usage = parse_ptxas(log)
    _report("nvcc -cubin -arch=sm_90 (binary.cu, reduce.cu):", usage)
    assert len([k for k in usage if "xf_bin_elementwise" in k]) == 6, usage
    assert len([k for k in usage if "xf_ce_probs" in k]) == 2, usage
    assert len([k for k in usage if "xf_ddsum" in k or "xf_target_weight_sum" in k]) == 3, usage
    # every kernel's registers were read (the float focal loss's out-of-line general form, a device function,
    # has none of its own)
    assert all(u[0] is not None for k, u in usage.items() if "kernel" in k), log
    spilling = {k: u for k, u in usage.items() if u[1] or u[2]}
    assert not spilling, f"register spills: {spilling}"
    # no 8 KiB gather buffer of the CPU block functions reached a kernel (binary.cu (b))
    assert not re.search(r"\b([1-9]\d{3,}) bytes stack frame", log), log


@pytest.mark.nvcc
@pytest.mark.parametrize("unit", sorted(NVCC_UNITS))
def test_nvcc_ptx_has_no_fma_and_no_ftz(nvcc_runs, unit):
    # with xf_fma emulated, any fma.rn left would be a contraction of nvcc's own
    ptx = _nvcc_result(nvcc_runs, f"ptx-emulated-fma-{unit}")[1].read_text()
    n_fma, n_ftz = len(re.findall(r"\bfma\.rn", ptx)), len(re.findall(r"\.ftz\b", ptx))
    print(f"\nPTX ({unit}) with --fmad=false, xf_fma emulated: {len(ptx)} bytes, {n_fma} fma.rn, {n_ftz} .ftz")
    assert n_fma == 0 and n_ftz == 0
    # the shipped build: fma.rn from xf_fma (__fma_rn) only, fewer than nvcc's default contraction makes
    n_explicit = len(re.findall(r"\bfma\.rn", _nvcc_result(nvcc_runs, f"ptx-{unit}")[1].read_text()))
    # the check has teeth: nvcc's default contracts the same source into fused multiply-adds
    default_ptx = _nvcc_result(nvcc_runs, f"ptx-default-fmad-{unit}")[1].read_text()
    n_default = len(re.findall(r"\bfma\.rn", default_ptx))
    print(f"PTX ({unit}): {n_explicit} fma.rn from xf_fma, {n_default} with nvcc's default --fmad=true")
    assert 0 < n_explicit < n_default


@pytest.mark.nvcc
@pytest.mark.parametrize("unit", sorted(NVCC_UNITS))
def test_nvcc_host_and_device_object(nvcc_runs, unit):
    # a full build runs the host pass too (the __CUDA_ARCH__ pitfall of notes/kernels.md section 3)
    _, obj = _nvcc_result(nvcc_runs, f"object-{unit}")
    assert obj.stat().st_size > 0


# ---------------------------------------------------------------------------------------------------
# (b) NVRTC: the run-time compile path, without a driver


needs_nvrtc = pytest.mark.skipif(not _nvrtc.available(),
                                 reason="no NVRTC library (pip install nvidia-cuda-nvrtc-cu12): NVRTC check not run")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XENTFAST_CUDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XENTFAST_CUDA_ORDER", raising=False)
    return tmp_path / "cache"


@needs_nvrtc
@pytest.mark.parametrize("source", _cuda.SOURCES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nvrtc_builds_the_shipped_kernels(kernel_cache, dtype, source, monkeypatch):
    print(f"\nNVRTC {_nvrtc.version()} from {_nvrtc.library_path()}")
    path, lowered = _cuda.build_module_file(dtype, 90, source)
    assert path.endswith(".cubin") and os.path.getsize(path) > 0
    assert set(lowered) == set(_cuda.name_expressions(dtype, source))
    assert all(v.startswith("_Z") for v in lowered.values())
    # cached: a second build compiles nothing
    monkeypatch.setattr(_nvrtc, "compile", lambda *a, **k: pytest.fail("recompiled a cached module"))
    assert _cuda.build_module_file(dtype, 90, source) == (path, lowered)


@pytest.fixture
def shipped_options(monkeypatch):
    """The build options as shipped, whatever the caller's environment selects for benchmarking."""
    for name in ("XENTFAST_CUDA_XENT_MIN_BLOCKS", "XENTFAST_CUDA_ORDER"):
        monkeypatch.delenv(name, raising=False)


@needs_nvrtc
@pytest.mark.parametrize("source", _cuda.SOURCES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nvrtc_registers_and_spills(dtype, source, shipped_options):
    code, _ = _cuda.kernel_source(source)
    res = _nvrtc.compile(code, source, _cuda.compile_options(source) + ("-arch=sm_90", "-Xptxas=-v"),
                         _cuda.name_expressions(dtype, source))
    usage = parse_ptxas(res.log)
    _report(f"NVRTC {_nvrtc.version()} -arch=sm_90, production options ({source}, {np.dtype(dtype).name}):",
            usage)
    kernels = set(res.lowered.values())
    assert kernels <= set(usage)
    # besides the kernels only the out-of-line rare paths may appear: the exact logsumexp, the z-loss's
    # exact rows and the float64 rows whose loss is tiny (kernels.cu), the float32 focal loss's general
    # form (binary.cu)
    rare = ("xf_lse_cancelling", "xf_cu_z_exact", "xf_cu_tiny_loss", "xf_cu_focal_general_apart")
    assert all(any(r in k for r in rare) for k in set(usage) - kernels), usage
    # xf_xent_z_exact_kernel redoes rare rows (a few dozen bytes of spills)
    over = _over_budget(usage, [k for k in kernels if "z_exact" not in k])
    assert not over, f"registers or spills over budget: {over}"


@needs_nvrtc
@pytest.mark.parametrize("source", _cuda.SOURCES)
def test_nvrtc_ptx_has_no_fma_and_no_ftz(source):
    code, _ = _cuda.kernel_source(source)
    names = tuple(dict.fromkeys(_cuda.name_expressions(np.float32, source) +
                                _cuda.name_expressions(np.float64, source)))
    # with xf_fma emulated (its __fma_rn are the only fused multiply-adds meant to be there)
    ptx = _nvrtc.compile(code, source, _cuda.compile_options(source) + ("-arch=compute_90", "-DXF_FMA_EMULATE=1"),
                         names, target="ptx").code.decode()
    n_fma, n_ftz = len(re.findall(r"\bfma\.rn", ptx)), len(re.findall(r"\.ftz\b", ptx))
    print(f"\nNVRTC PTX ({source}), xf_fma emulated: {len(ptx)} bytes, {n_fma} fma.rn, {n_ftz} .ftz")
    assert n_fma == 0 and n_ftz == 0
    assert re.search(r"\badd\.(rn\.)?f64", ptx)  # the arithmetic is there for the checks to see
    if source != "reduce.cu":
        assert re.search(r"cvt\.rn\.f32\.f64", ptx) and re.search(r"cvt\.f64\.f32", ptx)  # the checks see them


@needs_nvrtc
@pytest.mark.parametrize("source", _cuda.SOURCES)
def test_nvrtc_refuses_a_flush_to_zero_build(source):
    # what cupy.RawModule(code=...) would do: CuPy appends -ftz=true after the caller's options
    code, _ = _cuda.kernel_source(source)
    with pytest.raises(_nvrtc.NVRTCError, match="ftz=false"):
        _nvrtc.compile(code, source, _cuda.compile_options(source) + ("-arch=compute_90", "-ftz=true"),
                       _cuda.name_expressions(np.float32, source)[:1], target="ptx")


@pytest.mark.parametrize("source, header", [("kernels.cu", "include/xentfast/numerics.h"),
                                            ("binary.cu", "_core/binary_blocks.h"),
                                            ("binary.cu", "include/xentfast/binary.h"),
                                            ("reduce.cu", "include/xentfast/ddsum.h")])
def test_kernel_source_is_keyed_by_every_header(monkeypatch, source, header):
    code, digest = _cuda.kernel_source(source)
    assert code.startswith(f"// sha256={digest}\n") and len(digest) == 64
    names = [n for n, _ in _cuda._headers()]
    for needed in ("include/xentfast/numerics.h", "include/xentfast/xf_math.h", "include/xentfast/config.h",
                   "include/xentfast/softmax_row.h", "include/xentfast/binary.h", "include/xentfast/ddsum.h",
                   "_core/binary_kernels.h", "_core/binary_blocks.h"):
        assert needed in names
    real = _cuda._headers()
    edited = [(n, d + b"\n/* edit */" if n == header else d) for n, d in real]
    monkeypatch.setattr(_cuda, "_headers", lambda: edited)
    assert _cuda.kernel_source(source)[1] != digest


def test_every_source_includes_only_hashed_headers():
    """The digest covers the -I directories; a source must not include anything from elsewhere."""
    names = {n.rsplit("/", 1)[-1] for n, _ in _cuda._headers()} | set(_cuda.SOURCES)
    for source in _cuda.SOURCES:
        text = (PKG / "_cuda" / source).read_text()
        for inc in re.findall(r'#include\s+"([^"]+)"', text):
            assert inc.rsplit("/", 1)[-1] in names, (source, inc)
    assert _cuda.kernel_source("binary.cu")[1] != _cuda.kernel_source("reduce.cu")[1]
    with pytest.raises(ValueError):
        _cuda.kernel_source("nope.cu")


def test_compile_options(shipped_options):
    opts = _cuda.compile_options()
    for o in ("-std=c++17", "--fmad=false", "-ftz=false"):
        assert o in opts
    assert any(o.startswith("-I") and o.endswith("include") for o in opts)
    assert any(o.startswith("-I") and o.endswith("_core") for o in opts)  # binary.cu: binary_kernels.h
    assert "-DXF_CU_XENT_MIN_BLOCKS=2" in opts
    # the other sources do not read it: one build of each serves every value
    assert not any("XF_CU_XENT_MIN_BLOCKS" in o for o in _cuda.compile_options("binary.cu"))


def test_xent_min_blocks_option(monkeypatch):
    monkeypatch.setenv("XENTFAST_CUDA_XENT_MIN_BLOCKS", "1")
    assert "-DXF_CU_XENT_MIN_BLOCKS=1" in _cuda.compile_options()
    monkeypatch.setenv("XENTFAST_CUDA_XENT_MIN_BLOCKS", "3")
    with pytest.raises(ValueError, match="XENTFAST_CUDA_XENT_MIN_BLOCKS"):
        _cuda.compile_options()


def test_import_needs_neither_cupy_nor_a_gpu():
    code = ("import sys, xentfast, xentfast._cuda as c; assert 'cupy' not in sys.modules; "
            "print(c.gpu_available())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("True", "False")
    assert not _cuda.is_cupy_array(np.zeros(3))


def test_launch_shape():
    for C in (1, 10, 1000, 4096, 32000, 128256, 10**6):
        nt = _cuda.threads_for(C)
        assert 32 <= nt <= 512 and nt & (nt - 1) == 0
    assert _cuda.threads_for(128256) >= 8 * 32  # one thread per (block, lane) chain
    # past the chains, the elementwise steps grow a row's threads only up to 128: idle threads in the sum
    # steps hold room that other rows could use (threads_for's docstring has the measurement)
    assert _cuda.threads_for(32000) == 128 and _cuda.threads_for(4096) == 128
    assert _cuda.threads_for(1000) == 64


def test_rows_of_at_most_16_kb_stay_in_shared_memory_unless_told(monkeypatch):
    monkeypatch.setattr(_cuda, "_smem_limit", lambda: 227 * 1024)
    monkeypatch.delenv("XENTFAST_CUDA_CACHE_ROW", raising=False)
    cached = lambda C, itemsize: _cuda._launch_config(C, itemsize)[1]
    assert cached(1, 4) == cached(4096, 4) == cached(2048, 8) == 1
    assert cached(4097, 4) == cached(2049, 8) == cached(128256, 4) == 0
    monkeypatch.setenv("XENTFAST_CUDA_CACHE_ROW", "0")
    assert cached(1000, 4) == 0
    monkeypatch.setenv("XENTFAST_CUDA_CACHE_ROW", "1")
    assert cached(32000, 4) == 1
    assert cached(10**6, 4) == 0  # past the shared memory: global rows, not an error


# ---------------------------------------------------------------------------------------------------
# (c) the host model: kernels.cu on the CPU, against the CPU kernels


def test_model_scratch_layout_matches_the_launcher(host_model):
    assert host_model.lib.xf_model_sizeof_rowmax() == _cuda._SIZEOF_ROWMAX
    for nt in (32, 64, 256, 512):
        for C in (1, 7, 4096, 4097, 128256, 10**6):
            assert host_model.lib.xf_model_scratch_bytes(nt, C) == _cuda.smem_bytes(nt, C, 4, False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_model_gives_the_cpu_bits(host_model, dtype, data):
    a = _draw_args(data, dtype)
    nt = data.draw(st.sampled_from([32, 64, 128, 512]), label="nt")
    cache = data.draw(st.booleans(), label="cache_row")
    order = data.draw(st.sampled_from([0, 1, 2]), label="thread order")
    inplace = data.draw(st.booleans(), label="inplace")
    grad = inplace or data.draw(st.booleans(), label="grad")
    lc, gc = cpu_xent(a, grad)
    lm, gm = host_model.xent(a, grad, nt, cache, order, inplace)
    assert_same_bits(lm, lc, "row losses")
    if grad:
        assert_same_bits(gm, gc, "gradient")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_model_family_gives_the_cpu_bits(host_model, dtype, data):
    x = data.draw(logits(dtype, allow_nan=True, allow_posinf=True), label="x")
    mode = data.draw(st.sampled_from([0, 1, 2]), label="mode")
    nt = data.draw(st.sampled_from([32, 128, 512]), label="nt")
    cache = data.draw(st.booleans(), label="cache_row")
    oc, lc = cpu_family(x, mode)
    om, lm = host_model.family(x, mode, nt, cache, order=2)
    assert_same_bits(lm, lc, "logsumexp (double)")
    if mode:
        assert_same_bits(om, oc, ["", "log_softmax", "softmax"][mode])


def _long_row_problems(dtype):
    """Rows over several 4096-class blocks, with the features that take each code path."""
    rng = np.random.default_rng(5)
    probs = []
    for C in (4095, 4096, 4097, 3 * 4096 + 5, 20000):
        x = order_sensitive(rng, 6, C, dtype)
        x[1, C - 1] = 5.0                      # argmax in the last block
        x[2, [3, C // 2, C - 2]] = 4.0         # tied maxima in different blocks: the first one wins
        x[3, rng.random(C) < 0.3] = -np.inf    # masks
        x[4, :] = x[4, :] * 300 - 700          # spread over the exp range
        y = rng.integers(0, C, 6).astype(np.int64)
        y[1] = C - 1
        y[5] = -100
        t = rng.random((6, C)).astype(dtype)
        t /= t.sum(axis=1, keepdims=True)
        t_neg = t.copy()
        t_neg[::2, C // 2] = -0.25             # a negative target: those rows' terms add compensated
        w = rng.uniform(0, 2, C)
        probs += [
            Args(x, y, None, None, -100, 0.0, 0.0, None, 1.0),
            Args(x, y, None, w, -100, 0.1, 1e-2, rng.uniform(-1, 1, 6), 0.5),
            Args(x, None, t, w, -100, 0.2, 1e-4, None, 1.0 / 3.0),
            Args(x, None, t_neg, None, -100, 0.0, 0.0, None, 1.0),
        ]
    if np.dtype(dtype) == np.float64:
        # the rare float64 paths: a tiny-sum rescue over a multi-block row, scaled gradients
        x = np.zeros((2, 9000))
        x[0, 0], x[0, 1] = 712.0, 2.0
        x[1, :3] = [710.75, 1.75, 0.0]
        y = np.array([0, 0], dtype=np.int64)
        probs += [Args(x, y, None, None, -100, 0.0, 0.0, None, 1.0),
                  Args(x, y, None, np.full(9000, 7.0), -100, 0.0, 0.01, None, 1.0)]
        # rescued rows whose length is no multiple of the rescue's 8 lanes, the argmax in the first, the
        # last and a middle lane, entries beyond the rescue's reach, a masked one, a weight lifting w_y s
        C = 4099
        x = -np.linspace(700.0, 1250.0, 4 * C).reshape(4, C)
        y = np.array([5, C - 1, 0, 2], dtype=np.int64)
        x[np.arange(4), y] = 0.0
        x[2, 7] = -np.inf
        x[3] = -rng.uniform(740.0, 1120.0, C)
        x[3, 2] = 0.0
        w = np.full(C, 1e300)
        probs += [Args(x, y, None, None, -100, 0.0, 0.0, None, 1.0),
                  Args(x, y, None, w, -100, 0.0, 0.0, None, 1.0)]
    return probs


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("inplace", [False, True], ids=["grad", "inplace"])
def test_model_z_loss_exact_rows_give_the_cpu_bits(host_model, dtype, inplace):
    # rows the row kernel leaves to xf_xent_z_exact_kernel: lse ~ 0 (m + log S cancels) and lse ~ -1 with
    # z = 0.5 (A + 2 z r lse cancels); their logits must still be there for it when inplace
    rng = np.random.default_rng(12)
    n, c = 8, 300
    x = rng.standard_normal((n, c))
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    x[4:] -= 1.0 + np.geomspace(1e-9, 1e-2, 4)[:, None]
    x = x.astype(dtype)
    y = rng.integers(0, c, n).astype(np.int64)
    y[2] = -100
    t = np.zeros((n, c), dtype)
    t[4:, 0] = 1.0
    for a in (Args(x, y, None, None, -100, 0.0, 0.5, None, 1.0),
              Args(x, None, t, rng.uniform(0.5, 1.5, c), -100, 0.0, 0.5, None, 1.0),
              Args(x, y, None, None, -100, 0.0, 1e-4, None, 1.0)):
        lc, gc = cpu_xent(a)
        lm, gm = host_model.xent(a, True, 64, False, 1, inplace)
        assert_same_bits(lm, lc, "row losses")
        assert_same_bits(gm, gc, "gradient")


@pytest.mark.parametrize("inplace", [False, True], ids=["grad", "inplace"])
def test_model_tiny_loss_rows_give_the_cpu_bits(host_model, inplace):
    # float64 rows whose every loss term lies below the normal range are summed again 2^1200 larger, in
    # class order by one thread (softmax_row.h): the CPU's bits, the z-loss's second kernel included, and
    # the float64 bound (4 ULP) where each term rounded on the subnormal grid gave up to C/2
    C = 300
    x = np.zeros((4, C))
    x[1, 0] = 5.0
    x[2:, 1:] = -740.0
    t = np.full((4, C), 4.45e-311)
    t[2, 0], t[2, 1:] = 1.0, 1e-320
    y = np.array([0, 150, 0, 3], dtype=np.int64)
    for a in (Args(x, None, t, None, -100, 0.0, 0.0, None, 1.0),
              Args(x, y, None, np.full(C, 5e-324), -100, 1.0, 0.0, None, 1.0),
              Args(x, y, None, np.full(C, 1e-310), -100, 0.5, 1e-3, None, 1.0)):
        lc, gc = cpu_xent(a)
        lm, gm = host_model.xent(a, True, 64, False, 1, inplace)
        assert_same_bits(lm, lc, "row losses")
        assert_same_bits(gm, gc, "gradient")
        kw = dict(weight=a.w, label_smoothing=a.eps, z_loss=a.z, reduction="none")
        assert_ulp_close(lm, ref.cross_entropy(x, a.t if a.y is None else a.y, **kw), 4.0, dtype=np.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("nt", [32, 256, 512])
@pytest.mark.parametrize("cache_row", [False, True], ids=["global", "cached"])
def test_model_long_rows_give_the_cpu_bits(host_model, dtype, nt, cache_row):
    for a in _long_row_problems(dtype):
        lc, gc = cpu_xent(a)
        lm, gm = host_model.xent(a, nt=nt, cache_row=cache_row, order=1)
        what = f"C={a.x.shape[1]}, y={'yes' if a.y is not None else 'no'}, eps={a.eps}"
        assert_same_bits(lm, lc, f"row losses ({what})")
        assert_same_bits(gm, gc, f"gradient ({what})")
        for mode in (1, 2):
            oc, lsc = cpu_family(a.x, mode)
            om, lsm = host_model.family(a.x, mode, nt=nt, cache_row=cache_row)
            assert_same_bits(lsm, lsc, "logsumexp (double)")
            assert_same_bits(om, oc, ["", "log_softmax", "softmax"][mode])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_tree_order_is_not_the_cpu_order(host_model, tree_model, dtype):
    """What kernels.cu (c) buys, measured: the counterfactual tree order (g) computes other sums (the
    float64 row losses differ on order-sensitive rows) but rounds to the same outputs almost always,
    never more than 1 ulp apart; the CPU order gives every bit on the same rows."""
    rng = np.random.default_rng(11)
    rows = n_loss_diff = n_loss_diff_cpu_order = 0
    out_diff, out_total, worst = 0, 0, 0.0
    for C in (100, 1000, 5000, 20000):
        x = order_sensitive(rng, 32 if C <= 1000 else 8, C, dtype)
        a = Args(x, rng.integers(0, C, x.shape[0]).astype(np.int64), None, None, -100, 0.0, 0.0, None, 1.0)
        lc, gc = cpu_xent(a)
        lt, gt = tree_model.xent(a, nt=256)
        lm, gm = host_model.xent(a, nt=256)
        rows += len(lc)
        n_loss_diff += int(np.sum(lt != lc))
        n_loss_diff_cpu_order += int(np.sum(lm != lc))
        for got, want in ((lt.astype(dtype), lc.astype(dtype)), (gt, gc),
                          (tree_model.family(x, 1, nt=256)[0], cpu_family(x, 1)[0])):
            d = ulp_distance(got, want)
            out_diff += int(np.count_nonzero(d))
            out_total += d.size
            worst = max(worst, float(d.max()))
    print(f"\n{np.dtype(dtype).name}: tree order vs CPU: {n_loss_diff}/{rows} float64 row losses differ "
          f"(CPU order: {n_loss_diff_cpu_order}); {out_diff}/{out_total} {np.dtype(dtype).name} outputs "
          f"differ, at most {worst} ulp")
    assert n_loss_diff_cpu_order == 0
    assert worst <= 1.0
    if np.dtype(dtype) == np.float32:
        assert n_loss_diff > 0  # the rows are order-sensitive: equal bits above are not luck


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_tree_order_within_one_ulp_of_the_cpu(tree_model, dtype, data):
    a = _draw_args(data, dtype)
    nt = data.draw(st.sampled_from([32, 128, 512]), label="nt")
    lc, gc = cpu_xent(a)
    lt, gt = tree_model.xent(a, nt=nt)
    with np.errstate(over="ignore"):
        d_loss = ulp_distance(lt.astype(a.x.dtype), lc.astype(a.x.dtype))
    d_grad = ulp_distance(gt, gc)
    note(f"max ulp apart: loss {d_loss.max()}, gradient {d_grad.max()}")
    assert d_loss.max() <= 1
    if d_grad.max() > 1:
        # entries whose two terms cancel (p_j A against q_j: smoothing 1 over equal logits has gradient 0,
        # which each order leaves as a different residue of ~2^-58) are apart by their terms' roundings:
        # measured, as the contract measures them, in ulps of the terms' magnitude (the reference's scale
        # times the row's factor)
        n = a.x.shape[0]
        target = a.y if a.y is not None else a.t
        _, terms = ref.cross_entropy_grad(a.x, target, a.w, a.ignore_index, reduction="none",
                                          label_smoothing=a.eps, z_loss=a.z, grad_output=np.ones(n),
                                          return_scale=True)
        factor = np.abs(a.scale * (a.row_scale if a.row_scale is not None else np.ones(n)))[:, None]
        unit = np.maximum(factor * np.asarray(terms, dtype=np.float64), np.finfo(a.x.dtype).smallest_subnormal)
        spacing = np.asarray(ulp(unit, a.x.dtype), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            apart = np.abs(gt.astype(np.float64) - gc.astype(np.float64)) / spacing
        note(f"in ulps of the terms' magnitude: {np.nanmax(apart)}")
        assert np.all((d_grad <= 1) | (apart <= 1))


# ---------------------------------------------------------------------------------------------------
# (c') the host model of binary.cu and reduce.cu, against xentfast._core._binary and _xent.dd_sum


class BinArgs(NamedTuple):
    """One elementwise problem at _binary.elementwise's interface (weights as base[(i // div) % mod])."""
    op: int
    x: np.ndarray            # 1-D
    t: np.ndarray
    w: np.ndarray | None
    w_div: int
    w_mod: int
    pw: np.ndarray | None
    pw_div: int
    pw_mod: int
    g: np.ndarray | None     # per-element upstream gradient
    scale: float
    ignore: float | None
    alpha: float
    gamma: float
    eps: float | None        # clip
    log_clamp: float | None  # clamp
    loss_k: float


class CeArgs(NamedTuple):
    """One problem of CE from class probabilities at _binary.ce_probs's interface."""
    p: np.ndarray            # (N, C)
    y: np.ndarray | None
    t: np.ndarray | None
    w: np.ndarray | None
    ignore_index: int
    row_scale: np.ndarray | None
    scale: float
    eps: float | None
    loss_k: float


def _bcast(weight, shape):
    """(base, div, mod) of a weight broadcast to `shape`, as xentfast.api_binary addresses it."""
    from xentfast.api_binary import _broadcast_weight

    if weight is None:
        return None, 1, 1
    b = _broadcast_weight(weight, shape, "weight")
    return np.ascontiguousarray(b.base, dtype=np.float64), int(b.div), int(b.mod)


def _draw_weight(data, shape, dtype, label):
    """None, a scalar, the last axis, the full shape, or (2-D) one weight per row: div > 1."""
    w = data.draw(element_weights(shape, dtype), label=label)
    if len(shape) == 2 and data.draw(st.booleans(), label=f"{label} per row"):
        w = np.random.default_rng(shape[0]).uniform(0, 3, (shape[0], 1))
    return _bcast(w, shape)


def _draw_bin_args(data, dtype, op):
    if op == _binary.OP_BCE_PROB:
        x = data.draw(binary_logits(dtype, allow_nan=False, allow_inf=False), label="shape source")
        x = data.draw(unit_probabilities(x.shape, dtype), label="p")
        if x.size and data.draw(st.booleans(), label="a NaN probability"):
            x.reshape(-1)[data.draw(st.integers(0, x.size - 1))] = np.nan
        t = data.draw(binary_targets(x.shape, dtype), label="t")
        ignore = data.draw(st.sampled_from([None, -100.0, 0.0]), label="ignore")
        if ignore is not None and t.size:
            mask = np.random.default_rng(t.size).random(t.shape) < 0.3
            t = np.where(mask, np.asarray(ignore, dtype=dtype), t).astype(dtype)
        pw = None
    else:
        case = data.draw(binary_xent_cases(dtype), label="case")
        x, t, ignore = case.logits, case.target, case.ignore_index
        pw = case.pos_weight
    shape = x.shape
    w, w_div, w_mod = _draw_weight(data, shape, dtype, "weight")
    pw, pw_div, pw_mod = _bcast(pw, shape) if op == _binary.OP_BCE_LOGITS else (None, 1, 1)
    n = x.size
    g = None
    if data.draw(st.booleans(), label="upstream array"):
        g = np.random.default_rng(n + 1).standard_normal(n) * np.exp(np.random.default_rng(n).uniform(-30, 30, n))
        if n and data.draw(st.booleans(), label="infinite upstream entries"):
            # binary.h xf_bin_bce_logits_grad_inf: the CPU takes such elements out of its loops
            g[np.random.default_rng(n + 2).random(n) < 0.3] *= np.inf
    return BinArgs(
        op, np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(t, dtype=x.dtype).reshape(-1), w, w_div, w_mod,
        pw, pw_div, pw_mod, g,
        data.draw(st.sampled_from([1.0, 0.25, 1.0 / 3.0, -2.0, 1e-300, -np.inf]), label="scale"),
        None if ignore is None else float(ignore),
        data.draw(st.sampled_from([0.25, 0.0, 1.0, 0.5, -1.0]), label="alpha"),
        data.draw(st.sampled_from([2.0, 0.0, 1.0, 0.5, 3.7]), label="gamma"),
        data.draw(st.sampled_from([None, 1e-7, 1e-12]), label="eps") if op == _binary.OP_BCE_PROB else None,
        data.draw(st.sampled_from([None, -100.0, -3.5]), label="log_clamp") if op == _binary.OP_BCE_PROB else None,
        data.draw(st.sampled_from([0.0, 600.0]), label="loss_k"))


def _draw_outputs(data):
    """(want loss_d, want loss_o, want grad), at least one of them."""
    outs = data.draw(st.sampled_from(["d", "o", "g", "dg", "og", "dog"]), label="outputs")
    return "d" in outs, "o" in outs, "g" in outs


def _bin_call(a, want_d, want_o, want_grad, inplace, xp, empty):
    """The argument tuple of _binary.elementwise / _cuda.elementwise, and the output arrays."""
    n = a.x.size
    x = xp.asarray(a.x)
    if inplace:
        x = x.copy()
    loss_d = xp.full(n, np.nan) if want_d else empty(np.float64)
    loss_o = xp.full(n, np.nan, dtype=a.x.dtype) if want_o else empty(a.x.dtype)
    grad = (x if inplace else xp.full(n, np.nan, dtype=a.x.dtype)) if want_grad else empty(a.x.dtype)
    arr = lambda v: xp.asarray(v) if v is not None else empty(np.float64)  # noqa: E731
    args = (a.op, x, xp.asarray(a.t), arr(a.w), a.w_div, a.w_mod, arr(a.pw), a.pw_div, a.pw_mod, arr(a.g), a.scale,
            a.ignore is not None, a.ignore if a.ignore is not None else 0.0, a.alpha, a.gamma, a.eps is not None,
            a.eps if a.eps is not None else 0.0, a.log_clamp is not None,
            a.log_clamp if a.log_clamp is not None else 0.0, loss_d, loss_o, grad, 1, a.w is not None,
            a.pw is not None, a.g is not None, want_d, want_o, want_grad)
    return args, (loss_d if want_d else None, loss_o if want_o else None, grad if want_grad else None)


def _clamp_thresholds(a):
    """log_clamp's exact thresholds (xentfast.api_binary._clamp_thresholds), as the front end passes them."""
    return api_binary._clamp_thresholds(a.log_clamp) if a.log_clamp is not None else (0.0, 1.0)


def cpu_elementwise(a, want_d=True, want_o=False, want_grad=True, inplace=False):
    args, outs = _bin_call(a, want_d, want_o, want_grad, inplace, np, lambda dt: np.empty(0, dt))
    lo, hi = _clamp_thresholds(a)
    _binary.elementwise(*args, loss_k=a.loss_k, clamp_lo=lo, clamp_hi=hi)
    return outs


def _ce_call(a, want_grad, inplace, xp, empty1, empty2):
    N, C = a.p.shape
    p = xp.asarray(a.p).copy() if inplace else xp.asarray(a.p)
    loss = xp.full(N, np.nan)
    grad = (p if inplace else xp.full((N, C), np.nan, dtype=a.p.dtype)) if want_grad else empty2(a.p.dtype)
    args = (p, xp.asarray(a.y) if a.y is not None else empty1(np.int64),
            xp.asarray(a.t) if a.t is not None else empty2(a.p.dtype),
            xp.asarray(a.w) if a.w is not None else empty1(np.float64), a.ignore_index,
            xp.asarray(a.row_scale) if a.row_scale is not None else empty1(np.float64), a.scale,
            a.eps is not None, a.eps if a.eps is not None else 0.0, loss, grad, 1, a.y is not None,
            a.t is not None, a.w is not None, a.row_scale is not None, want_grad)
    return args, (loss, grad if want_grad else None)


def cpu_ce_probs(a, want_grad=True, inplace=False):
    args, outs = _ce_call(a, want_grad, inplace, np, lambda dt: np.empty(0, dt), lambda dt: np.empty((0, 0), dt))
    _binary.ce_probs(*args, loss_k=a.loss_k)
    return outs


def _draw_ce_args(data, dtype):
    N = data.draw(st.integers(1, 6), label="N")
    C = data.draw(st.integers(1, 12), label="C")
    p = data.draw(unit_probabilities((N, C), dtype), label="p")
    if data.draw(st.booleans(), label="normalised rows"):
        with np.errstate(invalid="ignore", divide="ignore"):
            s = p.astype(np.float64).sum(axis=1, keepdims=True)
            p = np.where(s > 0, p / np.where(s > 0, s, 1), p).astype(dtype)
    if data.draw(st.booleans(), label="a NaN probability"):
        p[data.draw(st.integers(0, N - 1)), data.draw(st.integers(0, C - 1))] = np.nan
    if data.draw(st.booleans(), label="index targets"):
        y, t = data.draw(index_targets(C, N, ignore_index=-100), label="y"), None
    else:
        y, t = None, data.draw(prob_targets((N, C), dtype), label="t")
    w = data.draw(st.one_of(st.none(), class_weights(C)), label="w")
    rs = np.random.default_rng(N * C).uniform(-2, 2, N) if data.draw(st.booleans(), label="row_scale") else None
    return CeArgs(np.ascontiguousarray(p), None if y is None else np.ascontiguousarray(y, dtype=np.int64),
                  None if t is None else np.ascontiguousarray(t, dtype=dtype),
                  None if w is None else np.ascontiguousarray(w, dtype=np.float64), -100, rs,
                  data.draw(st.sampled_from([1.0, 0.25, 1.0 / 3.0, 1e-300]), label="scale"),
                  data.draw(st.sampled_from([None, 1e-7, 1e-12]), label="eps"),
                  data.draw(st.sampled_from([0.0, 600.0]), label="loss_k"))


class BinaryModel:
    """ctypes front end of tests/cuda_model/binary_model.cpp (binary.cu and reduce.cu on the CPU)."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        P, LL, D, I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double, ctypes.c_int
        for s in ("f32", "f64"):
            f = getattr(lib, f"xf_model_elementwise_{s}")
            f.restype = None
            f.argtypes = [I, P, P, P, LL, LL, P, LL, LL, P, D, I, D, D, D, I, D, I, D, D, D, P, P, P, LL, D, I]
            f = getattr(lib, f"xf_model_ce_probs_{s}")
            f.restype, f.argtypes = None, [P, P, P, P, LL, P, D, I, D, P, P, LL, LL, D, I, I]
        lib.xf_model_dd_sum.restype, lib.xf_model_dd_sum.argtypes = None, [P, LL, I, I, P]
        lib.xf_model_target_weight_sum.restype = D
        lib.xf_model_target_weight_sum.argtypes = [P, P, LL, LL, LL]

    def elementwise(self, a, want_d=True, want_o=False, want_grad=True, inplace=False, order=0):
        args, outs = _bin_call(a, want_d, want_o, want_grad, inplace, np, lambda dt: None)
        (op, x, t, w, w_div, w_mod, pw, pw_div, pw_mod, g, scale, has_ignore, ignore, alpha, gamma, clip, eps,
         clamp, log_clamp, loss_d, loss_o, grad) = args[:22]
        getattr(self.lib, f"xf_model_elementwise_{_sfx(a.x.dtype)}")(
            op, _ptr(x), _ptr(t), _ptr(a.w), w_div, w_mod, _ptr(a.pw), pw_div, pw_mod, _ptr(a.g), scale,
            int(has_ignore), ignore, alpha, gamma, int(clip), eps, int(clamp), log_clamp, *_clamp_thresholds(a),
            _ptr(loss_d), _ptr(loss_o), _ptr(grad), a.x.size, a.loss_k, order)
        return outs

    def ce_probs(self, a, want_grad=True, inplace=False, order=0, nt=32):
        args, (loss, grad) = _ce_call(a, want_grad, inplace, np, lambda dt: None, lambda dt: None)
        N, C = a.p.shape
        getattr(self.lib, f"xf_model_ce_probs_{_sfx(a.p.dtype)}")(
            _ptr(args[0]), _ptr(a.y), _ptr(a.t), _ptr(a.w), a.ignore_index, _ptr(a.row_scale), a.scale,
            int(a.eps is not None), a.eps if a.eps is not None else 0.0, _ptr(loss), _ptr(grad), N, C,
            a.loss_k, nt, order)
        return loss, grad

    def dd_sum(self, v, nt=1024, order=0):
        v = np.ascontiguousarray(v, dtype=np.float64)
        out = np.full(2, np.nan)
        self.lib.xf_model_dd_sum(_ptr(v), v.size, nt, order, _ptr(out))
        return float(out[0]), float(out[1])

    def target_weight_sum(self, y, w, ignore_index, C):
        return self.lib.xf_model_target_weight_sum(_ptr(y), _ptr(w), y.size, ignore_index, C)


@pytest.fixture(scope="session")
def binary_model(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler: the host model of the CUDA kernels cannot be built")
    out = tmp_path_factory.mktemp("cuda_model") / "binary_model.so"
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-w",
           *[f"-I{d}" for d in INCLUDES], str(BINARY_MODEL_SRC), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"binary host model build failed:\n{' '.join(cmd)}\n{r.stderr}"
    return BinaryModel(out)


BIN_OPS = {"bce_logits": _binary.OP_BCE_LOGITS, "focal": _binary.OP_FOCAL, "bce_prob": _binary.OP_BCE_PROB}


@pytest.mark.parametrize("cpu_module, name", [
    (_xent, "softmax_xent"), (_xent, "softmax_family"), (_xent, "dd_sum"), (_xent, "target_weight_sum"),
    (_binary, "elementwise"), (_binary, "ce_probs")], ids=lambda v: getattr(v, "__name__", v))
def test_launch_functions_take_the_cpu_modules_parameters(cpu_module, name):
    """The front end calls backend.softmax.<f> and backend.binary.<f> by position with the CPU modules'
    parameters, so each launch function must take the same ones in the same order: binary elementwise's
    in-kernel sum (`part`) once reached only the CPU's, and every device call of the binary family then
    raised a TypeError.  Left out: the CPU's trailing parameters that the front end never passes."""
    cpu_only = {"softmax_xent": ["row_groups"], "softmax_family": ["row_groups", "force_phased"],
                "dd_sum": ["n_threads"]}
    cpu = [p for p in inspect.signature(getattr(cpu_module, name)).parameters if p not in cpu_only.get(name, [])]
    assert list(inspect.signature(getattr(_cuda, name)).parameters) == cpu


def test_op_constants_match_the_cpu_module():
    assert (_cuda.OP_BCE_LOGITS, _cuda.OP_FOCAL, _cuda.OP_BCE_PROB) == \
        (_binary.OP_BCE_LOGITS, _binary.OP_FOCAL, _binary.OP_BCE_PROB)
    src = (PKG / "_cuda" / "binary.cu").read_text()
    for name in ("BCE_LOGITS", "FOCAL", "BCE_PROB"):
        m = re.search(rf"#define XF_CU_OP_{name} (\d+)", src)
        assert m and int(m.group(1)) == getattr(_binary, f"OP_{name}")


def _assert_outputs(got, want, what):
    for name, g, w in zip(("loss_d", "loss_o", "grad"), got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            assert_same_bits(g, w, f"{what}: {name}")


@pytest.mark.parametrize("op", sorted(BIN_OPS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_model_elementwise_gives_the_cpu_bits(binary_model, dtype, op, data):
    a = _draw_bin_args(data, dtype, BIN_OPS[op])
    want_d, want_o, want_grad = _draw_outputs(data)
    inplace = want_grad and data.draw(st.booleans(), label="inplace")
    order = data.draw(st.sampled_from([0, 1, 2]), label="element order")
    want = cpu_elementwise(a, want_d, want_o, want_grad, inplace)
    got = binary_model.elementwise(a, want_d, want_o, want_grad, inplace, order)
    _assert_outputs(got, want, op)


@pytest.mark.parametrize("op", sorted(BIN_OPS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_model_elementwise_long_broadcasts(binary_model, dtype, op):
    """Several CPU blocks (XF_BIN_BLOCK = 1024) with weights broadcast along each kind of axis: the
    gather the CPU does per block and the direct index of binary.cu (b) address the same weights."""
    rng = np.random.default_rng(8)
    shape = (7, 3, 301)
    x = (rng.standard_normal(shape) * 20).astype(dtype)
    if BIN_OPS[op] == _binary.OP_BCE_PROB:
        x = rng.random(shape).astype(dtype)
    t = rng.random(shape).astype(dtype)
    t[rng.random(shape) < 0.1] = -1.0
    for wshape in [(), (301,), (3, 1), (7, 1, 1), (7, 3, 1), (3, 301), shape]:
        w, w_div, w_mod = _bcast(rng.uniform(0, 3, wshape), shape)
        pw, pw_div, pw_mod = _bcast(rng.uniform(0, 3, (301,)), shape)
        if BIN_OPS[op] != _binary.OP_BCE_LOGITS:
            pw, pw_div, pw_mod = None, 1, 1
        g = rng.standard_normal(x.size)
        g[::5] *= np.inf                      # binary.h xf_bin_bce_logits_grad_inf, in some blocks only
        g[2048:4096] = rng.standard_normal(2048)
        a = BinArgs(BIN_OPS[op], x.reshape(-1), t.reshape(-1), w, w_div, w_mod, pw, pw_div, pw_mod,
                    g, 0.5, -1.0, 0.25, 2.0, 1e-7, None, 0.0)
        _assert_outputs(binary_model.elementwise(a, True, True, True, order=1),
                        cpu_elementwise(a, True, True, True), f"{op}, weight {wshape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_model_ce_probs_gives_the_cpu_bits(binary_model, dtype, data):
    a = _draw_ce_args(data, dtype)
    want_grad = data.draw(st.booleans(), label="grad")
    inplace = want_grad and data.draw(st.booleans(), label="inplace")
    order = data.draw(st.sampled_from([0, 1, 2]), label="row and thread order")
    nt = data.draw(st.sampled_from([32, 1, 5]), label="team size")  # the kernel's is 32; the bits never depend on it
    lc, gc = cpu_ce_probs(a, want_grad, inplace)
    lm, gm = binary_model.ce_probs(a, want_grad, inplace, order, nt)
    assert_same_bits(lm, lc, "row losses")
    if want_grad:
        assert_same_bits(gm, gc, "gradient")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_model_ce_probs_long_rows(binary_model, dtype):
    """Rows over several loss chunks (XF_CU_CE_CHUNK = 256 classes) and a partial last chunk: lane 0's
    chain adds the chunks' terms in class order, as the CPU's one loop does."""
    rng = np.random.default_rng(13)
    for C in (255, 256, 257, 1000, 3 * 256 + 1):
        N = 5
        p = rng.random((N, C)).astype(dtype)
        p /= p.sum(axis=1, keepdims=True)
        p[1, C // 2] = 0.0
        p[2, C - 1] = np.nan
        t = rng.random((N, C)).astype(dtype)
        t /= t.sum(axis=1, keepdims=True)
        t[1, C // 2] = 0.0
        y = rng.integers(0, C, N).astype(np.int64)
        y[3] = -100
        w = rng.uniform(0, 2, C)
        for a in (CeArgs(p, None, t, w, -100, rng.uniform(-1, 1, N), 0.5, None, 0.0),
                  CeArgs(p, None, t, None, -100, None, 1.0, 1e-7, 600.0),
                  CeArgs(p, y, None, w, -100, None, 1.0 / 3.0, None, 0.0)):
            lc, gc = cpu_ce_probs(a)
            for nt, order in ((32, 1), (7, 2)):
                lm, gm = binary_model.ce_probs(a, order=order, nt=nt)
                assert_same_bits(lm, lc, f"row losses, C={C}")
                assert_same_bits(gm, gc, f"gradient, C={C}")
            lm, gm = binary_model.ce_probs(a, inplace=True)
            assert_same_bits(gm, gc, f"inplace gradient, C={C}")


def test_model_ce_probs_tiny_rows_give_the_cpu_bits(binary_model):
    """float64 rows whose terms all lie below the normal range are summed a second time 2^1200 larger
    (binary.h, xf_bin_ce_tiny_mass): the same chain on the team, the CPU's bits, within the float64 bound
    where each term's rounding on the subnormal grid gave up to C/2 ULP."""
    for C in (65, 300, 3 * 256 + 1):
        p = np.full((4, C), 1.0 / C)
        p[1, :2] = [0.5, 1e-300]
        t = np.full((4, C), 4.45e-311)
        t[2] = 0.0                              # padding: no mass, no second sum
        t[3, 0] = -1e-310                       # a negative mass: the scaled terms stay finite here
        for a in (CeArgs(p, None, t, None, -100, None, 1.0, None, 0.0),
                  CeArgs(p, None, t, np.linspace(0.5, 2.0, C), -100, None, 0.5, None, 0.0)):
            lc, gc = cpu_ce_probs(a)
            for nt, order in ((32, 1), (7, 2)):
                lm, gm = binary_model.ce_probs(a, order=order, nt=nt)
                assert_same_bits(lm, lc, f"row losses, C={C}")
                assert_same_bits(gm, gc, f"gradient, C={C}")
            exact = ref.cross_entropy_from_probs(p[:3], t[:3], weight=a.w, reduction="none")
            assert_ulp_close(lc[:3], exact, 4.0, dtype=np.float64, err_msg=f"C={C}")


# ---- dd_sum: one fixed shape (xentfast/ddsum.h) on every thread count and device


DD_BLOCK = _cuda.XF_DDSUM_BLOCK
# lanes inside a dd_sum block, read from the header itself so the Python restatement cannot drift
DD_LANES = int(re.search(r"#define XF_DDSUM_LANES (\d+)",
                         (PKG / "include" / "xentfast" / "ddsum.h").read_text()).group(1))


def _py_dd_add(hi, lo, bh, bl):
    """numerics.h xf_dd_add in Python floats (IEEE doubles, no contraction)."""
    s = hi + bh
    bv = s - hi
    av = s - bv
    e = (hi - av) + (bh - bv)
    e += lo + bl
    h = s + e
    if s - s == 0.0:
        return h, (e - (h - s) if h - h == 0.0 else 0.0)
    return s, 0.0


def py_dd_sum_serial(v):
    """The index-order double-double sum dd_sum computed before the tree (the baseline it must match)."""
    hi = lo = 0.0
    for x in np.asarray(v, dtype=np.float64).tolist():
        hi, lo = _py_dd_add(hi, lo, x, 0.0)
    return hi, lo


def _py_dd_pairwise(parts):
    """ddsum.h's fixed pairwise tree: at level s, part i absorbs part i + s for i a multiple of 2s."""
    nb, s = len(parts), 1
    while s < nb:
        for i in range(0, nb - s, 2 * s):
            parts[i] = _py_dd_add(*parts[i], *parts[i + s])
        s *= 2
    return parts[0] if parts else (0.0, 0.0)


def _py_acc_lane(v):
    """numerics.h xf_acc_add over v in index order from (0, 0): the running sum, and the TwoSum errors of
    its finite steps summed beside it."""
    acc = err = 0.0
    for x in v:
        s = acc + x
        bv = s - acc
        av = s - bv
        if s - s == 0.0:
            err += (acc - av) + (x - bv)
        acc = s
    return acc, err


def py_dd_sum_block(v):
    """ddsum.h's block partial: element i to lane i % DD_LANES, each lane compensated in index order,
    lanes merged by the pairwise tree (all DD_LANES lanes, empty ones as (0, 0))."""
    return _py_dd_pairwise([_py_acc_lane(v[k::DD_LANES]) for k in range(DD_LANES)])


def py_dd_sum_tree(v):
    """xentfast/ddsum.h, restated in Python from its comment: the specification the C code must meet."""
    v = np.asarray(v, dtype=np.float64).tolist()
    return _py_dd_pairwise([py_dd_sum_block(v[b:b + DD_BLOCK]) for b in range(0, len(v), DD_BLOCK)])


def _exact_scaled(v):
    """sum(v) * 2^1074 as an exact integer (every double is a multiple of 2^-1074)."""
    total = 0
    for x in v:
        num, den = float(x).as_integer_ratio()
        total += num * ((1 << 1074) // den)
    return total


def _adversarial_vector(kind, n, seed):
    rng = np.random.default_rng(seed)
    if n == 0:
        return np.empty(0)
    if kind == "spread":          # magnitudes over 2^-100 .. 2^100, both signs
        return rng.standard_normal(n) * np.exp2(rng.uniform(-100, 100, n))
    if kind == "cancel":          # pairs x, -x shuffled, plus a small remainder: the sum is tiny
        h = rng.standard_normal(n // 2) * np.exp2(rng.uniform(-30, 60, n // 2))
        v = np.concatenate([h, -h, rng.standard_normal(n - 2 * (n // 2)) * 1e-20])
        v[rng.integers(0, n)] += 2.0**-70
        return rng.permutation(v)
    if kind == "huge":            # non-negative, near the top of the range: the sum may overflow
        return rng.uniform(0, 1, n) * np.finfo(np.float64).max / rng.choice([1, 4, n], n)
    if kind == "tiny":            # subnormal and near-subnormal
        return rng.integers(-(1 << 40), 1 << 40, n) * 2.0**-1074 * rng.choice([1.0, 2.0**20], n)
    if kind == "losses":          # what the callers reduce: non-negative, mostly O(1), a few huge / tiny
        v = rng.exponential(1.0, n)
        v[rng.random(n) < 0.01] *= 2.0**900
        v[rng.random(n) < 0.01] *= 2.0**-900
        return v
    raise ValueError(kind)


def _with_specials(v, specials, seed):
    rng = np.random.default_rng(seed)
    v = v.copy()
    for s in specials:
        if v.size:
            v[rng.integers(0, v.size)] = s
    return v


DD_KINDS = ["spread", "cancel", "huge", "tiny", "losses"]
DD_SIZES = [0, 1, 2, 1023, 1024, 1025, 2048, 3 * 1024 + 7, 17 * 1024 + 1, 70_000]
DD_SPECIALS = [(), (np.inf,), (-np.inf,), (np.nan,), (np.inf, -np.inf), (np.inf, np.inf, 5.0)]


def test_dd_sum_overflowing_non_negative_sum_is_inf():
    # a finite partial sum that rounds up to inf must not leave -inf behind in the low part (NaN later)
    big = np.finfo(np.float64).max
    for v in ([big, 2.0**969, 0, 0, 2.0**969, 0, 0, 0], [big, 2.0**969, 2.0**969], [big] * 3000):
        v = np.array(v, dtype=np.float64)
        assert _xent.dd_sum(v) == (np.inf, 0.0) == py_dd_sum_tree(v)
    x = np.array([big, 2.0**969, 0, 0, 2.0**969, 0, 0, 0])   # softplus(x) = x for these, y = 0
    assert xf.binary_cross_entropy_with_logits(x, np.zeros_like(x), reduction="sum") == np.inf


def test_dd_sum_small_vectors_are_the_index_order_sum():
    # up to three elements the lane tree is the serial sum, operation for operation; up to one block it
    # is the block partial alone
    rng = np.random.default_rng(1)
    for n in range(4):
        v = rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))
        assert _xent.dd_sum(v) == py_dd_sum_serial(v)
    for n in (4, 7, 8, 9, 15, 1000, 1023, 1024):
        v = rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))
        assert _xent.dd_sum(v) == py_dd_sum_tree(v) == py_dd_sum_block(v.tolist())


@pytest.mark.parametrize("kind", DD_KINDS)
def test_dd_sum_is_thread_invariant_and_follows_its_specification(kind):
    for n in DD_SIZES[-4:] + [300_001]:
        v = _adversarial_vector(kind, n, n)
        ref_bits = _xent.dd_sum(v, 1)
        for nt in (2, 3, 4, 7, 16):
            assert _xent.dd_sum(v, nt) == ref_bits, (n, nt)
        assert _xent.dd_sum(v) == ref_bits
        if n <= 70_000:
            assert ref_bits == py_dd_sum_tree(v), n


@pytest.mark.parametrize("kind", DD_KINDS)
@given(data=st.data())
def test_model_dd_sum_gives_the_cpu_bits(binary_model, kind, data):
    n = data.draw(st.sampled_from(DD_SIZES), label="n")
    specials = data.draw(st.sampled_from(DD_SPECIALS), label="specials")
    v = _with_specials(_adversarial_vector(kind, n, data.draw(st.integers(0, 2**32), label="seed")), specials, n)
    nt = data.draw(st.sampled_from([32, 64, 1024]), label="tree threads")
    order = data.draw(st.sampled_from([0, 1, 2]), label="order")
    cpu = _xent.dd_sum(v)
    model = binary_model.dd_sum(v, nt, order)
    assert_same_bits(np.array(model), np.array(cpu), f"dd_sum (n={n}, {kind}, specials {specials})")


@pytest.mark.parametrize("kind", DD_KINDS)
@given(data=st.data())
def test_dd_sum_accuracy_and_limits(kind, data):
    """Within the bound of xentfast/ddsum.h of the exact sum, and the limits of the index-order sum:
    NaN in (or +inf with -inf) gives NaN, one infinity gives it, an overflowing non-negative sum gives
    +inf; a non-finite hi comes with lo = 0 (callers test hi == inf)."""
    n = data.draw(st.sampled_from(DD_SIZES[:-1]), label="n")
    specials = data.draw(st.sampled_from(DD_SPECIALS), label="specials")
    v = _with_specials(_adversarial_vector(kind, n, data.draw(st.integers(0, 2**32), label="seed")), specials, n)
    hi, lo = _xent.dd_sum(v)
    old = py_dd_sum_serial(v)
    has_nan, has_pinf, has_ninf = np.isnan(v).any(), (v == np.inf).any(), (v == -np.inf).any()
    if has_nan or (has_pinf and has_ninf):
        assert np.isnan(hi) and np.isnan(old[0])
        return
    if has_pinf or has_ninf:
        # the finite terms of the kinds that can overflow are non-negative: an overflow acts as +inf
        assert (np.isnan(hi) and np.isnan(old[0])) or hi == (np.inf if has_pinf else -np.inf) == old[0]
        assert lo == 0.0
        return
    exact = _exact_scaled(v)
    if abs(exact) >= int(np.finfo(np.float64).max) << 1074:
        # only the non-negative kinds get here: +inf, as in index order
        assert kind in ("huge", "losses") and hi == np.inf == old[0] and lo == 0.0
        return
    if not np.isfinite(hi):
        # an intermediate overflow with an in-range total needs huge terms of both signs: not the callers'
        assert kind not in ("huge", "losses", "tiny")
        return
    nb = max(1, -(-n // DD_BLOCK))
    # a lane's compensated sum: gamma_{m-1}^2 = (m-1)^2 2^-106 (to first order) of its sum |v|, in units
    # of 2^-103; then the lane merges and the block tree, about 2^-103 each
    lane_steps = math.ceil((DD_BLOCK // DD_LANES - 1) ** 2 / 8) + 1
    steps = lane_steps + int(np.log2(DD_LANES)) + int(np.ceil(np.log2(nb)))
    abs_sum = _exact_scaled(np.abs(v))
    err = abs(_exact_scaled([hi]) + _exact_scaled([lo]) - exact)
    # |hi + lo - sum| <= steps * 2^-103 * sum |v|  (ddsum.h), in units of 2^-1074, plus a subnormal ulp
    assert err * 2**103 <= steps * abs_sum + 2**103, (err, abs_sum)
    if np.isfinite(old[0]):
        err_old = abs(_exact_scaled([old[0]]) + _exact_scaled([old[1]]) - exact)
        note(f"error of the tree {err}, of the index-order sum {err_old} (units of 2^-1074)")
    # the rounded result is the correctly rounded sum unless the terms cancel to 2^-40 of their size
    if abs(exact) * 2**40 >= abs_sum:
        assert ulp_distance(np.float64(hi + lo), np.float64(math.fsum(v.tolist()))).max() <= 1


def test_model_target_weight_sum_matches_the_cpu_and_skips_bad_labels(binary_model):
    rng = np.random.default_rng(12)
    C = 50
    y = rng.integers(0, C, 5000).astype(np.int64)
    y[::7] = -100
    w = rng.uniform(0, 3, C)
    assert binary_model.target_weight_sum(y, w, -100, C) == _xent.target_weight_sum(y, w, -100, True, C)
    assert binary_model.target_weight_sum(y, None, -100, C) == _xent.target_weight_sum(y, w, -100, False, C)
    bad = y.copy()
    bad[::11] = C + 3          # out of range: skipped, never read
    bad[1::13] = -5
    keep = (bad >= 0) & (bad < C) | (bad == -100)
    assert binary_model.target_weight_sum(bad, w, -100, C) == _xent.target_weight_sum(bad[keep], w, -100, True, C)
    # the CPU sum skips them the same way
    assert _xent.target_weight_sum(bad, w, -100, True, C) == _xent.target_weight_sum(bad[keep], w, -100, True, C)


# ---- the launch wrappers without a GPU: a stand-in CuPy records each launch, the arguments are checked
# against the kernel's parameter list (types, and values by parameter name) and replayed on the host model


class _FakeDevice:
    compute_capability = "90"
    attributes = {"MultiProcessorCount": 132}

    def __init__(self, id=0):
        self.id = id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeArray(np.ndarray):
    """A NumPy array dressed as a cupy.ndarray (device 0)."""

    @property
    def device(self):
        return _FakeDevice(0)

    def get(self):
        return np.asarray(self).copy()


def _fake_cupy():
    import types

    def wrap(f):
        return lambda *a, **k: f(*a, **k).view(FakeArray)

    cp = types.SimpleNamespace(ndarray=FakeArray, zeros=wrap(np.zeros), empty=wrap(np.empty), asarray=lambda a: (
        np.ascontiguousarray(a).copy().view(FakeArray)), full=wrap(np.full))
    cp.cuda = types.SimpleNamespace(Device=_FakeDevice, runtime=types.SimpleNamespace(getDevice=lambda: 0))
    return cp


_C_TYPES = {"float": np.float32, "double": np.float64, "long long": np.int64, "int": np.int32}


def _params(text, name):
    """[(type, is_pointer, name)] of the first definition of function `name` in `text`."""
    m = re.search(rf"\b{re.escape(name)}\s*\(([^)]*)\)\s*\{{", text.replace("\\\n", " "))
    assert m, name
    out = []
    for p in m.group(1).split(","):
        p = " ".join(p.replace("const", " ").split())
        ptr = "*" in p
        typ, _, pname = p.replace("*", " ").rpartition(" ")
        out.append((" ".join(typ.split()), ptr, pname.strip()))
    return out


class _Launches:
    def __init__(self):
        self.calls = []

    def module(self, dtype, source="kernels.cu"):
        rec = self

        class _Mod:
            def kernel(self, expr):
                return lambda grid, block, args, shared_mem=0: rec.calls.append((source, expr, grid, block, args))

        return _Mod()


def _named_args(source, expr, args):
    """{parameter name: value} of a recorded launch, after checking every argument against the kernel's
    declared type (a pointer takes an array of that element type, or NULL)."""
    name, _, targs = expr.partition("<")
    params = _params((PKG / "_cuda" / source).read_text(), name)
    tparams = [s.strip() for s in targs.rstrip(">").split(",")] if targs else []
    assert len(params) == len(args), (expr, params, args)
    out = {}
    for (typ, ptr, pname), v in zip(params, args):
        typ = {"T": tparams[0] if tparams else typ}.get(typ, typ)
        if ptr:
            if isinstance(v, np.uint64):
                assert v == 0, pname
                out[pname] = None
            else:
                assert isinstance(v, FakeArray) and v.dtype == _C_TYPES[typ] and v.flags.c_contiguous, (expr, pname)
                out[pname] = v
        else:
            assert type(v) is _C_TYPES[typ], (expr, pname, type(v), typ)
            out[pname] = v.item()
    return out


def _replay(fn, text, fname, named):
    vals = []
    for typ, ptr, pname in _params(text, fname):
        v = named[pname]
        vals.append((None if v is None else v.ctypes.data) if ptr else v)
    fn(*vals)


@contextlib.contextmanager
def fake_gpu():
    """(stand-in cupy, launch recorder) while xentfast._cuda is pointed at them."""
    cp = _fake_cupy()
    rec = _Launches()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cuda, "_cupy", lambda: cp)
        mp.setattr(_cuda, "_module", rec.module)
        mp.setitem(sys.modules, "cupy", cp)
        yield cp, rec


MODEL_TEXT = BINARY_MODEL_SRC.read_text() if BINARY_MODEL_SRC.exists() else ""


@pytest.mark.parametrize("op", sorted(BIN_OPS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_wrapper_elementwise_marshals_the_kernel_arguments(binary_model, dtype, op, data):
    with fake_gpu() as (cp, rec):
        _check_elementwise_launch(binary_model, cp, rec, dtype, op, data)


def _check_elementwise_launch(binary_model, cp, rec, dtype, op, data):
    a = _draw_bin_args(data, dtype, BIN_OPS[op])
    want_d, want_o, want_grad = _draw_outputs(data)
    rec.calls.clear()
    args, outs = _bin_call(a, want_d, want_o, want_grad, False, cp, lambda dt: cp.empty(0, dt))
    lo, hi = _clamp_thresholds(a)
    _cuda.elementwise(*args, loss_k=a.loss_k, clamp_lo=lo, clamp_hi=hi)
    if a.x.size == 0:
        assert not rec.calls
        return
    ((source, expr, grid, block, kargs),) = rec.calls
    assert source == "binary.cu" and expr == f"xf_bin_elementwise_kernel<{_cuda._DTYPES[a.x.dtype]}, {a.op}>"
    assert grid[0] >= 1 and block[0] % 32 == 0
    named = _named_args(source, expr, kargs)
    named.update(op=a.op, order=0)
    for o in outs:
        if o is not None:
            o.fill(np.nan)
    _replay(getattr(binary_model.lib, f"xf_model_elementwise_{_sfx(a.x.dtype)}"), MODEL_TEXT,
            "xf_model_elementwise_##SFX", named)
    _assert_outputs(tuple(None if o is None else np.asarray(o) for o in outs),
                    cpu_elementwise(a, want_d, want_o, want_grad), f"{op} through the wrapper's arguments")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_wrapper_ce_probs_marshals_the_kernel_arguments(binary_model, dtype, data):
    with fake_gpu() as (cp, rec):
        _check_ce_probs_launch(binary_model, cp, rec, dtype, data)


def _check_ce_probs_launch(binary_model, cp, rec, dtype, data):
    a = _draw_ce_args(data, dtype)
    want_grad = data.draw(st.booleans(), label="grad")
    rec.calls.clear()
    args, (loss, grad) = _ce_call(a, want_grad, False, cp, lambda dt: cp.empty(0, dt),
                                  lambda dt: cp.empty((0, 0), dt))
    _cuda.ce_probs(*args, loss_k=a.loss_k)
    ((source, expr, grid, block, kargs),) = rec.calls
    assert source == "binary.cu" and expr == f"xf_ce_probs_kernel<{_cuda._DTYPES[a.p.dtype]}>"
    assert block == (_cuda._CE_TEAM * _cuda._CE_ROWS,) and grid[0] * _cuda._CE_ROWS >= min(a.p.shape[0], 4)
    named = _named_args(source, expr, kargs)
    named.update(order=0, nt=_cuda._CE_TEAM)
    _replay(getattr(binary_model.lib, f"xf_model_ce_probs_{_sfx(a.p.dtype)}"), MODEL_TEXT,
            "xf_model_ce_probs_##SFX", named)
    lc, gc = cpu_ce_probs(a, want_grad)
    assert_same_bits(np.asarray(loss), lc, "row losses through the wrapper's arguments")
    if want_grad:
        assert_same_bits(np.asarray(grad), gc, "gradient through the wrapper's arguments")


def test_wrapper_reductions_marshal_the_kernel_arguments(binary_model):
    with fake_gpu() as (cp, rec):
        _check_reduction_launches(binary_model, cp, rec)


def _check_reduction_launches(binary_model, cp, rec):
    for n in (0, 1, 1024, 1025, 70_000):
        v = _adversarial_vector("losses", n, n)
        rec.calls.clear()
        out = _cuda.dd_sum_device(cp.asarray(v))
        assert isinstance(out, FakeArray) and out.shape == (2,) and out.dtype == np.float64
        if n == 0:
            assert not rec.calls and (out == 0).all()
            continue
        (s1, e1, g1, b1, a1), (s2, e2, g2, b2, a2) = rec.calls
        assert (s1, e1, s2, e2) == ("reduce.cu", "xf_ddsum_blocks_kernel", "reduce.cu", "xf_ddsum_tree_kernel")
        blocks, tree = _named_args(s1, e1, a1), _named_args(s2, e2, a2)
        nb = -(-n // DD_BLOCK)
        assert blocks["n"] == n and blocks["nb"] == tree["nb"] == nb and blocks["part"] is tree["part"]
        assert blocks["part"].size == 2 * nb and tree["out"] is out
        assert g1[0] * b1[0] >= nb and g2 == (1,) and 32 <= b2[0] <= 1024 and b2[0] & (b2[0] - 1) == 0
        # replayed: the model's dd_sum with the launch's tree width
        assert binary_model.dd_sum(v, b2[0]) == _xent.dd_sum(v)
    y = np.random.default_rng(1).integers(-3, 60, 999).astype(np.int64)
    w = np.random.default_rng(2).uniform(0, 3, 50)
    keep = ((y >= 0) & (y < 50)) | (y == -1)
    # without weights: a parallel count, no kernel of ours, the serial sum's bits
    rec.calls.clear()
    out = _cuda.target_weight_sum_device(cp.asarray(y), cp.asarray(w), -1, False, 50)
    assert not rec.calls and out.shape == (1,) and out.dtype == np.float64
    assert out[0] == _xent.target_weight_sum(y[keep], w, -1, False, 50) == np.count_nonzero(keep & (y != -1))
    # with weights: the serial kernel, replayed on the host model
    rec.calls.clear()
    out = _cuda.target_weight_sum_device(cp.asarray(y), cp.asarray(w), -1, True, 50)
    ((s, e, g, b, ka),) = rec.calls
    named = _named_args(s, e, ka)
    assert named["C"] == 50 and named["n"] == y.size and named["ignore_index"] == -1
    assert named["out"] is out and named["w"] is not None
    got = binary_model.lib.xf_model_target_weight_sum(
        named["y"].ctypes.data, named["w"].ctypes.data, named["n"],
        named["ignore_index"], named["C"])
    assert got == _xent.target_weight_sum(y[keep], w, -1, True, 50)


def test_wrappers_reject_what_could_reach_a_kernel_wrongly():
    with fake_gpu() as (cp, rec):
        _check_wrapper_guards(cp, rec)


def _check_wrapper_guards(cp, rec):
    x = cp.zeros(10, dtype=np.float32)
    e = cp.empty(0, dtype=np.float64)
    base = [0, x, cp.zeros(10, dtype=np.float32), e, 1, 1, e, 1, 1, e, 1.0, False, 0.0, 0.25, 2.0, False, 0.0,
            False, 0.0, cp.zeros(10), cp.empty(0, dtype=np.float32), cp.empty(0, dtype=np.float32), 1, False, False,
            False, True, False, False]
    _cuda.elementwise(*base)
    assert len(rec.calls) == 1
    for i, bad in ((0, 3), (2, cp.zeros(9, dtype=np.float32)), (2, cp.zeros(10)), (19, cp.zeros(9)),
                   (1, np.zeros(10, dtype=np.float32))):
        args = list(base)
        args[i] = bad
        with pytest.raises((TypeError, ValueError)):
            _cuda.elementwise(*args)
    args = list(base)
    args[3], args[4], args[5], args[23] = cp.zeros(4), 1, 5, True  # mod 5 > 4 weights
    with pytest.raises(ValueError, match="w:"):
        _cuda.elementwise(*args)
    with pytest.raises(ValueError, match="w:"):
        _cuda.target_weight_sum_device(cp.zeros(3, dtype=np.int64), cp.zeros(4), -100, True, 5)


class _OptInCheckingModule:
    """Kernels that refuse, as the driver does (CUDA_ERROR_INVALID_VALUE), a launch with more than 48 KB
    of dynamic shared memory unless that same kernel raised its own limit first."""

    class Kernel:
        def __init__(self, expr, launched):
            self.expr, self.launched, self.max_dynamic_shared_size_bytes = expr, launched, 0

        def __call__(self, grid, block, args, shared_mem=0):
            assert shared_mem <= max(48 * 1024, self.max_dynamic_shared_size_bytes), (
                f"{self.expr}: launched with {shared_mem} bytes of shared memory without opting in")
            self.launched.append((self.expr, shared_mem))

    def __init__(self):
        self.smem_set, self.kernels, self.launched = {}, {}, []

    def kernel(self, expr):
        return self.kernels.setdefault(expr, self.Kernel(expr, self.launched))


@pytest.mark.parametrize("wrapper", ["softmax_xent z_loss", "softmax_family lse"])
def test_every_kernel_launched_past_48_kb_of_shared_memory_opts_in(wrapper):
    # the z-loss rows' second kernel once ran with the first one's shared memory but without its opt-in:
    # every long-row launch with the row cached failed on the GPU
    N, C = 3, 20000
    mod = _OptInCheckingModule()
    with fake_gpu() as (cp, rec), pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cuda, "_module", lambda dtype, source="kernels.cu": mod)
        mp.setattr(_cuda, "_smem_limit", lambda: 227 * 1024)
        mp.setenv("XENTFAST_CUDA_CACHE_ROW", "1")
        x = cp.zeros((N, C), dtype=np.float32)
        if wrapper == "softmax_xent z_loss":
            e64 = cp.empty(0, dtype=np.float64)
            _cuda.softmax_xent(x, cp.zeros(N, dtype=np.int64), cp.empty((0, 0), dtype=np.float32), e64, -100,
                               0.0, 1e-4, e64, 1.0, cp.zeros(N), cp.zeros((N, C), dtype=np.float32), 1, True,
                               False, False, False, True)
        else:
            _cuda.softmax_family(x, cp.zeros((N, C), dtype=np.float32), cp.zeros(N), 1, 1, True)
    assert len(mod.launched) == 2, mod.launched
    assert mod.launched[0][1] > 48 * 1024  # the case this test is about


# ---------------------------------------------------------------------------------------------------
# (d) on a GPU


def _cp():
    return pytest.importorskip("cupy")


def gpu_xent(a, grad=True, inplace=False):
    cp = _cp()
    N, C = a.x.shape
    x = cp.asarray(a.x)
    dev = {k: (None if v is None else cp.asarray(v)) for k, v in
           dict(y=a.y, t=a.t, w=a.w, rs=a.row_scale).items()}
    loss = cp.full(N, cp.nan)
    g = (x if inplace else cp.full_like(x, cp.nan)) if grad else cp.empty((0, 0), x.dtype)
    _cuda.softmax_xent(x, _or(dev["y"], cp.empty(0, cp.int64)), _or(dev["t"], cp.empty((0, 0), x.dtype)),
                       _or(dev["w"], cp.empty(0)), a.ignore_index, a.eps, a.z, _or(dev["rs"], cp.empty(0)),
                       a.scale, loss, g, 1, a.y is not None, a.t is not None, a.w is not None,
                       a.row_scale is not None, grad, loss_scale=a.loss_scale)
    return cp.asnumpy(loss), (cp.asnumpy(g) if grad else None)


def gpu_family(x, mode):
    cp = _cp()
    xd = cp.asarray(x)
    out = cp.full_like(xd, cp.nan) if mode else cp.empty((0, 0), xd.dtype)
    lse = cp.full(x.shape[0], cp.nan)
    _cuda.softmax_family(xd, out, lse, mode, 1, True)
    return (cp.asnumpy(out) if mode else None), cp.asnumpy(lse)


# short rows are cached in shared memory by default (_cuda._launch_config): "global-rows" keeps the
# other path of those rows under the same tests
ROW_CACHE = pytest.mark.parametrize("row_cache", ["", "0"], ids=["default-rows", "global-rows"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@ROW_CACHE
@given(data=st.data())
def test_gpu_gives_the_cpu_bits(dtype, row_cache, data):
    a = _draw_args(data, dtype)
    inplace = data.draw(st.booleans(), label="inplace")
    lc, gc = cpu_xent(a)
    with pytest.MonkeyPatch.context() as mp:
        if row_cache:
            mp.setenv("XENTFAST_CUDA_CACHE_ROW", row_cache)
        lg, gg = gpu_xent(a, inplace=inplace)
    assert_same_bits(lg, lc, "row losses")
    assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@ROW_CACHE
@given(data=st.data())
def test_gpu_family_gives_the_cpu_bits(dtype, row_cache, data):
    x = data.draw(logits(dtype, allow_nan=True, allow_posinf=True), label="x")
    for mode in (0, 1, 2):
        oc, lc = cpu_family(x, mode)
        with pytest.MonkeyPatch.context() as mp:
            if row_cache:
                mp.setenv("XENTFAST_CUDA_CACHE_ROW", row_cache)
            og, lg = gpu_family(x, mode)
        assert_same_bits(lg, lc, "logsumexp (double)")
        if mode:
            assert_same_bits(og, oc, ["", "log_softmax", "softmax"][mode])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_gpu_meets_the_contract(dtype, data):
    # the per-row bounds of tests/test_softmax_xent.py, on the GPU's own outputs
    case = data.draw(softmax_xent_cases(dtype))
    kw = dict(weight=case.weight, ignore_index=case.ignore_index, label_smoothing=case.label_smoothing,
              z_loss=case.z_loss)
    loss, grad = gpu_xent(args_from_case(case))
    x, t = case.logits, case.target
    bound = BOUND[np.dtype(dtype)]
    with np.errstate(over="ignore"):
        assert_ulp_close(loss.astype(dtype), ref.cross_entropy(x, t, reduction="none", **kw), bound,
                         inputs={"logits": x, "target": t})
    exact, scale = ref.cross_entropy_grad(x, t, reduction="none", return_scale=True, **kw)
    simple = t.dtype.kind in "iu" and case.label_smoothing == 0 and case.z_loss == 0
    assert_ulp_close(grad, exact, bound, scale=None if simple else scale, inputs={"logits": x, "target": t})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("threads", ["", "32", "512"])
@pytest.mark.parametrize("cache_row", ["0", "1"])
@pytest.mark.parametrize("min_blocks", ["2", "1"], ids=["64-registers", "72-registers"])
def test_gpu_long_rows_every_launch_shape(dtype, threads, cache_row, min_blocks, monkeypatch):
    # every launch shape, and both register budgets of the cross-entropy kernel (kernels.cu
    # XF_CU_XENT_MIN_BLOCKS: another register allocation of the same code must give the same bits)
    monkeypatch.setenv("XENTFAST_CUDA_THREADS", threads)
    monkeypatch.setenv("XENTFAST_CUDA_CACHE_ROW", cache_row)
    monkeypatch.setenv("XENTFAST_CUDA_XENT_MIN_BLOCKS", min_blocks)
    for a in _long_row_problems(dtype):
        lc, gc = cpu_xent(a)
        lg, gg = gpu_xent(a)
        assert_same_bits(lg, lc, f"row losses, C={a.x.shape[1]}")
        assert_same_bits(gg, gc, f"gradient, C={a.x.shape[1]}")


@pytest.mark.gpu
@pytest.mark.parametrize("C", [32000, 128256])
def test_gpu_vocabulary_rows(C):
    rng = np.random.default_rng(C)
    x = order_sensitive(rng, 4, C, np.float32)
    a = Args(x, rng.integers(0, C, 4).astype(np.int64), None, None, -100, 0.0, 0.0, None, 0.25)
    lc, gc = cpu_xent(a)
    lg, gg = gpu_xent(a)
    assert_same_bits(lg, lc, "row losses")
    assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
def test_gpu_shared_memory_opt_in_row():
    # 800000 classes: more than 48 KiB of scratch per block, the kernel attribute path
    rng = np.random.default_rng(2)
    x = order_sensitive(rng, 1, 800_000, np.float32)
    assert _cuda.smem_bytes(_cuda.threads_for(800_000), 800_000, 4, False) > 48 * 1024
    a = Args(x, np.array([3], dtype=np.int64), None, None, -100, 0.0, 0.0, None, 1.0)
    lc, gc = cpu_xent(a)
    lg, gg = gpu_xent(a)
    assert_same_bits(lg, lc, "row loss")
    assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
def test_gpu_float32_subnormals_are_not_flushed():
    # subnormal logits in, subnormal probabilities and gradients out: FTZ anywhere changes these bits
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    x = np.array([[tiny, -tiny, 3 * tiny, 0.0], [0.0, -100.0, -103.0, -90.0], [95.0, 0.0, 1.0, 2.0]],
                 dtype=np.float32)
    a = Args(x, np.array([0, 1, 2], dtype=np.int64), None, None, -100, 0.0, 0.0, None, 1.0)
    lc, gc = cpu_xent(a)
    lg, gg = gpu_xent(a)
    assert np.any((gc != 0) & (np.abs(gc) < np.finfo(np.float32).smallest_normal))
    assert_same_bits(gg, gc, "gradient")
    for mode in (1, 2):
        assert_same_bits(gpu_family(x, mode)[0], cpu_family(x, mode)[0], "family")


@pytest.mark.gpu
def test_gpu_on_a_non_default_stream():
    cp = _cp()
    rng = np.random.default_rng(3)
    x = order_sensitive(rng, 64, 1000, np.float32)
    a = Args(x, rng.integers(0, 1000, 64).astype(np.int64), None, None, -100, 0.0, 0.0, None, 1.0)
    lc, gc = cpu_xent(a)
    with cp.cuda.Stream(non_blocking=True) as s:
        lg, gg = gpu_xent(a)
        s.synchronize()
    assert_same_bits(lg, lc, "row losses")
    assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
def test_gpu_reductions_match_the_cpu():
    cp = _cp()
    rng = np.random.default_rng(4)
    v = rng.standard_normal(10_001) * np.exp(rng.uniform(-30, 30, 10_001))
    assert _cuda.dd_sum(cp.asarray(v)) == _xent.dd_sum(v)
    y = rng.integers(0, 50, 5000).astype(np.int64)
    y[::7] = -100
    w = rng.uniform(0, 3, 50)
    for has_w in (False, True):
        assert _cuda.target_weight_sum(cp.asarray(y), cp.asarray(w), -100, has_w, 50) == \
            _xent.target_weight_sum(y, w, -100, has_w, 50)
        dev = _cuda.target_weight_sum_device(cp.asarray(y), cp.asarray(w), -100, has_w, 50)
        assert isinstance(dev, cp.ndarray) and dev.shape == (1,) and dev.dtype == np.float64
        assert float(dev.get()[0]) == _xent.target_weight_sum(y, w, -100, has_w, 50)
    # labels outside [0, C) are skipped, never read (the API raises on them before)
    bad = y.copy()
    bad[::11] = 50 + 10**9
    bad[1::13] = -5
    keep = ((bad >= 0) & (bad < 50)) | (bad == -100)
    assert _cuda.target_weight_sum(cp.asarray(bad), cp.asarray(w), -100, True, 50) == \
        _xent.target_weight_sum(bad[keep], w, -100, True, 50)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_tree_order_within_one_ulp(dtype, monkeypatch):
    monkeypatch.setenv("XENTFAST_CUDA_ORDER", "tree")
    for a in _long_row_problems(dtype):
        lc, gc = cpu_xent(a)
        lg, gg = gpu_xent(a)
        with np.errstate(over="ignore"):
            assert ulp_distance(lg.astype(a.x.dtype), lc.astype(a.x.dtype)).max() <= 1
        assert ulp_distance(gg, gc).max() <= 1


# ---- the binary family and dd_sum on the GPU


def gpu_elementwise(a, want_d=True, want_o=False, want_grad=True, inplace=False):
    cp = _cp()
    args, outs = _bin_call(a, want_d, want_o, want_grad, inplace, cp, lambda dt: cp.empty(0, dt))
    lo, hi = _clamp_thresholds(a)
    _cuda.elementwise(*args, loss_k=a.loss_k, clamp_lo=lo, clamp_hi=hi)
    return tuple(None if o is None else cp.asnumpy(o) for o in outs)


def gpu_ce_probs(a, want_grad=True, inplace=False):
    cp = _cp()
    args, (loss, grad) = _ce_call(a, want_grad, inplace, cp, lambda dt: cp.empty(0, dt),
                                  lambda dt: cp.empty((0, 0), dt))
    _cuda.ce_probs(*args, loss_k=a.loss_k)
    return cp.asnumpy(loss), (cp.asnumpy(grad) if want_grad else None)


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(BIN_OPS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_gpu_elementwise_gives_the_cpu_bits(dtype, op, data):
    a = _draw_bin_args(data, dtype, BIN_OPS[op])
    want_d, want_o, want_grad = _draw_outputs(data)
    inplace = want_grad and data.draw(st.booleans(), label="inplace")
    _assert_outputs(gpu_elementwise(a, want_d, want_o, want_grad, inplace),
                    cpu_elementwise(a, want_d, want_o, want_grad, inplace), op)


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(BIN_OPS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_elementwise_long_broadcasts(dtype, op):
    """Many CPU blocks and a grid-stride loop (more elements than threads), every broadcast kind, and
    every option on; then the same on a non-default stream."""
    cp = _cp()
    rng = np.random.default_rng(9)
    shape = (64, 3, 3001)  # 576192 elements
    x = (rng.standard_normal(shape) * 20).astype(dtype)
    if BIN_OPS[op] == _binary.OP_BCE_PROB:
        x = rng.random(shape).astype(dtype)
        x.reshape(-1)[::97] = 0.0
        x.reshape(-1)[1::89] = 1.0
    t = rng.random(shape).astype(dtype)
    t.reshape(-1)[::5] = 1.0
    t.reshape(-1)[::31] = -1.0
    for wshape in [(), (3001,), (3, 1), (64, 1, 1), (3, 3001), shape]:
        w, w_div, w_mod = _bcast(rng.uniform(0, 3, wshape), shape)
        pw, pw_div, pw_mod = _bcast(rng.uniform(0, 3, (3001,)), shape)
        if BIN_OPS[op] != _binary.OP_BCE_LOGITS:
            pw, pw_div, pw_mod = None, 1, 1
        for eps, clamp, k in ((1e-7, None, 0.0), (None, -100.0, 600.0)):
            a = BinArgs(BIN_OPS[op], x.reshape(-1), t.reshape(-1), w, w_div, w_mod, pw, pw_div, pw_mod,
                        rng.standard_normal(x.size), 0.5, -1.0, 0.25, 2.0, eps, clamp, k)
            want = cpu_elementwise(a, True, True, True)
            _assert_outputs(gpu_elementwise(a, True, True, True), want, f"{op}, weight {wshape}")
    with cp.cuda.Stream(non_blocking=True) as s:
        got = gpu_elementwise(a, True, False, True, inplace=True)
        s.synchronize()
    _assert_outputs(got, cpu_elementwise(a, True, False, True), f"{op}, inplace on a stream")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_gpu_ce_probs_gives_the_cpu_bits(dtype, data):
    a = _draw_ce_args(data, dtype)
    want_grad = data.draw(st.booleans(), label="grad")
    inplace = want_grad and data.draw(st.booleans(), label="inplace")
    lc, gc = cpu_ce_probs(a, want_grad, inplace)
    lg, gg = gpu_ce_probs(a, want_grad, inplace)
    assert_same_bits(lg, lc, "row losses")
    if want_grad:
        assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_ce_probs_many_rows(dtype):
    rng = np.random.default_rng(10)
    N, C = 5000, 301
    p = rng.random((N, C)).astype(dtype)
    p /= p.sum(axis=1, keepdims=True)
    p[7, 3] = np.nan
    t = rng.random((N, C)).astype(dtype)
    t /= t.sum(axis=1, keepdims=True)
    y = rng.integers(0, C, N).astype(np.int64)
    y[::9] = -100
    w = rng.uniform(0, 2, C)
    for a in (CeArgs(p, y, None, w, -100, rng.uniform(-1, 1, N), 0.5, None, 0.0),
              CeArgs(p, None, t, w, -100, None, 1.0 / 3.0, 1e-7, 600.0)):
        lc, gc = cpu_ce_probs(a)
        lg, gg = gpu_ce_probs(a)
        assert_same_bits(lg, lc, "row losses")
        assert_same_bits(gg, gc, "gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", DD_KINDS)
def test_gpu_dd_sum_gives_the_cpu_bits(kind):
    cp = _cp()
    for n in DD_SIZES + [2**20 + 3]:
        for specials in ((), (np.inf,), (np.nan,), (np.inf, -np.inf)):
            v = _with_specials(_adversarial_vector(kind, n, n + 1), specials, n)
            vd = cp.asarray(v)
            out = _cuda.dd_sum_device(vd)
            assert isinstance(out, cp.ndarray) and out.shape == (2,) and out.dtype == np.float64
            assert_same_bits(cp.asnumpy(out), np.array(_xent.dd_sum(v)), f"dd_sum n={n} {kind} {specials}")
            assert_same_bits(np.array(_cuda.dd_sum(vd)), np.array(_xent.dd_sum(v)), "dd_sum (host)")


@pytest.mark.gpu
def test_gpu_dd_sum_large():
    """2^25 + 5 elements (32769 blocks: a 16-level tree, partials over every tree thread)."""
    cp = _cp()
    v = _adversarial_vector("losses", 2**25 + 5, 3)
    with cp.cuda.Stream(non_blocking=True) as s:
        vd = cp.asarray(v)
        out = _cuda.dd_sum_device(vd)
        s.synchronize()
    assert_same_bits(cp.asnumpy(out), np.array(_xent.dd_sum(v)), "dd_sum 2^25 + 5")


# the public API on CuPy arrays: xfail until api.py dispatches them (see the issue-5 report)


def _api_on_gpu():
    cp = _cp()
    try:
        out = xf.logsumexp(cp.zeros((2, 3), dtype=cp.float32))
    except TypeError as exc:
        pytest.xfail(f"xentfast.api does not dispatch CuPy arrays yet: {exc}")
    if not isinstance(out, cp.ndarray):
        pytest.xfail("xentfast.api returned a NumPy result for CuPy input")
    return cp


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_api_cupy_in_cupy_out_cpu_bits(dtype, reduction):
    cp = _api_on_gpu()
    rng = np.random.default_rng(6)
    x = order_sensitive(rng, 16, 5000, dtype)
    y = rng.integers(0, 5000, 16)
    y[3] = -100
    loss_c, grad_c = xf.cross_entropy_with_grad(x, y, reduction=reduction, label_smoothing=0.1)
    loss_g, grad_g = xf.cross_entropy_with_grad(cp.asarray(x), cp.asarray(y), reduction=reduction,
                                                label_smoothing=0.1)
    assert isinstance(loss_g, cp.ndarray) and isinstance(grad_g, cp.ndarray)
    assert grad_g.device.id == cp.cuda.runtime.getDevice()
    assert_same_bits(cp.asnumpy(loss_g), np.asarray(loss_c), "loss")
    assert_same_bits(cp.asnumpy(grad_g), grad_c, "gradient")
    for f in (xf.log_softmax, xf.softmax, xf.logsumexp):
        assert_same_bits(cp.asnumpy(f(cp.asarray(x))), f(x), f.__name__)


@pytest.mark.gpu
def test_api_mixed_arrays_raise_type_error_naming_them():
    cp = _api_on_gpu()
    x = np.zeros((2, 3), dtype=np.float32)
    y = np.array([0, 1])
    with pytest.raises(TypeError, match=r"(?s)input.*target|target.*input"):
        xf.cross_entropy(cp.asarray(x), y)
    with pytest.raises(TypeError, match=r"(?s)input.*weight|weight.*input"):
        xf.cross_entropy(cp.asarray(x), cp.asarray(y), weight=np.ones(3))


@pytest.mark.gpu
def test_api_inplace_on_cupy():
    cp = _api_on_gpu()
    rng = np.random.default_rng(7)
    x = order_sensitive(rng, 8, 300, np.float32)
    y = rng.integers(0, 300, 8)
    _, grad_c = xf.cross_entropy_with_grad(x, y)
    xd = cp.asarray(x)
    _, grad_g = xf.cross_entropy_with_grad(xd, cp.asarray(y), inplace=True)
    assert grad_g.data.ptr == xd.data.ptr
    assert_same_bits(cp.asnumpy(xd), grad_c, "inplace gradient")


@pytest.mark.gpu
def test_api_label_range_is_checked_on_gpu():
    cp = _api_on_gpu()
    with pytest.raises(ValueError, match="target: labels must be in"):
        xf.cross_entropy(cp.zeros((2, 3), dtype=cp.float32), cp.asarray([0, 7]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_api_binary_family_on_cupy_gives_the_cpu_bits(dtype, reduction):
    cp = _api_on_gpu()
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((64, 300)) * 8).astype(dtype)
    x[0, :4] = [np.inf, -np.inf, 1e30, -1e-30]
    t = (rng.uniform(size=x.shape) > 0.5).astype(dtype)
    t[1, ::3] = 0.25
    w = rng.uniform(0.5, 2, (64, 1))
    pw = rng.uniform(0.5, 2, 300)
    p = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(dtype)
    calls = [
        (xf.binary_cross_entropy_with_logits_with_grad, (x, t), dict(weight=w, pos_weight=pw)),
        (xf.sigmoid_focal_loss_with_grad, (x, t), dict(alpha=0.3, gamma=1.5)),
        (xf.binary_cross_entropy_with_grad, (p, t), dict(weight=w, log_clamp=-100.0)),
        (xf.cross_entropy_from_probs_with_grad, (xf.softmax(x), rng.integers(0, 300, 64)), dict(weight=pw)),
    ]
    for f, args, kw in calls:
        loss_c, grad_c = f(*args, reduction=reduction, **kw)
        dkw = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        loss_g, grad_g = f(*map(cp.asarray, args), reduction=reduction, **dkw)
        assert isinstance(loss_g, cp.ndarray) and isinstance(grad_g, cp.ndarray), f.__name__
        assert_same_bits(cp.asnumpy(loss_g), np.asarray(loss_c), f"{f.__name__} loss")
        assert_same_bits(cp.asnumpy(grad_g), grad_c, f"{f.__name__} gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_api_logsumexp_of_cancelling_rows_on_cupy(dtype):
    # rows whose lse cancels take xf_lse_exact_kernel on the GPU: same bits as the CPU's exact path
    cp = _api_on_gpu()
    rng = np.random.default_rng(9)
    rows = [xf.log_softmax(rng.standard_normal(C).astype(dtype)) for C in (3, 100, 1000)]
    rows += [np.full(C, -np.log(C), dtype=dtype) for C in (2, 13, 1024)]
    for row in rows:
        x = np.stack([row, row[::-1].copy()])
        lse_c = xf.logsumexp(x)
        assert_same_bits(cp.asnumpy(xf.logsumexp(cp.asarray(x))), lse_c, f"logsumexp C={row.size}")
        exact = ref.logsumexp(x)
        assert_ulp_close(lse_c, exact, BOUND[np.dtype(dtype)])


@pytest.mark.gpu
@pytest.mark.slow
def test_api_more_than_2_to_31_elements_on_cupy():
    # every kernel family on arrays past 2^31 elements: the drawn rows past that offset must carry the bits
    # the CPU gives them alone (a 32-bit element index would wrap onto other rows).  ~45 GB of device memory
    cp = _api_on_gpu()
    if cp.cuda.Device().mem_info[1] < 48e9:
        pytest.skip("needs a GPU with 48 GB of memory or more")
    n, c = 65540, 32768
    assert n * c > 2**31 and (n - 3) * c > 2**31
    rng = np.random.default_rng(10)
    drawn = [0, n // 2, n - 3, n - 1]
    rows = (rng.standard_normal((len(drawn), c)) * 3).astype(np.float32)
    labels = rng.integers(0, c, len(drawn))
    x = cp.zeros((n, c), dtype=cp.float32)
    x[cp.asarray(drawn)] = cp.asarray(rows)
    y = cp.zeros(n, dtype=cp.int64)
    y[cp.asarray(drawn)] = cp.asarray(labels)

    def check(what, got, want):
        assert_same_bits(cp.asnumpy(got[cp.asarray(drawn)]), want, what)

    loss, grad = xf.cross_entropy_with_grad(x, y, reduction="none")
    want_loss, want_grad = xf.cross_entropy_with_grad(rows, labels, reduction="none")
    check("cross_entropy_with_grad loss", loss, want_loss)
    check("cross_entropy_with_grad gradient", grad, want_grad)
    del loss, grad
    check("log_softmax", xf.log_softmax(x), xf.log_softmax(rows))
    t = (x > 0).astype(cp.float32)
    loss, grad = xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction="sum")
    check("binary_cross_entropy_with_logits gradient", grad,
          xf.binary_cross_entropy_with_logits_with_grad(rows, (rows > 0).astype(np.float32), reduction="sum")[1])
    # the sum over all 2^31+ elements against the CPU's (zero pages but for the drawn rows)
    xh, th = np.zeros((n, c), dtype=np.float32), np.zeros((n, c), dtype=np.float32)
    xh[drawn], th[drawn] = rows, (rows > 0)
    assert_same_bits(cp.asnumpy(loss), np.asarray(xf.binary_cross_entropy_with_logits(xh, th, reduction="sum")),
                     "binary_cross_entropy_with_logits sum")
    del loss, grad, t, xh, th
    p = xf.softmax(x)
    loss, grad = xf.cross_entropy_from_probs_with_grad(p, y, reduction="none")
    want_p = xf.softmax(rows)
    want_loss, want_grad = xf.cross_entropy_from_probs_with_grad(want_p, labels, reduction="none")
    check("softmax", p, want_p)
    check("cross_entropy_from_probs loss", loss, want_loss)
    check("cross_entropy_from_probs gradient", grad, want_grad)
