"""``kvemu replay``: drive a running cluster with a trace or a workload preset."""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import sys
import time
import urllib.parse
import urllib.request

from kvemu.options.arrivals import add_arrivals_arg, arrivals_mode
from kvemu.options.requests_out import add_requests_out_arg, requests_out
from kvemu.options.source import add_source_args
from kvemu.program import check_outputs
from loadgen.critical_path import PARTS
from loadgen.replay import GIVE_UP_S, Record, Replayer, Unreachable, agent_sessions, records_json, summarize
from loadgen.source import load_source
from loadgen.trace import has_dependencies
from shared.errors import InputError, KvemuError
from shared.ratios import ratio


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="router (or replica) base URL, e.g. http://127.0.0.1:8000")
    add_source_args(p, duration=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speedup", type=float, default=1.0, help="compress trace time this many times")
    add_arrivals_arg(p)
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per-request limit: a request not answered by then is dropped (its connection closed, so"
                        " the replica aborts it) and counted as timed out")
    p.add_argument("--give-up-after", type=float, default=GIVE_UP_S, metavar="SECONDS",
                   help="stop when every request for this long failed to connect (the cluster stopped or its port"
                        f" closed), report what finished and say why; 0: keep sending (default {GIVE_UP_S:g})")
    p.add_argument("--json", metavar="OUT", help="summary and per-request records")
    p.add_argument("--csv", metavar="OUT.csv", help="the per-request records, one row each")
    p.add_argument("--plot", metavar="OUT.png", help="per-replica load and TTFT distribution")
    add_requests_out_arg(p, help="speak OpenAI's streamed /v1/completions (to vLLM, SGLang or kvemu alike) and write"
                                 " one JSON line per request: index, arrival_s, first_token_s, finish_s (seconds from"
                                 " the replay's start), input_tokens, output_tokens, cached_tokens, preemptions, replica"
                                 " (null where the server does not say); the same fields as `kvemu sim --requests-out`")
    p.add_argument("--quiet", action="store_true")


def base_url(flag: str, url: str) -> str:
    """``url`` without its trailing slash, once it names a server the replay can speak to: a URL without
    a scheme (``127.0.0.1:8000``) would otherwise read as no server answering."""
    parts = urllib.parse.urlsplit(url)
    if "://" not in url and not url.lower().startswith(("http:", "https:")):
        raise InputError(flag, f"{url!r} has no scheme: give http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(flag, f"expected http://HOST:PORT (a router's or a replica's), got {url!r}")
    return url.rstrip("/")


def fetch_json(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return None


LIFETIME_KEYS = ("policy", "capacity_blocks", "usage", "block_hit_ratio", "token_hit_ratio", "csr", "evictions",
                 "recompute_cost_total_s", "recompute_cost_saved_s", "model", "gpu")


def replica_stats(url: str) -> dict[str, dict]:
    """Each replica's lifetime counters (``GET /stats``), by replica id; ``aborted``: requests whose
    client went away (a timed-out request is one)."""
    cluster = fetch_json(url + "/cluster")
    urls = [row["url"] for row in cluster["replicas"]] if cluster else [url]
    out = {}
    for u in urls:
        st = fetch_json(u + "/stats")
        if st:
            out[st["replica_id"]] = {k: st.get(k) or 0 for k in LIFETIME_KEYS}
            out[st["replica_id"]]["aborted"] = (st.get("scheduler") or {}).get("aborted", 0)
            if st.get("tiers"):  # memory below HBM: blocks looked up, and found at any level
                out[st["replica_id"]]["levels"] = level_hits(st["tiers"])
    return out


def level_hits(tiers: dict) -> dict[str, int]:
    """A replica's ``/stats`` ``tiers`` as counts: blocks looked up, and found in HBM or any level below
    (``accessed_blocks`` times each ``<level>_block_hit_ratio``, as /cluster's hits by level)."""
    n = tiers.get("accessed_blocks") or 0
    found = sum(round(v * n) for k, v in tiers.items() if k.endswith("_block_hit_ratio")
                and k != "all_levels_block_hit_ratio" and isinstance(v, float | int))
    return {"accessed_blocks": n, "found_blocks": found}


def cluster_report(url: str, before: dict[str, dict]) -> dict:
    """This run's CSR and evictions (replica counters after minus ``before``), each replica's
    lifetime counters, and the router's hotspot view."""
    cluster = fetch_json(url + "/cluster")
    replicas, total, saved = {}, 0.0, 0.0
    accessed = found = 0  # over this run, on replicas with memory below HBM
    for replica_id, life in replica_stats(url).items():
        was = before.get(replica_id, {})
        if "levels" in life:
            old = was.get("levels", {})
            accessed += life["levels"]["accessed_blocks"] - old.get("accessed_blocks", 0)
            found += life["levels"]["found_blocks"] - old.get("found_blocks", 0)
        d_total = life["recompute_cost_total_s"] - was.get("recompute_cost_total_s", 0.0)
        d_saved = life["recompute_cost_saved_s"] - was.get("recompute_cost_saved_s", 0.0)
        total, saved = total + d_total, saved + d_saved
        replicas[replica_id] = {"run": {"csr": ratio(d_saved, d_total),
                                        "evictions": life["evictions"] - was.get("evictions", 0),
                                        "aborted": life["aborted"] - was.get("aborted", 0)},
                                "lifetime": life}
    # all levels: the block hit ratio over HBM and every level below it (None: no replica has one)
    return {"csr": ratio(saved, total), "replicas": replicas,
            "all_levels_block_hit_ratio": ratio(found, accessed) if accessed else None,
            "imbalance": cluster["imbalance"] if cluster else None,
            "hotspots": cluster["hotspots"] if cluster else None,
            "routing": cluster["routing"] if cluster else None}


def print_report(summary: dict, report: dict, out=None) -> None:
    """This run (its responses, and the replicas' counters' change over it), then each replica's
    lifetime counters, apart: a cluster that served earlier runs has more behind it."""
    out = out or sys.stdout  # the stream at call time (a default would be the one at import)
    timed_out = f", {summary['timed_out']:,} timed out" if summary.get("timed_out") else ""
    out.write(f"requests        {summary['requests']:,} ({summary['ok']:,} ok, {summary['failed']:,} failed{timed_out})"
              + ("   INTERRUPTED: partial run" if summary.get("interrupted") else "") + "\n")
    out.write(f"token hit ratio (HBM) {summary['token_hit_ratio']:.4f}   block hit ratio (HBM)"
              f" {summary['block_hit_ratio']:.4f}   CSR {report['csr']:.4f}\n")
    if report.get("all_levels_block_hit_ratio") is not None:  # host, SSD or a shared store below HBM
        out.write(f"all levels (HBM + lower): block hit ratio {report['all_levels_block_hit_ratio']:.4f}"
                  f"   prompt tokens cached (the replicas' cached_tokens) {summary['cached_token_ratio']:.4f}\n")
    out.write(f"TTFT (emulated) p50 {summary['ttft_p50_s'] * 1000:.1f} ms   p99 {summary['ttft_p99_s'] * 1000:.1f} ms"
              f"   wall latency p50 {summary['wall_latency_p50_s'] * 1000:.1f} ms\n")
    out.write(f"load imbalance (max/mean requests) {summary['load_imbalance']:.2f}")
    if report.get("hotspots") is not None:
        out.write(f"   hotspots: {', '.join(report['hotspots']) or 'none'}")
    if summary.get("pd_paths"):  # a P/D cluster: how requests went, and which prefill instance took the remote ones
        paths = ", ".join(f"{path} {n:,}" for path, n in summary["pd_paths"].items())
        prefills = ", ".join(f"{rid} {n:,}" for rid, n in summary["prefill_replicas"].items()) or "none"
        out.write(f"\nP/D paths: {paths}   remote prefills by instance: {prefills}")
    moves = summary.get("session_moves")
    if moves and moves["turns"]:  # where a session's cache was left behind, and the router's reason for it
        why = ", ".join(f"{reason} {n:,}" for reason, n in moves["by_reason"].items())
        out.write(f"\nturns that left their session's replica {moves['left']:,} of {moves['turns']:,}"
                  + (f" ({why})" if why else ""))
    if summary.get("agent_sessions"):
        out.write("\n" + agent_lines(summary["agent_sessions"]))
    # requests: answered by the replica; aborted: the replica's count of clients that left (timed out here)
    # tok_hit, blk_hit: HBM's, as in the headline
    out.write("\n\n  this run         requests  tok_hit  blk_hit     CSR  evictions  aborted\n")
    empty = {"requests": 0, "token_hit_ratio": 0.0, "block_hit_ratio": 0.0}
    aborting = {replica_id for replica_id, rep in report["replicas"].items() if rep["run"].get("aborted")}
    for replica_id in sorted(set(summary["per_replica"]) | aborting):  # those that answered or aborted
        p = summary["per_replica"].get(replica_id, empty)
        run = report["replicas"].get(replica_id, {}).get("run", {})
        out.write(f"  {replica_id:<16}{p['requests']:>8,}  {p['token_hit_ratio']:7.4f}  {p['block_hit_ratio']:7.4f}"
                  f"  {run.get('csr', 0):6.4f}  {run.get('evictions', 0):>9,}  {run.get('aborted', 0):>7,}\n")
    out.write("\n  lifetime         blk_hit     CSR  evictions  usage   (each replica since it started)\n")
    for replica_id, rep in report["replicas"].items():
        life = rep["lifetime"]
        out.write(f"  {replica_id:<16}{life['block_hit_ratio']:7.4f}  {life['csr']:6.4f}  {life['evictions']:>9,}"
                  f"  {life['usage']:5.2f}\n")


def agent_lines(agents: dict) -> str:
    """Agent sessions' task time and its critical path's parts, p50 and p99 across sessions (each its own)."""
    head = (f"agent sessions  {agents['sessions']:,} finished" + (f", {agents['incomplete']:,} incomplete"
                                                               if agents["incomplete"] else ""))
    if not agents["sessions"]:
        return head + ": no task time"
    rows = [head + "   (seconds: task = first arrival to last finish; critical path = the chain of waits that"
                   " ends last)", "                  task   " + "".join(f"{p:>9}" for p in PARTS)]
    for q in ("p50", "p99"):
        rows.append(f"  {q}     {agents[f'task_{q}_s']:10.2f}   " + "".join(f"{agents[f'{p}_{q}_s']:9.2f}" for p in PARTS))
    return "\n".join(rows)


def plot_context(trace, requests, speedup: float, report: dict, source: str | None = None) -> dict:
    """What the replay figure's title says: the source, the cluster as the replicas describe
    themselves, and the infinite-cache ceiling of ``requests`` (the ones replayed)."""
    from loadgen.source import trace_name
    from loadgen.trace import infinite_cache_hit_ratio, response_hashes

    reps = [r.get("lifetime", r) for r in report["replicas"].values()]

    def same(key):  # "lru", or "lru/s3fifo" after a live switch on some replicas
        values = {str(v.get("name") if isinstance(v, dict) else v) for r in reps if (v := r.get(key)) is not None}
        return "/".join(sorted(values)) or None

    caps = {r.get("capacity_blocks") for r in reps}
    sent = {id(r): h for r, h in zip(trace.requests, response_hashes(trace))}
    times = [r.t for r in requests]
    return {"source": source or trace_name(trace.source), "speedup": speedup,
            "duration_s": (max(times) - min(times)) if times else 0.0, "replicas": len(reps),
            "capacity_blocks": caps.pop() if len(caps) == 1 else None, "policy": same("policy"),
            "routing": report.get("routing"), "model": same("model"), "gpu": same("gpu"),
            # the replay sends each request's response blocks (replicas keep them by default)
            "ceiling": infinite_cache_hit_ratio(requests, [sent[id(r)] for r in requests])}


def cluster_matching(url: str) -> tuple[str, int | None]:
    """How the replicas behind ``url`` match prompts, and their tokens per block or page (a replica says so
    in /health): ``("blocks", 16)``; ``("blocks", None)`` when none says."""
    health = fetch_json(url + "/health") or {}
    if "block_size" not in health:
        for row in (fetch_json(url + "/cluster") or {}).get("replicas", []):
            health = fetch_json(row["url"] + "/health") or {}
            if "block_size" in health:
                break
    return str(health.get("matching", "blocks")), health.get("block_size")


def run(args) -> int:
    if not args.speedup > 0:
        raise InputError("--speedup", f"must be > 0, got {args.speedup}")
    if args.max_requests is not None and args.max_requests <= 0:
        raise InputError("--max-requests", f"must be >= 1, got {args.max_requests}")
    if args.connections <= 0:  # aiohttp reads a limit of 0 as "unbounded"
        raise InputError("--connections", f"must be >= 1, got {args.connections}")
    if not args.timeout > 0:
        raise InputError("--timeout", f"must be > 0 seconds, got {args.timeout}")
    if not args.give_up_after >= 0 or args.give_up_after == float("inf"):
        raise InputError("--give-up-after", f"must be >= 0 seconds (0: never), got {args.give_up_after}")
    check_outputs(args)
    url = base_url("--url", args.url)
    records_path = requests_out(args)
    if records_path:  # any OpenAI-compatible server: kvemu's own /health and /generate are not needed
        from kvemu.replay_openai import run_openai

        return run_openai(args, url, records_path, fetch_json, write_outputs)
    if fetch_json(url + "/health") is None:
        raise KvemuError(f"no kvemu router or replica answers at {args.url} (is `kvemu up` running? Another"
                         " OpenAI-compatible server: add --requests-out FILE)")
    matching, block_size = cluster_matching(url)
    tokens = matching == "radix"  # the replicas cut token ids into their pages: send tokens
    trace = load_source(args, 1 if tokens else None, tokens=tokens)
    if not tokens and block_size is not None and block_size != trace.block_size:
        # The trace's hashes stand for blocks of its own size; on another size every count would be off.
        raise InputError("--trace" if args.trace else "--workload",
                         f"has {trace.block_size}-token blocks but the cluster at {args.url} uses {block_size};"
                         f" start it with `kvemu up --block-size {trace.block_size}`")
    before = replica_stats(url)
    replayer = Replayer(args.url, trace, args.speedup, args.max_requests, args.connections, args.timeout,
                        progress=not args.quiet, tokens=tokens, give_up_s=args.give_up_after,
                        dependent=arrivals_mode(args, has_dependencies(trace)) == "dependent")
    interrupted, gone = False, None
    try:
        records = asyncio.run(replayer.run())
    except KeyboardInterrupt:  # stop sending; report and save what finished
        interrupted, records = True, list(replayer.records)
        print(f"replay: interrupted after {len(records):,} of {replayer.total:,} requests; reporting those",
              file=sys.stderr)
    except Unreachable as exc:  # the cluster went away: sending on would only add failures
        gone, records = exc, list(replayer.records)
    summary = summarize(records, block_size if block_size is not None else trace.block_size)
    summary["interrupted"] = interrupted
    summary["stopped"] = f"no request could connect for {gone.seconds:.1f} s: {gone.cause}" if gone else None
    if has_dependencies(replayer.chosen):  # an agent trace: each session's task time and critical path
        summary["agent_sessions"] = agent_sessions(records, replayer.chosen)
    if summary["timed_out"]:  # the replicas abort what timed out as they see its connection close: let them
        time.sleep(0.2)
    report = cluster_report(url, before)
    print_report(summary, report)
    write_outputs(args, trace, summary, report, records)
    if gone is not None:
        print(stopped_line(args, gone, len(records), replayer.total), file=sys.stderr)
    if interrupted:
        return 130
    return 0 if summary["failed"] == 0 else 1


def stopped_line(args, gone: Unreachable, done: int, total: int) -> str:
    """The one line that says the replay gave up on a cluster that went away: why, and what it kept."""
    kept = [f"{what} in {path}" for what, path in (("records and summary", args.json), ("rows", args.csv),
                                                    ("figure", args.plot)) if path]
    return (f"replay: stopped after {done:,} of {total:,} requests: none could connect to {args.url} for"
            f" {gone.seconds:.0f} s ({gone.cause}); is the cluster still up? The report covers those {done:,};"
            f" {', '.join(kept) if kept else 'nothing written (--json FILE keeps the records)'}")


def write_outputs(args, trace, summary: dict, report: dict, records) -> None:
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "cluster": report, "records": records_json(records)}, fh, indent=1)
    if args.csv:
        rows = records_json(records)
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=[f.name for f in dataclasses.fields(Record)])
            w.writeheader()
            w.writerows(rows)
        print(f"csv: {len(rows)} rows written to {args.csv}", file=sys.stderr)
    if args.plot:
        from loadgen.plots import plot_replay
        from loadgen.replay import sessions_of

        sent = [r for reqs in sessions_of(trace, args.max_requests).values() for r in reqs]
        plot_replay(summary, records, args.plot, plot_context(trace, sent, args.speedup, report))
        print(f"plot written to {args.plot}", file=sys.stderr)
