"""bench/bench_flashgen.py: every configuration is a command line that `kvemu sim` and `kvemu up`
take and that builds the same replica core in both; the search for the sustainable rate; a tiny
end-to-end run (the JSON the issue names); one configuration live behind `kvemu up`."""

import argparse
import json
from dataclasses import fields

import pytest

from bench import bench_flashgen as fg
from kvemu import replica_cmd, sim_cmd
from kvemu import up as up_cmd
from shared.costmodel import CostModel
from sim.simulator import core_settings

OPTS = {"model": "opt-13b", "gpu": "a100-80gb-pcie", "tp": 1, "host_gb": 224.0, "ssd_gb": 1920.0, "drives": 2,
        "utilization": 0.9, "duration": 60.0, "slo": 5.0, "window": 2048, "start_rate": 0.1, "max_rate": 0.4,
        "steps": 1}
# What a live replica's core and the simulator's differ in by design (virtual time's oracles, exact
# reuse distances and unbounded queue; the live feed's events and streamed tokens).
LIVE_ONLY = {"max_waiting", "reuse", "shards_rate", "shards_max_tracked", "seed", "emit_events", "tier_events",
             "oracles", "stream_tokens", "compiled"}
SIM_ONLY = ("--workload", "--duration", "--seed", "--set", "--reuse", "--quiet", "--jobs")


def sim_core(flags: list[str]):
    p = argparse.ArgumentParser()
    sim_cmd.configure(p)
    trace, grid = sim_cmd.runs_of(p.parse_args(flags))
    s = grid[0]
    return core_settings(s, trace.block_size, CostModel.from_names(s.model, s.gpu), False, len(trace.requests))


def live_core(flags: list[str]):
    """What `kvemu up` would start each replica with: up's parser and checks, then the replica's own."""
    p = argparse.ArgumentParser()
    up_cmd.configure(p)
    a = p.parse_args(["--replicas", "1", "--time-scale", "0", *flags])
    child = up_cmd.replica_args(0, 8123, up_cmd.validate(a), None)
    q = argparse.ArgumentParser()
    replica_cmd.configure(q)
    return replica_cmd.settings_from_args(q.parse_args(child[4:])).core_settings()


def without_sim_only(argv: list[str]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x in SIM_ONLY:
            skip = x not in ("--quiet",)
            continue
        out.append(x)
    return out


@pytest.mark.parametrize("name", [*fg.CONFIGS, *fg.ABLATIONS])
def test_each_configuration_builds_the_same_core_in_sim_and_up(name):
    flags = {**fg.CONFIGS, **fg.ABLATIONS}[name]
    argv = fg.command_line(name, flags, 0.2, 0, OPTS)
    sim, live = flat(sim_core(argv)), flat(live_core(without_sim_only(argv)))
    for name in sim:
        if name not in LIVE_ONLY:
            assert sim[name] == live[name], name


def flat(core) -> dict:
    """A core's settings by field, the knobs' as if they were its own."""
    out = {f.name: getattr(core, f.name) for f in fields(core) if f.name != "knobs"}
    return {**{f.name: getattr(core.knobs, f.name) for f in fields(core.knobs)}, **out}


def test_the_configurations_are_the_papers_systems():
    cores = {name: sim_core(fg.command_line(name, flags, 0.2, 0, OPTS)).knobs for name, flags in fg.CONFIGS.items()}
    base, today = cores["vllm_recompute"], cores["vllm"]
    assert (base.prefix_caching, base.scheduler, base.watermark, base.token_budget) == ("off", "fcfs", 0.01, 2048)
    assert (today.prefix_caching, today.scheduler, today.watermark, today.token_budget) == ("on", "fcfs", 0.0, 8192)
    assert today.response_kv == "keep" and not today.tiers.enabled
    assert cores["sched_only"].scheduler == "reorder" and cores["sched_only"].prefix_caching == "off"
    # vLLM v0's steps for the paper's baseline and Sched only on it; today's vLLM and the cached systems mix
    assert [cores[n].step_rule for n in fg.CONFIGS] == ["v0", "v1", "v0", "v1", "v1", "v1"]
    ca, fc, f = cores["cachedattn"].tiers, cores["flashgen_cache"].tiers, cores["flashgen"].tiers
    assert (ca.mode, ca.fetch, ca.hbm_caching) == ("exclusive", "always", False)
    assert (fc.mode, fc.fetch, fc.hbm_caching) == ("inclusive", "auto", True) and f == fc
    assert cores["flashgen"].scheduler == "reorder" and cores["flashgen_cache"].scheduler == "fcfs"
    # 224 GB of host DRAM and two 960 GB drives, in 16-token blocks of OPT-13B's KV (13.1 MB each)
    block = CostModel.from_names("opt-13b", "a100-80gb-pcie").block_bytes(16)
    assert block == 2 * 40 * 5120 * 2 * 16
    assert f.host_blocks == int(208.6 * 2**30 // block) and f.ssd_blocks == int(1788.1 * 2**30 // block)
    # two drives of 6.5 GB/s read and 1.5 GB/s write each, striped
    assert (f.ssd_read_gbps, f.ssd_write_gbps, f.host_link_gbps) == (13.0, 3.0, 25.0)


def test_search_doubles_then_bisects_to_the_highest_rate_met(monkeypatch):
    calls = []

    def fake_point(config, flags, rate, seed, opts):  # meets the objective up to 1.33 sessions/s
        calls.append(rate)
        return {"session_rate": rate, "rps": 7 * rate, "meets": rate <= 1.33, "ttft_p95_s": rate, "saturated": False}

    monkeypatch.setattr(fg, "run_point", fake_point)
    out = fg.sustainable("x", "", 0, {**OPTS, "start_rate": 0.1, "max_rate": 12.8, "steps": 4})
    # 0.1, 0.2, 0.4, 0.8 met, 1.6 not; then 1.2 (met), 1.4 (not), 1.3 (met), 1.35 (not)
    assert calls == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 1.2, 1.4, 1.3, 1.35])
    assert out["best"]["session_rate"] == pytest.approx(1.3) and len(out["points"]) == 9
    # nothing met: 0, and no bisection without an upper bound below max_rate
    monkeypatch.setattr(fg, "run_point", lambda c, f, r, s, o: {"session_rate": r, "rps": r, "meets": False})
    assert fg.sustainable("x", "", 0, OPTS)["best"] is None


