"""The virtual-time P/D cluster (sim/pd_flow.py): a request's path priced by hand, links shared, the decider,
failover, nothing left pinned, and the command line."""

from __future__ import annotations

import json

import pytest

from kvemu.cli import main
from loadgen.trace import Trace, TraceRequest
from replica.core.disagg import PdCluster, PdSettings, PoolShape
from shared.costmodel import CostModel
from sim.run import simulate
from sim.settings import SimSettings

MODEL, GPU = "llama-3-8b", "h200"
BS = 16


def _req(t: float, session: str, blocks: int, out: int = 3, first: int = 0, turn: int = 0) -> TraceRequest:
    return TraceRequest(t, session, turn, list(range(first, first + blocks)), blocks * BS, out)


def _run(reqs, pd: PdCluster, replicas: int = 0, **kw) -> dict:
    s = SimSettings.of(capacity_blocks=kw.pop("capacity_blocks", 4000), replicas=replicas, pd=pd, model=MODEL, gpu=GPU,
                    **kw)
    return simulate(Trace(reqs, BS, "hand"), s)


def _pinned(out: dict) -> list[int]:
    return [p["pinned_blocks"] for p in out["per_replica"]]


def test_one_request_ttft_is_prefill_then_transfer_then_one_token():
    """1P:1D, decider always, a 1,600-token prompt, NICs of 8 Gb/s (1e9 bytes/s), no latency: the prefill
    step, the whole prompt's KV over the link (the decoder holds none of it), then one token at depth 1,599."""
    cost = CostModel.from_names(MODEL, GPU)
    pd = PdCluster(1, 1, PdSettings(decider="always", link_gbps=8.0, link_latency_s=0.0))
    out = _run([_req(0.0, "a", 100)], pd)
    prefill = cost.prefill_time(1600)
    transfer = 1600 * cost.kv_bytes_per_token / 1e9
    first = cost.prefill_time(1, 1599)
    split = out["pd"]["ttft_split"]
    assert split["prefill_p50_s"] == pytest.approx(prefill, rel=0.02)  # a log histogram's bucket
    assert split["transfer_p50_s"] == pytest.approx(transfer, rel=0.02)
    assert split["first_decode_p50_s"] == pytest.approx(first, rel=0.02)
    assert out["ttft_p50_s"] == pytest.approx(prefill + transfer + first, rel=0.02)
    assert out["pd"]["transfer_bytes"] == 1600 * cost.kv_bytes_per_token
    assert out["pd"]["requests"] == {"remote": 1, "local": 0, "failover": 0}
    assert out["served"] == 1 and _pinned(out) == [0, 0]
    link = out["pd"]["links"]
    assert set(link) == {"prefill-0:send", "decode-0:recv"}
    assert link["prefill-0:send"]["bytes"] == 1600 * cost.kv_bytes_per_token


def test_two_transfers_from_one_prefill_instance_share_its_nic():
    """Two equal prompts prefilled in one step go to two decoders at once: the sender's NIC carries both, so
    each transfer takes twice one alone."""
    cost = CostModel.from_names(MODEL, GPU)
    pd = PdCluster(1, 2, PdSettings(decider="always", link_gbps=8.0, link_latency_s=0.0))
    out = _run([_req(0.0, "a", 100), _req(0.0, "b", 100, first=1000)], pd, routing="round_robin")
    one = 1600 * cost.kv_bytes_per_token / 1e9
    assert out["pd"]["ttft_split"]["transfer_p50_s"] == pytest.approx(2 * one, rel=0.02)
    assert out["pd"]["ttft_split"]["transfer_p99_s"] == pytest.approx(2 * one, rel=0.02)
    assert _pinned(out) == [0, 0, 0]


def test_the_prefix_decider_keeps_a_turn_the_decoder_holds_local():
    """Turn 2 extends turn 1's prompt by 10 blocks (160 tokens, under the 256-token threshold): the decode
    instance that served turn 1 holds the rest, so it prefills turn 2 itself; turn 1 went remote."""
    pd = PdCluster(1, 1, PdSettings(decider="prefix"))
    reqs = [_req(0.0, "a", 100, turn=0), TraceRequest(5.0, "a", 1, list(range(110)), 110 * BS, 3)]
    out = _run(reqs, pd, response_kv="drop")
    assert out["pd"]["requests"] == {"remote": 1, "local": 1, "failover": 0}
    assert out["pd"]["saved_tokens"] == 0  # turn 1's decoder held nothing
    assert _pinned(out) == [0, 0]


def test_a_decoder_without_room_prefills_locally_and_says_so():
    """The decoder's pool (60 blocks) holds one 50-block request at a time: the second transfer finds no
    room while the first decodes, so the decode instance prefills it itself (a failover)."""
    pd = PdCluster(1, 1, PdSettings(decider="always"), decode_pool=PoolShape(capacity_blocks=60))
    reqs = [_req(0.0, "a", 50, out=100), _req(0.0, "b", 50, out=3, first=1000)]
    out = _run(reqs, pd, capacity_blocks=4000)
    assert out["pd"]["requests"]["failover"] == 1
    assert out["served"] == 2 and _pinned(out) == [0, 0]


