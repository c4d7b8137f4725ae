"""The ratio table's timing harness (benchmarks/ratio_table.py): its round orders, without timing anything."""
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
