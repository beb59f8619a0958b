"""Sizes, targets and paths of the router bench, and its progress log."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parents[1]
REPLICAS = 4
BLOCKS = 16
SHARED_PREFIX_BLOCKS = 12  # each prompt: a 12-block prefix shared with others + 4 blocks of its own
N_PREFIXES = 256
CAPACITY_BLOCKS = 200_000
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 5.0
TARGET_ROUTED_RPS = 1500
PIN_THROUGHPUT_DEFAULT = "none"
REQUEST_TIMEOUT_S = 10.0


_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr (the JSON result alone goes to stdout)."""
    print(f"[bench_router {time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)
