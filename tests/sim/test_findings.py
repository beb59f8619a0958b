"""Seed 002's qualitative findings, each reproduced on a workload preset through the simulator.

Every run: one replica, ``max_running=1`` (the cache sees requests one at a time, in arrival
order), ``hit_mode="holes"`` (the analysis' count, given: the default is vLLM's prefix), no reuse-distance
tracking, the default cost model
(qwen3-coder-30b-a3b on an H200: a block's recompute cost grows with its depth, which is what
CSR weighs). Traces are small and seeded, so every number below is exact and repeatable; the
numbers in the comments were measured with these very settings, and each assertion keeps a
margin below them.

Why the agent trace is stretched in time: with ``max_running=1`` the replica serves one request
at a time, prefill *and* decode, so the agent preset at its default rate (1.25 requests/s)
overloads it and requests queue for minutes. The pool's clock is the admission time, while an
oracle's next-use times are arrival times; RandomCompute's idle times and BeladyCompute's
``next_use - now`` are then measured against a clock running minutes late. ``STRETCH`` multiplies
every gap and divides the session rate by 20: the same sessions with the same turns, arriving
in the same order (block hit ratios of time-blind policies are identical), but the replica keeps
up (queue p99 ~5 s instead of ~430 s). Measured on the unstretched trace (seed 8, 3800 blocks):
BeladyCompute's CSR falls to 0.626, below Belady's 0.732 and LRU's 0.643 -- see the report, this
is a simulator/oracle caveat, not a finding.
"""

from __future__ import annotations

import functools

from loadgen.workloads import generate
from replica.core.build import EngineKnobs
from sim.run import simulate
from sim.simulator import SimSettings

ONLINE = ("lru", "s3fifo", "arc", "session_lru", "random_compute", "partial_node")


@functools.cache
def _trace(preset: str, duration_s: float, seed: int, overrides: tuple[tuple[str, str], ...]):
    return generate(preset, duration_s, seed=seed, overrides=dict(overrides))


@functools.cache
def _run(workload: tuple, capacity: int, policy: str) -> dict:
    """One serial simulation; cached so tests sharing a trace share runs (random_compute is slow)."""
    run = simulate(_trace(*workload), SimSettings(capacity_blocks=capacity, replicas=1, reuse="off",
                                                  knobs=EngineKnobs(policy=policy, hit_mode="holes", max_running=1, response_kv="drop")))
    assert run["served"] == run["requests"]
    return run


# ---- workloads -----------------------------------------------------------------------------

# freeinference: heavy-tailed session footprints (seed 002's quantiles) at 16x the default session
# rate, so many sessions share the cache, with the footprint tail compressed (p99 3000 blocks
# instead of 8300, max 6000 instead of 160000) so a "small" pool (4300 blocks, 6.3 GiB of
# Qwen3-Coder KV) still holds the largest request (4176 blocks). 3416 requests, 959,865 accesses.
FREEINFERENCE = ("freeinference", 150, 3, (("session_rate", "4"), ("footprint_p99", "3000"),
                                           ("footprint_p999", "4000"), ("footprint_max", "6000")))

# agent: long agentic prefixes (system prompt ~3000 tokens, tool output every turn, contexts to
# 128K tokens), default profile, time-stretched 20x (see the module docstring). 200 requests in
# 13 sessions, 232,348 accesses, largest request 2929 blocks; 3800 blocks is a tight pool (LRU
# hits 0.718). Seed 8 was picked, among 12 seeds scanned, as a small trace with cache pressure.
STRETCH = 20
# (the agent turns of these findings follow one another: no fan-out)
AGENT = ("agent", 300 * STRETCH, 8, (("session_rate", repr(0.05 / STRETCH)), ("gap_median", repr(3.0 * STRETCH)),
                                     ("tool_fanout_prob", "0"), ("subagent_prob", "0")))
AGENT_CAPACITY = 3800

# single: one-turn requests, a Zipf-popular system prompt + a unique payload (default preset).
# 901 requests, 92,899 accesses, largest request 335 blocks.
SINGLE = ("single", 600, 1, ())


def _agent(policy: str) -> dict:
    return _run(AGENT, AGENT_CAPACITY, policy)


def _assert_replica_keeps_up(run: dict) -> None:
    # Time-aware policies score against the pool's clock; it must track arrival times.
    # Measured queue p99: 5.5 s (unstretched: 433 s), against a 60 s median gap between turns.
    assert run["queue_p99_s"] < 30.0, run["queue_p99_s"]


# ---- 1. block-level LRU vs session-level LRU --------------------------------------------------


