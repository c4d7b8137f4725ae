"""Build of the compiled parts only; metadata lives in pyproject.toml.

Flags, and why:
  -O3                      the kernels are written to be vectorized by the compiler
  -ffp-contract=off        no silent a*b+c -> fma: results must not depend on the compiler's mood or the ISA,
                           and the error-free transformations (TwoSum) in numerics.h need exact roundings
  -fno-math-errno          libm calls may be treated as pure
  -fno-trapping-math       lets gcc if-convert the selects in the math header (nothing vectorizes without it);
                           it does not change any result
  never fast-math or O-fast: they reassociate sums and assume no inf/NaN, which breaks the accuracy contract
  no -march=native:        the wheel must run on any x86-64; the AVX2+FMA kernels are a static library of
                           their own units (avx2_*.c, -mavx2 -mfma), chosen at import on CPUs that have both

XLA FFI handlers for xentfast.jax (xentfast._core._xla_ffi, C++17): built only when jaxlib's FFI headers
are installed at build time (pip's isolated build has no jaxlib, so they are skipped there and
xentfast.jax uses its callbacks), never required: a failed compile is a warning.  The build records the
jaxlib version whose headers it used; xentfast.jax loads the handlers only with that jaxlib or a newer one
(XLA refuses handlers built against a newer FFI API).  XENTFAST_NO_XLA_FFI=1 skips them;
XENTFAST_ONLY_XLA_FFI=1 builds them alone (CI adds them to the isolated install that way).

OpenMP: probed by compiling a tiny program with -fopenmp.  Without it the build falls back to a serial
extension with a visible warning; XENTFAST_REQUIRE_OPENMP=1 turns the fallback into an error (CI sets it),
XENTFAST_NO_OPENMP=1 forces the serial build.

AVX2+FMA path: on x86-64, avx2_softmax.c and avx2_binary.c are a static library compiled with -mavx2 -mfma
(build_clib, run by build_ext first).  If the compiler cannot, the build warns and ships the baseline path
alone; XENTFAST_REQUIRE_AVX2_PATH=1 turns that into an error (CI sets it).
"""

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
PKG = HERE / "src" / "xentfast"

BASE_CFLAGS = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
DEBUG = os.environ.get("XENTFAST_DEBUG", "0") not in ("", "0")


def _env_flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def _compiles(flags, source):
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    cc = [os.environ.get("CC", cc[0])] + cc[1:]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        cmd = cc + flags + [str(src), "-o", str(Path(tmp) / "probe")]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True)
        except OSError:
            return False
        if result.returncode != 0:
            return False
        return subprocess.run([str(Path(tmp) / "probe")], capture_output=True).returncode == 0


def _fall_back(message, require_flag):
    """A build that works but is far slower than it should be: a banner pip shows, or an error where
    `require_flag`=1 (CI) says such a build must not land."""
    if _env_flag(require_flag):
        sys.exit(f"{message} {require_flag}=1 forbids that.")
    print("\n" + "*" * 78 + "\nWARNING: " + message + "\n" + "*" * 78 + "\n", file=sys.stderr)


OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        return (n >= 1 && omp_get_max_threads() >= 1) ? 0 : 1;
    }
    """
)


def openmp_flags():
    if _env_flag("XENTFAST_NO_OPENMP"):
        if _env_flag("XENTFAST_REQUIRE_OPENMP"):
            sys.exit("XENTFAST_REQUIRE_OPENMP=1 and XENTFAST_NO_OPENMP=1 contradict each other")
        return None
    for compile_flags, link_flags in ((["-fopenmp"], ["-fopenmp"]),
                                      (["-Xpreprocessor", "-fopenmp"], ["-lomp"])):
        if _compiles(compile_flags + link_flags, OPENMP_PROBE):
            return compile_flags, link_flags
    _fall_back("xentfast: the C compiler does not support OpenMP; building a SERIAL extension "
               "(n_threads will have no effect).", "XENTFAST_REQUIRE_OPENMP")
    return None


omp = openmp_flags()
cflags = list(BASE_CFLAGS)
ldflags = []
if omp:
    cflags += omp[0]
    ldflags += omp[1]
elif _compiles(["-fopenmp-simd"], "int main(void){return 0;}"):
    # keep the `#pragma omp simd` vectorization hints even in the serial build
    cflags.append("-fopenmp-simd")


include_dirs = [str(PKG / "include"), str(PKG / "_core"), np.get_include()]
# every header the kernels include: a change to one rebuilds the units and extensions that include it
# (neither build_clib nor build_ext looks at #include lines on its own)
kernel_headers = sorted(str(p.relative_to(HERE)) for p in [*(PKG / "include" / "xentfast").glob("*.h"),
                                                           *(PKG / "_core").glob("*.h")])
avx2_sources = ["src/xentfast/_core/avx2_softmax.c", "src/xentfast/_core/avx2_binary.c"]


def avx2_path_library():
    """The AVX2+FMA kernels, a static library of their own units (see xent_kernels.h); None off x86-64.

    Without it the package runs the baseline path only, whose emulated fma makes the softmax kernels
    17-30x slower: hence the banner, and XENTFAST_REQUIRE_AVX2_PATH=1 (CI) to make it an error."""
    target = sysconfig.get_platform() + " " + os.environ.get("ARCHFLAGS", "")
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686") or \
            any(arch in target for arch in ("arm64", "universal2")):
        return None                    # not an x86 build (the headers check the target again)
    if not _compiles(["-mavx2", "-mfma"], "int main(void){return 0;}"):
        _fall_back("xentfast: the C compiler did not build a test program with -mavx2 -mfma; building the "
                   "baseline path only, whose exact fma emulation makes the kernels 17-30x slower.",
                   "XENTFAST_REQUIRE_AVX2_PATH")
        return None
    return ("xentfast_avx2", {
        "sources": avx2_sources,
        "include_dirs": include_dirs,
        "cflags": cflags + ["-mavx2", "-mfma"],
        "obj_deps": {"": kernel_headers},
    })


avx2_library = avx2_path_library()
path_macros = [("XF_AVX2_PATH_BUILT", "1")] if avx2_library else []

(PKG / "_build_info.py").write_text(
    "# generated by setup.py at build time; do not edit\n"
    f"OPENMP = {bool(omp)!r}\n"
    f"CFLAGS = {' '.join(cflags)!r}\n"
    f"AVX2_PATH_CFLAGS = {' '.join(avx2_library[1]['cflags']) if avx2_library else None!r}\n"
    f"LDFLAGS = {' '.join(ldflags)!r}\n"
)
extensions = [
    Extension(
        f"xentfast._core.{name}",
        [f"src/xentfast/_core/{name}.pyx"],
        include_dirs=include_dirs,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")] + path_macros,
        depends=kernel_headers + avx2_sources,  # relink after a change to the AVX2+FMA units
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )
    for name in ("_xent", "_scalar", "_openmp_helpers", "_binary")
]


def xla_ffi_extension():
    """The FFI handlers, against the FFI headers of the installed jaxlib; None where there are none."""
    if _env_flag("XENTFAST_NO_XLA_FFI"):
        return None
    spec = importlib.util.find_spec("jaxlib")      # locates the package without importing jax
    if spec is None or spec.origin is None:
        return None
    headers = Path(spec.origin).parent / "include"
    if not (headers / "xla" / "ffi" / "api" / "ffi.h").is_file():
        return None
    version = importlib.metadata.version("jaxlib")
    cxxflags = [f for f in cflags if not f.startswith("-std=")] + ["-std=c++17"]
    return Extension(
        "xentfast._core._xla_ffi",
        ["src/xentfast/_core/_xla_ffi.cc"],
        include_dirs=[str(PKG / "include"), str(PKG / "_core")],
        define_macros=[("XF_JAXLIB_VERSION", f'"{version}"')] + path_macros,
        depends=kernel_headers + avx2_sources,  # relink after a change to the AVX2+FMA units
        # -isystem: jaxlib's headers are not ours to warn about
        extra_compile_args=cxxflags + ["-isystem", str(headers)],
        extra_link_args=ldflags,
        language="c++",
        optional=True,
    )


ffi_extension = xla_ffi_extension()
if _env_flag("XENTFAST_ONLY_XLA_FFI"):
    # add the FFI handlers to an install built without jaxlib (pip's isolated build), without rebuilding
    # the kernels: `XENTFAST_ONLY_XLA_FFI=1 python setup.py build_ext --inplace`
    if ffi_extension is None:
        raise SystemExit("XENTFAST_ONLY_XLA_FFI=1 but jaxlib's FFI headers are not installed")
    extensions = []

class build_ext_after_clib(build_ext):
    """build_ext links the AVX2+FMA library, so it builds it first (plain build_ext --inplace does not)."""

    def run(self):
        if self.distribution.has_c_libraries():
            self.run_command("build_clib")
        super().run()


setup(
    libraries=[avx2_library] if avx2_library else [],
    cmdclass={"build_ext": build_ext_after_clib},
    ext_modules=cythonize(
        extensions,
        compiler_directives=dict(
            language_level=3,
            boundscheck=DEBUG,
            wraparound=False,
            cdivision=True,
            initializedcheck=DEBUG,
            embedsignature=True,
        ),
    )
    + ([ffi_extension] if ffi_extension is not None else [])
)
