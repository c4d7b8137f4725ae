"""Build of the compiled parts only; metadata lives in pyproject.toml.

Flags, and why:
  -O3                      the kernels are written to be vectorized by the compiler
  -ffp-contract=off        no silent a*b+c -> fma: results must not depend on the compiler's mood or the ISA,
                           and the error-free transformations (TwoSum) in numerics.h need exact roundings
  -fno-math-errno          libm calls may be treated as pure
  -fno-trapping-math       lets gcc if-convert the selects in the math header (nothing vectorizes without it);
                           it does not change any result
  no flag that lets the compiler reassociate sums or assume finite values (the -O level stays 3): either
                           breaks inf/NaN handling and the accuracy contract
  no -march=native:        the wheel must run on any x86-64; the AVX2+FMA kernels are a static library of
                           their own units (avx2_*.c, -mavx2 -mfma), chosen at import on CPUs that have both
  -g0                      Python's own CFLAGS bring -g; the kernels' specialized loops make the debug
                           information 3/4 of each module and a third of the compile time, for the same
                           machine code (objdump).  XENTFAST_DEBUG=1 keeps -g (and turns bounds checks on).

XLA FFI handlers for xentfast.jax (xentfast._core._xla_ffi, C++17): built only when jaxlib's FFI headers
are installed at build time (pip's isolated build has no jaxlib, so they are skipped there and
xentfast.jax uses its callbacks), never required: a failed compile is a warning.  They compile no kernel:
they call _xent's and _binary's through capsules (_xla_ffi.cc (a)), so they build in seconds.  The build
records the jaxlib version whose headers it used; xentfast.jax loads the handlers only with that jaxlib or
a newer one (XLA refuses handlers built against a newer FFI API).  XENTFAST_NO_XLA_FFI=1 skips them;
XENTFAST_ONLY_XLA_FFI=1 builds them alone (CI adds them to the isolated install that way).

OpenMP: probed by compiling a tiny program with -fopenmp.  Without it the build falls back to a serial
extension with a visible warning; XENTFAST_REQUIRE_OPENMP=1 turns the fallback into an error (CI sets it),
XENTFAST_NO_OPENMP=1 forces the serial build.

AVX2+FMA path: on x86-64, avx2_softmax.c and avx2_binary.c are a static library compiled with -mavx2 -mfma
that _xent and _binary link.  If the compiler cannot, the build warns and ships the baseline path alone;
XENTFAST_REQUIRE_AVX2_PATH=1 turns that into an error (CI sets it).  AVX-512 path: avx512_softmax.c and
avx512_binary.c, the same kernels with -mavx512f -mavx512dq -mavx512vl -mavx512bw and 512-bit vectors
preferred, in the same library, chosen at import only on CPUs with all of those; a compiler without them
leaves the path out with a warning (the AVX2 path serves those CPUs), XENTFAST_REQUIRE_AVX512_PATH=1 makes
that an error (CI sets it), XENTFAST_NO_AVX512_PATH=1 leaves the path out on purpose.

Build time: every kernel unit is one compiler process of a minute or more, so build_ext compiles them all
at once: the AVX2+FMA and AVX-512 units in threads of their own while the extensions compile in parallel
(`-j`, default: every core), linking _xent and _binary once the library is there.
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
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.modified import newer_group

HERE = Path(__file__).resolve().parent
PKG = HERE / "src" / "xentfast"

BASE_CFLAGS = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
DEBUG = os.environ.get("XENTFAST_DEBUG", "0") not in ("", "0")


def _env_flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def _compiles(flags, source, run=True):
    """Whether the C compiler builds `source` with `flags` (and, with `run`, the program runs: off for
    instructions the build machine's CPU may lack)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    cc = [os.environ.get("CC", cc[0])] + cc[1:]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        out = Path(tmp) / ("probe" if run else "probe.o")
        cmd = cc + flags + ([] if run else ["-c"]) + [str(src), "-o", str(out)]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True)
        except OSError:
            return False
        if result.returncode != 0:
            return False
        return not run or subprocess.run([str(out)], capture_output=True).returncode == 0


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
cflags = list(BASE_CFLAGS) + ([] if DEBUG else ["-g0"])
ldflags = []
if omp:
    cflags += omp[0]
    ldflags += omp[1]
