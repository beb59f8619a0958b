"""A KV store shared by the simulated replicas (replica/core/tiers/shared.py, sim/simulator.py's
_shared_stores): a session's second turn lands on the other replica (round_robin) and reads what the
first turn left in the store; one store per replica (--shared-scope 1) shares nothing; the command line's
flags, its summary line and its one-line refusals.

The trace, by hand: session "a", turn 1 at t=0 with a 10-block prompt (160 tokens, hashes 0..9) on
replica-0, turn 2 at t=50 with a 20-block prompt (hashes 0..19) on replica-1. Responses' KV dropped, fetch
always: 30 blocks accessed; with the store turn 2 reads its first 10 blocks from it, 10 / 30."""

from __future__ import annotations

import json

import pytest

from kvemu.cli import main
from loadgen.formats import write_kvemu
from loadgen.trace import Trace, TraceRequest
from replica.core.build import EngineKnobs
from replica.core.tiers.shared import SharedSettings
from replica.core.tiers.stack import TierSettings
from shared.costmodel import CostModel
from sim.run import simulate
from sim.settings import SimSettings

MODEL, GPU = "llama-3-8b", "h200"
BS = 16
BLOCK = CostModel.from_names(MODEL, GPU).block_bytes(BS)  # 2 MiB: 16 tokens of 128 KiB


def two_turns() -> Trace:
    return Trace([TraceRequest(0.0, "a", 0, list(range(10)), 10 * BS, 3),
                  TraceRequest(50.0, "a", 1, list(range(20)), 20 * BS, 3)], BS, "hand")


def run(tiers: TierSettings | None = None, trace: Trace | None = None, **kw) -> dict:
    s = SimSettings.of(capacity_blocks=kw.pop("capacity_blocks", 100), replicas=kw.pop("replicas", 2),
                       routing=kw.pop("routing", "round_robin"), model=MODEL, gpu=GPU, response_kv="drop",
                       tiers=tiers or TierSettings(), **kw)
    return simulate(trace or two_turns(), s)


def by_replica(out: dict) -> dict[str, dict]:
    return {p["replica"]: p for p in out["per_replica"]}


def test_without_a_store_the_second_turn_on_the_other_replica_recomputes_everything():
    out = run()
    reps = by_replica(out)
    assert [reps[r]["requests"] for r in ("replica-0", "replica-1")] == [1, 1]  # round_robin: one turn each
    assert [reps[r]["block_accesses"] for r in ("replica-0", "replica-1")] == [10, 20]
    assert out["block_hit_ratio"] == 0.0 and out["all_levels_block_hit_ratio"] == 0.0
    assert out["recomputed_blocks"] == 30 and out["fetched_blocks"] == 0
    assert "shared_block_hit_ratio" not in out and "tiers" not in out


@pytest.mark.parametrize("write, hbm_caching", [("through", True), ("evict", False)])
def test_with_a_store_the_second_turn_reads_the_first_turns_blocks_from_it(write, hbm_caching):
    """through: replica-0 writes turn 1's 10 blocks when it finishes; evict without HBM caching: they leave
    its HBM for the store as it finishes. Either way replica-1 restores 10 and computes 10, then writes its
    10 new ones (0..9 are held): 20 chunks written, 10 read, 20 held."""
    tiers = TierSettings(fetch="always", hbm_caching=hbm_caching, shared=SharedSettings(100, write=write))
    out = run(tiers)
    assert out["shared_block_hit_ratio"] == 10 / 30 and out["all_levels_block_hit_ratio"] == 10 / 30
    assert out["hbm_block_hit_ratio"] == 0.0 and out["host_block_hit_ratio"] == 0.0
    assert out["fetched_blocks"] == 10 and out["recomputed_blocks"] == 20
    reps = by_replica(out)
    assert reps["replica-0"]["hit_tokens_by_level"] == {"hbm": 0, "host": 0, "ssd": 0, "shared": 0, "recomputed": 160}
    assert reps["replica-1"]["hit_tokens_by_level"] == {"hbm": 0, "host": 0, "ssd": 0, "shared": 160,
                                                        "recomputed": 160}
    t = out["tiers"]
    assert (t["shared_blocks"], t["host_blocks"], t["ssd_blocks"]) == (100, 0, 0)
    [store] = t["shared"]
    assert {k: store[k] for k in ("blocks", "used_blocks", "chunks", "chunk_blocks", "eviction", "write", "writes",
                                  "refused_writes", "reads", "evictions", "nic_gbps", "store_gbps")} == {
        "blocks": 100, "used_blocks": 20, "chunks": 20, "chunk_blocks": 1, "eviction": "mooncake", "write": write,
        "writes": 20, "refused_writes": 0, "reads": 10, "evictions": 0, "nic_gbps": 400.0, "store_gbps": 640.0}
    # the replicas' NICs: 20 blocks written, 10 read; down the device link the 20 written (evict without HBM
    # caching demotes turn 2's 0..9 too, which the store holds: nothing crosses), up it the 10 read
    assert t["bytes_moved"] == {"host_to_device": 10 * BLOCK, "device_to_host": 20 * BLOCK, "ssd": 0,
                                "shared": 30 * BLOCK}
    assert t["demoted_blocks"] == (0 if hbm_caching else 30)


