"""One vocabulary for settings and flags (kvemu/options/): the five commands that build a replica
agree on every default they share, the flags agree with the settings' fields, and `kvemu up`
hands each flag it takes to the children, which read the value it was given."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex

import pytest

from kvemu.options.option import Option
from kvemu.options.replica_flags import BLOCK_SIZE
from kvemu.options.tiers import TIER_OPTIONS
from kvemu.up import TO_BOTH, TO_REPLICAS, TO_ROUTER
from replica.core.build import CoreSettings
from replica.core.sched.sched_types import ADMISSIONS, SchedulerSettings
from replica.settings import ReplicaSettings
from router.settings import RouterSettings
from shared.serving import ServingSettings
from sim.simulator import SimSettings

COMMANDS = {"sim": "sim.sim_cmd", "sweep": "sim.sweep_cmd", "replica": "replica.cmd", "up": "kvemu.up",
            "demo": "kvemu.demo"}

# Defaults that differ on purpose, and why; every other flag two commands share has one default.
DIFFER = {
    "replicas": "a sim of one replica; up and demo start four; sweep takes a list",
    "port": "replica 8100, router 8000; demo picks a free one",
    "seed": "demo replays its own workload seed",
    "time_scale": "demo runs its GPUs 20x faster, in step with its compressed trace",
    "plot": "demo always draws its figure; sim and sweep on request",
    "workload": "the demo's own preset",
    "duration": "the demo replays five minutes",
    "index": "the same default, spelled as each takes it: a replica's None (its feed) is up's memory index",
}


def defaults(command: str) -> dict[str, object]:
    p = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command]).configure(p)
    return {a.dest: a.default for a in p._actions if a.default is not argparse.SUPPRESS}


def test_every_default_two_commands_share_is_the_same():
    seen: dict[str, dict[str, object]] = {}
    for command in COMMANDS:
        for dest, value in defaults(command).items():
            seen.setdefault(dest, {})[command] = value
    drift = {dest: by for dest, by in seen.items()
             if len(by) > 1 and dest not in DIFFER and len({repr(v) for v in by.values()}) > 1}
    assert drift == {}
    # the settings all five take are really there, so the check above compares something
    for dest in ("hit_mode", "token_budget", "max_running", "scheduler", "model", "gpu", "tier_mode", "response_kv",
                 "prefix_caching"):
        assert set(seen[dest]) == set(COMMANDS), dest


def _field_defaults(cls) -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_flags_default_to_the_settings_fields():
    replica, sim = defaults("replica"), defaults("sim")
    for cls, flags in ((ReplicaSettings, replica), (SimSettings, sim), (CoreSettings, sim)):
        fields = _field_defaults(cls)
        for name in ("hit_mode", "token_budget", "max_running", "scheduler", "shards_rate", "max_waiting", "model",
                     "prefix_caching"):
            if name in fields and name in flags:
                assert flags[name] == fields[name], (cls.__name__, name)
    # a colocated vLLM keeps each response's KV: the one default of every command and settings class
    for cls in (ReplicaSettings, SimSettings, CoreSettings):
        assert _field_defaults(cls)["response_kv"] == "keep", cls.__name__
    for command in COMMANDS:
        assert defaults(command)["response_kv"] == "keep", command
    serving = _field_defaults(ServingSettings)
    for option in TO_BOTH:
        field = option.dest + ("_s" if option.dest.endswith("timeout") else "")
        assert option.default == serving[field] == replica[option.dest], option.flag
    router = _field_defaults(RouterSettings)
    for option in TO_ROUTER:
        assert option.default == router[option.dest + ("_s" if option.dest.endswith("interval") else "")]


def test_one_max_waiting_and_one_admission_vocabulary():
    assert _field_defaults(ReplicaSettings)["max_waiting"] == _field_defaults(CoreSettings)["max_waiting"] \
        == _field_defaults(SchedulerSettings)["max_waiting"] == defaults("up")["max_waiting"]
    assert "admission" in _field_defaults(SchedulerSettings) and "policy" not in _field_defaults(SchedulerSettings)
    assert CoreSettings(capacity_blocks=8).reuse == "sampled"  # SHARDS sampling: one name in core, sim and flags


def non_default(option: Option) -> str:
    """A valid value other than the default, as it would be typed."""
    if option.choices:
        return next(c for c in option.choices if c != option.default)
    special = {"--scheduler": next(a for a in ADMISSIONS if a != option.default), "--model": "llama-3-8b",
               "--time-scale": "0.0", "--parse-workers": "0", "--max-model-len": "4096"}
    if option.flag in special:
        return special[option.flag]
    if option.type is int:
        return str(option.default * 2 or 3)
    return repr(option.default * 2 or 0.5)


FORWARDED = (*TO_REPLICAS, BLOCK_SIZE, *TO_BOTH, *TO_ROUTER)
UP_FLAGS = [x for option in FORWARDED for x in (option.flag, non_default(option))]


def up_args(*extra: str) -> argparse.Namespace:
    from kvemu.up import configure, validate

    p = argparse.ArgumentParser()
    configure(p)
    a = p.parse_args(["--capacity-blocks", "512", *UP_FLAGS, *extra])
    validate(a)
    return a


def child_settings(cmdline: list[str]):
    """What a child makes of the command line up gave it, with its own parser and settings."""
    module = importlib.import_module({"replica": "replica.cmd", "router": "router.cmd"}[cmdline[2]])
    p = argparse.ArgumentParser()
    module.configure(p)
    return module.settings_from_args(p.parse_args(cmdline[3:]))


def check_children_got_every_flag(replica, router) -> None:
    """Each forwarded flag's non-default value reached the settings of the children it is for."""
    def value(settings, option: Option):
        name = option.dest
        for where in (settings, getattr(settings, "serving", None)):
            for field in (name, name + "_s"):
                if where is not None and hasattr(where, field):
                    return getattr(where, field)
        raise AssertionError(f"{type(settings).__name__} has no field for {option.flag}")

    for option in FORWARDED:
        want = non_default(option)
        targets = ([replica] if option in TO_REPLICAS else [router] if option in TO_ROUTER else [replica, router])
        for settings in targets:
            got = value(settings, option)
            assert str(got) == want or repr(got) == want, (option.flag, type(settings).__name__, got, want)