def test_block_lru_beats_session_lru_at_small_capacity_and_the_gap_shrinks_when_capacity_grows():
    trace = _trace(*FREEINFERENCE)
    # The workload is heavy-tailed: measured, the top 10% of sessions (by their largest request)
    # hold 60.7% of the blocks (seed 002: 76.2%; the compressed tail lowers it).
    footprints = {}
    for r in trace.requests:
        footprints[r.session] = max(footprints.get(r.session, 0), len(r.hash_ids))
    sizes = sorted(footprints.values(), reverse=True)
    assert sum(sizes[: len(sizes) // 10]) >= 0.55 * sum(sizes)

    gap = {}
    for cap in (4300, 17_000, 68_000):
        lru = _run(FREEINFERENCE, cap, "lru")["block_hit_ratio"]
        sess = _run(FREEINFERENCE, cap, "session_lru")["block_hit_ratio"]
        gap[cap] = lru - sess
    # Measured block hit ratio, lru / session_lru (gap):
    #   4300 blocks:  0.4858 / 0.4479 (+0.0379)
    #  17000 blocks:  0.7156 / 0.7109 (+0.0047)
    #  68000 blocks:  0.8105 / 0.8089 (+0.0016)
    # Seed 002 reports 10.5 points at 24 GiB shrinking to 3.3 at 48 GiB; here the gap is smaller
    # (seeds 1, 2 of the same settings: +0.7 and +2.8 points at the smallest pool) but the
    # direction and the shrinking hold on every seed tried.
    assert gap[4300] >= 0.03
    assert gap[17_000] <= gap[4300] / 4
    assert 0 <= gap[68_000] <= 0.005


# ---- 2. PartialNode: far fewer holes, nearly the same CSR --------------------------------------


def test_partial_node_leaves_far_fewer_holes_than_random_compute_at_nearly_equal_csr():
    rc, pn = _agent("random_compute"), _agent("partial_node")
    _assert_replica_keeps_up(rc)
    rc_holes, pn_holes = rc["holes"]["mean_per_request"], pn["holes"]["mean_per_request"]
    # Measured: holes per request 8.39 (random_compute) vs 0.56 (partial_node), 15x fewer;
    # CSR 0.7200 vs 0.7142 (0.6 points). Seed 002: 8.7x fewer holes, negligible CSR loss.
    # Across 6 small agent traces x 2 capacities the ratio was 12x-18x, the CSR gap <= 1.5 points.
    assert rc_holes >= 4.0
    assert pn_holes * 8 <= rc_holes
    assert abs(rc["csr"] - pn["csr"]) <= 0.02


# ---- 3. RandomCompute beats LRU on CSR where miss cost grows with depth ------------------------


def test_random_compute_beats_lru_on_csr_with_long_agentic_prefixes():
    lru, rc = _agent("lru"), _agent("random_compute")
    _assert_replica_keeps_up(rc)
    # Measured: CSR 0.7200 (random_compute) vs 0.6426 (lru), +7.7 points; block hit ratio
    # 0.7185 vs 0.7180: it wins by keeping the expensive (deep) blocks, not by hitting more.
    # Seed 002: +10.4 points on FreeInference at 24 GiB. Across 6 small agent traces x 2
    # capacities: +1.7 to +7.8 points in 11 of 12, -1.2 on the smallest trace (148K accesses,
    # the roomier pool), so this is a tendency that needs cache pressure, not a law.
    assert rc["csr"] - lru["csr"] >= 0.05
    assert abs(rc["block_hit_ratio"] - lru["block_hit_ratio"]) <= 0.01


# ---- 4. S3-FIFO beats LRU when one-hit traffic floods a tight cache ----------------------------


def test_s3fifo_beats_lru_when_one_hit_payloads_dominate_a_tight_cache():
    tight = {p: _run(SINGLE, 1340, p) for p in ("lru", "s3fifo")}
    # One-hit traffic dominates: measured, 84.2% of the blocks LRU inserted were never reused.
    lru_stats = tight["lru"]["per_replica"][0]
    assert lru_stats["one_hit_blocks"] >= 0.7 * lru_stats["inserted_blocks"]
    # Measured block hit ratio at 1340 blocks: 0.3866 (s3fifo) vs 0.2301 (lru), +15.6 points
    # (seeds 2, 3 at comparable pools: +11.1, +9.1). Seed 002: +8.8 points on Qwen To-B, 24 GiB.
    assert tight["s3fifo"]["block_hit_ratio"] - tight["lru"]["block_hit_ratio"] >= 0.10
    # With room for the popular prompts the advantage fades (measured at 10720 blocks: 0.6607
    # vs 0.6372, +2.4 points): quick demotion pays only when the cache is tight.
    roomy = {p: _run(SINGLE, 10_720, p)["block_hit_ratio"] for p in ("lru", "s3fifo")}
    assert roomy["s3fifo"] - roomy["lru"] <= 0.05


# ---- 5. the offline oracles bound the online policies ------------------------------------------


def test_belady_bounds_every_online_hit_ratio_and_belady_compute_bounds_belady_csr():
    runs = {p: _agent(p) for p in (*ONLINE, "belady", "belady_compute")}
    _assert_replica_keeps_up(runs["belady_compute"])
    best_online = max(runs[p]["block_hit_ratio"] for p in ONLINE)
    # Measured block hit ratio: belady 0.7718; online: lru 0.7180, s3fifo 0.7157, arc 0.7171,
    # session_lru 0.6233, random_compute 0.7185, partial_node 0.7170. No tolerance needed.
    assert runs["belady"]["block_hit_ratio"] >= best_online + 0.03
    # Measured CSR: belady_compute 0.7864 vs belady 0.7324 (+5.4 points); BeladyCompute's hit
    # ratio is a little lower (0.7680): it gives up cheap hits for expensive ones. No tolerance
    # needed here either -- but see the module docstring: on the unstretched, overloaded trace
    # BeladyCompute's CSR drops to 0.626, below Belady. Best online CSR: random_compute 0.7200.
    assert runs["belady_compute"]["csr"] >= runs["belady"]["csr"] + 0.03
    assert runs["belady_compute"]["csr"] >= max(runs[p]["csr"] for p in ONLINE)
