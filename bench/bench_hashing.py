"""Tokens hashed per second by shared.hashing.block_hashes, side by side with a
blake2b chained baseline measured in the same run.  Prints JSON.

    python bench/bench_hashing.py [--tokens 2000000] [--block-size 16] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import struct
import time

import numpy as np

from shared.hashing import ROOT_HASH, block_hashes


def blake2b_chained(tokens: np.ndarray, block_size: int) -> list[int]:
    raw = tokens.astype("<u4").tobytes()
    width = 4 * block_size
    h = ROOT_HASH
    out = []
    for i in range(len(raw) // width):
        d = hashlib.blake2b(struct.pack("<Q", h) + raw[i * width : (i + 1) * width], digest_size=8).digest()
        h = int.from_bytes(d, "little")
        out.append(h)
    return out


def best_rate(fn, tokens, block_size, repeat) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(tokens, block_size)
        best = min(best, time.perf_counter() - t0)
    return len(tokens) / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    tokens = np.random.default_rng(0).integers(0, 150_000, a.tokens, dtype=np.int64)
    xxh = best_rate(block_hashes, tokens, a.block_size, a.repeat)
    blake = best_rate(blake2b_chained, tokens, a.block_size, a.repeat)
    print(json.dumps({
        "bench": "block_hashing",
        "python": platform.python_version(),
        "tokens": a.tokens,
        "block_size": a.block_size,
        "xxh3_tokens_per_s": round(xxh),
        "blake2b_tokens_per_s": round(blake),
        "xxh3_over_blake2b": round(xxh / blake, 2),
        "xxh3_blocks_per_s": round(xxh / a.block_size),
    }, indent=2))


if __name__ == "__main__":
    main()
