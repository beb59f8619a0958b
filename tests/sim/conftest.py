"""What the sweep, cell, plot and Dask tests of the simulator share."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.formats import write_kvemu
from loadgen.workloads import generate


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    """740 requests of 300 s of scm conversations, the largest 536 blocks (a module may define its own)."""
    path = tmp_path_factory.mktemp("scm") / "scm.jsonl"
    write_kvemu(generate("scm", 300, seed=3, overrides={"arrival_rate": "0.5"}), path)
    return path
