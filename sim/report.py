"""The run report: what ``kvemu sim`` prints and writes as JSON, built once from a finished
``Simulation`` (sim/simulator.py). A P/D cluster's parts come from its component (sim/pd_flow.py,
``PdFlow``) as the report is built: the per-instance role, GPU and routed count, the TTFT of the
instances that give first tokens, the decode pool's imbalance, both pools' routing decisions and the
``pd`` section; DP instances' from theirs (sim/dp.py, ``DpFlow``): each rank's instance and rank, and the
``data_parallel`` section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadgen.critical_path import SessionPath, session_paths, summarize_paths
from loadgen.trace import has_dependencies
from replica.core.cache.group_usage import kv_groups_run
from replica.core.tiers.stack import TierStack
from router.strategies import session_moves
from shared import compiled_modules
from shared.histogram import LogHistogram
from shared.ratios import CacheCounts, ratio
from sim.settings import max_model_len

if TYPE_CHECKING:
    from sim.simulator import Replica, Simulation


def run_report(sim: Simulation, wall_s: float) -> dict:
    pd = sim.pd
    per = []
    timed = None if sim.s.cache_only else True  # cache-only has no clock: no latencies to report
    counts = CacheCounts()
    requests = evictions = holes = preemptions = 0
    for rep in sim.replicas:
        m = rep.pool.metrics
        preemptions += rep.sched.preemptions
        per.append(_replica_entry(sim, rep, timed is not None))
        counts += m.counts()
        requests, evictions, holes = requests + m.requests, evictions + m.evictions, holes + m.holes_total
    # P/D: every request is decoded once, so the decode pool's routed counts are the load
    reqs = pd.decode_loads() if pd is not None else [p["requests"] for p in per]
    mean_load = sum(reqs) / len(reqs) if reqs else 0
    decisions = dict(sorted(sim.router.decisions.items()))
    out = {
        **_setup_report(sim),
        "requests": requests,
        "served": sim.served,
        # vLLM's length rule: prompt plus output over max_model_len (or beyond the pool), never run
        "refused": sim.refused,
        # dependent arrivals: requests that wait (`after`) for a refused one, never arrived (a live replay's
        # "dependency failed")
        "dependency_failed": sim.dependency_failed,
        "max_model_len": max_model_len(sim.s, sim.cost, sim.block_size),
        "block_accesses": counts.block_accesses,
        **counts.ratios(),
        "holes": {"total": holes, "mean_per_request": ratio(holes, requests)},
        "evictions": evictions,
        **_tier_report(sim, counts),
        **_latencies(sim, timed is not None),
        **_throughput(sim, timed is not None, preemptions),
        **_speculative(sim),
        # exact means and percentiles from every request (the *_p50_s above are the histograms')
        "latency": sim.finished_requests.summary(len(sim.source_trace.requests)) if timed else None,
        **_agent_sessions(sim, timed is not None),
        "load_imbalance": (max(reqs) / mean_load) if mean_load else 0.0,
        "arrival_span_s": sim.last_arrival - sim.first_arrival,
        "drain_s": max(sim.last_finish - sim.last_arrival, 0.0),
        "saturated": _saturated(sim, per),
        "routing_decisions": pd.routing_decisions(decisions) if pd is not None else decisions,
        "session_moves": session_moves(sim.router),
        "per_replica": per,
        "wall_s": round(wall_s, 3),
    }
    if pd is not None:
        out["pd"] = pd.report(sim)
    if sim.dp is not None:
        out["data_parallel"] = sim.dp.report()
    # several KV cache groups (a sliding-window model): each group's blocks over the run; none for one group, whose
    # figures are the pool's own (replica/core/cache/group_usage.py)
    groups = kv_groups_run([rep.groups for rep in sim.replicas if rep.groups is not None])
    if groups is not None:
        out["kv_groups"] = groups
    return out


def agent_paths(sim: Simulation) -> tuple[list[SessionPath], int]:
    """Each finished agent session's task time and critical path (``loadgen.critical_path``, the function the live
    replay reports with), and how many agent sessions did not finish."""
    return session_paths(sim.finished_requests.spans(sim.source_trace, sim.trace_index))


def _agent_sessions(sim: Simulation, timed: bool) -> dict:
    """A trace with dependencies: ``agent_sessions``, the p50 and p99 across agent sessions of the task time and of
    its critical path's parts (the rows a session: ``simulate(records=True)``, ``kvemu sim --sessions-out``);
    nothing for a trace without, or a run without a clock."""
    if not timed or not has_dependencies(sim.source_trace):
        return {}
    return {"agent_sessions": summarize_paths(*agent_paths(sim))}


def _replica_entry(sim: Simulation, rep: Replica, timed: bool) -> dict:
    """One instance's entry of ``per_replica``: its pool's figures, its scheduler's, its TTFT and busy time, where
    its prompt blocks came from (tiers), its role (P/D) and its rank (DP)."""
    st = rep.pool.stats()
    st["replica"] = rep.replica_id
    st["scheduler"] = rep.sched.stats()
    st["ttft_p50_s"] = rep.ttft.quantile(0.5) if timed else None
    st["ttft_p99_s"] = rep.ttft.quantile(0.99) if timed else None
    st["busy_s"] = rep.busy_s
    if rep.tiers is not None:  # LMCache's hits per level, in tokens: where each prompt block came from
        st["hit_tokens_by_level"] = _hit_tokens(rep.tiers, sim.block_size)
    if sim.pd is not None:
        st.update(sim.pd.instance_fields(rep))
    if sim.dp is not None:
        st.update(sim.dp.rank_fields(rep))
    return st


def _engine(sim: Simulation) -> str:
    """``compiled`` where every replica's pools run their compiled twins, ``python`` where none's HBM
    does, else ``mixed`` (``ReplicaCore.engine``)."""
    engines = {rep.core.engine for rep in sim.replicas}
    return engines.pop() if len(engines) == 1 else "mixed"


def _setup_report(sim: Simulation) -> dict:
    """What ran: the mode, the settings, the pool's capacity (in its own unit, blocks of
    ``block_size`` tokens, pages under radix, and in tokens and bytes, which mean one memory in
    every mode) and which engines served."""
    s, cost = sim.s, sim.cost
    return {
        "mode": "cache_only" if s.cache_only else "batching",
        "reuse": s.reuse_mode if s.reuse_mode != "sampled" else f"sampled (SHARDS, rate {s.knobs.shards_rate:g})",
        "policy": s.knobs.policy,
        "capacity_blocks": s.capacity_blocks,
        "capacity_tokens": s.capacity_blocks * sim.block_size,
        "capacity_bytes": s.capacity_blocks * cost.block_bytes(sim.block_size),
        "capacity_gib": round(cost.blocks_to_gib(s.capacity_blocks, sim.block_size), 3),
        "replicas": s.replicas,
        "routing": s.routing,
        "hit_mode": s.knobs.hit_mode,
        "matching": s.knobs.matching,
        "response_kv": s.knobs.response_kv,
        "prefix_caching": s.knobs.prefix_caching,
        "max_running": s.knobs.max_running,
        "scheduler": None if s.cache_only else s.knobs.scheduler,
        "decode_kv": None if s.cache_only else s.knobs.decode_kv,
        # the pool that served: compiled (replica.core.compiled.pool, the same results) or python, and
        # why not compiled where it was asked for (None: it ran, or --python-core asked for Python)
        "engine": _engine(sim),
        "engine_reason": next((why for rep in sim.replicas for why in (rep.core.why_python,
                                                                        rep.core.why_python_levels) if why), None),
        # the scheduler step and this loop: compiled by mypyc from their source, or that source
        # (shared.compiled_modules: the same results)
        "step_engine": compiled_modules.status(),
        "step_engine_reason": compiled_modules.reason() or None,
        "block_size": sim.block_size,
        "model": cost.model.name,
        "kv_cache_dtype": cost.model.kv_cache_dtype,
        "gpu": cost.gpu.name,
    }


def _hit_tokens(tiers: TierStack, block_size: int) -> dict[str, int]:
    """Tokens of admitted prompts' blocks by where they came from: HBM, each lower level by name, or
    recomputed (blocks of ``block_size`` tokens; a prompt's partial tail is never reused)."""
    c, bs = tiers.counters, block_size
    out = {"hbm": c.hits[0] * bs}
    out.update({name: c.hits[k] * bs for k, name in enumerate(tiers.names, 1)})
    out["recomputed"] = (c.accessed_blocks - sum(c.hits)) * bs
    return out


def _tier_report(sim: Simulation, counts: CacheCounts) -> dict:
    """Per-level hit ratios over block accesses (without tiers, HBM's is the block hit ratio),
    each level under its name (``host_block_hit_ratio``, ...)."""
    levels = sim.s.knobs.tiers.levels()
    stacks = [rep.tiers for rep in sim.replicas if rep.tiers is not None]
    if not stacks:
        out: dict = {"hbm_block_hit_ratio": ratio(counts.block_hits, counts.block_accesses)}
        out.update({f"{lv.kind}_block_hit_ratio": 0.0 for lv in levels})
        out["all_levels_block_hit_ratio"] = out["hbm_block_hit_ratio"]
        return {**out, "fetched_blocks": 0, "recomputed_blocks": counts.block_accesses - counts.block_hits}
    c = [t.counters for t in stacks]
    n = sum(x.accessed_blocks for x in c)
    hits = [sum(x.hits[k] for x in c) for k in range(len(levels) + 1)]  # hits[0]: HBM
    moved: dict[str, int] = {}
    for t in stacks:
        for link, b in t.stats()["bytes_moved"].items():
            moved[link] = moved.get(link, 0) + b
    s = stacks[0].settings
    out = {"hbm_block_hit_ratio": ratio(hits[0], n)}
    out.update({f"{lv.kind}_block_hit_ratio": ratio(hits[k], n) for k, lv in enumerate(levels, 1)})
    out["all_levels_block_hit_ratio"] = ratio(sum(hits), n)  # reused from any level: what was not recomputed
    tiers: dict = {"mode": s.mode, "fetch": s.fetch}
    tiers.update({f"{lv.kind}_blocks": lv.blocks for lv in levels})
    tiers.update({f"{lv.kind}_policy": lv.policy for lv in levels})
    if s.shared is not None:  # the store's own eviction, not a block policy
        tiers["shared_policy"] = s.shared.eviction
    if sim.stores:  # the shared level's stores, as many as its scope makes
        tiers["shared"] = [store.stats() for store in sim.stores]
    tiers.update({"host_link_gbps": s.host_link_gbps, "bytes_moved": moved,
                  "demoted_blocks": sum(x.demoted for x in c), "dropped_blocks": sum(x.dropped for x in c),
                  # held by a lower level but recomputed: --fetch auto found the restore slower
                  "recomputed_from_tier_blocks": sum(x.recomputed for x in c)})
    return {**out, "fetched_blocks": sum(hits[1:]), "recomputed_blocks": n - sum(hits), "tiers": tiers}


def _latencies(sim: Simulation, timed: bool) -> dict[str, float | None]:
    ttft = LogHistogram()
    # the same counts, minimum and maximum as one cluster-wide histogram; under P/D a request's first
    # token comes from its decode (or colocated) instance, not from the prefill instance's one token
    for rep in sim.replicas if sim.pd is None else sim.pd.decoders:
        ttft.merge(rep.ttft)
    hists = {"ttft": ttft, "queue": sim.queue, "e2e": sim.e2e, "tpot": sim.tpot}
    out: dict[str, float | None] = {}
    for name, q in (("ttft_p50_s", 0.5), ("ttft_p95_s", 0.95), ("ttft_p99_s", 0.99), ("queue_p99_s", 0.99),
                    ("e2e_p50_s", 0.5), ("e2e_p99_s", 0.99), ("tpot_p50_s", 0.5), ("tpot_p99_s", 0.99)):
        out[name] = hists[name.split("_")[0]].quantile(q) if timed else None
    return out


def _speculative(sim: Simulation) -> dict:
    """The cluster's speculative decoding figures, from the replicas' summed counts (a mean of per-replica rates
    would weigh a replica that verified little as much as a busy one); none without speculative decoding."""
    if sim.s.knobs.speculative is None or sim.s.cache_only:
        return {}
    verifies = sum(rep.sched.spec_verifies for rep in sim.replicas)
    drafts = sum(rep.sched.spec_drafts for rep in sim.replicas)
    accepted = sum(rep.sched.spec_accepted for rep in sim.replicas)
    return {"speculative": {"verifies": verifies, "draft_tokens": drafts, "accepted_tokens": accepted,
                            "mean_accepted_length": 1 + accepted / verifies if verifies else 0.0,
                            "acceptance_rate": ratio(accepted, drafts)}}


def _throughput(sim: Simulation, timed: bool, preemptions: int) -> dict[str, float | int | None]:
    """Requests finished per second from the first arrival to the last finish; the fraction of
    HBM blocks held by running requests, averaged over that span (idle time counts as empty);
    requests preempted (reorder). ``hbm_utilization_queued``: the same over the steps that began
    with requests waiting (the memory FlashGen's reordering fills: FCFS leaves it idle behind a
    head that does not fit); ``hbm_utilization_head_blocked``: over the steps whose head waited for
    memory (a head may also wait for a step's token budget or max_running); ``mean_batch_size``:
    requests running per step (prefilling or decoding), over every step. Cache-only runs have no
    clock: None."""
    span = sim.last_finish - sim.first_arrival
    if not timed:
        return {"preemptions": None, "throughput_rps": None, "hbm_utilization": None,
                "hbm_utilization_queued": None, "hbm_utilization_head_blocked": None, "mean_batch_size": None}
    scheds = [rep.sched for rep in sim.replicas]
    cap = sim.s.capacity_blocks
    held = sum(s.pinned_block_s for s in scheds)
    queued = sum(s.queued_s for s in scheds)
    blocked = sum(s.blocked_s for s in scheds)
    return {"preemptions": preemptions, "throughput_rps": ratio(sim.served, span),
            "hbm_utilization": ratio(held, span * cap * len(sim.replicas)),
            "hbm_utilization_queued": ratio(sum(s.queued_block_s for s in scheds), queued * cap)
            if queued else None,  # None: no request ever waited
            # the same over the steps whose queue head waited for memory (not for a step's room)
            "hbm_utilization_head_blocked": ratio(sum(s.blocked_block_s for s in scheds),
                                                  blocked * cap) if blocked else None,
            "mean_batch_size": ratio(sum(s.batch_steps for s in scheds), sum(s.steps for s in scheds))}


def _saturated(sim: Simulation, per: list[dict]) -> bool:
    """A replica's queue grew without bound: busy nearly all the time requests arrived, and
    still working through a backlog long after the last one (a tenth of the trace or more)."""
    span = sim.last_arrival - sim.first_arrival
    drain = sim.last_finish - sim.last_arrival
    if span <= 0:
        return False
    return drain > max(0.1 * span, 60.0) and max(p["busy_s"] for p in per) > 0.9 * span


def saturation_warning(runs: list[dict]) -> str | None:
    """One line for the runs whose replica queue grew without bound (their TTFT is mostly
    waiting), naming the worst; None when every queue kept up."""
    bad = [r for r in runs if r.get("saturated")]
    if not bad:
        return None
    w = max(bad, key=lambda r: r["drain_s"])
    which = f"{w['policy']} @ {w['capacity_blocks']:,} blocks"
    head = f"warning: {which}" if len(bad) == 1 else f"warning: {len(bad)} of {len(runs)} runs (worst: {which})"
    more = f"--replicas (now {w['replicas']})"
    if w.get("pd"):  # a P/D run: the pool whose queue grew is the one to widen
        topo = w["pd"]["topology"]
        more = f"--prefill-replicas (now {topo['prefill']}) or --decode-replicas (now {topo['decode']})"
    return (f"{head}: the replica queue grew without bound (the last request finished {_duration(w['drain_s'])}"
            f" after the last arrival, over a {_duration(w['arrival_span_s'])} trace), so TTFT is mostly queueing;"
            f" raise --max-running (now {w['max_running']}) or {more}, or lower the load")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"
