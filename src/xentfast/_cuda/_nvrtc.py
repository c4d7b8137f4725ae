"""A minimal ctypes binding of NVRTC: compile CUDA C++ to a cubin or PTX without a GPU or a driver.

Used by :mod:`xentfast._cuda` to build its kernels (CuPy's own compile path appends ``-ftz=true``, see
kernels.cu (e)) and by the tests to compile-check kernels.cu on machines without a GPU.  Only the
library is needed: a CUDA toolkit's ``libnvrtc.so``, or the ``nvidia-cuda-nvrtc-cu12`` /
``nvidia-cuda-nvrtc`` wheels.  ``XENTFAST_NVRTC=/path/to/libnvrtc.so.N`` picks one explicitly.
"""

import ctypes
import glob
import os
from typing import NamedTuple

__all__ = ["NVRTCError", "CompileResult", "available", "library_path", "version", "supported_archs", "compile"]


class NVRTCError(RuntimeError):
    """NVRTC failed; ``log`` holds the compiler's log (empty if the failure came before compiling)."""

    def __init__(self, message, log=""):
        super().__init__(message + (f"\n{log}" if log else ""))
        self.log = log


class CompileResult(NamedTuple):
    code: bytes              # cubin (target "cubin") or PTX text as bytes (target "ptx")
    lowered: dict            # name expression -> mangled kernel name
    log: str                 # compiler warnings


_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("XENTFAST_NVRTC")
    if env:
        yield env
        return
    try:  # cuda-pathfinder, a CuPy >= 14 dependency, knows every layout NVIDIA ships
        from cuda.pathfinder import load_nvidia_dynamic_lib

        yield load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:
        pass
    try:  # pip wheels: nvidia-cuda-nvrtc-cu12 (nvidia/cuda_nvrtc/lib), CUDA 13 (nvidia/cu13/lib)
        import nvidia

        for base in nvidia.__path__:
            for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*", "cu12/lib/libnvrtc.so.*"):
                yield from sorted(glob.glob(os.path.join(base, pattern)), reverse=True)
    except ImportError:
        pass
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root:
            yield from sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")), reverse=True)
    yield from ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12")


def _load():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            lib.nvrtcVersion  # noqa: B018  (a library of that name that is not NVRTC fails here)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        _setup(lib)
        _lib, _lib_path = lib, path
        return lib
    raise NVRTCError("NVRTC library not found; install nvidia-cuda-nvrtc-cu12 (or a CUDA toolkit), or set "
                     "XENTFAST_NVRTC.  Tried:\n  " + "\n  ".join(tried))


def _setup(lib):
    P, c_char_p, c_int, c_size_t = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    proto = {
        "nvrtcGetErrorString": (c_char_p, [c_int]),
        "nvrtcVersion": (c_int, [ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
        "nvrtcCreateProgram": (c_int, [ctypes.POINTER(P), c_char_p, c_char_p, c_int, P, P]),
        "nvrtcDestroyProgram": (c_int, [ctypes.POINTER(P)]),
        "nvrtcCompileProgram": (c_int, [P, c_int, ctypes.POINTER(c_char_p)]),
        "nvrtcAddNameExpression": (c_int, [P, c_char_p]),
        "nvrtcGetLoweredName": (c_int, [P, c_char_p, ctypes.POINTER(c_char_p)]),
        "nvrtcGetProgramLogSize": (c_int, [P, ctypes.POINTER(c_size_t)]),
        "nvrtcGetProgramLog": (c_int, [P, c_char_p]),
        "nvrtcGetPTXSize": (c_int, [P, ctypes.POINTER(c_size_t)]),
        "nvrtcGetPTX": (c_int, [P, c_char_p]),
        "nvrtcGetCUBINSize": (c_int, [P, ctypes.POINTER(c_size_t)]),
        "nvrtcGetCUBIN": (c_int, [P, c_char_p]),
        "nvrtcGetNumSupportedArchs": (c_int, [ctypes.POINTER(c_int)]),
        "nvrtcGetSupportedArchs": (c_int, [ctypes.POINTER(c_int)]),
    }
    for name, (res, args) in proto.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = res, args


def _check(lib, status, what, log=""):
    if status != 0:
        msg = lib.nvrtcGetErrorString(status)
        raise NVRTCError(f"{what}: {msg.decode() if msg else status}", log)


def available():
    """Whether an NVRTC library can be loaded."""
    try:
        _load()
        return True
    except NVRTCError:
        return False


def library_path():
    """Path (or name) of the loaded NVRTC library."""
    _load()
    return _lib_path


def version():
    """(major, minor) of the loaded NVRTC."""
    lib = _load()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs():
    """Compute capabilities this NVRTC can emit SASS for, e.g. [75, 80, ..., 90, ...]."""
    lib = _load()
    n = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    arr = (ctypes.c_int * n.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
    return list(arr)


def _log(lib, prog):
    n = ctypes.c_size_t()
    if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)) != 0 or n.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def compile(source, name="kernels.cu", options=(), name_expressions=(), target="cubin"):
    """Compile `source`; `options` as for nvrtcCompileProgram (one of them ``-arch=sm_XX`` for a cubin,
    ``-arch=compute_XX`` for PTX).  Returns a :class:`CompileResult`; raises :class:`NVRTCError` with the
    compiler's log on failure."""
    if target not in ("cubin", "ptx"):
        raise ValueError(f"target: expected 'cubin' or 'ptx', got {target!r}")
    lib = _load()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(lib, lib.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr!r})")
        opts = [o.encode() for o in options]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        log = _log(lib, prog)
        _check(lib, status, f"compiling {name} with {' '.join(options)}", log)
        size = ctypes.c_size_t()
        get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if target == "cubin"
                         else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
        _check(lib, get_size(prog, ctypes.byref(size)), f"size of the {target}")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, buf), f"reading the {target}")
        code = buf.raw[:size.value]
        if target == "ptx":
            code = code.rstrip(b"\0")
        lowered = {}
        for expr in name_expressions:
            out = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(out)),
                   f"nvrtcGetLoweredName({expr!r})")
            lowered[expr] = out.value.decode()
        return CompileResult(code, lowered, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
