import json

import pytest

from loadgen.formats import read_trace
from loadgen.trace import Trace, TraceRequest
from replica.core.build import EngineKnobs
from replica.core.compiled import pool as compiled_pool
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError, UnknownNameError
from sim.run import simulate
from sim.simulator import NextUses, SimSettings, Simulation


@pytest.fixture(scope="module")
def mooncake(request):
    return read_trace("mooncake-conversation")


def serial(capacity, policy="lru", **kw):
    return SimSettings.of(capacity_blocks=capacity, policy=policy, max_running=1, **kw)


def test_lru_fidelity_on_mooncake(mooncake):
    run = simulate(mooncake, serial(18_279, reuse="off"))
    assert run["requests"] == 12_031 and run["block_accesses"] == 288_500
    assert 0.278 <= run["block_hit_ratio"] <= 0.280


def test_mrc_from_reuse_distances_predicts_lru_at_any_capacity(mooncake):
    sim = Simulation(mooncake, serial(18_279, reuse="exact"))
    sim.run()
    tracker = sim.replicas[0].pool.metrics.reuse
    for cap in (2_000, 7_500, 18_279, 40_000, 70_000):
        actual = simulate(mooncake, serial(cap, reuse="off"))["block_hit_ratio"]
        assert tracker.hit_ratio_at(cap) == pytest.approx(actual, abs=0.002), cap


def tiny_trace():
    reqs = []
    t = 0.0
    for turn in range(6):
        for s in range(4):
            base = (s + 1) * 1000
            n = 3 + 2 * turn
            reqs.append(TraceRequest(t, f"s{s}", turn, [base + i for i in range(n)], n * 16 + 5, 20))
            t += 0.5
    return Trace(reqs, block_size=16, source="tiny")


def test_same_inputs_same_json():
    a = simulate(tiny_trace(), SimSettings(capacity_blocks=40, replicas=2, routing="random",
                                           knobs=EngineKnobs(seed=4)))
    b = simulate(tiny_trace(), SimSettings(capacity_blocks=40, replicas=2, routing="random",
                                           knobs=EngineKnobs(seed=4)))
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_run_reports_contract_fields_and_per_replica_sums():
    run = simulate(tiny_trace(), SimSettings(capacity_blocks=40, replicas=3, routing="round_robin"))
    for key in ("policy", "capacity_blocks", "replicas", "routing", "hit_mode", "requests", "block_accesses",
                "block_hit_ratio", "token_hit_ratio", "csr", "holes", "ttft_p50_s", "ttft_p99_s", "per_replica"):
        assert key in run
    assert run["requests"] == 24 and run["served"] == 24
    assert [p["requests"] for p in run["per_replica"]] == [8, 8, 8]
    assert sum(p["block_accesses"] for p in run["per_replica"]) == run["block_accesses"]
    assert "reuse" in run["per_replica"][0]
    assert 0 < run["ttft_p50_s"] <= run["ttft_p99_s"]


def test_session_routing_keeps_history_local_and_beats_round_robin():
    # response KV dropped: the hand count below is of prompt blocks only
    rr = simulate(tiny_trace(), SimSettings(capacity_blocks=60, replicas=3, routing="round_robin",
                                            knobs=EngineKnobs(response_kv="drop")))
    sess = simulate(tiny_trace(), SimSettings(capacity_blocks=60, replicas=3, routing="session",
                                              knobs=EngineKnobs(response_kv="drop")))
    aware = simulate(tiny_trace(), SimSettings(capacity_blocks=60, replicas=3, routing="cache_aware",
                                               knobs=EngineKnobs(response_kv="drop")))
    # 4 sessions x 6 turns; turn j reuses the 3 + 2(j-1) blocks of turn j-1 when it lands on the same replica
    reusable = sum(3 + 2 * (j - 1) for j in range(1, 6)) * 4
    assert sess["block_hit_ratio"] == pytest.approx(reusable / rr["block_accesses"])
    assert aware["block_hit_ratio"] == pytest.approx(sess["block_hit_ratio"])
    assert rr["block_hit_ratio"] < sess["block_hit_ratio"]