def test_the_stores_aggregate_carries_its_reads_as_well_as_its_writes():
    out = run(TierSettings(fetch="always", shared=SharedSettings(100, write="through")))
    assert out["tiers"]["shared"][0]["bytes_moved"] == 30 * BLOCK


def test_the_json_names_the_stores_eviction_as_it_runs():
    out = run(TierSettings(fetch="always", shared=SharedSettings(100, write="through")))
    assert out["tiers"].get("shared_policy", "mooncake") == "mooncake"


def test_chunks_of_four_blocks_share_only_whole_chunks():
    """Chunks of 4 (64 tokens): turn 1 writes (0..3), (4..7); 8, 9 are a tail. Turn 2 restores 8 blocks and
    writes (8..11), (12..15), (16..19): 5 chunks written, 20 blocks held."""
    out = run(TierSettings(fetch="always", shared=SharedSettings(100, chunk_blocks=4, write="through")))
    assert out["shared_block_hit_ratio"] == 8 / 30 and out["recomputed_blocks"] == 22
    [store] = out["tiers"]["shared"]
    assert (store["writes"], store["reads"], store["used_blocks"], store["chunks"]) == (5, 2, 20, 5)


@pytest.mark.parametrize("scope, stores", [(0, 1), (2, 1)])
def test_a_scope_of_the_whole_cluster_is_one_store(scope, stores):
    out = run(TierSettings(fetch="always", shared=SharedSettings(100, write="through", scope=scope)))
    assert len(out["tiers"]["shared"]) == stores and out["shared_block_hit_ratio"] == 10 / 30


def test_one_store_per_replica_shares_nothing_across_replicas():
    out = run(TierSettings(fetch="always", shared=SharedSettings(100, write="through", scope=1)))
    assert out["shared_block_hit_ratio"] == 0.0 and out["all_levels_block_hit_ratio"] == 0.0
    assert out["recomputed_blocks"] == 30
    first, second = out["tiers"]["shared"]  # replica-0's, replica-1's
    assert (first["writes"], first["reads"], first["used_blocks"]) == (10, 0, 10)
    assert (second["writes"], second["reads"], second["used_blocks"]) == (20, 0, 20)


def test_one_store_per_replica_still_serves_a_replicas_own_turns():
    """Both turns on the one replica (a store of its own: scope 1), HBM not
    caching: turn 2 finds turn 1's blocks in its own store."""
    out = run(TierSettings(fetch="always", hbm_caching=False, shared=SharedSettings(100, scope=1)), replicas=1)
    assert out["shared_block_hit_ratio"] == 10 / 30 and len(out["tiers"]["shared"]) == 1


def test_the_python_api_takes_a_shared_store():
    from kvemu.api import simulate as api_simulate
    [out] = api_simulate(two_turns(), ["lru"], [100], replicas=2, routing="round_robin", model=MODEL, gpu=GPU,
                         response_kv="drop", tiers=TierSettings(fetch="always", shared=SharedSettings(
                             100, write="through")))
    assert out["shared_block_hit_ratio"] == 10 / 30 and out["tiers"]["shared"][0]["reads"] == 10


def test_a_chunked_write_through_run_under_hbm_pressure_completes():
    from kvemu.api import generate_trace
    trace = generate_trace("chat", duration_s=60, seed=1)
    s = SimSettings(capacity_blocks=300, replicas=2, model=MODEL, gpu=GPU,
                    knobs=EngineKnobs(tiers=TierSettings(shared=SharedSettings(256, chunk_blocks=2, write="through"))))
    out = simulate(trace, s)
    assert out["tiers"]["shared"][0]["used_blocks"] <= 256


# ---- the command line ------------------------------------------------------------------------
@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "two-turns.jsonl"
    write_kvemu(two_turns(), path)
    return str(path)


def sim_argv(trace_file: str, *extra: str) -> list[str]:
    return ["sim", "--trace", trace_file, "--replicas", "2", "--routing", "round_robin", "--capacity-blocks", "100",
            "--max-model-len", "1600", "--model", MODEL, "--gpu", GPU, "--response-kv", "drop", "--quiet", *extra]


