"""Build and run-time configuration report."""

import platform

from ._core import _xent
from ._core._openmp_helpers import omp_max_threads, openmp_enabled
from ._threads import effective_n_threads

try:
    from . import _build_info
except ImportError:  # pragma: no cover - only when the build step did not run
    _build_info = None


def config():
    """The facts :func:`show_config` prints, as a dict."""
    from . import __version__

    return {
        "version": __version__,
        "openmp": openmp_enabled(),
        "default_n_threads": effective_n_threads(None),
        "omp_max_threads": omp_max_threads(),
        "cpu_code_path": _xent.cpu_path() + " (available: " + ", ".join(_xent.available_cpu_paths())
        + "; avx2 means AVX2 and FMA, avx512 AVX-512 F/DQ/VL/BW besides; override with XENTFAST_CPU; every "
        "path gives the same bits)",
        "fma": ", ".join(f"{p}: {'instruction' if _xent.fma_instruction(p) else 'exact emulation (slow)'}"
                         for p in _xent.available_cpu_paths()),
        "cflags": getattr(_build_info, "CFLAGS", "unknown"),
        "avx2_path_cflags": getattr(_build_info, "AVX2_PATH_CFLAGS", "unknown"),
        "avx512_path_cflags": getattr(_build_info, "AVX512_PATH_CFLAGS", "unknown"),
        "python": platform.python_version(),
    }


def show_config():
    """Print version, OpenMP on/off, default thread count and the CPU code path."""
    for key, value in config().items():
        print(f"{key:>18}: {value}")
