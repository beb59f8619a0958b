"""--prefix-caching off in virtual time: nothing is matched (hit ratio 0), a repeated prompt costs what
its first run did, a router's index sees nothing, and sweep ids of the default stay what they were."""

import json

import pytest

from loadgen.trace import Trace, TraceRequest
from replica.core.build import EngineKnobs
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError
from sim.run import simulate
from sim.simulator import SimSettings, Simulation
from sim.sweep import point_id, settings_dict


def repeated_prompt(times: int = 3, gap: float = 100.0) -> Trace:
    """One prompt sent ``times`` times, each after the last has long finished."""
    reqs = [TraceRequest(k * gap, f"s{k}", 0, list(range(40)), 40 * 16 + 3, 8) for k in range(times)]
    return Trace(reqs, block_size=16, source="repeated")


def test_hit_ratio_is_zero_and_a_repeated_prompts_ttft_is_the_firsts():
    trace = repeated_prompt()
    on = simulate(trace, SimSettings(capacity_blocks=200, knobs=EngineKnobs(max_running=1)))
    sim = Simulation(trace, SimSettings(capacity_blocks=200, knobs=EngineKnobs(max_running=1, prefix_caching="off")))
    off = sim.run()
    assert on["prefix_caching"] == "on" and on["block_hit_ratio"] > 0.6  # turns 2 and 3 hit all 40
    assert (off["prefix_caching"], off["engine"]) == ("off", "python")
    assert off["block_hit_ratio"] == off["token_hit_ratio"] == off["csr"] == 0.0
    assert off["per_replica"][0]["prefix_caching"] == "off"
    assert off["per_replica"][0]["resident_blocks"] == off["evictions"] == 0
    assert off["ttft_p50_s"] == pytest.approx(off["ttft_p99_s"])  # every TTFT is the first's
    assert off["ttft_p50_s"] > on["ttft_p50_s"]
    assert sim.replicas[0].sched.prefill_tokens == 3 * (40 * 16 + 3)  # every prompt prefilled in full


def test_the_cache_only_replay_and_response_kv_keep_hit_nothing_either():
    trace = repeated_prompt()
    for kw in ({"cache_only": True}, {"response_kv": "keep"}):
        run = simulate(trace, SimSettings.of(capacity_blocks=200, prefix_caching="off", **kw))
        assert run["block_hit_ratio"] == 0.0 and run["per_replica"][0]["inserted_blocks"] == 0, kw


def test_cache_aware_routing_sees_no_overlap():
    trace = repeated_prompt(6, gap=50.0)
    sim = Simulation(trace, SimSettings(capacity_blocks=200, replicas=2, routing="cache_aware",
                                        knobs=EngineKnobs(prefix_caching="off")))
    run = sim.run()
    assert run["block_hit_ratio"] == 0.0
    assert sim.index is not None and sim.index.lookup(list(range(40))) == {}


def test_off_with_a_tier_is_refused():
    with pytest.raises(InputError, match="would hold nothing"):
        SimSettings(capacity_blocks=200, knobs=EngineKnobs(prefix_caching="off", tiers=TierSettings(host_blocks=100)))


def test_the_default_keeps_old_sweep_ids():
    s = SimSettings(capacity_blocks=200)
    assert "prefix_caching" not in settings_dict(s)
    off = SimSettings(capacity_blocks=200, knobs=EngineKnobs(prefix_caching="off"))
    assert settings_dict(off)["prefix_caching"] == "off"
    assert point_id({"t": 1}, s) != point_id({"t": 1}, off)
    json.dumps(settings_dict(off))
