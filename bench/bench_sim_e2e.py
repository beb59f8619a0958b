"""kvemu's simulator against libCacheSim, end to end from the trace file to the hit ratio.

Builds the Mooncake conversation trace repeated ``--copies`` times (20 by default: 240,620
requests, 5.77M block accesses; each copy shifted past the previous one in time), then
times, alternating and each in a fresh interpreter (imports included):

* ``lcs_lru`` / ``lcs_s3fifo``: libCacheSim's Python package (a bench-only dependency,
  ``pip install libcachesim``): the JSONL read with the standard ``json`` module, the block
  ids written as a plain-text trace, simulated in C by ``process_trace``;
* ``kvemu_cache_only_lru`` / ``_s3fifo``: ``kvemu sim --cache-only`` with its defaults, the
  trace parsed from JSONL (parsed-trace cache off) and, ``_warm``, read back from that cache;
  ``_pycore``: with ``--python-core`` (the Python pool instead of the compiled one, same results);
  ``_drop``: with ``--response-kv drop`` (the default keeps response KV, as a colocated vLLM does);
* ``python_floor_lru``: the same JSONL read with kvemu's reader, then a bare ``OrderedDict`` LRU in
  Python with the pool's semantics and nothing else: the floor of a pure-Python design;
* ``kvemu_default_lru``: ``kvemu sim`` with its defaults (continuous batching, cost model,
  sampled reuse tracking), ``kvemu_default_lru_noreuse`` the same with ``--reuse off`` (what reuse
  tracking costs), ``kvemu_default_lru_pycore`` with the Python pool, and ``kvemu_default_belady``
  / ``_belady_compute`` to compare with it.

* the cluster cases (``CLUSTER``): 16 replicas routed ``cache_aware`` over the same trace, cache-only,
  with the compiled pools and with ``--python-core``; the same with a 64 GiB host tier per replica
  (response KV kept, the default); ``_batch``: the same 16 replicas (and with the host tier) in the
  batching default instead of cache-only; and a chat-preset cluster in batching mode (300 s of session
  starts at 20 sessions/s, 16 replicas of 4 GiB of KV with 64 GiB of host each).

``--pd``: instead of all that, the shipped Mooncake conversation trace (12,031 requests, no copies) as 16
colocated instances (``kvemu_mooncake16``) and as a P/D cluster of 4 prefill + 12 decode instances
(``kvemu_mooncake_4p12d``), LRU, ``--capacity`` blocks each, alternating in one run: their best wall times (the
whole process, and the simulator's own ``sim_s``) and the P/D one's ratio to the colocated one.

Prints JSON: best wall time per mode, the hit ratios, the real-time factor (simulated seconds per
wall second: the trace's span, and in batching mode its drain too), and the ratios the targets name.
``--old PATH``: also run the chat cluster case from another checkout (its own interpreter path and
sources, e.g. a worktree of an older commit), side by side. ``--uncompiled PATH``: also run the
batching default from a checkout where nothing was built (``git worktree add`` and no install: what
a machine without a C compiler runs, the Python pool and the interpreted step), side by side.

    python bench/bench_sim_e2e.py [--copies 20] [--capacity 18279] [--repeat 2] [--modes a,b,...] [--old DIR]
                                  [--uncompiled DIR]
    python bench/bench_sim_e2e.py --pd [--capacity 18279] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "loadgen" / "data" / "mooncake_conversation_trace.jsonl.gz"

LCS = """
import json, sys, time
import libcachesim as lcs
t0 = time.perf_counter()
trace, ids, policy, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(trace) as src, open(ids, "w") as out:
    for line in src:
        out.write("\\n".join(map(str, json.loads(line)["hash_ids"])) + "\\n")
cache = {"lru": lcs.LRU, "s3fifo": lcs.S3FIFO}[policy](cache_size=cap)
miss, _ = cache.process_trace(lcs.TraceReader(ids, lcs.TraceType.PLAIN_TXT_TRACE))
print(json.dumps({"hit_ratio": 1 - miss, "inner_s": time.perf_counter() - t0}))
"""

# The floor of a pure-Python design: the same trace reader, then a bare OrderedDict LRU with the
# pool's semantics (a request's blocks are looked up, evicted around, and re-queued deepest first)
# and nothing else: no pins, events, footprints or metrics. Its hit ratio equals kvemu's exactly.
FLOOR = """
import json, os, sys, time
from collections import OrderedDict, deque
from itertools import islice, repeat
sys.path.insert(0, os.getcwd())
from loadgen.formats import read_trace
reqs = read_trace(sys.argv[1]).requests
cap, queue, hits, accesses = int(sys.argv[2]), OrderedDict(), 0, 0
for r in reqs:
    hs = r.hash_ids
    k = sum(map(queue.__contains__, hs))
    hits, accesses = hits + k, accesses + len(hs)
    need = len(queue) - k + len(hs) - cap
    if need > 0:
        own = set(hs)
        victims = [h for h in islice(queue, need + k) if h not in own][:need]
        deque(map(queue.__delitem__, victims), 0)
    deque(map(queue.pop, hs, repeat(None)), 0)
    queue.update(zip(reversed(hs), repeat(None)))