def test_tiny_run_writes_the_documented_json(tmp_path):
    out = tmp_path / "fg.json"
    plot = tmp_path / "fg.png"
    assert fg.main(["--model", "opt-13b", "--seeds", "2", "--steps", "1", "--duration", "60", "--start-rate", "0.1",
                    "--max-rate", "0.2", "--jobs", "2", "--json", str(out), "--plot", str(plot)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["model"], doc["gpu"], doc["tp"], doc["objective_p95_s"], doc["seeds"]) == (
        "opt-13b", "a100-80gb-pcie", 1, 5.0, [0, 1])
    assert set(doc["configs"]) == set(fg.CONFIGS)
    for c in doc["configs"].values():
        assert {"sustainable_rps", "spread", "hbm_util_queued", "mean_batch_size", "hbm_block_hit_ratio",
                "host_block_hit_ratio", "ssd_block_hit_ratio", "at_common_rate"} <= set(c)
        assert c["spread"]["min"] <= c["sustainable_rps"] <= c["spread"]["max"] and len(c["per_seed_rps"]) == 2
    assert doc["workload"]["unlimited"]["turns_median"] == 3.0  # the chat preset: ShareGPT's median
    assert doc["flags"]["vllm_recompute"] == "--prefix-caching off --scheduler fcfs --watermark 0.01 --token-budget 2048 --step-rule v0"
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_flashgen_and_the_papers_baseline_run_live_behind_up():
    """Two turns of one chat session through `kvemu up` with each configuration's flags: FlashGen's
    second turn finds its history cached; the paper's baseline recomputes it."""
    from tests.conftest import free_port
    from tests.support.kvemu_cli import Up
    from tests.support.procs import http_json

    seen = {}
    for name in ("flashgen", "vllm_recompute"):
        argv = without_sim_only(fg.command_line(name, fg.CONFIGS[name], 0.2, 0, OPTS))
        up = Up("--replicas", "1", "--time-scale", "0", "--port", str(free_port()), *argv)
        try:
            urls = up.ready()
            prompt = list(range(1, 700))
            first = http_json("POST", urls["router"] + "/generate", {"token_ids": prompt, "max_tokens": 40},
                              headers={"X-Session-Id": "s"})[1]
            second = http_json("POST", urls["router"] + "/generate",
                               {"token_ids": prompt + list(range(5000, 5100)), "max_tokens": 8},
                               headers={"X-Session-Id": "s"})[1]
            stats = http_json("GET", urls["replica-0"] + "/stats")[1]
            seen[name] = (stats, first, second)
        finally:
            up.cleanup()
    fg_stats, _, fg_second = seen["flashgen"]
    base_stats, _, base_second = seen["vllm_recompute"]
    assert fg_stats["scheduler"]["policy"] == "reorder" and base_stats["scheduler"]["policy"] == "fcfs"
    assert fg_second["cached_tokens"] == 688 and base_second["cached_tokens"] == 0
