"""``kvemu replay --requests-out FILE``: the replay against any OpenAI-compatible server (vLLM, SGLang, kvemu's
router or replica), each request streamed from ``/v1/completions`` (``loadgen.openai_replay``), and one JSON
line per request written to FILE, the fields ``kvemu sim --requests-out`` writes for the same trace."""

from __future__ import annotations

import asyncio
import sys

from kvemu.options.arrivals import arrivals_mode
from loadgen.openai_replay import OpenAIReplayer
from loadgen.replay import Unreachable
from loadgen.replay import summarize as replay_summary
from loadgen.request_metrics import summarize, write_requests
from loadgen.source import load_source
from loadgen.trace import has_dependencies
from shared.errors import KvemuError


def served_model(url: str, fetch_json) -> str:
    """The first model ``GET /v1/models`` lists (what a vLLM or SGLang server serves)."""
    listed = fetch_json(url + "/v1/models")
    data = listed.get("data") if isinstance(listed, dict) else None
    ids = [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise KvemuError(f"no OpenAI-compatible server answers GET {url}/v1/models with a model (is it up, and is"
                         " --url its base, without /v1?)")
    return ids[0]


def latency_line(lat: dict) -> str:
    """The exact figures in one line each: mean / p50 / p90 / p99 in ms."""
    lines = []
    for name in ("ttft", "tpot", "itl", "e2e"):
        if lat.get(f"{name}_mean_s") is None:
            continue
        values = " / ".join(f"{lat[f'{name}_{k}_s'] * 1000:,.1f}" for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"{name.upper():<5} mean / p50 / p90 / p99 ms  {values}")
    if lat.get("makespan_s") is not None:
        lines.append(f"makespan {lat['makespan_s']:,.2f} s   throughput {lat['throughput_rps'] or 0:,.2f} req/s,"
                     f" {lat['output_tokens_per_s'] or 0:,.1f} output tokens/s")
    return "\n".join(lines)


def run_openai(args, url: str, path: str, fetch_json, write_outputs) -> int:
    """Replay ``args``' source against the server at ``url``; the records to ``path``, the usual outputs
    (--json, --csv, --plot) through ``write_outputs``. 0 when every request was answered whole."""
    model = served_model(url, fetch_json)
    trace = load_source(args)
    replayer = OpenAIReplayer(url, trace, model, args.speedup, args.max_requests, args.connections, args.timeout,
                              progress=not args.quiet, give_up_s=args.give_up_after,
                              dependent=arrivals_mode(args, has_dependencies(trace)) == "dependent")
    interrupted, gone = False, None
    try:
        records = asyncio.run(replayer.run())
    except KeyboardInterrupt:
        interrupted, records = True, list(replayer.records)
    except Unreachable as exc:
        gone, records = exc, list(replayer.records)
    summary = replay_summary(records, trace.block_size)
    results = replayer.request_records()
    summary["latency"] = summarize(results, replayer.itl)
    summary["interrupted"] = interrupted
    summary["stopped"] = f"no request could connect for {gone.seconds:.1f} s: {gone.cause}" if gone else None
    n = write_requests(path, results)
    whole = summary["latency"]["finished"]
    print(f"requests {len(records):,} to {model} at {url}: {whole:,} answered whole, {len(records) - whole:,} not"
          + ("   INTERRUPTED: partial run" if interrupted else ""))
    print(latency_line(summary["latency"]))
    report: dict = {"csr": None, "replicas": {}, "all_levels_block_hit_ratio": None, "imbalance": None,
              "hotspots": None, "routing": None}
    write_outputs(args, trace, summary, report, records)
    print(f"requests: {n:,} written to {path}", file=sys.stderr)
    if gone is not None:
        print(f"replay: stopped: {summary['stopped']}", file=sys.stderr)
    return 130 if interrupted else 0 if whole == len(records) else 1