def test_colocated_replicas_beside_the_pools_prefill_their_own():
    pd = PdCluster(1, 1, PdSettings(decider="always"))
    reqs = [_req(float(i), f"s{i}", 40, first=1000 * i) for i in range(6)]
    out = _run(reqs, pd, replicas=1, routing="round_robin")
    assert out["pd"]["requests"]["local"] == 3 and out["pd"]["requests"]["remote"] == 3
    assert [p["role"] for p in out["per_replica"]] == ["both", "prefill", "decode"]
    assert _pinned(out) == [0, 0, 0]


def test_a_slower_link_delays_ttft_by_the_bytes_it_carries():
    cost = CostModel.from_names(MODEL, GPU)
    reqs = [_req(0.0, "a", 100)]
    fast = _run(reqs, PdCluster(1, 1, PdSettings(decider="always", link_gbps=400.0, link_latency_s=0.0)))
    slow = _run(reqs, PdCluster(1, 1, PdSettings(decider="always", link_gbps=25.0, link_latency_s=0.0)))
    nbytes = 1600 * cost.kv_bytes_per_token
    assert slow["ttft_p50_s"] - fast["ttft_p50_s"] == pytest.approx(nbytes * 8 / 25e9 - nbytes * 8 / 400e9, rel=0.05)


def test_pools_may_run_other_gpus(tmp_path):
    pd = PdCluster(1, 1, PdSettings(decider="always"), decode_pool=PoolShape(gpu="h100", capacity_blocks=1000))
    out = _run([_req(0.0, "a", 20)], pd)
    assert [(p["role"], p["gpu"], p["capacity_blocks"]) for p in out["per_replica"]] == \
        [("prefill", GPU, 4000), ("decode", "h100", 1000)]
    assert out["pd"]["links"]["decode-0:recv"]["gbps"] == 400.0


def test_kvemu_sim_runs_a_pd_cluster_and_refuses_half_of_one(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["sim", "--workload", "chat", "--duration", "60", "--capacity-blocks", "4000", "--quiet",
                 "--prefill-replicas", "1", "--decode-replicas", "2", "--pd-decider", "always",
                 "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["pd"]["topology"] == {"colocated": 0, "prefill": 1, "decode": 2}
    assert run["pd"]["requests"]["local"] == 0 and run["pd"]["requests"]["remote"] == run["served"]
    assert "P/D 1P:2D" in capsys.readouterr().out
    assert main(["sim", "--workload", "chat", "--duration", "60", "--capacity-blocks", "4000", "--quiet",
                 "--prefill-replicas", "1"]) == 2
    assert "--decode-replicas: a P/D cluster needs both pools" in capsys.readouterr().err
    assert main(["sim", "--workload", "chat", "--duration", "60", "--capacity-blocks", "4000", "--quiet",
                 "--prefill-replicas", "1", "--decode-replicas", "1", "--pd-link-gbps", "0"]) == 2
    assert "--pd-link-gbps: must be a number > 0" in capsys.readouterr().err
    assert main(["sim", "--workload", "chat", "--duration", "60", "--capacity-blocks", "4000", "--quiet",
                 "--prefill-replicas", "1", "--decode-replicas", "1", "--cache-only"]) == 2
    assert "batching mode" in capsys.readouterr().err


def test_the_python_api_runs_a_pd_cluster():
    from kvemu.api import PdCluster, PdSettings, generate_trace
    from kvemu.api import simulate as api_simulate
    trace = generate_trace("chat", duration_s=60, seed=3)
    [run] = api_simulate(trace, ["lru"], [4000], pd=PdCluster(2, 2, PdSettings(decider="always")), model=MODEL)
    assert run["pd"]["topology"] == {"colocated": 0, "prefill": 2, "decode": 2}
    assert run["pd"]["requests"]["remote"] == run["served"] == len(trace.requests) - run["refused"]
    assert [p["pinned_blocks"] for p in run["per_replica"]] == [0, 0, 0, 0]


def test_kvemu_sweep_runs_its_grid_on_a_pd_cluster(tmp_path):
    out = tmp_path / "s.jsonl"
    assert main(["sweep", "--workload", "chat", "--duration", "60", "--capacity-blocks", "2000,4000", "--quiet",
                 "--prefill-replicas", "1", "--decode-replicas", "2", "--jobs", "1", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["capacity_blocks"] for r in records) == [2000, 4000]
    assert all(r["pd"]["topology"] == {"colocated": 0, "prefill": 1, "decode": 2} and r["replicas"] == 0
               for r in records)
    assert main(["sweep", "--workload", "chat", "--duration", "60", "--capacity-blocks", "2000", "--quiet",
                 "--decode-replicas", "2", "--out", str(tmp_path / "x.jsonl")]) == 2
