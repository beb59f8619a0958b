"""One definition per hit-ratio name: `kvemu replay`'s token and block hit ratios are HBM's, as `kvemu sim`'s and
each replica's /stats (shared/ratios.py), and what lower levels (host, SSD, a shared store) add is apart and named."""

from __future__ import annotations

import io

import pytest

from kvemu.replay_cmd import level_hits, print_report
from loadgen.replay import Record, summarize


def record(replica: str, prompt_tokens: int, prompt_blocks: int, cached_blocks: int, cached_tokens: int) -> Record:
    return Record("s", 0, 200, replica, prompt_tokens, cached_tokens, prompt_blocks, cached_blocks, 0.01, 0.02, 0.03, 0.0)


def test_replay_hit_ratios_are_hbms_and_the_replicas_cached_tokens_are_apart():
    # blocks of 16 tokens. r0: 4 blocks (64 tokens), 2 found in HBM and 1 restored from the shared store: the
    # replica computed 16 (cached_tokens 48). r1: 4 blocks and 8 tokens more (72), all 4 in HBM (cached 64).
    # r2: 4 blocks (64 tokens) all in HBM: a prompt cached whole computes its last block again (cached 48).
    records = [record("replica-0", 64, 4, 2, 48), record("replica-0", 72, 4, 4, 64), record("replica-1", 64, 4, 4, 48)]
    s = summarize(records, 16)
    tokens = 64 + 72 + 64
    assert s["block_hit_ratio"] == pytest.approx((2 + 4 + 4) / 12)
    assert s["token_hit_ratio"] == pytest.approx((32 + 64 + 64) / tokens)  # HBM's blocks x 16, at most the prompt
    assert s["cached_token_ratio"] == pytest.approx((48 + 64 + 48) / tokens)
    per = s["per_replica"]
    assert per["replica-0"]["token_hit_ratio"] == pytest.approx((32 + 64) / 136)
    assert per["replica-0"]["cached_token_ratio"] == pytest.approx((48 + 64) / 136)
    assert per["replica-1"]["token_hit_ratio"] == 1.0 and per["replica-1"]["cached_token_ratio"] == 0.75
    # pages of 1 token (radix): the same count of hits is that many tokens
    assert summarize([record("replica-0", 64, 64, 40, 40)], 1)["token_hit_ratio"] == pytest.approx(40 / 64)


def test_every_level_comes_from_the_replicas_tier_counters():
    # 1,000 blocks looked up: 0.3 in HBM, 0.1 on host, 0.2 in the shared store
    tiers = {"accessed_blocks": 1000, "hbm_block_hit_ratio": 0.3, "host_block_hit_ratio": 0.1, "ssd_block_hit_ratio": 0.0,
             "shared_block_hit_ratio": 0.2, "fetched_blocks": 300}
    assert level_hits(tiers) == {"accessed_blocks": 1000, "found_blocks": 600}


def test_the_report_names_the_level_of_each_ratio():
    s = summarize([record("replica-0", 64, 4, 2, 48)], 16)
    out = io.StringIO()
    print_report(s, {"csr": 0.4, "replicas": {}, "all_levels_block_hit_ratio": 0.75}, out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "token hit ratio (HBM) 0.5000   block hit ratio (HBM) 0.5000   CSR 0.4000"
    assert lines[2] == ("all levels (HBM + lower): block hit ratio 0.7500   prompt tokens cached (the replicas'"
                        " cached_tokens) 0.7500")
    out = io.StringIO()  # no level below HBM: no such line
    print_report(s, {"csr": 0.4, "replicas": {}, "all_levels_block_hit_ratio": None}, out)
    assert not any(line.startswith("all levels") for line in out.getvalue().splitlines())