def test_up_hands_every_flag_it_takes_to_the_children_that_use_it():
    from kvemu.up import replica_args

    a = up_args()
    replica = child_settings(replica_args(0, 8100, a, None))
    assert replica.serving.write_timeout_s == 60.0 and replica.max_waiting == 20_000
    router_argv = ["python", "-m", "router", "--replicas", "http://127.0.0.1:8100", "--block-size", str(a.block_size)]
    from kvemu.options.option import forward

    router = child_settings(router_argv + forward((*TO_BOTH, *TO_ROUTER), a))
    check_children_got_every_flag(replica, router)


@pytest.mark.slow
def test_up_started_with_every_forwarded_flag_set_passes_each_to_its_children():
    from tests.conftest import free_port
    from tests.support.kvemu_cli import Up

    up = Up("--replicas", "1", "--capacity-blocks", "512", "--port", str(free_port()), *UP_FLAGS)
    try:
        up.ready()
        lines = [shlex.split(cmd) for cmd in up.children.values()]
        by_name = {cmd[2]: cmd for cmd in lines if len(cmd) > 2 and cmd[1] == "-m"}
        check_children_got_every_flag(child_settings(by_name["replica"]), child_settings(by_name["router"]))
    finally:
        up.cleanup()


TIER_FLAGS = ["--host-cache-gib", "2.5", "--ssd-cache-gib", "10.0", "--tier-policy", "host=s3fifo,ssd=lru",
              "--tier-mode", "inclusive", "--fetch", "always", "--host-link-gbps", "12.5", "--ssd-drives", "2",
              "--no-hbm-caching"]


def test_up_hands_every_tier_flag_to_the_replicas_from_the_one_definition():
    from kvemu.up import replica_args

    a = up_args(*TIER_FLAGS, "--prefix-caching", "on")  # off keeps nothing a tier could hold: refused with tiers
    assert {o.dest for o in TIER_OPTIONS} == {f.removeprefix("--").replace("-", "_") for f in TIER_FLAGS[::2]} | {
        "no_hbm_caching"}  # the test sets every tier flag
    p = argparse.ArgumentParser()
    importlib.import_module("replica.cmd").configure(p)
    child = p.parse_args(replica_args(0, 9000, a, None)[3:])
    for option in TIER_OPTIONS:
        assert getattr(child, option.dest) == getattr(a, option.dest) != option.default, option.flag
    tiers = child_settings(replica_args(0, 9000, a, None)).tiers
    assert (tiers.mode, tiers.fetch, tiers.host_policy, tiers.hbm_caching) == ("inclusive", "always", "s3fifo", False)
    assert (tiers.ssd_read_gbps, tiers.ssd_write_gbps) == (14.0, 10.0)  # two drives striped


@pytest.mark.parametrize("command", ["sim", "sweep", "replica", "up"])
def test_vllm_length_and_capacity_flags_are_on_every_command_that_runs_replicas(command):
    module = importlib.import_module({"sim": "sim.sim_cmd", "sweep": "sim.sweep_cmd", "replica": "replica.cmd",
                                      "up": "kvemu.up"}[command])
    p = argparse.ArgumentParser()
    module.configure(p)
    need = {"sim": ["--workload", "chat"], "sweep": ["--workload", "chat", "--out", "x.jsonl"]}.get(command, [])
    a = p.parse_args([*need, "--gpu-memory-utilization", "0.8", "--max-model-len", "4096"])
    assert (a.max_model_len, float(a.gpu_memory_utilization)) == (4096, 0.8)
    with pytest.raises(SystemExit):  # an alternative to the other capacity flags, never beside them
        p.parse_args([*need, "--gpu-memory-utilization", "0.8", "--capacity-blocks", "100"])


def test_up_hands_gpu_memory_utilization_and_max_model_len_to_every_replica():
    from kvemu.up import configure, replica_args, validate

    p = argparse.ArgumentParser()
    configure(p)
    a = p.parse_args(["--model", "llama-3-8b", "--gpu-memory-utilization", "0.85", "--max-model-len", "2048"])
    validate(a)
    replica = child_settings(replica_args(0, 8100, a, None))
    assert (replica.gpu_memory_utilization, replica.capacity_blocks, replica.max_model_len) == (0.85, None, 2048)
    assert replica.resolved_max_model_len() == 2048 and a.limit_lines[0].startswith("capacity (llama-3-8b): 0.85 x")
