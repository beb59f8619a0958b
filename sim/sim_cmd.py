"""``kvemu sim``: virtual-time runs over a grid of policies x capacities."""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.source import add_source_args, load_source
from sim.simulator import SimSettings, simulate, stderr_progress
from shared.costmodel import CostModel
from shared.errors import InputError
from replica.core.policies import policy_class
from router.strategies import RoutingSettings, get_strategy
from shared.overrides import apply_overrides, parse_pairs


def add_emulation_args(p: argparse.ArgumentParser) -> None:
    """Capacity, model and replica scheduler settings shared by sim and sweep."""
    cap = p.add_mutually_exclusive_group(required=True)
    cap.add_argument("--capacity-blocks", metavar="N1,N2,...", help="per-replica capacity in blocks")
    cap.add_argument("--capacity-gib", metavar="G1,G2,...", help="per-replica capacity in GiB of KV (uses --model)")
    p.add_argument("--model", default="qwen3-coder-30b-a3b")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--hit-mode", default="holes", choices=["prefix", "holes"])
    p.add_argument("--max-running", type=int, default=256,
                   help="requests running at once per replica (1 = the cache sees requests one at a time)")
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per scheduler step")
    p.add_argument("--causal", action="store_true",
                   help="turn j+1 arrives when turn j finished plus their trace gap, as `kvemu replay` sends it"
                        " (default: every request at its trace time)")
    p.add_argument("--routing-set", action="append", default=[], metavar="NAME=VALUE",
                   help="routing setting, as `kvemu up --set` (e.g. bounded_load_factor=1.5)")


def configure(p: argparse.ArgumentParser) -> None:
    add_source_args(p)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--routing", default="cache_aware")
    p.add_argument("--policy", default="lru", help="comma-separated policies, e.g. lru,s3fifo,belady")
    add_emulation_args(p)
    p.add_argument("--no-reuse-distances", action="store_true", help="skip exact reuse-distance tracking (faster)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write {\"runs\": [...]} here ('-' for stdout)")
    p.add_argument("--plot", metavar="FILE.png", help="hit ratio and CSR against capacity per policy")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def split_numbers(text: str, conv, field: str) -> list:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = conv(part)
        except ValueError:
            raise InputError(field, f"expected a comma-separated list of numbers, got {part!r}") from None
        if not 0 < value < float("inf"):  # also refuses nan
            raise InputError(field, f"must be a finite positive number, got {part}")
        out.append(value)
    if not out:
        raise InputError(field, "is empty")
    return out


def capacities(args, block_size: int) -> list[int]:
    if args.capacity_blocks:
        return split_numbers(args.capacity_blocks, int, "--capacity-blocks")
    cost = CostModel.from_names(args.model, args.gpu)
    blocks = [cost.gib_to_blocks(g, block_size) for g in split_numbers(args.capacity_gib, float, "--capacity-gib")]
    if min(blocks) <= 0:
        raise InputError("--capacity-gib", "smaller than one block of this model")
    return blocks


def validate_names(policies: list[str], replicas: int, routing: str) -> None:
    """What needs no trace is checked before any trace is read or capacity computed."""
    if not policies:
        raise InputError("--policy", "is empty")
    for name in policies:
        policy_class(name)
    if replicas <= 0:
        raise InputError("--replicas", f"must be a positive integer, got {replicas}")
    get_strategy(routing)


def run(args) -> int:
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    validate_names(policies, args.replicas, args.routing)
    trace = load_source(args)
    if not trace.requests:
        raise InputError("trace", "has no requests")
    caps = capacities(args, trace.block_size)
    biggest = max(len(r.hash_ids) for r in trace.requests)
    if biggest > min(caps):
        raise InputError("capacity", f"{min(caps)} blocks is smaller than the largest request ({biggest} blocks)")
    routing = apply_overrides(RoutingSettings(block_size=trace.block_size), parse_pairs(args.routing_set))
    grid = [SimSettings(capacity_blocks=c, policy=pol, replicas=args.replicas, routing=args.routing,
                        hit_mode=args.hit_mode, seed=args.seed, model=args.model, gpu=args.gpu,
                        token_budget=args.token_budget, max_running=args.max_running,
                        reuse_distances=not args.no_reuse_distances, causal=args.causal,
                        routing_settings=routing)
            for pol in policies for c in caps]  # validates every name before the first run
    runs = []
    for i, settings in enumerate(grid, 1):
        label = f"[{i}/{len(grid)}] {settings.policy} @ {settings.capacity_blocks} blocks"
        progress = None if args.quiet else stderr_progress(label)
        runs.append(simulate(trace, settings, progress))
    print_table(runs, sys.stdout)
    if args.json:
        doc = json.dumps({"trace": trace.source, "runs": runs}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as fh:
                fh.write(doc)
    if args.plot:
        from sim.plots import plot_capacity_curves

        plot_capacity_curves(runs, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def print_table(runs: list[dict], out) -> None:
    cols = [("policy", "{}", 14), ("capacity_blocks", "{:,}", 10), ("replicas", "{}", 3),
            ("block_hit_ratio", "{:.4f}", 8), ("token_hit_ratio", "{:.4f}", 8), ("csr", "{:.4f}", 8),
            ("holes/req", "{:.2f}", 9), ("ttft_p50_s", "{:.3f}", 9), ("ttft_p99_s", "{:.3f}", 9),
            ("load_imbalance", "{:.2f}", 6)]
    heads = ["policy", "capacity", "R", "blk_hit", "tok_hit", "CSR", "holes/req", "ttft_p50", "ttft_p99", "imbal"]
    out.write("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, (_, _, w)) in enumerate(zip(heads, cols))) + "\n")
    for r in runs:
        cells = []
        for i, (key, fmt, w) in enumerate(cols):
            value = r["holes"]["mean_per_request"] if key == "holes/req" else r[key]
            text = fmt.format(value)
            cells.append(text.ljust(w) if i == 0 else text.rjust(w))
        out.write("  ".join(cells) + "\n")
