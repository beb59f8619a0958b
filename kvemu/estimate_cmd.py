"""``kvemu estimate``: mean-field hit ratio of whole-conversation LRU (the mean-field LRU analysis of
multi-turn conversations, docs/sources.md), no simulation.

    kvemu estimate --set arrival_rate=1.5 --set think_mean=135 --set continue_prob=0.75 \\
                   --set prompt_blocks=1 --set response_blocks=2 --capacity-blocks 2275 [--practical] [--json]
    kvemu estimate --set think_dist=lognormal --set think_sigma=1.5 --set turn_dist=fixed --set turns=4 ...
    kvemu estimate --trace FILE [--format F] --target-hit-ratio 0.4     # -> capacity_blocks

``--set`` takes the ``scm`` preset's parameters (so the same flags drive ``kvemu gen`` / ``kvemu
sim --workload scm``) plus the laws the preset does not sample: ``think_dist`` (exponential,
deterministic, lognormal with ``think_sigma``) and ``turn_dist`` (geometric with
``continue_prob``, fixed at ``turns``, empirical with ``turn_pmf=w1,w2,...`` for M = 1, 2, ...).
With ``--trace`` every primitive is measured on the trace instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from kvemu.options.replica_flags import DEFAULT_MODEL, MODEL
from loadgen.formats import read_trace
from loadgen.stats import Distribution
from shared.costmodel import get_model
from shared.errors import InputError
from shared.kv_groups import STATE, KvGroups
from shared.overrides import apply_overrides, parse_pairs
from sim.estimate import ScmModel, capacity_for, estimate, turn_counts, workload_from_trace


def configure(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", default=None, metavar="NAME", help="the modelled preset: scm (default)")
    src.add_argument("--trace", metavar="FILE", help="measure the primitives on a trace instead")
    p.add_argument("--format", default="auto", help="trace format: auto, kvemu, mooncake, bailian")
    p.add_argument("--block-size", default=None, metavar="N", help="tokens per block of the trace (default: its own)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="scm parameter or think_dist/think_sigma/turn_dist/turns/turn_pmf (repeatable)")
    cap = p.add_mutually_exclusive_group(required=True)
    cap.add_argument("--capacity-blocks", metavar="N", help="cache capacity in blocks -> hit ratio")
    cap.add_argument("--target-hit-ratio", metavar="H", help="target hit ratio -> the capacity that reaches it")
    p.add_argument("--practical", action="store_true",
                   help="the paper's practical variant: one unhashable tail block per turn (A_H - E[M-1])")
    MODEL.add(p, help=f"the model whose KV bytes turn blocks into GiB (default {DEFAULT_MODEL})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _number(text: str, field: str, conv):
    try:
        value = conv(text)
    except ValueError:
        raise InputError(field, f"expected a {conv.__name__}, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(field, f"must be positive, got {text}")
    return value


def _source(args, groups: KvGroups):
    """(Workload, description of the inputs); ``groups``: the model's KV cache groups (a window's blocks held)."""
    if args.trace:
        if args.set:
            raise InputError("--set", "applies to the scm model; with --trace every primitive comes from the trace")
        bs = _number(args.block_size, "--block-size", int) if args.block_size is not None else None
        trace = read_trace(args.trace, args.format, bs)
        # the practical variant counts the blocks an engine allocates, partial tail included
        work = workload_from_trace(trace, physical=args.practical, groups=groups)
        turns = Distribution.of(turn_counts(trace)).to_dict()
        return work, {"trace": args.trace, "format": args.format, "block_size": trace.block_size,
                      "requests": len(trace.requests), "sessions": turns["count"],
                      "blocks": "physical" if args.practical else "hashed", "turns_per_session": turns}
    if args.workload not in (None, "scm"):
        raise InputError("--workload", f"only scm has a mean-field model, got {args.workload!r}; "
                                       "for other workloads generate a trace and pass --trace")
    model = apply_overrides(ScmModel(), parse_pairs(args.set))
    return model.workload(groups), {"workload": "scm", "params": dataclasses.asdict(model)}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no infinity


def run(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    if any(g.kind == STATE for g in spec.kv_groups.groups):  # a state page a session, not blocks a token
        raise InputError("--model", f"{spec.name} has state layers (KV cache groups): the mean-field estimate counts"
                                    " full-attention and sliding-window blocks only; run kvemu sim --model for its hit ratio")
    work, inputs = _source(args, spec.kv_groups)
    target = None
    if args.target_hit_ratio is not None:
        try:
            target = float(args.target_hit_ratio)
        except ValueError:
            raise InputError("--target-hit-ratio", f"expected a number, got {args.target_hit_ratio!r}") from None
        capacity = capacity_for(work, target, args.practical)
    else:
        capacity = _number(args.capacity_blocks, "--capacity-blocks", int)
    doc = estimate_doc(work, inputs, capacity, target, args.practical, args.model)
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    return 0


def estimate_doc(work, inputs: dict, capacity: int, target: float | None, practical: bool,
                 model: str = DEFAULT_MODEL) -> dict:
    """The estimate at ``capacity`` as one JSON-ready dict (what ``--json`` prints): blocks, and the bytes a block
    of ``model``'s KV takes (blocks of the trace's, or the modelled preset's, size)."""
    est = estimate(work, capacity, practical)
    block_size = inputs["block_size"] if "block_size" in inputs else inputs["params"]["block_size"]
    spec = get_model(model)
    block_bytes = spec.kv_bytes_per_block_token * block_size  # one KV cache group's page (every layer's: one group)
    doc = {"variant": est.variant, "capacity_blocks": capacity, "capacity_gib": capacity * block_bytes / GIB,
           "model": model, "block_size": block_size, "block_bytes": block_bytes,
           "hit_ratio": est.hit_ratio, "h_max": est.h_max, "characteristic_time_s": _finite(est.characteristic_time_s)}
    if target is not None:
        doc["target_hit_ratio"] = target
    doc.update(work.describe())
    if work.held is not None:  # a block is one group's page; a session holds its window groups' tails only
        doc["kv_groups"] = spec.kv_groups.describe()
        doc["E_B_held"], doc["A_H_held"] = work.held.last, work.held.history
    doc["inputs"] = inputs
    return doc


