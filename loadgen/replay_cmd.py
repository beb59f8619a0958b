"""``kvemu replay``: drive a running cluster with a trace or a workload preset."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request

from loadgen.replay import Replayer, records_json, summarize
from loadgen.source import add_source_args, load_source
from shared.errors import InputError, KvemuError
from shared.ratios import ratio


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="router (or replica) base URL, e.g. http://127.0.0.1:8000")
    add_source_args(p, duration=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speedup", type=float, default=1.0, help="compress trace time this many times")
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--json", metavar="OUT", help="summary and per-request records")
    p.add_argument("--plot", metavar="OUT.png", help="per-replica load and TTFT distribution")
    p.add_argument("--quiet", action="store_true")


def fetch_json(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return None


def cluster_report(url: str) -> dict:
    """Replica-side metrics (CSR, hit ratio, evictions) and the router's hotspot view."""
    cluster = fetch_json(url + "/cluster")
    replicas = {}
    urls = [row["url"] for row in cluster["replicas"]] if cluster else [url]
    total_cost = saved = 0.0
    for u in urls:
        st = fetch_json(u + "/stats")
        if not st:
            continue
        replicas[st["replica_id"]] = {k: st.get(k) for k in ("policy", "capacity_blocks", "usage", "block_hit_ratio",
                                                             "token_hit_ratio", "csr", "evictions", "holes",
                                                             "model", "gpu")}
        total_cost += st.get("recompute_cost_total_s", 0.0)
        saved += st.get("recompute_cost_saved_s", 0.0)
    return {"csr": ratio(saved, total_cost), "replicas": replicas,
            "routing": cluster["routing"] if cluster else None,
            "imbalance": cluster["imbalance"] if cluster else None,
            "hotspots": cluster["hotspots"] if cluster else None}


def print_report(summary: dict, report: dict, out=sys.stdout) -> None:
    out.write(f"requests        {summary['requests']:,} ({summary['ok']:,} ok, {summary['failed']:,} failed)\n")
    out.write(f"token hit ratio {summary['token_hit_ratio']:.4f}   block hit ratio {summary['block_hit_ratio']:.4f}"
              f"   CSR {report['csr']:.4f}\n")
    out.write(f"TTFT (emulated) p50 {summary['ttft_p50_s'] * 1000:.1f} ms   p99 {summary['ttft_p99_s'] * 1000:.1f} ms"
              f"   wall latency p50 {summary['wall_latency_p50_s'] * 1000:.1f} ms\n")
    out.write(f"load imbalance (max/mean requests) {summary['load_imbalance']:.2f}")
    if report.get("hotspots") is not None:
        out.write(f"   hotspots: {', '.join(report['hotspots']) or 'none'}")
    out.write("\n\n  replica          requests  tok_hit  blk_hit     CSR  evictions  usage\n")
    for rid, p in summary["per_replica"].items():
        st = report["replicas"].get(rid, {})
        out.write(f"  {rid:<16}{p['requests']:>8,}  {p['token_hit_ratio']:7.4f}  {p['block_hit_ratio']:7.4f}"
                  f"  {st.get('csr') or 0:6.4f}  {st.get('evictions') or 0:>9,}  {st.get('usage') or 0:5.2f}\n")


def plot_context(trace, requests, speedup: float, report: dict, source: str | None = None) -> dict:
    """What the replay figure's title says: the source, the cluster as the replicas describe
    themselves, and the infinite-cache ceiling of ``requests`` (the ones replayed)."""
    from loadgen.plots import infinite_cache_hit_ratio
    from loadgen.source import trace_name

    reps = list(report["replicas"].values())

    def same(key):  # "lru", or "lru/s3fifo" after a live switch on some replicas
        values = {str(v.get("name") if isinstance(v, dict) else v) for r in reps if (v := r.get(key)) is not None}
        return "/".join(sorted(values)) or None

    caps = {r.get("capacity_blocks") for r in reps}
    times = [r.t for r in requests]
    return {"source": source or trace_name(trace.source), "speedup": speedup,
            "duration_s": (max(times) - min(times)) if times else 0.0, "replicas": len(reps),
            "capacity_blocks": caps.pop() if len(caps) == 1 else None, "policy": same("policy"),
            "routing": report.get("routing"), "model": same("model"), "gpu": same("gpu"),
            "ceiling": infinite_cache_hit_ratio(requests)}


def cluster_block_size(url: str) -> int | None:
    """Tokens per block of the replicas behind ``url`` (a replica says so in /health)."""
    health = fetch_json(url + "/health") or {}
    if "block_size" in health:
        return health["block_size"]
    for row in (fetch_json(url + "/cluster") or {}).get("replicas", []):
        health = fetch_json(row["url"] + "/health") or {}
        if "block_size" in health:
            return health["block_size"]
    return None


def run(args) -> int:
    if not args.speedup > 0:
        raise InputError("--speedup", f"must be > 0, got {args.speedup}")
    if args.max_requests is not None and args.max_requests <= 0:
        raise InputError("--max-requests", f"must be >= 1, got {args.max_requests}")
    if args.connections <= 0:  # aiohttp reads a limit of 0 as "unbounded"
        raise InputError("--connections", f"must be >= 1, got {args.connections}")
    url = args.url.rstrip("/")
    if fetch_json(url + "/health") is None:
        raise KvemuError(f"no kvemu router or replica answers at {args.url} (is `kvemu up` running?)")
    trace = load_source(args)
    block_size = cluster_block_size(url)
    if block_size is not None and block_size != trace.block_size:
        # The trace's hashes stand for blocks of its own size; on another size every count would be off.
        raise InputError("--trace" if args.trace else "--workload",
                         f"has {trace.block_size}-token blocks but the cluster at {args.url} uses {block_size};"
                         f" start it with `kvemu up --block-size {trace.block_size}`")
    replayer = Replayer(args.url, trace, args.speedup, args.max_requests, args.connections,
                        progress=not args.quiet)
    records = asyncio.run(replayer.run())
    summary = summarize(records)
    report = cluster_report(args.url.rstrip("/"))
    print_report(summary, report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "cluster": report, "records": records_json(records)}, fh, indent=1)
    if args.plot:
        from loadgen.plots import plot_replay
        from loadgen.replay import sessions_of

        sent = [r for reqs in sessions_of(trace, args.max_requests).values() for r in reqs]
        plot_replay(summary, records, args.plot, plot_context(trace, sent, args.speedup, report))
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0 if summary["failed"] == 0 else 1