def test_kvemu_sim_with_a_shared_store_prints_its_line_and_writes_its_figures(trace_file, tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(sim_argv(trace_file, "--shared-cache-gib", "1", "--shared-write", "through", "--json", str(out))) == 0
    text = capsys.readouterr().out
    # 1 GiB of 2 MiB blocks: 512; 20 held; 20 writes of 2 MiB through the store (0.04 GB)
    # turn 0 on replica-0 misses its 10 blocks; turn 1 on replica-1 reads those 10 of its 20 from the store
    lines = text.splitlines()
    at = lines.index("  block hit ratio by level: hbm 0.0000, shared 0.3333; all levels (HBM + lower) 0.3333")
    assert lines[at + 1] == "  shared store: 20/512 blocks held, 0 chunks evicted, 0 writes refused, 0.1 GB through it"
    [r] = json.loads(out.read_text())["runs"]
    assert r["shared_block_hit_ratio"] == pytest.approx(1 / 3) and r["tiers"]["shared"][0]["blocks"] == 512
    assert (r["tiers"]["shared"][0]["nic_gbps"], r["tiers"]["shared"][0]["store_gbps"]) == (400.0, 640.0)


def test_kvemu_sim_shared_flags_reach_the_store(trace_file, tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(sim_argv(trace_file, "--shared-cache-gib", "1", "--shared-write", "through", "--shared-chunk-tokens",
                         "64", "--shared-eviction", "lru", "--shared-nic-gbps", "100", "--shared-store-gbps", "200",
                         "--shared-ttfb-us", "50", "--shared-scope", "1", "--json", str(out))) == 0
    text = capsys.readouterr().out  # a store per replica (--shared-scope 1): neither reads the other's blocks
    assert "  block hit ratio by level: hbm 0.0000, shared 0.0000; all levels (HBM + lower) 0.0000\n  shared stores:" in text
    first, second = json.loads(out.read_text())["runs"][0]["tiers"]["shared"]
    assert (first["chunk_blocks"], first["eviction"], first["write"], first["nic_gbps"], first["store_gbps"]) == \
        (4, "lru", "through", 100.0, 200.0)
    assert (first["used_blocks"], second["used_blocks"]) == (8, 20)  # 10 -> 2 chunks of 4; 20 -> 5


@pytest.mark.parametrize("extra, error", [
    (["--shared-chunk-tokens", "32"], "error: --shared-chunk-tokens: shapes a shared KV store, but there is none:"
                                      " give --shared-cache-gib G"),
    (["--shared-eviction", "lru"], "error: --shared-eviction: shapes a shared KV store, but there is none: give"
                                   " --shared-cache-gib G"),
    (["--shared-write", "through"], "error: --shared-write: shapes a shared KV store, but there is none: give"
                                    " --shared-cache-gib G"),
    (["--shared-scope", "1"], "error: --shared-scope: shapes a shared KV store, but there is none: give"
                              " --shared-cache-gib G"),
    (["--shared-ttfb-us", "5"], "error: --shared-ttfb-us: shapes a shared KV store, but there is none: give"
                                " --shared-cache-gib G"),
    (["--shared-cache-gib", "1", "--shared-chunk-tokens", "24", "--shared-write", "through"],
     "error: --shared-chunk-tokens: must be a multiple of the block size (16 tokens), got 24"),
    (["--shared-cache-gib", "1", "--shared-chunk-tokens", "8", "--shared-write", "through"],
     "error: --shared-chunk-tokens: must be a multiple of the block size (16 tokens), got 8"),
    (["--shared-cache-gib", "1", "--shared-chunk-tokens", "32"],
     "error: --shared-write: chunks of 32 tokens are written whole, at prefill: give --shared-write through (a"
     " replica's evictions come a block at a time)"),
    (["--shared-cache-gib", "1", "--shared-scope", "3"],
     "error: --shared-scope: must be 0 (the whole cluster) or a group size of 1 to 2 replicas (the cluster has 2),"
     " got 3"),
    (["--shared-cache-gib", "1", "--shared-scope", "-1"],
     "error: --shared-scope: must be 0 (the whole cluster) or a group size of 1 to 2 replicas (the cluster has 2),"
     " got -1"),
    (["--shared-cache-gib", "0.001"], "error: --shared-cache-gib: 0.001 GiB holds no block of 16 tokens of this model"),
    (["--shared-cache-gib", "-1"], "error: --shared-cache-gib: must be a number >= 0, got -1.0"),
    (["--shared-cache-gib", "nan"], "error: --shared-cache-gib: must be a number >= 0, got nan"),
    (["--shared-cache-gib", "1", "--shared-ttfb-us", "-5"], "error: --shared-ttfb-us: must be a number >= 0, got -5.0"),
])
def test_kvemu_sim_refuses_each_bad_shared_flag_in_one_line(trace_file, capsys, extra, error):
    assert main(sim_argv(trace_file, *extra)) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [error] and captured.out == ""


@pytest.mark.parametrize("flag", ["--shared-nic-gbps", "--shared-store-gbps"])
def test_kvemu_sim_refuses_a_zero_link_bandwidth_naming_the_flag(trace_file, capsys, flag):
    assert main(sim_argv(trace_file, "--shared-cache-gib", "1", flag, "0")) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {flag}: must be a number > 0, got 0.0"]


def test_kvemu_sim_takes_fetch_with_only_a_shared_store(trace_file, capsys):
    assert main(sim_argv(trace_file, "--shared-cache-gib", "1", "--shared-write", "through", "--fetch", "always")) == 0


def test_kvemu_sim_help_describes_the_shared_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["sim", "--help"])
    assert done.value.code == 0
    assert "--shared-cache-gib" in capsys.readouterr().out
