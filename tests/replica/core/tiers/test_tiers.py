"""Host / SSD tiers below HBM: demotion, promotion, inclusive vs exclusive, links, fetch decisions."""

from __future__ import annotations

import argparse

import pytest

from kvemu.options.tiers import add_tier_args, tier_settings
from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from replica.core.sched.scheduler import SchedRequest
from replica.core.tiers.stack import TierSettings, TierStack
from shared.costmodel import CostModel
from shared.errors import InputError
from tests.support.tier_stack import serve

COST = CostModel.from_names("llama-3-8b", "h200")  # 128 KiB of KV per token: 2 MiB per 16-token block
BLOCK = 16 * 131072


def stack(hbm_blocks=4, cost_per_block=1.0, block_bytes=10**9, **tier):
    """A TierStack over a bare LRU pool; 1 GB blocks over 1 GB/s links make transfers 1 s each."""
    settings = TierSettings(host_link_gbps=1.0, ssd_read_gbps=1.0, ssd_write_gbps=1.0, **tier)
    hbm = BlockPool(hbm_blocks, make_policy("lru"), emit_events=False)
    return hbm, TierStack(settings, hbm, block_bytes, lambda depth: cost_per_block)


def test_exclusive_demotes_on_eviction_and_a_fetch_takes_the_block_back_up():
    hbm, tiers = stack(host_blocks=3, fetch="always")
    serve(hbm, tiers, [1, 2, 3])
    serve(hbm, tiers, [4, 5, 6])  # LRU evicts the deepest of the first request first: 3, 2
    assert sorted(hbm.resident) == [1, 4, 5, 6] and sorted(tiers.pool("host").resident) == [2, 3]
    plan = serve(hbm, tiers, [1, 2, 3], now=10.0)  # 1 is an HBM hit, 2 and 3 come from host
    assert plan.restored_idx == [1, 2] and plan.ready_at == 12.0  # two 1 s transfers on one link
    assert 2 not in tiers.pool("host").resident and 3 not in tiers.pool("host").resident  # exclusive: they left host
    c = tiers.counters
    assert (c.accessed_blocks, c.hits, c.recomputed) == (9, [1, 2, 0], 0)
    st = tiers.stats()
    assert st["host_block_hit_ratio"] == pytest.approx(2 / 9) and st["hbm_block_hit_ratio"] == pytest.approx(1 / 9)


def test_inclusive_copies_each_block_down_as_produced_and_keeps_it_after_a_fetch():
    hbm, tiers = stack(host_blocks=8, mode="inclusive", fetch="always")
    serve(hbm, tiers, [1, 2, 3])
    assert sorted(tiers.pool("host").resident) == [1, 2, 3]  # copied at once: freeing HBM costs nothing
    assert tiers.d2h.bytes_moved == 3 * 10**9
    serve(hbm, tiers, [4, 5, 6])
    assert tiers.counters.demoted == 0  # no demotion on eviction: a copy already lives below
    assert tiers.d2h.bytes_moved == 6 * 10**9
    serve(hbm, tiers, [1, 2, 3], now=20.0)
    assert {2, 3} <= set(tiers.pool("host").resident)  # inclusive: the copy stays
    assert tiers.counters.hits[1] == 2


def test_host_evictions_spill_to_ssd_and_ssd_evictions_leave_the_hierarchy():
    hbm, tiers = stack(hbm_blocks=2, host_blocks=2, ssd_blocks=2, fetch="always")
    for h in range(1, 7):
        serve(hbm, tiers, [h], now=float(h))
    # HBM holds the last 2; host the 2 before them; SSD the 2 before those; nothing dropped yet
    assert sorted(hbm.resident) == [5, 6] and sorted(tiers.pool("host").resident) == [3, 4]
    assert sorted(tiers.pool("ssd").resident) == [1, 2] and tiers.counters.dropped == 0
    serve(hbm, tiers, [7], now=7.0)
    assert sorted(tiers.pool("ssd").resident) == [2, 3] and tiers.counters.dropped == 1
    plan = serve(hbm, tiers, [2], now=100.0)  # from SSD: staged through host, the slower link paces it
    assert plan.restored_idx == [0] and tiers.counters.hits[2] == 1


@pytest.mark.parametrize("cost, fetched", [(1.0, False), (1.0001, True), (0.5, False)])
def test_auto_fetches_a_run_only_when_its_transfer_beats_recomputing_it(cost, fetched):
    hbm, tiers = stack(host_blocks=4, fetch="auto", cost_per_block=cost)
    serve(hbm, tiers, [1, 2, 3, 4])
    serve(hbm, tiers, [5, 6, 7, 8])  # 1..4 demoted to host
    plan = serve(hbm, tiers, [1, 2], now=50.0)  # a run of 2: 2 s to fetch vs 2 x cost to recompute
    assert (plan.restored_idx == [0, 1]) is fetched
    assert tiers.counters.recomputed == (0 if fetched else 2)


