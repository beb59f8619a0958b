"""A replica with a host tier, as a real process: demotion, restore, /stats and /metrics."""

import pytest

from tests.support.procs import http, http_json, start_replica

pytestmark = pytest.mark.slow

# qwen3-coder-30b-a3b: 96 KiB of KV per token, 1.5 MiB per 16-token block; 0.01 GiB = 6 blocks of host
HOST = ("--host-cache-gib", "0.01", "--tier-policy", "host=lru", "--fetch", "always")


def generate(url, first_token, blocks):
    body = {"token_ids": list(range(first_token, first_token + 16 * blocks)), "max_tokens": 1}
    status, out = http_json("POST", url + "/generate", body)
    assert status == 200, out
    return out


def test_evicted_blocks_come_back_from_host_and_are_counted():
    # 8 blocks: a request of 4 blocks and its token fits vLLM's length rule (a 4-block pool's
    # max_model_len is its 64 tokens, which 64 prompt tokens and 1 output token exceed)
    proc = start_replica(*HOST, capacity_blocks=8)
    try:
        generate(proc.url, 0, 4)  # A: 4 blocks
        generate(proc.url, 1000, 4)  # B: 4 blocks, the pool is full
        generate(proc.url, 2000, 4)  # C: evicts all of A (the least recently used), demoted to host
        again = generate(proc.url, 0, 4)  # A again: restored from host, not recomputed
        # restored blocks count as cached, as vLLM reports them; a prompt cached whole computes its last
        # block again (vLLM's hit stops a token short of the prompt, in whole blocks): 3 of its 4 blocks
        assert again["cached_tokens"] == 48
        status, st = http_json("GET", proc.url + "/stats")
        tiers = st["tiers"]
        assert tiers["host_blocks"] == 6 and tiers["mode"] == "exclusive" and tiers["host_policy"] == "lru"
        assert tiers["fetched_blocks"] == 4 and tiers["demoted_blocks"] >= 8
        assert tiers["host_block_hit_ratio"] == pytest.approx(4 / 16)  # 4 of the 16 blocks asked for
        assert tiers["bytes_moved"]["host_to_device"] == 4 * 16 * 98304
        status, _, data = http("GET", proc.url + "/metrics")
        text = data.decode()
        assert 'kvemu_tier_block_hits_total{model_name="qwen3-coder-30b-a3b",replica_id="' in text
        assert 'tier="host"} 4.0' in text
        assert 'kvemu_tier_bytes_moved_total' in text and 'link="host_to_device"' in text
    finally:
        assert proc.stop() == 0


def test_bad_tier_flags_are_one_line_errors():
    import subprocess
    import sys

    for flags, field in ((["--host-cache-gib", "-1"], "--host-cache-gib"), (["--tier-policy", "gpu=lru"], "--tier-policy"),
                         (["--tier-mode", "both"], "--tier-mode")):
        res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "8", *flags],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 2 and "Traceback" not in res.stderr and field in res.stderr, res.stderr
