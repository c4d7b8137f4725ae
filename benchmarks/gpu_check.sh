#!/usr/bin/env bash
# One-shot check of xentfast's CUDA twin (issue 5) on a GPU machine: build, GPU tests, benchmark, and
# every kernel family under compute-sanitizer's memory checker.
#
# Made for a machine without network access whose Python already holds CuPy, an NVRTC library,
# torch with CUDA, Cython, pytest and Hypothesis:  bash benchmarks/gpu_check.sh
# Inner time limits: GPU tests 210 s, benchmark 200 s, memory check 100 s; the build is not limited (~40 s
# on 16 cores).  All steps took ~230 s on an H200 machine; give the whole run a ten-minute limit.
# XENTFAST_GPU_TESTS=0, XENTFAST_GPU_BENCH=0, XENTFAST_GPU_MEMCHECK=0 leave a step out.
# Everything also lands in $OUT/gpu_check.log ($OUT defaults to /tmp/xentfast-gpu-check).
# Elsewhere: needs CuPy, an NVRTC library (CuPy's, a CUDA toolkit's or the nvidia-cuda-nvrtc wheel), a C
# compiler, Cython and numpy; a missing CuPy is installed from ./.whl wheels if present, else from PyPI.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/xentfast-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export XENTFAST_CUDA_CACHE_DIR=${XENTFAST_CUDA_CACHE_DIR:-/tmp/xentfast-kernels}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

main() {
    echo "== machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
    "$PY" -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
    if ! "$PY" -c 'import cupy' 2>/dev/null; then
        echo "== installing CuPy"
        if [ -d .whl ]; then
            "$PY" -m pip install -q --no-index --find-links .whl cupy-cuda13x cupy-cuda12x 2>/dev/null ||
                "$PY" -m pip install -q --no-index --no-deps .whl/*.whl
        else
            timeout 60 "$PY" -m pip install -q cupy-cuda12x
        fi
        "$PY" -c 'import cupy' || { echo "CuPy unavailable: nothing was run on the GPU"; return 2; }
    fi
    "$PY" -c 'import cupy; print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())'

    echo "== build (setup.py build_ext --inplace)"
    "$PY" -c 'import setuptools, Cython; print("setuptools", setuptools.__version__, "Cython", Cython.__version__)'
    if ! "$PY" setup.py build_ext --inplace -j 8 >"$OUT/build.log" 2>&1; then
        tail -15 "$OUT/build.log"
        # an older setuptools rejects pyproject.toml's SPDX license field: build the extensions from a
        # copy without it (setup.py holds everything the compiled parts need) and bring them back
        echo "retrying the build without pyproject.toml metadata"
        rm -rf /tmp/xf-build && mkdir -p /tmp/xf-build && cp -r setup.py src /tmp/xf-build/
        if ! (cd /tmp/xf-build && "$PY" setup.py build_ext --inplace -j 8) >>"$OUT/build.log" 2>&1; then
            tail -40 "$OUT/build.log"
            echo "build failed: nothing was run on the GPU"
            return 3
        fi
        cp /tmp/xf-build/src/xentfast/_core/*.so src/xentfast/_core/
        cp /tmp/xf-build/src/xentfast/_build_info.py src/xentfast/ 2>/dev/null || true
    fi
    "$PY" - <<'EOF' || return 4
import xentfast, xentfast._cuda as c
from xentfast._cuda import _nvrtc
print("xentfast", xentfast.__version__, "from", xentfast.__file__)
print("gpu_available", c.gpu_available(), "| NVRTC", _nvrtc.version(), _nvrtc.library_path())
EOF

    local tests_rc=0
    if [ "${XENTFAST_GPU_TESTS:-1}" != 0 ]; then
        echo "== GPU tests (pytest -m gpu): the CuPy kernels and xentfast.torch on CUDA tensors"
        XENTFAST_HYPOTHESIS_PROFILE=${XENTFAST_HYPOTHESIS_PROFILE:-dev} timeout 210 "$PY" -m pytest \
            tests/test_cuda.py tests/test_torch_dropin.py -m gpu -q -ra -p no:cacheprovider --durations=8 \
            --junitxml="$OUT/gpu_tests.xml"
        tests_rc=$?
        echo "pytest exit code: $tests_rc"
    fi

    local bench_rc=0
    if [ "${XENTFAST_GPU_BENCH:-1}" != 0 ]; then
        echo "== benchmark"
        timeout 200 "$PY" benchmarks/gpu_check.py
        bench_rc=$?
    fi
    echo "benchmark exit code: $bench_rc"

    # every kernel family on shapes that end off the tile edges, under the memory checker where it exists
    # (its kernels were compiled and cached by the steps above)
    local sanitizer memcheck_rc=0
    [ "${XENTFAST_GPU_MEMCHECK:-1}" != 0 ] || { [ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]; return; }
    echo "== memory check (compute-sanitizer memcheck)"
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$sanitizer" ]; then
        timeout 100 "$sanitizer" --tool memcheck --error-exitcode 9 --print-limit 20 "$PY" benchmarks/gpu_memcheck.py
    else
        echo "compute-sanitizer not found: the calls run unchecked"
        timeout 100 "$PY" benchmarks/gpu_memcheck.py
    fi
    memcheck_rc=$?
    echo "memory check exit code: $memcheck_rc"
    [ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
}

main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
