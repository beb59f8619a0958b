"""Resilience under faults, bad input and load: real processes on 127.0.0.1.  Prints JSON.

Each scenario starts its own cluster (3 replicas at --time-scale 0.05 behind a router),
sends an open-loop load of ``--rate`` requests/s for ``--duration`` seconds (a fresh
connection per request, 10 s client timeout) and injects one fault:

  replica_kill_memory / replica_kill_redis   SIGKILL a replica at 1/3, restart it at 2/3
  redis_restart                              stop redis-server for 3 s at 1/3
  router_kill                                two router workers; SIGKILL one half way
  busy_replicas                              replicas with 2 running / 2 waiting slots
  slow_clients                               100 + 100 connections sending a head byte by byte
                                             and 4 + 4 reading nothing of long streams
  big_prompts                                two clients sending 1M-token prompts back to back
  soak                                       --soak-seconds of load through --router-workers
                                             workers (2), RSS sampled every 5 s
  store_kill                                 SIGKILL the shared KV store at 1/3, restart it at 2/3

The operator's probes (``--scenarios probes``; not in the default set) start ``kvemu up`` as a user does
and send ``--probe-rate`` requests/s for ``--probe-duration`` s of /v1/completions, half streamed:

  ssrf_probe          requests naming a local listener (SGLang's bootstrap_host/port, vLLM's
                      kv_transfer_params): connections it got, how many carried the cluster token; the
                      port-scan check (closed / open non-HTTP / HTTP port: the same answers?)
  pinning_client      prompts held for a remote decode straight at a prefill replica, never pulled
  abandoning_client   clients closing their connection mid-request through a P/D router
  store_kill_up       SIGKILL up's shared KV store at 1/3
  replica_kill_up     SIGKILL a colocated replica, then (P/D) a prefill instance, at 1/3
  frozen_replica      SIGSTOP a replica for 10 s under load (the router's first-byte timeout where it has one)

Each probe reports sent, answered, refused (a 4xx or 503), failed by cause, lost (neither answered nor
cleanly refused: a stream cut without [DONE], a reset, a timeout, a 5xx other than 503) and pinned_after
(blocks prefill replicas still hold for a remote decode after the load).

For each: requests sent / answered / failed by cause (timeout, reset, refused, http_<code>),
recovery times (``index_consistent_s``: until the router has taken a dead replica out and
cleared its entries, or until index lookups succeed again after Redis returns), and the RSS
of every process at start and end.  The exit status is 1 when the soak's replica RSS grew
by more than 10 % over its last half.  ``--short`` is the CI version (about 2 minutes).

    .venv/bin/python bench/chaos.py                       # every scenario, 100 req/s, 15 s each
    .venv/bin/python bench/chaos.py --soak-seconds 600 --scenarios soak
    .venv/bin/python bench/chaos.py --short --scenarios probes    # the probes, about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaoskit.scenarios import PROBES, SCENARIOS  # noqa: E402

DEFAULT = [n for n in SCENARIOS if n not in PROBES]
GROUPS = {"probes": list(PROBES), "all": list(SCENARIOS)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (open loop)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load per scenario")
    p.add_argument("--soak-seconds", type=float, default=120.0)
    p.add_argument("--router-workers", type=int, default=2, help="router workers in the soak")
    p.add_argument("--probe-rate", type=float, default=20.0, help="requests per second in the probes")
    p.add_argument("--probe-duration", type=float, default=15.0, help="seconds of load per probe")
    p.add_argument("--scenarios", default=",".join(DEFAULT),
                   help="comma-separated, from: " + ", ".join(SCENARIOS) + "; or probes (the last six), all")
    p.add_argument("--short", action="store_true", help="CI: 40 req/s, 3 s per scenario, a 20 s soak; probes:"
                                                        " 10 req/s for 8 s")
    a = p.parse_args(argv)
    if a.short:
        a.rate, a.duration, a.soak_seconds = 40.0, 3.0, 20.0
        a.probe_rate, a.probe_duration = 10.0, 8.0
    names = [m for n in a.scenarios.split(",") if n.strip() for m in GROUPS.get(n.strip(), [n.strip()])]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; valid: {', '.join(SCENARIOS)}")
    out = {"rate": a.rate, "duration_s": a.duration, "probe_rate": a.probe_rate, "probe_duration_s": a.probe_duration,
           "scenarios": {}}
    for name in names:
        t0 = time.monotonic()
        result = SCENARIOS[name](a)
        result["wall_s"] = round(time.monotonic() - t0, 1)
        out["scenarios"][name] = result
        print(f"{name}: sent {result['sent']}, failed {result['failed']}", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    soak = out["scenarios"].get("soak")
    return 1 if soak is not None and not soak["replica_rss_flat"] else 0  # RSS that does not level off fails


if __name__ == "__main__":
    raise SystemExit(main())