def test_next_uses_are_positions_in_access_order():
    # accesses: 1@0 2@1 | 2@2 3@3 | 1@4 ; the second request shares the first one's timestamp
    tr = Trace([TraceRequest(0.0, "a", 0, [1, 2], 32, 1), TraceRequest(0.0, "b", 0, [2, 3], 32, 1),
                TraceRequest(2.5, "a", 1, [1], 16, 1)], block_size=16)
    nu = NextUses(tr)
    inf = float("inf")
    assert [nu.of(k) for k in range(3)] == [[4.0, 2.0], [inf, inf], [inf]]
    assert [nu.position(k) for k in range(3)] == [0.0, 2.0, 4.0]


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "arc", "session_lru", "belady"])
def test_cache_only_gives_exactly_the_one_at_a_time_hit_ratios(policy):
    # cache simulators count prompt blocks only: so does a one-at-a-time run without decode KV
    trace = read_trace("mooncake-synthetic")
    cache_only = simulate(trace, SimSettings(capacity_blocks=2000, cache_only=True, knobs=EngineKnobs(policy=policy)))
    serial = simulate(trace, SimSettings(capacity_blocks=2000,
                                         knobs=EngineKnobs(policy=policy, max_running=1, decode_kv=False)))
    assert cache_only["mode"] == "cache_only" and serial["mode"] == "batching"
    for key in ("block_hit_ratio", "token_hit_ratio", "csr", "evictions", "block_accesses", "requests"):
        assert cache_only[key] == serial[key], key
    assert cache_only["ttft_p50_s"] is None and cache_only["per_replica"][0]["ttft_p99_s"] is None
    assert serial["ttft_p50_s"] > 0


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("policy", ["lru", "s3fifo", "belady", "belady_compute"])
@pytest.mark.parametrize("name,capacity,kw", [
    ("mooncake-synthetic", 878, {"cache_only": True}),
    ("mooncake-synthetic", 878, {"cache_only": True, "hit_mode": "prefix"}),
    ("mooncake-conversation", 4000, {}),  # batching: decode KV, preemptions, SHARDS
    ("mooncake-synthetic", 878, {"hit_mode": "prefix", "reuse": "exact", "decode_kv": False, "max_running": 8}),
], ids=["synthetic-cache_only", "synthetic-cache_only-prefix", "conversation-batching", "synthetic-batching-prefix-exact"])
@pytest.mark.parametrize("response_kv", ["drop", "keep"])
def test_the_compiled_pool_reports_what_the_python_pool_reports(policy, name, capacity, kw, response_kv):
    trace = read_trace(name)
    # kept response KV: the compiled store has LRU and S3-FIFO; the oracles keep the Python pool then
    runs = [simulate(trace, SimSettings.of(capacity_blocks=capacity, policy=policy, compiled=compiled,
                                        response_kv=response_kv, **kw))
            for compiled in (True, False)]
    stores = response_kv == "drop" or policy in ("lru", "s3fifo")
    assert [r["engine"] for r in runs] == ["compiled" if stores else "python", "python"]
    for r in runs:
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert runs[0] == runs[1]  # every field, per replica too: hits, CSR, holes, footprints, evictions


def test_the_compiled_replay_is_not_used_where_it_would_differ():
    # events for a shared index, response KV, oracles, tiers and the reorder scheduler keep the Python pool
    trace = read_trace("mooncake-synthetic")
    for kw in ({"replicas": 2, "policy": "arc"}, {"response_kv": "keep", "policy": "belady"}, {"policy": "session_lru"}, {"policy": "arc"},
               {"tiers": TierSettings(host_blocks=500, hbm_caching=False)}):
        settings = {"response_kv": "drop", **kw}  # dropped, the compiled pool would run: kw alone keeps it off
        assert simulate(trace, SimSettings.of(capacity_blocks=878, cache_only=True, **settings))["engine"] == "python", kw
    # each run says why, where the compiled pool was asked for (the default) and did not run
    reasons = {name: simulate(trace, SimSettings.of(capacity_blocks=878, cache_only=True, **kw))["engine_reason"]
               for name, kw in (("tiers", {"tiers": TierSettings(host_blocks=500, hbm_caching=False)}),
                                ("belady_keep", {"policy": "belady"}), ("arc", {"policy": "arc"}),
                                ("python_core", {"compiled": False}), ("lru", {}))}
    if compiled_pool.compiled():
        assert reasons == {"tiers": "HBM without caching (--no-hbm-caching) needs the Python pool",
                           "belady_keep": "kept response KV with belady needs the Python pool (the compiled store"
                                          " has LRU and S3-FIFO)",
                           "arc": "policy arc is not compiled or not fresh", "python_core": None, "lru": None}
    else:
        assert reasons["python_core"] is None and "not built" in reasons["lru"]
    # a hash that is not a 64-bit unsigned integer too, in either mode
    odd = Trace([TraceRequest(0.0, "s", 0, [1 << 70, 2], 32, 4), TraceRequest(1.0, "s", 1, [1 << 70, 2, 3], 48, 4)], 16)
    for cache_only in (True, False):
        run = simulate(odd, SimSettings(capacity_blocks=8, cache_only=cache_only))
        assert (run["engine"], run["block_hits"] if "block_hits" in run else run["per_replica"][0]["block_hits"]) == \
            ("python", 2)