def test_fetch_never_recomputes_what_a_tier_holds():
    hbm, tiers = stack(host_blocks=4, fetch="never", cost_per_block=100.0)
    serve(hbm, tiers, [1, 2])
    serve(hbm, tiers, [3, 4, 5, 6])
    assert serve(hbm, tiers, [1, 2], now=9.0).restored_idx == []
    assert tiers.counters.recomputed == 2


def core_with_tiers(link_gbps=55.0, **tier):
    s = CoreSettings(capacity_blocks=4, reuse="off",
                     knobs=EngineKnobs(tiers=TierSettings(host_link_gbps=link_gbps, **tier)))
    return build_core(s, COST)


def run_request(core, rid, hashes, now):
    sched = core.scheduler
    sched.submit(SchedRequest(rid, hashes, len(hashes) * 16, 1, now))
    first = sched.step(now)
    while sched.has_work():
        now += sched.step(now + first.duration).duration
    return first


def test_a_restore_overlaps_prefill_compute_layer_by_layer():
    for gbps in (0.1, 55.0):  # a slow link: the transfer dominates; a fast one: the compute does
        core = core_with_tiers(gbps, host_blocks=8, fetch="always")
        run_request(core, 1, [1, 2, 3], 0.0)
        run_request(core, 2, [4, 5, 6], 1.0)  # demotes 3 and 2 to host
        step = run_request(core, 3, [1, 2, 3], 2.0)  # 1 hit; 2, 3 restored; the last block recomputed (vLLM)
        transfer = 2 * BLOCK / (gbps * 1e9)
        compute = COST.prefill_time(16, 32)
        assert (transfer > compute) == (gbps == 0.1)
        layers = COST.model.layers
        # the copy starts with the step, layer by layer: the step waits for the first layer's
        # share, or ends a layer of compute after the last; never the sum of the two
        assert step.duration == pytest.approx(max(transfer / layers + compute, transfer + compute / layers))
        assert step.duration < transfer + compute
    assert core.tiers.counters.hits[1] == 2


def test_tier_flags_become_validated_settings():
    p = argparse.ArgumentParser()
    add_tier_args(p)
    s = tier_settings(p.parse_args(["--host-cache-gib", "1", "--tier-policy", "host=s3fifo", "--tier-mode",
                                    "inclusive"]), COST, 16)
    assert (s.host_blocks, s.ssd_blocks, s.host_policy, s.ssd_policy, s.mode) == (512, 0, "s3fifo", "lru", "inclusive")
    assert (s.host_link_gbps, s.host_copy_overhead_s) == (55.5, 5e-6)  # the h200 preset's host link
    for argv, field in ((["--tier-policy", "gpu=lru"], "--tier-policy"), (["--host-cache-gib", "nan"], "--host-cache-gib"),
                        (["--tier-policy", "host=belady"], "tier_policy")):
        with pytest.raises(InputError) as err:
            tier_settings(p.parse_args(argv), COST, 16)
        assert err.value.field == field


