"""Every script under bench/ still imports: a bench nobody ran for a while must not fail on a name
the code it measures has since moved (bench_policies once imported one that was gone)."""

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_the_bench_script_imports(script, load_bench):
    module = load_bench(script[:-3])  # top level only: its main() runs under __main__
    assert module.__doc__, f"{script} says what it measures in its docstring"