TIER_CASES = {
    "host_exclusive": TierSettings(host_blocks=800),
    "host_ssd_exclusive": TierSettings(host_blocks=300, ssd_blocks=900),
    "host_ssd_inclusive": TierSettings(host_blocks=300, ssd_blocks=900, mode="inclusive"),
    "host_fetch_always": TierSettings(host_blocks=500, fetch="always", host_policy="s3fifo"),
    "host_fetch_never": TierSettings(host_blocks=500, fetch="never"),
}


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("tiers", list(TIER_CASES))
@pytest.mark.parametrize("mode", ["cache_only", "batching", "batching_4_replicas"])
def test_tiers_under_a_compiled_hbm_pool_report_what_the_python_pool_reports(tiers, mode):
    """The compiled HBM pool hands each call's evictions to the tiers (demotion) and answers which
    blocks it lacks (restore planning): every field of the run equal, per-tier hits, bytes per link,
    demoted and dropped blocks included."""
    trace = read_trace("mooncake-conversation")
    kw = {"cache_only": mode == "cache_only", "replicas": 4 if mode.endswith("replicas") else 1}
    runs = [simulate(trace, SimSettings.of(capacity_blocks=600, tiers=TIER_CASES[tiers], compiled=c, **kw))
            for c in (True, False)]
    assert [r["engine"] for r in runs] == ["compiled", "python"]
    assert (runs[1]["fetched_blocks"] > 0) == (tiers != "host_fetch_never")  # something restored, or recomputed
    assert runs[1]["tiers"]["bytes_moved"]["device_to_host"] > 0  # demoted or copied down
    for r in runs:
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert runs[0] == runs[1]


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("tiers", ["host_ssd_exclusive", "host_ssd_inclusive", "host_fetch_always"])
def test_tier_levels_run_compiled_and_leave_the_levels_the_python_pools_leave(tiers):
    """Each level below HBM runs its pool's compiled twin (demotions, restores, removals, spills to the
    level below): after a cluster run every level's whole pool, policy order and metrics equal the
    Python pools', replica by replica."""
    from replica.core.compiled.pool import CompiledPool
    from replica.core.compiled.snapshot import PoolSnapshot
    trace = read_trace("mooncake-conversation")
    sims = [Simulation(trace, SimSettings(capacity_blocks=600, replicas=3, routing="cache_aware", compiled=c,
                                          knobs=EngineKnobs(tiers=TIER_CASES[tiers]))) for c in (True, False)]
    for sim in sims:
        sim.run()
    fast, python = ([lv for rep in sim.replicas for lv in rep.tiers.levels] for sim in sims)
    assert all(isinstance(lv.serving, CompiledPool) for lv in fast)
    assert not any(isinstance(lv.serving, CompiledPool) for lv in python)
    assert sum(lv.pool.metrics.requests for lv in python) > 0
    for a, b in zip(fast, python, strict=True):
        assert PoolSnapshot.of(a.serving) == PoolSnapshot.of(b.pool)


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
def test_a_tier_level_the_kernel_lacks_runs_python_and_the_run_says_which_and_why():
    trace = read_trace("mooncake-conversation")
    run = simulate(trace, SimSettings(capacity_blocks=600,
                                      knobs=EngineKnobs(tiers=TierSettings(host_blocks=800, host_policy="arc"))))
    assert (run["engine"], run["engine_reason"]) == ("mixed", "the host tier: policy arc is not compiled or not fresh")
    python = simulate(trace, SimSettings(capacity_blocks=600, compiled=False,
                                         knobs=EngineKnobs(tiers=TierSettings(host_blocks=800, host_policy="arc"))))
    for r in (run, python):
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert run == python


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("policy", ["lru", "s3fifo", "belady"])
@pytest.mark.parametrize("name,capacity", [("mooncake-conversation", 1500), ("mooncake-synthetic", 700)])
def test_the_reorder_scheduler_runs_compiled_and_reports_what_the_python_pool_reports(policy, name, capacity):
    """Reorder asks its pool for pin counts (``pins_of``) when a head blocks, lends, takes back and
    re-admits: every field of the run equal, preemptions and promotions included."""
    trace = read_trace(name)
    runs = [simulate(trace, SimSettings(capacity_blocks=capacity, compiled=c,
                                        knobs=EngineKnobs(policy=policy, scheduler="reorder", max_running=64)))
            for c in (True, False)]
    assert runs[0]["engine"] == ("compiled" if policy != "belady" else "python") and runs[1]["engine"] == "python"
    st = runs[1]["per_replica"][0]["scheduler"]
    assert st["promotions"] > 0 and st["preemptions"] > 0  # it lent and took back
    for r in runs:
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert runs[0] == runs[1]


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
@pytest.mark.parametrize("cache_only", [True, False])
@pytest.mark.parametrize("routing", ["cache_aware"])
def test_replicas_routed_by_the_index_run_compiled_and_report_what_the_python_pools_report(policy, cache_only,
                                                                                         routing):
    """The compiled pools ship no events; the simulator asks them for each prompt's prefix instead
    of a MemoryIndex fed every pool's events: the same overlaps, so every field of the run is equal."""
    trace = read_trace("mooncake-conversation")
    runs = [simulate(trace, SimSettings(capacity_blocks=1500, replicas=4, routing=routing, cache_only=cache_only,
                                        compiled=c, knobs=EngineKnobs(policy=policy)))
            for c in (True, False)]
    assert [r["engine"] for r in runs] == ["compiled", "python"]
    # batching spreads the load (queues count in the cost); cache-only has none, so one replica takes all
    assert (runs[0]["load_imbalance"] < 2) == (not cache_only)
    for r in runs:
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert runs[0] == runs[1]


@pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")
@pytest.mark.parametrize("response_kv", ["drop", "keep"])
def test_several_replicas_without_an_index_each_get_a_compiled_pool(response_kv):
    trace = read_trace("mooncake-synthetic")
    runs = [simulate(trace, SimSettings(capacity_blocks=500, replicas=3, routing="round_robin", compiled=c,
                                        knobs=EngineKnobs(response_kv=response_kv)))
            for c in (True, False)]
    assert [r["engine"] for r in runs] == ["compiled", "python"]
    for r in runs:
        del r["engine"], r["engine_reason"], r["wall_s"]
    assert runs[0] == runs[1]


def test_cache_only_never_overflows_a_queue():
    # 400 requests at one instant: one at a time with a waiting bound of 100_000 would be fine
    # here, but the point is that cache-only has no scheduler at all, hence no queue.
    reqs = [TraceRequest(0.0, f"s{i}", 0, [10 * i + j for j in range(4)], 64, 4) for i in range(400)]
    run = simulate(Trace(reqs, block_size=16), SimSettings(capacity_blocks=64, cache_only=True))
    assert run["served"] == run["requests"] == 400 and run["block_hit_ratio"] == 0.0


def test_bad_settings_name_the_field():
    with pytest.raises(InputError) as err:
        SimSettings(capacity_blocks=0)
    assert err.value.field == "capacity_blocks"
    with pytest.raises(UnknownNameError) as err:
        SimSettings(capacity_blocks=10, knobs=EngineKnobs(policy="mru"))
    assert "lru" in str(err.value)
    with pytest.raises(UnknownNameError):
        SimSettings(capacity_blocks=10, routing="nearest")