def test_ssd_blocks_are_pre_staged_while_the_request_waits():
    # 1 GB blocks, SSD at 1 GB/s, host link at 10 GB/s, no host tier; recomputing a block costs 1.5 s
    settings = TierSettings(host_link_gbps=10.0, ssd_read_gbps=1.0, ssd_write_gbps=1.0, ssd_blocks=8, fetch="auto")
    hbm = BlockPool(2, make_policy("lru"), emit_events=False)
    tiers = TierStack(settings, hbm, 10**9, lambda depth: 1.5)
    for h in (1, 2, 3, 4):
        serve(hbm, tiers, [h], now=float(h))  # 1, 2 end up on SSD (their writes long done by 99)
    assert sorted(tiers.pool("ssd").resident) == [1, 2]
    ssd = tiers.level("ssd")
    # at 4 s, block 2's write down (1 s) is still on the drive: a 2 GB read shares it for 2 s (1 GB read
    # by then), then runs alone for 1 s: 3 s (the 0.2 s host copy beside it is the faster of the two)
    assert tiers.transfer_seconds(ssd, 2) == 3.0
    tiers.stage([1, 2], 99.0)  # the request arrives and waits: its read starts, done at 101
    plan = tiers.plan([1, 2], now=100.0)  # 1 s of the read left (< 3 s of recompute): fetched
    assert plan.restored_idx == [0, 1] and plan.ready_at == pytest.approx(101.0)
    tiers.cancel(plan)  # the staged read stays staged; the host copy is taken back
    assert tiers.h2d.in_flight == 0 and plan.waits == []
    again = tiers.plan([1, 2], now=100.0)
    assert again.ready_at == pytest.approx(101.0)
    tiers.cancel(again)
    # a drive at 0.5 GB/s: 4 s of read for 3 s of recompute
    def slow_stack():
        settings = TierSettings(host_link_gbps=10.0, ssd_read_gbps=0.5, ssd_write_gbps=1.0, ssd_blocks=8, fetch="auto")
        hbm2 = BlockPool(2, make_policy("lru"), emit_events=False)
        slow = TierStack(settings, hbm2, 10**9, lambda depth: 1.5)
        for h in (1, 2, 3, 4):
            serve(hbm2, slow, [h], now=float(h))
        return hbm2, slow

    # 4 s of SSD read for 3 s of recompute: recompute unless the request waited more than 1 s
    _, slow = slow_stack()
    unstaged = slow.plan([1, 2], now=100.0)
    assert unstaged.restored_idx == [] and unstaged.recomputed == 2
    hbm2, slow = slow_stack()
    slow.stage([1, 2], 98.5)  # arrived at 98.5: 2.5 s of the 4 s read left at 100
    waited = slow.plan([1, 2], now=100.0)
    assert waited.restored_idx == [0, 1]
    serve_alloc = hbm2.serve(Lookup([1, 2], now=100.0))
    slow.complete(waited, serve_alloc.hashes, serve_alloc.hit_idx, serve_alloc.new_idx, 100.0)
    # the SSD read started at arrival (98.5) on an idle drive: 4 s -> ends at 102.5
    assert waited.ready_at == pytest.approx(102.5)


def test_two_restores_at_once_share_the_device_link():
    # 1 GB blocks over a 1 GB/s host link: one block alone takes 1 s, two restored together 2 s each
    settings = TierSettings(host_link_gbps=1.0, host_blocks=8, fetch="always")
    hbm = BlockPool(4, make_policy("lru"), emit_events=False)
    tiers = TierStack(settings, hbm, 10**9, lambda depth: 1.5)
    for h in (1, 2, 3, 4, 5, 6):
        serve(hbm, tiers, [h], now=float(h))  # 1, 2 demoted to host (their copies down done long before 50)
    a = tiers.plan([1], now=50.0)
    b = tiers.plan([2], now=50.0)
    assert a.ready_at == 51.0 and b.ready_at == 52.0  # b was planned with a in flight
    assert tiers.windows([a, b], 50.0) == [(0.0, 2.0), (0.0, 2.0)]  # projected again: both at twice one


def test_a_pcie_all_reduce_shares_the_device_link_with_a_restore():
    # a step of 3 s whose all-reduce alone is 1 s (1 GB each direction at 1 GB/s), with a 1 GB restore
    # in flight on the host-to-device direction: the all-reduce gets half the link until the restore
    # ends (2 s), so the step takes 1 s more; and the restore ends at 2 s instead of 1 s
    settings = TierSettings(host_link_gbps=1.0, host_blocks=8, fetch="always", tp_bytes_per_token=1e6,
                            tp_comm_s_per_token=1e-3)
    hbm = BlockPool(4, make_policy("lru"), emit_events=False)
    tiers = TierStack(settings, hbm, 10**9, lambda depth: 1.5)
    for h in (1, 2, 3, 4, 5):
        serve(hbm, tiers, [h], now=float(h))
    plan = tiers.plan([1], now=50.0)
    assert plan.ready_at == 51.0
    assert tiers.all_reduce(50.0, 3.0, 1000) == 4.0
    assert tiers.windows([plan], 50.0) == [(0.0, 2.0)]
    assert tiers.all_reduce(60.0, 3.0, 1000) == 3.0  # the link idle again: as priced alone


def test_without_hbm_caching_a_finished_request_moves_down_and_the_next_turn_restores_it():
    core = build_core(CoreSettings(capacity_blocks=16, reuse="off",
                                   knobs=EngineKnobs(tiers=TierSettings(
        host_blocks=16, fetch="always", hbm_caching=False))), COST)
    run_request(core, 1, [1, 2, 3], 0.0)
    assert core.pool.used == 0 and sorted(core.tiers.pool("host").resident) == [1, 2, 3]
    run_request(core, 2, [1, 2, 3, 4], 1.0)  # all three from host, one computed
    c = core.tiers.counters
    assert c.hits[:2] == [0, 3] and sorted(core.tiers.pool("host").resident) == [1, 2, 3, 4]