def format_table(doc: dict) -> str:
    think = doc["think"]
    shape = f"{think['dist']}, mean {think['mean_s']:.4g} s"
    if "sigma" in think:
        shape += f", sigma {think['sigma']:g}"
    t_c = doc["characteristic_time_s"]
    reusable = "A_H^hash" if doc["variant"] == "practical" else "A_H"

    def size(blocks: float) -> str:
        gib = blocks * doc["block_bytes"] / GIB
        return f"{blocks:,.2f} blocks ({gib:,.2f} GiB)" if gib >= 1 else f"{blocks:,.2f} blocks ({gib:.3f} GiB)"
    lines = [f"mean-field whole-conversation LRU estimate ({doc['variant']} variant), source {doc['source']}"]
    if "target_hit_ratio" in doc:
        lines.append(f"target hit ratio   {doc['target_hit_ratio']:.4f}")
    lines += [
        f"capacity           {doc['capacity_blocks']:,} blocks ({doc['capacity_gib']:,.2f} GiB: {doc['block_size']}-token"
        f" blocks of {doc['model']}'s KV, {doc['block_bytes'] / 2**20:,.2f} MiB each)",
        f"hit ratio          {doc['hit_ratio']:.4f}   (h_max = {reusable}/A_R = {doc['h_max']:.4f})",
        f"characteristic T   {'inf' if t_c is None else f'{t_c:,.2f}'} s",
        f"arrival rate       {doc['arrival_rate']:.4g} sessions/s",
        f"turns E[M]         {doc['E_M']:.4g}",
        f"think time         {shape}",
        f"E[B]               {size(doc['E_B'])} per session",
        f"A_H / A_H^hash     {size(doc['A_H'])} / {size(doc['A_H_hash'])} per session",
        f"A_R                {size(doc['A_R'])} per session",
    ]
    if "E_B_held" in doc:  # KV cache groups: the displacement counts what the pool holds
        lines.append(f"held E[B] / A_H    {size(doc['E_B_held'])} / {size(doc['A_H_held'])} per session (every KV"
                     f" cache group's blocks, a window's it has not passed)")
    lines += [
        "",
        *LEGEND,
    ]
    return "\n".join(lines)


GIB = 2**30
# The model's symbols (sim/estimate.py, after the mean-field LRU analysis of multi-turn conversations), per session.
LEGEND = ("  E[B]: blocks a session ever inserts (its last prompt's); A_H: blocks of history a next turn can reuse",
          "  (A_H^hash: A_H less one unhashable tail block per turn, the practical variant's); A_R: every prompt block",
          "  looked up (the hit ratio's denominator); h_max = A_H / A_R: an infinite cache's hit ratio; characteristic T:",
          "  how long an unused block stays cached at this capacity; hit ratio: prompt blocks found in the cache (HBM)")