def test_sampled_reuse_tracking_is_the_default_and_its_mrc_is_within_001_of_exact(mooncake):
    sampled = Simulation(mooncake, SimSettings(capacity_blocks=18_279, knobs=EngineKnobs(max_running=1)))
    run = sampled.run()
    exact = Simulation(mooncake, SimSettings(capacity_blocks=18_279, cache_only=True, reuse="exact"))
    assert SimSettings(capacity_blocks=8, cache_only=True).reuse_mode == "off"
    exact.run()
    assert run["reuse"] == "sampled (SHARDS, rate 0.1)" and run["per_replica"][0]["reuse"]["kind"] == "shards"
    s_tracker, e_tracker = sampled.replicas[0].pool.metrics.reuse, exact.replicas[0].pool.metrics.reuse
    for cap in (1_000, 2_000, 4_000, 8_000, 18_279, 40_000, 100_000):
        assert s_tracker.hit_ratio_at(cap) == pytest.approx(e_tracker.hit_ratio_at(cap), abs=0.01), cap


@pytest.mark.parametrize("cache_only", [False, True])
def test_tiers_split_every_block_access_between_hbm_host_ssd_and_recompute(cache_only):
    from replica.core.tiers.stack import TierSettings

    tiers = TierSettings(host_blocks=12, ssd_blocks=30, fetch="always")
    base = SimSettings(capacity_blocks=20, replicas=1, cache_only=cache_only)
    plain = simulate(tiny_trace(), base)
    run = simulate(tiny_trace(), SimSettings(capacity_blocks=20, replicas=1, cache_only=cache_only,
                                             knobs=EngineKnobs(tiers=tiers)))
    assert run["hbm_block_hit_ratio"] == plain["block_hit_ratio"] == run["block_hit_ratio"]  # HBM unchanged
    assert plain["host_block_hit_ratio"] == plain["ssd_block_hit_ratio"] == 0
    assert run["host_block_hit_ratio"] > 0 and run["ssd_block_hit_ratio"] > 0  # history came back from below
    n = run["block_accesses"]
    found = round((run["hbm_block_hit_ratio"] + run["host_block_hit_ratio"] + run["ssd_block_hit_ratio"]) * n)
    assert found + run["recomputed_blocks"] == n and run["fetched_blocks"] == found - round(run["hbm_block_hit_ratio"] * n)
    assert run["tiers"]["host_blocks"] == 12 and run["tiers"]["mode"] == "exclusive"
    if not cache_only:  # restored blocks are not prefilled: first tokens come sooner
        assert run["ttft_p50_s"] < plain["ttft_p50_s"]


def test_two_replicas_with_host_tiers_and_cache_aware_routing_recover_more_history():
    from replica.core.tiers.stack import TierSettings

    settings = dict(capacity_blocks=20, replicas=2, routing="cache_aware", cache_only=True)
    run = simulate(tiny_trace(), SimSettings.of(**settings, tiers=TierSettings(host_blocks=60, fetch="always")))
    plain = simulate(tiny_trace(), SimSettings.of(**settings))
    assert run["host_block_hit_ratio"] > 0
    total = run["hbm_block_hit_ratio"] + run["host_block_hit_ratio"]
    assert total > plain["block_hit_ratio"]


def two_turns(second_extends_first=True):
    # turn 0: 3 prompt blocks (52 tokens) + 40 output tokens -> (52 + 40) // 16 - 3 = 2 response blocks
    first = TraceRequest(0.0, "s", 0, [1, 2, 3], 52, 40)
    nxt = [1, 2, 3, 4, 5, 6, 7] if second_extends_first else [9, 2, 3, 4, 5, 6, 7]
    return Trace([first, TraceRequest(100.0, "s", 1, nxt, 7 * 16 + 3, 5)], block_size=16, source="two")


def test_response_hashes_are_the_next_turns_blocks_or_their_own():
    from loadgen.trace import response_hashes
    from shared.hashing import chain_ids, content_id

    assert response_hashes(two_turns()) == [[4, 5], []]  # the last turn's response completes no block
    own = response_hashes(two_turns(second_extends_first=False))[0]
    assert own == chain_ids([content_id("response", "s", 0, 0), content_id("response", "s", 0, 1)], 3)


@pytest.mark.parametrize("cache_only", [False, True])
@pytest.mark.parametrize("response_kv, hits", [("drop", 3), ("keep", 5)])
def test_keep_caches_the_response_so_the_next_turn_hits_it(response_kv, hits, cache_only):
    run = simulate(two_turns(), SimSettings(capacity_blocks=100, cache_only=cache_only,
                                            knobs=EngineKnobs(response_kv=response_kv)))
    assert run["response_kv"] == response_kv
    assert run["per_replica"][0]["block_hits"] == hits  # turn 1 reuses its 3 prompt blocks (+ 2 of response)