elif _compiles(["-fopenmp-simd"], "int main(void){return 0;}"):
    # keep the `#pragma omp simd` vectorization hints even in the serial build
    cflags.append("-fopenmp-simd")


include_dirs = [str(PKG / "include"), str(PKG / "_core"), np.get_include()]
# every header the kernels include: a change to one rebuilds the units and extensions that include it
# (build_ext does not look at #include lines on its own)
kernel_headers = sorted(str(p.relative_to(HERE)) for p in [*(PKG / "include" / "xentfast").glob("*.h"),
                                                           *(PKG / "_core").glob("*.h")])
avx2_sources = ["src/xentfast/_core/avx2_softmax.c", "src/xentfast/_core/avx2_binary.c"]
avx512_sources = ["src/xentfast/_core/avx512_softmax.c", "src/xentfast/_core/avx512_binary.c"]
AVX2_LIBRARY = "xentfast_avx2"  # the AVX2+FMA units, and the AVX-512 ones where built
KERNEL_MODULES = ("_binary", "_xent")  # the extensions whose kernels have an AVX2+FMA path


def avx2_path_cflags():
    """Flags of the AVX2+FMA units (a static library of their own, see xent_kernels.h); None off x86-64.

    Without them the package runs the baseline path only, whose emulated fma makes the softmax kernels
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
    return cflags + ["-mavx2", "-mfma"]


avx2_cflags = avx2_path_cflags()

AVX512_FLAGS = ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mprefer-vector-width=512"]
# what the avx512 units use beyond the flags: the intrinsics of softmax_rows.h's 512-bit loop and the
# CPU test of xent_kernels.h; compiled only (the build machine's CPU may lack AVX-512)
AVX512_PROBE = textwrap.dedent(
    """
    #include <immintrin.h>
    int probe(const float *x) {
        __m512 a = _mm512_loadu_ps(x), b = _mm512_max_ps(a, _mm512_loadu_ps(x + 16));
        __m256 h = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1));
        __mmask16 k = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
        return (int)k + _mm256_movemask_ps(h) + __builtin_cpu_supports("avx512f") +
               __builtin_cpu_supports("avx512dq") + __builtin_cpu_supports("avx512vl") +
               __builtin_cpu_supports("avx512bw");
    }
    """
)


def avx512_path_cflags():
    """Flags of the AVX-512 units (the AVX2 path's plus AVX512_FLAGS); None where there is no AVX2 path,
    XENTFAST_NO_AVX512_PATH=1, or a compiler that cannot: the AVX2 path then serves those CPUs, 14-18 %
    slower at the large fused rows.  XENTFAST_REQUIRE_AVX512_PATH=1 (CI) makes the last an error."""
    if avx2_cflags is None:
        return None
    if _env_flag("XENTFAST_NO_AVX512_PATH"):
        if _env_flag("XENTFAST_REQUIRE_AVX512_PATH"):
            sys.exit("XENTFAST_REQUIRE_AVX512_PATH=1 and XENTFAST_NO_AVX512_PATH=1 contradict each other")
        return None
    if not _compiles(["-mavx2", "-mfma", *AVX512_FLAGS], AVX512_PROBE, run=False):
        _fall_back("xentfast: the C compiler did not build the AVX-512 probe; building without the avx512 "
                   "path (CPUs with AVX-512 run the avx2 path, 14-38 % slower).", "XENTFAST_REQUIRE_AVX512_PATH")
        return None
    return avx2_cflags + AVX512_FLAGS


avx512_cflags = avx512_path_cflags()
path_macros = ([("XF_AVX2_PATH_BUILT", "1")] if avx2_cflags else []) + \
    ([("XF_AVX512_PATH_BUILT", "1")] if avx512_cflags else [])

(PKG / "_build_info.py").write_text(
    "# generated by setup.py at build time; do not edit\n"
    f"OPENMP = {bool(omp)!r}\n"
    f"CFLAGS = {' '.join(cflags)!r}\n"
    f"AVX2_PATH_CFLAGS = {' '.join(avx2_cflags) if avx2_cflags else None!r}\n"
    f"AVX512_PATH_CFLAGS = {' '.join(avx512_cflags) if avx512_cflags else None!r}\n"
    f"LDFLAGS = {' '.join(ldflags)!r}\n"
)
# the largest units first: the parallel build starts them first
extensions = [
    Extension(
        f"xentfast._core.{name}",
        [f"src/xentfast/_core/{name}.pyx"],
        include_dirs=include_dirs,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")] + path_macros,
        libraries=[AVX2_LIBRARY] if avx2_cflags and name in KERNEL_MODULES else [],
        # relink after a change to the AVX2+FMA units
        depends=kernel_headers + (avx2_sources + avx512_sources if name in KERNEL_MODULES else []),
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )
    for name in ("_binary", "_xent", "_scalar", "_layout", "_openmp_helpers")
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
        define_macros=[("XF_JAXLIB_VERSION", f'"{version}"')],
        depends=kernel_headers,
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


class build_ext_all_at_once(build_ext):
    """Every compiler process of the build at once (module docstring, "Build time"): the extensions in
    parallel (-j, default every core), and the AVX2+FMA units in threads of their own beside them,
    archived into the library the kernel modules link before the first of those links."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = True

    def build_extensions(self):
        needs_library = [ext for ext in self.extensions if AVX2_LIBRARY in ext.libraries]
        library_ready = self._start_avx2_library() if needs_library else None
        link = self.compiler.link_shared_object

        def link_once_the_library_is_there(*args, libraries=None, **kwargs):
            if AVX2_LIBRARY in (libraries or []):
                library_ready()
            return link(*args, libraries=libraries, **kwargs)

        self.compiler.link_shared_object = link_once_the_library_is_there
        super().build_extensions()
        if library_ready is not None:
            library_ready()  # a unit's compile error surfaces even where no extension needed relinking

    def _start_avx2_library(self):
        """Starts compiling the AVX2+FMA (and AVX-512) units; returns the function that waits for them and
        archives."""
        sources = avx2_sources + (avx512_sources if avx512_cflags else [])
        flags = [avx2_cflags] * len(avx2_sources) + [avx512_cflags] * (len(sources) - len(avx2_sources))
        objects = self.compiler.object_filenames(sources, output_dir=self.build_temp)
        self.compiler.add_library_dir(self.build_temp)

        def compile_unit(source, obj, unit_flags):
            # the header dependencies by hand: the compiler object does not look at #include lines
            if self.force or newer_group([source, *kernel_headers], obj):
                self.compiler.compile([source], output_dir=self.build_temp, include_dirs=include_dirs,
                                      extra_postargs=unit_flags, debug=self.debug)

        pool = ThreadPoolExecutor(len(sources))
        units = [pool.submit(compile_unit, *unit) for unit in zip(sources, objects, flags)]
        pool.shutdown(wait=False)
        lock = threading.Lock()

        def library_ready():
            with lock:
                for unit in units:
                    unit.result()  # re-raises a failed compile
                self.compiler.create_static_lib(objects, AVX2_LIBRARY, output_dir=self.build_temp,
                                                debug=self.debug)  # no-op while the archive is up to date

        return library_ready


setup(
    cmdclass={"build_ext": build_ext_all_at_once},
    ext_modules=cythonize(
        extensions,
        nthreads=os.cpu_count() or 1,
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
