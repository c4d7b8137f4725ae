"""The build promises: OpenMP present (unless explicitly waived), no flush-to-zero, sane config report."""
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xentfast
from xentfast._config import config


def test_openmp_enabled():
    # a silent serial build must not land; XENTFAST_SKIP_CHECK_OPENMP=1 waives it on compilers without OpenMP
    if os.environ.get("XENTFAST_SKIP_CHECK_OPENMP", "0") not in ("", "0"):
        return
    assert xentfast.openmp_enabled(), "built without OpenMP (set XENTFAST_SKIP_CHECK_OPENMP=1 to waive)"


def _linux_cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def test_avx2_path_present_where_the_cpu_has_it():
    # a build that lost the AVX2+FMA units runs the emulated fma everywhere, 17-30x slower: same bits, so
    # no other test would notice
    if not {"avx2", "fma"} <= _linux_cpu_flags():
        pytest.skip("not Linux on a CPU with AVX2 and FMA: nothing to ask of the build")
    from xentfast._core import _xent
    paths = _xent.available_cpu_paths()
    assert "avx2" in paths
    assert _xent.fma_instruction("avx2")  # the unit got its -mfma: the emulation gives the same bits, slowly
    # the import picks the last (best) path this CPU runs, unless XENTFAST_CPU says otherwise
    assert _xent.cpu_path() == paths[-1] or os.environ.get("XENTFAST_CPU") not in (None, "", "auto")


def test_avx512_path_present_where_the_cpu_has_it():
    # 12-15 % of the large fused rows (benchmarks/README.md); a build that lost the units is only slower
    needed = {"avx2", "fma", "avx512f", "avx512dq", "avx512vl", "avx512bw"}
    if not needed <= _linux_cpu_flags():
        pytest.skip("not Linux on a CPU with AVX-512 F/DQ/VL/BW: nothing to ask of the build")
    if config()["avx512_path_cflags"] is None:
        pytest.skip("built without the avx512 path (XENTFAST_NO_AVX512_PATH=1, or a compiler without it)")
    from xentfast._core import _xent
    assert _xent.available_cpu_paths() == ["baseline", "avx2", "avx512"]
    assert _xent.fma_instruction("avx512")


def test_no_flush_to_zero_after_import():
    # under FTZ/DAZ (e.g. an -ffast-math crtfastmath.o linked in) this subnormal result becomes 0
    assert sys.float_info.min / 2 > 0
    assert np.float32(np.finfo(np.float32).tiny) / np.float32(2) > 0


def test_no_fast_math_flags():
    # the AVX2+FMA units too: -mfma must not bring contraction with it
    cfg = config()
    for flags in (cfg["cflags"], cfg["avx2_path_cflags"], cfg["avx512_path_cflags"]):
        if flags is None:  # a build without the AVX2+FMA or AVX-512 path (not x86-64)
            continue
        for bad in ("-ffast-math", "-Ofast", "-funsafe-math", "-ffp-contract=fast"):
            assert bad not in flags
        assert "-ffp-contract=off" in flags


def test_show_config_reports_the_facts(capsys):
    xentfast.show_config()
    out = capsys.readouterr().out
    for key in ("version", "openmp", "default_n_threads", "cpu_code_path"):
        assert key in out
    assert xentfast.__version__ in out


def test_no_masked_vector_stores_in_the_kernels():
    # gcc if-converts `if (store) store[i] = v` inside a vectorized loop into vmaskmovps/vpmaskmovd stores
    # with an all-ones mask; AMD Zen runs each as tens of micro-operations (a third of the fused float32
    # sum pass, benchmarks/README.md, ninth round), and no kernel needs a masked store or load: the
    # softmax sum pass passes `store` as a literal to expansions of its own (softmax_rows.h)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 build")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump: the disassembly check did not run")
    from xentfast._core import _binary, _xent
    for module in (_xent, _binary):
        asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", module.__file__], capture_output=True,
                             text=True, check=True).stdout
        # the AVX2 masked moves, and the avx512 units' stores under an opmask (`...,(%rax){%k1}`)
        masked = [line.strip() for line in asm.splitlines()
                  if "maskmov" in line or re.search(r"\)\{%k[1-7]\}", line)]
        assert not masked, f"{module.__name__}: {len(masked)} masked moves, e.g. {masked[:3]}"
        if "avx2" in _xent.available_cpu_paths():  # the check has teeth: the AVX2+FMA units are in there
            assert "vfmadd" in asm, module.__name__
        if config()["avx512_path_cflags"] is not None:  # and the AVX-512 ones
            assert "zmm" in asm, module.__name__


def test_a_wheel_holds_every_file_the_runtime_reads(tmp_path):
    # A wheel is build_py's tree plus the compiled extensions; build_py alone takes seconds and applies
    # the same packages and package-data rules as `pip install .`.  What the runtime reads from the
    # installed package: every Python module, and for the GPU path the CUDA sources and every header under
    # the two -I directories (NVRTC compiles them on the user's machine, xentfast._cuda._headers); a
    # header left out of package-data works in an editable install and fails only after a real one.
    root = Path(__file__).resolve().parents[1]
    if not (root / "setup.py").is_file() or not (root / "src" / "xentfast").is_dir():
        pytest.skip("not run from a source checkout")
    from xentfast import _cuda
    src = root / "src" / "xentfast"
    needed = {p.relative_to(src).as_posix() for p in src.rglob("*.py")}
    needed |= {p.relative_to(src).as_posix() for d in ("include/xentfast", "_core") for p in (src / d).glob("*.h")}
    needed |= {f"_cuda/{name}" for name in _cuda.SOURCES}
    assert {"include/xentfast/numerics.h", "_core/softmax_rows.h", "_cuda/kernels.cu", "api.py"} <= needed
    # in a copy of the tree: setup.py writes _build_info.py, and the copy's egg-info is fresh (build_py also
    # ships what that file list names, and the one a development install left in src/ may name files that
    # today's rules no longer select).  The generated C keeps its times, so Cython does not run again.
    tree, out = tmp_path / "tree", tmp_path / "lib"
    shutil.copytree(root / "src", tree / "src",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "*.egg-info"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(root / name, tree / name)
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "build_py", "-d", str(out)], cwd=tree,
                   check=True, capture_output=True, text=True)
    built = {p.relative_to(out / "xentfast").as_posix() for p in (out / "xentfast").rglob("*") if p.is_file()}
    missing = sorted(needed - built)
    assert not missing, f"package-data or packages leave out: {missing}"