print(json.dumps({"hit_ratio": hits / accesses}))
"""


def build_trace(path: Path, copies: int) -> dict:
    rows = [json.loads(line) for line in gzip.open(SOURCE, "rt")]
    span = max(r["timestamp"] for r in rows) + 1000
    accesses = 0
    with open(path, "w") as fh:
        for c in range(copies):
            for r in rows:
                fh.write(json.dumps({**r, "timestamp": r["timestamp"] + c * span}) + "\n")
                accesses += len(r["hash_ids"])
    return {"requests": len(rows) * copies, "block_accesses": accesses, "bytes": path.stat().st_size}


# libCacheSim and the floor count every resident block a request asks for as a hit, wherever it sits:
# kvemu's holes count (its default is vLLM's prefix count, which stops at the first miss)
SAME_COUNT = ["--hit-mode", "holes"]


def kvemu_cmd(trace: Path, policy: str, cap: int, out: Path, cache_only: bool, reuse: bool = True,
              pycore: bool = False, drop: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "kvemu", "sim", "--trace", str(trace), "--policy", policy,
           "--capacity-blocks", str(cap), *SAME_COUNT, "--quiet", "--json", str(out)]
    return (cmd + (["--cache-only"] if cache_only else []) + ([] if reuse else ["--reuse", "off"])
            + (["--python-core"] if pycore else []) + (["--response-kv", "drop"] if drop else []))


CLUSTER16_BATCH = ["--replicas", "16", "--routing", "cache_aware"]  # the batching default
CLUSTER16 = [*CLUSTER16_BATCH, "--cache-only"]
CHAT = ["--workload", "chat", "--duration", "300", "--set", "session_rate=20", "--replicas", "16",
        "--capacity-gib", "4", "--host-cache-gib", "64"]
# mode -> (arguments after the trace's or workload's, whether the trace file is read)
CLUSTER = {
    "kvemu_cluster16_lru": (CLUSTER16, True),
    "kvemu_cluster16_lru_pycore": ([*CLUSTER16, "--python-core"], True),
    "kvemu_cluster16_lru_host64": ([*CLUSTER16, "--host-cache-gib", "64"], True),
    "kvemu_cluster16_batch_lru": (CLUSTER16_BATCH, True),
    "kvemu_cluster16_batch_lru_host64": ([*CLUSTER16_BATCH, "--host-cache-gib", "64"], True),
    "kvemu_chat16_host64": (CHAT, False),
}
# --pd: the shipped trace itself, colocated and disaggregated (mode -> its cluster's flags)
PD_SIDE_BY_SIDE = {
    "kvemu_mooncake16": ["--replicas", "16"],
    "kvemu_mooncake_4p12d": ["--replicas", "0", "--prefill-replicas", "4", "--decode-replicas", "12"],
}


def cluster_cmd(mode: str, trace: Path, cap: int, out: Path, repo: Path = REPO) -> list[str]:
    if mode in PD_SIDE_BY_SIDE:
        return [sys.executable, "-m", "kvemu", "sim", "--trace", "mooncake-conversation", "--capacity-blocks", str(cap),
                "--policy", "lru", "--routing", "cache_aware", "--quiet", "--json", str(out), *PD_SIDE_BY_SIDE[mode]]
    args, reads_trace = CLUSTER[mode]
    python = sys.executable
    source = ["--trace", str(trace), "--capacity-blocks", str(cap)] if reads_trace else []
    return [python, "-m", "kvemu", "sim", *source, "--policy", "lru", *SAME_COUNT, "--quiet", "--json", str(out), *args]


def run_mode(mode: str, trace: Path, work: Path, cap: int, repo: Path = REPO) -> dict:
    env = dict(os.environ)
    out = work / f"{mode}.json"
    if mode in CLUSTER or mode in PD_SIDE_BY_SIDE:
        env["KVEMU_CACHE_DIR"] = "off"
        env["PYTHONPATH"] = str(repo)
        cmd = cluster_cmd(mode, trace, cap, out, repo)
    elif mode.startswith("lcs_"):
        cmd = [sys.executable, "-c", LCS, str(trace), str(work / "ids.txt"), mode[4:], str(cap)]
    elif mode == "python_floor_lru":
        env["KVEMU_CACHE_DIR"] = "off"
        cmd = [sys.executable, "-c", FLOOR, str(trace), str(cap)]
    else:
        # kvemu_<cache_only|default>_<policy>[_warm|_noreuse|_pycore][_drop]
        drop = mode.endswith("_drop")
        base = mode.removesuffix("_drop")
        warm = base.endswith("_warm")
        reuse = not base.endswith("_noreuse")
        policy = (base.removesuffix("_warm").removesuffix("_noreuse").removesuffix("_pycore")
                  .removeprefix("kvemu_cache_only_").removeprefix("kvemu_default_"))
        env["KVEMU_CACHE_DIR"] = str(work / "cache") if warm else "off"
        env["PYTHONPATH"] = str(repo)
        cmd = kvemu_cmd(trace, policy, cap, out, base.startswith("kvemu_cache_only"), reuse, base.endswith("_pycore"),
                        drop)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-2000:]}")
    if mode.startswith("lcs_") or mode == "python_floor_lru":
        return {"wall_s": wall, "hit_ratio": json.loads(proc.stdout)["hit_ratio"]}
    run = json.loads(out.read_text())["runs"][0]
    simulated = run["arrival_span_s"] + (run.get("drain_s") or 0.0)
    return {"wall_s": wall, "hit_ratio": run["block_hit_ratio"], "sim_s": run["wall_s"], "engine": run["engine"],
            "step_engine": run.get("step_engine"), "requests": run["requests"], "real_time_factor": round(simulated / wall, 1)}


MODES = ("lcs_lru", "python_floor_lru", "kvemu_cache_only_lru", "kvemu_cache_only_lru_drop", "kvemu_cache_only_lru_warm",
         "kvemu_cache_only_lru_warm_drop", "kvemu_cache_only_lru_pycore_drop",
         "lcs_s3fifo", "kvemu_cache_only_s3fifo", "kvemu_cache_only_s3fifo_drop",
         "kvemu_default_lru", "kvemu_default_lru_drop", "kvemu_default_lru_noreuse", "kvemu_default_lru_noreuse_drop",
         "kvemu_default_lru_pycore_drop", "kvemu_default_belady", "kvemu_default_belady_drop",
         "kvemu_default_belady_compute", "kvemu_default_belady_compute_drop", *CLUSTER)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--capacity", type=int, default=18279)
    ap.add_argument("--repeat", type=int, default=2, help="rounds; each round runs every mode once, in turn")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--old", type=Path, default=None, help="another checkout: its chat cluster case too")
    ap.add_argument("--uncompiled", type=Path, default=None,
                    help="a checkout with nothing built: its batching default too (a machine without a C compiler)")
    ap.add_argument("--pd", action="store_true",
                    help="only the shipped Mooncake trace, colocated (16) and P/D (4 prefill + 12 decode), side by side")
    a = ap.parse_args()
    if a.pd:
        return pd_side_by_side(a.capacity, a.repeat)
    modes = [m for m in a.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="kvemu-bench-") as tmp:
        work = Path(tmp)
        trace = work / f"mooncake_conversation_x{a.copies}.jsonl"
        info = build_trace(trace, a.copies)
        if any(m.endswith("_warm") for m in modes):  # fill the parsed-trace cache once
            env = {**os.environ, "KVEMU_CACHE_DIR": str(work / "cache")}
            subprocess.run(kvemu_cmd(trace, "lru", a.capacity, work / "fill.json", True), env=env, check=True,
                           capture_output=True, cwd=REPO)
        best: dict[str, dict] = {}
        for rnd in range(a.repeat):
            for mode in modes:
                res = run_mode(mode, trace, work, a.capacity)
                print(f"round {rnd + 1}/{a.repeat} {mode}: {res['wall_s']:.2f} s, hit {res['hit_ratio']:.4f}",
                      file=sys.stderr, flush=True)
                if mode not in best or res["wall_s"] < best[mode]["wall_s"]:
                    best[mode] = res
            if a.old is not None:
                res = run_mode("kvemu_chat16_host64", trace, work, a.capacity, a.old)
                print(f"round {rnd + 1}/{a.repeat} old kvemu_chat16_host64: {res['wall_s']:.2f} s", file=sys.stderr)
                if "old_chat16_host64" not in best or res["wall_s"] < best["old_chat16_host64"]["wall_s"]:
                    best["old_chat16_host64"] = res
            if a.uncompiled is not None:
                res = run_mode("kvemu_default_lru", trace, work, a.capacity, a.uncompiled)
                print(f"round {rnd + 1}/{a.repeat} uncompiled kvemu_default_lru: {res['wall_s']:.2f} s,"
                      f" engine {res['engine']}", file=sys.stderr)
                if "uncompiled_default_lru" not in best or res["wall_s"] < best["uncompiled_default_lru"]["wall_s"]:
                    best["uncompiled_default_lru"] = res
    ratios = {}
    for name, (num, den) in {
        "cache_only_lru / lcs_lru": ("kvemu_cache_only_lru", "lcs_lru"),
        "cache_only_lru_warm / lcs_lru": ("kvemu_cache_only_lru_warm", "lcs_lru"),
        "python_floor_lru / lcs_lru": ("python_floor_lru", "lcs_lru"),
        "cache_only_lru / python_floor_lru": ("kvemu_cache_only_lru", "python_floor_lru"),
        "cache_only_lru_drop / lcs_lru": ("kvemu_cache_only_lru_drop", "lcs_lru"),
        "cache_only_lru_warm_drop / lcs_lru": ("kvemu_cache_only_lru_warm_drop", "lcs_lru"),
        "cache_only_lru / cache_only_lru_drop": ("kvemu_cache_only_lru", "kvemu_cache_only_lru_drop"),
        "cache_only_lru_pycore_drop / cache_only_lru_drop": ("kvemu_cache_only_lru_pycore_drop", "kvemu_cache_only_lru_drop"),
        "default_lru_pycore_drop / default_lru_drop": ("kvemu_default_lru_pycore_drop", "kvemu_default_lru_drop"),
        "default_lru / default_lru_drop": ("kvemu_default_lru", "kvemu_default_lru_drop"),
        "cache_only_s3fifo_drop / lcs_s3fifo": ("kvemu_cache_only_s3fifo_drop", "lcs_s3fifo"),
        "default_lru_drop / lcs_lru": ("kvemu_default_lru_drop", "lcs_lru"),
        "cache_only_s3fifo / lcs_s3fifo": ("kvemu_cache_only_s3fifo", "lcs_s3fifo"),
        "default_lru / lcs_lru": ("kvemu_default_lru", "lcs_lru"),
        "default_lru_noreuse / lcs_lru": ("kvemu_default_lru_noreuse", "lcs_lru"),
        "default_lru / default_lru_noreuse": ("kvemu_default_lru", "kvemu_default_lru_noreuse"),
        "default_belady / default_lru": ("kvemu_default_belady", "kvemu_default_lru"),
        "default_belady_compute / default_lru": ("kvemu_default_belady_compute", "kvemu_default_lru"),
        "cluster16_lru / lcs_lru": ("kvemu_cluster16_lru", "lcs_lru"),
        "cluster16_lru_pycore / lcs_lru": ("kvemu_cluster16_lru_pycore", "lcs_lru"),
        "cluster16_lru_host64 / lcs_lru": ("kvemu_cluster16_lru_host64", "lcs_lru"),
        "cluster16_batch_lru / lcs_lru": ("kvemu_cluster16_batch_lru", "lcs_lru"),
        "cluster16_batch_lru_host64 / lcs_lru": ("kvemu_cluster16_batch_lru_host64", "lcs_lru"),
        "old_chat16_host64 / chat16_host64": ("old_chat16_host64", "kvemu_chat16_host64"),
        "uncompiled_default_lru / lcs_lru": ("uncompiled_default_lru", "lcs_lru"),
    }.items():
        if num in best and den in best:
            ratios[name] = round(best[num]["wall_s"] / best[den]["wall_s"], 2)
    print(json.dumps({"trace": {"copies": a.copies, **info}, "capacity_blocks": a.capacity, "repeat": a.repeat,
                      "best": {m: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                               for m, r in best.items()},
                      "ratios": ratios, "python": platform.python_version(), "cpus": os.cpu_count()}, indent=1))


def pd_side_by_side(cap: int, repeat: int) -> None:
    """The colocated and the P/D cluster on the same trace, alternating; best of ``repeat`` each."""
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kvemu-bench-") as tmp:
        for rnd in range(repeat):
            for mode in PD_SIDE_BY_SIDE:
                res = run_mode(mode, Path(), Path(tmp), cap)
                print(f"round {rnd + 1}/{repeat} {mode}: {res['wall_s']:.2f} s (simulator {res['sim_s']:.2f} s)",
                      file=sys.stderr, flush=True)
                if mode not in best or res["wall_s"] < best[mode]["wall_s"]:
                    best[mode] = res
    colo, pd = best["kvemu_mooncake16"], best["kvemu_mooncake_4p12d"]
    print(json.dumps({"trace": "mooncake-conversation", "capacity_blocks": cap, "repeat": repeat,
                      "best": {m: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                               for m, r in best.items()},
                      "ratios": {"pd_4p12d / colocated16 (wall)": round(pd["wall_s"] / colo["wall_s"], 2),
                                 "pd_4p12d / colocated16 (simulator)": round(pd["sim_s"] / colo["sim_s"], 2)},
                      "python": platform.python_version(), "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
