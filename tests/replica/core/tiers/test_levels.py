"""A new kind of memory level takes a ``LevelKind`` and its entry in ``LEVELS``: here a remote
shared KV store below SSD (as LMCache or Mooncake's store are), registered by the test alone, and
a request's blocks demoted HBM -> host -> SSD -> remote and restored from it through TierStack."""

from __future__ import annotations

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, KvEvent
from replica.core.tiers import levels
from replica.core.tiers.levels import LevelKind, LevelSettings
from replica.core.tiers.stack import TierSettings, TierStack
from shared.errors import InputError
from tests.support.tier_stack import serve

REMOTE = LevelKind("remote", read_gbps=1.0, write_gbps=0.5, in_file=True)


@pytest.fixture
def remote(monkeypatch):
    monkeypatch.setitem(levels.LEVELS, "remote", REMOTE)


def stack(**tier):
    hbm = BlockPool(2, make_policy("lru"))
    settings = TierSettings(host_blocks=2, ssd_blocks=2, host_link_gbps=1.0, ssd_read_gbps=1.0, ssd_write_gbps=1.0,
                            deeper=(LevelSettings("remote", blocks=4),), **tier)
    return hbm, TierStack(settings, hbm, block_bytes=10**9, recompute_cost=lambda depth: 100.0, emit_events=True)


def test_a_registered_level_takes_the_blocks_ssd_evicts_and_restores_them(remote):
    hbm, tiers = stack(fetch="always")
    assert [(lv.index, lv.name) for lv in tiers.levels] == [(1, "host"), (2, "ssd"), (3, "remote")]
    for t, h in enumerate(range(1, 9)):  # 8 blocks through 2 + 2 + 2 + 4 slots: nothing dropped
        serve(hbm, tiers, [h], now=float(t))
    held = {lv.name: sorted(lv.pool.resident) for lv in tiers.levels}
    assert held == {"host": [5, 6], "ssd": [3, 4], "remote": [1, 2]} and sorted(hbm.resident) == [7, 8]
    assert tiers.counters.dropped == 0
    remote_link = tiers.level("remote").link
    assert remote_link is not None and remote_link.bytes_moved == 2 * 10**9  # the two blocks written to it
    # block 1 comes back from the remote store: a level-3 hit, staged through host memory
    plan = serve(hbm, tiers, [1], now=100.0)
    assert plan.restored_idx == [0] and tiers.counters.hits == [0, 0, 0, 1]
    assert 1 in hbm.resident and 1 not in tiers.pool("remote").resident  # exclusive: it left the store
    # read at 1 GB/s over the store's link, and over the device link: the slower of the two, each shared
    # with what is in flight there. On the store's link: that restore's read (1 s) and the write of the
    # block SSD evicted to make room (1 GB at 0.5 GB/s: 2 s of the link's work); a second 1 GB read shares
    # it three ways until the first two marks: 3 s. On the device link two ways: 2 s. The slower: 3 s.
    assert tiers.transfer_seconds(tiers.level("remote"), 1) == 3.0
    assert tiers.stats()["remote_block_hit_ratio"] == pytest.approx(1 / 9)
    assert "remote" in tiers.stats()["bytes_moved"]


def test_its_events_carry_its_index_and_the_overlap_map_names_it_by_index(remote):
    hbm, tiers = stack(fetch="always")
    for t, h in enumerate(range(1, 8)):
        serve(hbm, tiers, [h], now=float(t))
    assert KvEvent("stored", (1,), 3) in tiers.drain_events()
    assert tiers.lower_overlap("r", [1, 3, 5, 9], 0) == {"r#3": 1, "r#2": 1, "r#1": 1}


def test_an_unregistered_level_is_refused_by_name():
    with pytest.raises(InputError, match="unknown memory level 'remote'"):
        LevelSettings("remote", blocks=4)
