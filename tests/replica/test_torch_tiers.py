"""The torch backend under memory tiers: real copies to a host tensor and an SSD file, equal to a
recompute (to float32 rounding: see test_torch_backend.same_kv)."""

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.sched.scheduler import SchedRequest
from replica.core.tiers.stack import TierSettings
from shared.costmodel import CostModel
from shared.hashing import chain_ids

torch = pytest.importorskip("torch")

from replica.backends.torch_backend import TorchBackend  # noqa: E402
from replica.backends.torchstack import TorchStack  # noqa: E402

# one_thread: the autouse fixture (one torch thread), applied here too
from tests.replica.test_torch_backend import (  # noqa: E402, F401
    BS,
    _reference,
    _requests,
    _serve_one,
    one_thread,
    replay_checked,
    same_kv,
)


def _core(backend: bool, mode: str):
    """24 HBM blocks over 10 host blocks over 12 SSD blocks: the trace demotes, spills to SSD,
    drops off the SSD and restores from both (fetch always)."""
    cost = CostModel.from_names("tiny", "h200")
    tiers = TierSettings(host_blocks=10, ssd_blocks=12, mode=mode, fetch="always")
    core = build_core(CoreSettings(capacity_blocks=24, block_size=BS, reuse="off",
                                   knobs=EngineKnobs(token_budget=6, tiers=tiers)), cost)
    tb = TorchBackend(cost.model, core.pool, "cpu", layers=2, seed=7, tiers=core.tiers).attach(core.scheduler) \
        if backend else None
    return core, tb


def _check_every_tier(core, tb: TorchBackend, expected: dict) -> int:
    """Every block HBM, host and SSD hold equals its recompute from scratch (``same_kv``)."""
    checked = 0
    for h in core.pool.resident:
        assert same_kv(tb.block_kv(h), expected[h]), f"HBM block {h:#x} differs from its recompute"
        checked += 1
    for name, tier in (("host", core.tiers.pool("host")), ("ssd", core.tiers.pool("ssd"))):
        for h in tier.resident:
            kv = tb.mover.block_kv(name, h)
            assert same_kv(kv, expected[h]), f"{name} block {h:#x} differs from its recompute"
            checked += 1
    return checked


@pytest.mark.parametrize("mode", ["exclusive", "inclusive"])
def test_blocks_moved_through_host_and_ssd_equal_a_recompute(mode):
    core, tb = _core(True, mode)
    expected, checked = replay_checked(core, tb, _check_every_tier)
    moves, stats = tb.mover.counters, core.tiers.stats()
    # restored blocks were copied up from both tiers and read by the prefill, not computed
    assert moves["host>hbm"] > 0 and moves["ssd>hbm"] > 0 and moves["host>ssd"] > 0 and moves["restored_without_kv"] == 0
    assert moves["host>hbm"] + moves["ssd>hbm"] == stats["fetched_blocks"] == tb.counters["blocks_fetched"]
    assert moves["copy_s"] > 0 and stats["dropped_blocks"] > 0 and not tb.mover.owed
    if mode == "exclusive":  # each HBM eviction was demoted: one copy down per demoted block
        assert moves["hbm>host"] + moves["hbm>ssd"] == stats["demoted_blocks"]
    else:  # each block was copied to host once it was computed (owed at admission); a block that comes
        # back into HBM while its old slot still holds its K/V (slots are freed lazily) is copied at once
        assert moves["owed"] > 0 and moves["hbm>host"] >= moves["owed"]
    assert checked > 200
    # The check can fail: two host slots swapped (a wrong slot) and a stale SSD slot are caught.
    host = tb.mover.stores["host"]
    a, b = list(core.tiers.pool("host").resident)[:2]
    host.slot_of[a], host.slot_of[b] = host.slot_of[b], host.slot_of[a]
    with pytest.raises(AssertionError, match="host block .* differs from its recompute"):
        _check_every_tier(core, tb, expected)
    host.slot_of[a], host.slot_of[b] = host.slot_of[b], host.slot_of[a]
    ssd = tb.mover.stores["ssd"]
    ssd.data[ssd.slot_of[next(iter(core.tiers.pool("ssd").resident))]] += 1
    with pytest.raises(AssertionError, match="ssd block .* differs from its recompute"):
        _check_every_tier(core, tb, expected)


def test_tier_hit_ratios_equal_the_emulated_backends():
    stats = []
    for backend in (False, True):
        core, _ = _core(backend, "exclusive")
        now = 0.0
        for rid, (hashes, tokens) in enumerate(_requests()):
            now = _serve_one(core, rid, hashes, tokens, now)
        s = core.tiers.stats()
        stats.append({k: s[k] for k in ("hbm_block_hit_ratio", "host_block_hit_ratio", "ssd_block_hit_ratio",
                                         "fetched_blocks", "demoted_blocks", "dropped_blocks")})
    assert stats[0] == stats[1]
    assert stats[0]["host_block_hit_ratio"] > 0 and stats[0]["ssd_block_hit_ratio"] > 0


def _turns_with_responses():
    """Three sessions of four turns; each turn's response is the next turn's two new blocks
    (chained after its prompt), as `--response-kv keep` caches them."""
    out = []
    for turn in range(4):
        for session in range(3):
            ids = [1000 + session % 2] * 3 + [session * 100 + t for t in range(2 * turn + 2)]
            following = ids + [session * 100 + t for t in range(2 * turn + 2, 2 * turn + 4)]
            out.append((chain_ids(ids), len(ids) * BS + 2, chain_ids(following)[len(ids):]))
    return out


def test_response_blocks_kept_and_moved_equal_a_recompute():
    """Response KV kept: a finished turn's response blocks get the K/V the next turn's recompute
    would give them, in HBM and after demotion to host / SSD; the next turn reads them."""
    cost = CostModel.from_names("tiny", "h200")
    tiers = TierSettings(host_blocks=10, ssd_blocks=12, mode="exclusive", fetch="always")
    core = build_core(CoreSettings(capacity_blocks=24, block_size=BS, reuse="off",
                                   knobs=EngineKnobs(token_budget=6, tiers=tiers, response_kv="keep")), cost)
    tb = TorchBackend(cost.model, core.pool, "cpu", layers=2, seed=7, tiers=core.tiers).attach(core.scheduler)
    ref = TorchStack(tb.spec, "cpu", 2, seed=7)
    expected: dict = {}
    now, checked = 0.0, 0
    for rid, (hashes, tokens, response) in enumerate(_turns_with_responses()):
        chain = [*hashes, *response]
        if chain[-1] not in expected:
            expected.update(zip(chain, _reference(ref, chain)))
        core.scheduler.submit(SchedRequest(rid, hashes, tokens, 2, now, response_hashes=response))
        while core.scheduler.has_work():
            now += core.scheduler.step(now).duration
        now += 1.0
        checked += _check_every_tier(core, tb, expected)
    c = tb.counters
    assert c["response_blocks_computed"] > 12 and c["response_blocks_dropped"] == 0 and c["hits_not_in_slots"] == 0
    # turns 2-4 start with the previous turn's response: read from HBM or fetched, not computed
    assert c["blocks_computed"] < 12 * 2 + 3 * 2 + 3 and checked > 200
