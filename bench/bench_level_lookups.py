"""The compiled pool's lookups in tables larger than the caches: nanoseconds a block, each query in one run.

Builds ``--pools`` LRU pools of ``--capacity`` blocks (a cluster's host tiers: 16 x 43,690 blocks in the
chat cluster of ``bench_sim_e2e.py``), fills each, then asks ``--queries`` runs of ``--run`` resident
keys of a random pool through each query the tier stack and the router make: ``absent`` and
``missing`` (one pool), ``level_runs`` and ``lower_counts`` (``KernelLevels``), ``prefix_matches`` (the
simulator's exact index). Prints JSON: ns a block per query, and each over ``absent``'s (ratios in one run).

    python bench/bench_level_lookups.py [--pools 16] [--capacity 43000] [--run 300] [--queries 3000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replica.core.compiled.adapters import MISSING  # noqa: E402
from replica.core.compiled.adapters import kernel_module as K


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=43000)
    ap.add_argument("--run", type=int, default=300)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if K is None:
        raise SystemExit(f"the compiled pool is not built here: {MISSING}")
    rng = random.Random(a.seed)
    cum = np.arange(a.capacity + 2, dtype=np.float64)
    pools, keys = [], []
    for _ in range(a.pools):
        pool = K.Pool(kind=K.KIND_LRU, capacity=a.capacity, block_size=16, prefix_mode=False, cum=cum)
        ks = [rng.getrandbits(63) for _ in range(a.capacity - a.run)]
        for i in range(0, len(ks), a.run):
            pool.acquire(ks[i:i + a.run], 0, -1, True, 0)
            pool.release(ks[i:i + a.run])
        pools.append(pool)
        keys.append(ks)
    queries = []
    for _ in range(a.queries):
        p = rng.randrange(a.pools)
        start = rng.randrange(0, len(keys[p]) - a.run, a.run)
        queries.append((p, keys[p][start:start + a.run]))
    depths = range(a.run)
    calls = {
        "absent": lambda p, q: pools[p].absent(q),
        "missing": lambda p, q: pools[p].missing(q),
        "level_runs": lambda p, q: K.level_runs([pools[p]], q, depths),
        "lower_counts": lambda p, q: K.lower_counts([pools[p]], q, 0),
        "prefix_matches": lambda p, q: K.prefix_matches([pools[p]], q),
    }
    blocks = a.queries * a.run
    ns = {}
    for name, call in calls.items():
        t0 = time.perf_counter()
        for p, q in queries:
            call(p, q)
        ns[name] = round((time.perf_counter() - t0) / blocks * 1e9, 1)
    print(json.dumps({"pools": a.pools, "capacity": a.capacity, "run": a.run, "queries": a.queries,
                      "ns_per_block": ns, "over_absent": {k: round(v / ns["absent"], 2) for k, v in ns.items()}},
                     indent=1))


if __name__ == "__main__":
    main()
