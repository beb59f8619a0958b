"""The bench scripts as tests load them: as ``python bench/NAME.py`` runs one (``bench/`` on ``sys.path``,
so its siblings import), top level only (its main() runs under ``__main__``)."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def load_bench(monkeypatch):
    """``load_bench("bench_e2e")``: the module of bench/bench_e2e.py."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"bench_script_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