def test_throughput_and_time_averaged_hbm_use_of_one_request():
    # One request of 10 blocks alone on a 40-block replica: it holds 10 blocks while it prefills
    # and 11 while it decodes (tokens 161-163 fill an 11th), arrival to finish being the whole
    # span; 1 request over that span. Without decode KV, 10 blocks throughout: a quarter.
    from shared.costmodel import CostModel

    trace = Trace([TraceRequest(2.0, "s", 0, list(range(10)), 160, 4)], block_size=16, source="one")
    run = simulate(trace, SimSettings(capacity_blocks=40))
    span = run["e2e_p50_s"]
    assert run["scheduler"] == "fcfs" and run["preemptions"] == 0
    cost = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    prefill, decode = cost.prefill_time(160, 0), 3 * cost.decode_step_time(1, 162)  # one run of 3 steps
    assert run["hbm_utilization"] == pytest.approx((10 * prefill + 11 * decode) / (40 * (prefill + decode)))
    assert simulate(trace, SimSettings(capacity_blocks=40, knobs=EngineKnobs(decode_kv=False)))["hbm_utilization"] == pytest.approx(0.25)
    assert run["throughput_rps"] == pytest.approx(1 / span, rel=0.01)  # e2e p50 is a histogram quantile


def hol_trace() -> Trace:
    reqs = [TraceRequest(0.0, "a", 0, list(range(6)), 96, 30), TraceRequest(0.001, "h", 0, list(range(100, 110)), 160, 2)]
    reqs += [TraceRequest(0.002 + k * 0.001, f"s{k}", 0, list(range(1000 * (k + 1), 1000 * (k + 1) + 3)), 48, 60)
             for k in range(2)]
    return Trace(reqs, block_size=16, source="hol")


def test_reorder_runs_report_their_scheduler_and_preemptions():
    # 12 blocks, prompt blocks only: a 10-block head arrives while a 6-block request runs; the first
    # 3-block request behind it borrows idle blocks (the second would eat into the 3 kept in reserve
    # for the running requests' next blocks) and is preempted when the first request ends.
    trace = hol_trace()
    fcfs = simulate(trace, SimSettings(capacity_blocks=12, knobs=EngineKnobs(decode_kv=False)))
    reorder = simulate(trace, SimSettings(capacity_blocks=12, knobs=EngineKnobs(scheduler="reorder", decode_kv=False)))
    assert (fcfs["scheduler"], fcfs["preemptions"]) == ("fcfs", 0)
    assert (reorder["scheduler"], reorder["preemptions"]) == ("reorder", 1)
    assert reorder["served"] == fcfs["served"] == 4
    assert reorder["hbm_utilization"] > fcfs["hbm_utilization"]
    # With decode KV, fcfs preempts too: s0 and s1 run together once h is done, each growing to
    # 7 blocks of KV (48 + 59 tokens); s1, admitted last, is preempted when they fill the 12.
    fcfs = simulate(trace, SimSettings(capacity_blocks=12))
    assert (fcfs["preemptions"], fcfs["served"]) == (1, 4)
    with pytest.raises(InputError) as err:
        SimSettings(capacity_blocks=12, knobs=EngineKnobs(scheduler="sjf"))
    assert err.value.field == "scheduler"


def test_a_preempted_requests_readmission_is_not_counted_again():
    # reorder with decode KV: s0 (lent a's idle blocks) is preempted for h, and a small request again as
    # decode KV fills the 12 blocks; each of them is still one request of 3 block accesses
    run = simulate(hol_trace(), SimSettings(capacity_blocks=12, knobs=EngineKnobs(scheduler="reorder")))
    assert run["preemptions"] == 2 and run["requests"] == run["served"] == 4
    assert run["block_accesses"] == 6 + 10 + 3 + 3


def test_a_backlog_longer_than_any_live_queue_bound_still_finishes():
    # 100,500 requests at one instant: more than the scheduler's default waiting bound (100,000),
    # which once aborted a long backlogged run ("waiting queue is full"). Virtual time refuses nothing.
    n = 100_500
    reqs = [TraceRequest(0.0, "s", 0, [i], 16, 1) for i in range(n)]
    run = simulate(Trace(reqs, block_size=16), SimSettings(capacity_blocks=64, reuse="off"))
    assert run["served"] == run["requests"] == n
