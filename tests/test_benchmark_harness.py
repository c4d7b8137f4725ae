"""The ratio table's timing harness (benchmarks/ratio_table.py): its round orders, without timing anything."""
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ratio_table  # noqa: E402


@pytest.mark.parametrize("n", range(1, 8))
def test_each_callable_follows_each_other_one_equally_often(n):
    rows = ratio_table.round_orders(n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    follows = Counter((row[j], row[j + 1]) for row in rows for j in range(n - 1))
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    assert sorted(follows) == sorted(pairs)
    assert set(follows.values()) <= {1 if n % 2 == 0 else 2}


def test_rows_are_timed_in_whole_cycles():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcde"}
    stats = ratio_table.run_interleaved(fns, repeats=5, slow_repeats=3, slow_s=1e9, max_repeats=7)
    # 5 callables: a cycle is 10 rounds, so 7 (and the 5 of --repeats) become 10 runs each
    assert {name: st.n for name, st in stats.items()} == dict.fromkeys("abcde", 10)
    timed = calls[len(fns):]
    before = Counter(timed[i] for i in range(len(timed) - 1) if timed[i + 1] == "a" and i % 5 != 4)
    assert set(before) == set("bcde") and len(set(before.values())) == 1


_PEERS_AGREE = r"""
import os
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import peers

def arrays(result):
    parts = result if isinstance(result, tuple) else (result,)
    return [np.asarray(p.detach().numpy() if hasattr(p, "detach") else p, dtype=np.float64) for p in parts]

for family, factories in peers.FAMILIES.items():
    x, b = peers.PROBLEMS[family](6, 40, "float64", seed=3)
    want = arrays(factories["xentfast"](x, b, 1)())
    for peer in ("torch", "jax", "numpy"):
        run = factories[peer](x, b, 1)
        assert run is not None, (family, peer, "not installed")
        got = arrays(run())
        assert len(got) == len(want), (family, peer)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-15, err_msg=f"{family}, {peer}")
    peers.drop_problems()
print("ok", sorted(peers.FAMILIES))
"""


def test_every_peer_computes_what_xentfast_computes():
    # a ratio means something only if both sides compute the same function: every family's torch, JAX and
    # NumPy peer against xentfast on one small float64 problem.  In a process of its own, since the JAX
    # peers switch on jax_enable_x64 for the whole process.
    import subprocess
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    done = subprocess.run([sys.executable, "-c", _PEERS_AGREE, str(benchmarks)], capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0 and "not installed" in done.stderr and not os.environ.get("XENTFAST_REQUIRE_PEERS"):
        pytest.skip("a peer is not installed")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "log_softmax" in done.stdout and "binary" in done.stdout


def test_the_magnitude_scan_marks_the_subnormal_cells(capsys):
    import magnitude_scan
    from xentfast._core import _scalar
    if _scalar.consumes_subnormals(lambda: None) is None:
        pytest.skip("no denormal-operand flag on this CPU")
    magnitude_scan.main(["--only", "bce", "--dtype", "float64", "--magnitudes", "10", "700", "--rows", "4",
                         "--classes", "64", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    row = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ("10", "700")}
    # float64 BCE at |x| = 700 without own mass: losses ~2^-1010, whose compensated sum makes subnormal
    # error terms (and some results are subnormal themselves)
    assert "*" not in row["10"] and "*" in row["700"]
