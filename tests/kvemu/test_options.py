"""One vocabulary for settings and flags (kvemu/options/): the five commands that build a replica
agree on every default they share, the flags agree with the settings' fields, and `kvemu up`
hands each flag it takes to the children, which read the value it was given."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex

import pytest

from kvemu.options.matching import matching_setting
from kvemu.options.option import Option
from kvemu.options.serving import SERVER_OPTIONS
from kvemu.options.speculative import spec_decode
from kvemu.options.tiers import TIER_OPTIONS
from kvemu.router_cmd import ROUTER_OPTIONS
from kvemu.up import TO_BOTH, TO_REPLICAS, TO_ROUTER, TRANSFORMED
from kvemu.up_plan import UpPlan
from replica.core.build import CoreSettings
from replica.core.sched.sched_types import ADMISSIONS, SchedulerSettings
from replica.settings import ReplicaSettings
from router.settings import RouterSettings
from shared.serving import ServingSettings
from sim.simulator import SimSettings

COMMANDS = {"sim": "kvemu.sim_cmd", "sweep": "kvemu.sweep_cmd", "replica": "kvemu.replica_cmd", "up": "kvemu.up",
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
    """Every field's default, the knobs' (``EngineKnobs``, which the settings hold as ``knobs``) as if its own."""
    out = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    knobs = out.pop("knobs", None)
    return {**_field_defaults(type(knobs)), **out} if knobs is not None else out


def test_flags_default_to_the_settings_fields():
    replica, sim = defaults("replica"), defaults("sim")
    for cls, flags in ((ReplicaSettings, replica), (SimSettings, sim), (CoreSettings, sim)):
        fields = _field_defaults(cls)
        for name in ("token_budget", "max_running", "scheduler", "shards_rate", "max_waiting", "model",
                     "prefix_caching", "matching"):
            if name in fields and name in flags:
                assert flags[name] == fields[name], (cls.__name__, name)
        # --hit-mode and --block-size default to None: their defaults depend on --matching (matching_setting)
        resolved = matching_setting(argparse.Namespace(**flags))
        assert resolved.hit_mode == fields["hit_mode"], cls.__name__
        assert resolved.block_size == fields.get("block_size", 16), cls.__name__
    # a colocated vLLM keeps each response's KV: the one default of every command and settings class
    for cls in (ReplicaSettings, SimSettings, CoreSettings):
        assert _field_defaults(cls)["response_kv"] == "keep", cls.__name__
    for command in COMMANDS:
        assert defaults(command)["response_kv"] == "keep", command
    serving = _field_defaults(ServingSettings)
    for option in SERVER_OPTIONS:
        field = option.dest + ("_s" if option.dest.endswith("timeout") else "")
        assert option.default == serving[field] == replica[option.dest], option.flag
    router = _field_defaults(RouterSettings)
    for option in ROUTER_OPTIONS:
        assert option.default == router[option.dest + ("_s" if option.dest.endswith(("interval", "timeout")) else "")]


def test_one_max_waiting_and_one_admission_vocabulary():
    assert _field_defaults(ReplicaSettings)["max_waiting"] == _field_defaults(CoreSettings)["max_waiting"] \
        == _field_defaults(SchedulerSettings)["max_waiting"] == defaults("up")["max_waiting"]
    assert "admission" in _field_defaults(SchedulerSettings) and "policy" not in _field_defaults(SchedulerSettings)
    assert CoreSettings(capacity_blocks=8).reuse == "sampled"  # SHARDS sampling: one name in core, sim and flags


def non_default(option: Option) -> list[str]:
    """The flag with a valid value other than its default, as it would be typed (a switch: the flag)."""
    if option.switch:
        return [option.flag]
    special = {"--scheduler": next(a for a in ADMISSIONS if a != option.default), "--model": "llama-3-8b",
               "--time-scale": "0.0", "--parse-workers": "0", "--max-model-len": "4096", "--policy": "s3fifo",
               "--admin-token": "admin-secret", "--cluster": "prod", "--routing": "session",
               "--set": "bounded_load_factor=1.5", "--tier-policy": "host=s3fifo,ssd=lru", "--host-link-gbps": "12.5",
               "--capacity-blocks": "512", "--capacity-tokens": "8192", "--capacity-gib": "2.0", "--gpu-memory-utilization": "0.5",
               "--device": "cuda", "--layers": "2", "--block-size": "32", "--page-size": "4",
               "--max-connections-per-client": "64", "--vllm-version": "0.2.3",
               "--speculative-method": "ngram", "--acceptance-lengths": "0.5,0.5"}
    if option.flag in special:
        return [option.flag, special[option.flag]]
    if option.choices:
        return [option.flag, next(c for c in option.choices if c != option.default)]
    if option.type in (int, float) and option.default is not None:
        return [option.flag, str(option.default * 2 or 3) if option.type is int else repr(option.default * 2 or 0.5)]
    raise AssertionError(f"no non-default value for {option.flag}: add one to non_default")


CHILDREN = {"replica": "kvemu.replica_cmd", "router": "kvemu.router_cmd"}
FORWARDED = {"replica": (*TO_REPLICAS, *TO_BOTH), "router": (*TO_BOTH, *TO_ROUTER)}
EVERY_FORWARDED = tuple(dict.fromkeys((*TO_REPLICAS, *TO_BOTH, *TO_ROUTER)))


def parser_of(module: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    importlib.import_module(module).configure(p)
    return p


def flags_of(module: str) -> set[str]:
    """Each flag's spelling (an old one a renamed flag still takes, ``Option.aliases``, is not another flag)."""
    longs = ([f for f in a.option_strings if f.startswith("--")] for a in parser_of(module)._actions)
    return {spellings[0] for spellings in longs if spellings} - {"--help"}


def test_every_flag_up_shares_with_a_child_is_forwarded_from_its_record_or_turned_by_up():
    """From the parsers themselves: a flag `kvemu up` and a child both take is either in up's forwarded
    records for that child or in TRANSFORMED (what up hands on instead); up forwards nothing the child
    does not take. A flag added to both parsers and to neither table fails here."""
    up = flags_of("kvemu.up")
    for child, module in CHILDREN.items():
        takes = flags_of(module)
        forwarded = {o.flag for o in FORWARDED[child]}
        assert forwarded - takes == set(), f"up forwards flags {child} does not take"
        assert forwarded - up == set(), f"up forwards flags to {child} that it does not take itself"
        assert (up & takes) - forwarded - set(TRANSFORMED) == set(), f"flags up takes and drops for {child}"
    assert set(TRANSFORMED) <= up
    assert set(TRANSFORMED).isdisjoint(o.flag for o in EVERY_FORWARDED)


# Flags that cannot all be set at once: each group's with --capacity-blocks (the default group's
# capacity) replaced, and every other forwarded flag in the default group, so a new record is
# covered without being named here. The torch backend's (--device cuda) is checked on the command
# lines only: this machine may have no GPU.
GROUPS = {
    "tiers": ("--host-cache-gib", "--ssd-cache-gib", "--tier-policy", "--tier-mode", "--fetch", "--ssd-drives",
              "--host-link-gbps", "--no-hbm-caching", "--capacity-gib", "--ssd-drive-read-gbps", "--ssd-drive-write-gbps",
              "--separate-tp-link"),  # --prefix-caching off would hold nothing
    "utilization": ("--gpu-memory-utilization",),
    "tokens": ("--capacity-tokens",),
    "torch": ("--backend", "--device", "--layers"),
    "radix": ("--matching", "--page-size"),  # radix takes pages, not --block-size, and LRU only
    "parallel": ("--data-parallel-size", "--enable-expert-parallel"),  # experts: a MoE model (the default one)
    # one acceptance model at a time: a rate here, measured lengths (with the method and K) in the next group
    "speculative": ("--speculative-method", "--num-speculative-tokens", "--acceptance-rate"),
    "spec_lengths": ("--acceptance-lengths",),
}
# What a group needs besides its own flags to be valid
GROUP_NEEDS = {"torch": ["--capacity-blocks", "512"],
               "spec_lengths": ["--speculative-method", "ngram", "--num-speculative-tokens", "1"]}
GROUP_OF = {flag: group for group, flags in GROUPS.items() for flag in flags}


def group_options(group: str) -> tuple[Option, ...]:
    return tuple(o for o in EVERY_FORWARDED if GROUP_OF.get(o.flag, "default") == group)


def group_argv(group: str) -> list[str]:
    """Every option of the group at a value other than its default (with what the group needs, GROUP_NEEDS)."""
    return GROUP_NEEDS.get(group, []) + [x for o in group_options(group) for x in non_default(o)]


def up_plan(argv: list[str]) -> UpPlan:
    """up's parser, then its checks (the ones a child would make, before any starts): up's plan."""
    from kvemu.up import validate

    return validate(parser_of("kvemu.up").parse_args(argv))


def child_args(cmdline: list[str]) -> tuple[str, argparse.Namespace]:
    """Which child a command line of up's starts, and what that child's own parser makes of it."""
    assert cmdline[1:3] == ["-m", "kvemu"], cmdline  # every child runs as python -m kvemu COMMAND
    child = cmdline[3]
    return child, parser_of(CHILDREN[child]).parse_args(cmdline[4:])


def child_settings(cmdline: list[str]):
    """What a child makes of the command line up gave it, with its own parser and settings."""
    child, args = child_args(cmdline)
    return importlib.import_module(CHILDREN[child]).settings_from_args(args)


def settings_value(settings, option: Option):
    """The setting a flag became, where a field of its name holds it (else None: its parsed value is checked)."""
    knobs = getattr(settings, "knobs", None)
    for where in (settings, getattr(settings, "serving", None), knobs, getattr(knobs, "tiers", None)):
        for field in (option.dest, option.dest + "_s"):
            if where is not None and hasattr(where, field):
                return getattr(where, field)
    return None


def check_children_got(options: tuple[Option, ...], up: argparse.Namespace, cmdlines: list[list[str]],
                       settings: bool = True) -> int:
    """Each option's value up was given reached every child it is forwarded to: on the child's parsed
    command line, and in its settings where a field is named for it. Returns how many settings fields
    were compared (so the check is seen to compare something)."""
    compared = 0
    by_child = {child_args(c)[0]: c for c in cmdlines}
    assert set(by_child) == set(CHILDREN), by_child
    for child, cmdline in by_child.items():
        _, parsed = child_args(cmdline)
        made = child_settings(cmdline) if settings else None
        for option in options:
            if option not in FORWARDED[child]:
                continue
            want = getattr(up, option.dest)
            assert want not in (option.default, [] if option.repeat else None), option.flag  # the test sets it
            assert getattr(parsed, option.dest) == want, (child, option.flag, getattr(parsed, option.dest), want)
            got = settings_value(made, option) if made is not None else None
            if got is not None:
                assert got == want, (child, option.flag, got, want)
                compared += 1
    return compared


def up_cmdlines(plan: UpPlan) -> list[list[str]]:
    from kvemu.up import replica_args, router_args

    return [replica_args(0, 8100, plan, None), router_args(8000, plan, ["http://127.0.0.1:8100"], "memory")]


@pytest.mark.parametrize("group", ["default", *GROUPS])
def test_up_hands_every_flag_it_forwards_to_the_children_that_use_it(group, monkeypatch):
    if group == "torch":  # torch and CUDA need not be here: not checked
        monkeypatch.setattr("kvemu.up_plan.check_backend", lambda backend, layers: None)
    plan = up_plan(group_argv(group))
    compared = check_children_got(group_options(group), plan.flags, up_cmdlines(plan), settings=group != "torch")
    assert compared >= {"default": 30, "tiers": 3, "utilization": 1, "tokens": 1, "torch": 0, "radix": 1,
                        "parallel": 0, "speculative": 0, "spec_lengths": 0}[group]
    # parallel: ReplicaSettings.dp holds both (the command lines compared);
    # speculative decoding's flags: one setting, knobs.speculative, the replica's the one up's flags give
    if group in ("speculative", "spec_lengths"):
        replica = child_settings(up_cmdlines(plan)[0])
        assert replica.knobs.speculative == spec_decode(plan.flags) is not None


def test_every_forwarded_flag_is_in_one_group_and_each_group_is_set():
    seen = [o.flag for group in ("default", *GROUPS) for o in group_options(group)]
    assert sorted(seen) == sorted(o.flag for o in EVERY_FORWARDED)
    assert set(GROUP_OF) <= set(seen)  # no group names a flag up does not forward


def test_the_router_and_replica_settings_the_defaults_give():
    replica, router = (child_settings(c) for c in up_cmdlines(up_plan(["--capacity-blocks", "64"])))
    assert replica.serving.write_timeout_s == 30.0 and replica.max_waiting == 10_000
    assert router.routing == "cache_aware" and router.dashboard_interval_s == 1.0 and router.client_rate == 0


@pytest.mark.slow
@pytest.mark.parametrize("group", ["default", "tiers"])
def test_up_started_with_every_forwarded_flag_set_passes_each_to_its_children(group):
    """A real `kvemu up`: its children's command lines read back from /proc, parsed by the children's
    own parsers and settings; the combined --gpu/--tp too."""
    from tests.conftest import free_port
    from tests.support.kvemu_cli import Up

    argv = [*group_argv(group), "--gpu", "h100", "--tp", "2"]
    plan = up_plan(argv)
    up = Up("--replicas", "1", "--port", str(free_port()), *argv)
    try:
        up.ready()
        cmdlines = [shlex.split(cmd) for cmd in up.children.values()]
        cmdlines = [c for c in cmdlines if len(c) > 2 and c[1] == "-m"]
        assert check_children_got(group_options(group), plan.flags, cmdlines) >= (30 if group == "default" else 3)
        replica = child_settings(next(c for c in cmdlines if c[3] == "replica"))
        assert replica.gpu == "h100@tp2"
    finally:
        up.cleanup()


TIER_FLAGS = ["--host-cache-gib", "2.5", "--ssd-cache-gib", "10.0", "--tier-policy", "host=s3fifo,ssd=lru",
              "--tier-mode", "inclusive", "--fetch", "always", "--host-link-gbps", "12.5", "--ssd-drives", "2",
              "--ssd-drive-read-gbps", "6.5", "--ssd-drive-write-gbps", "1.5", "--no-hbm-caching", "--separate-tp-link"]


def test_up_hands_every_tier_flag_to_the_replicas_from_the_one_definition():
    from kvemu.up import replica_args

    plan = up_plan(["--capacity-blocks", "512", *TIER_FLAGS])
    a = plan.flags
    assert {o.dest for o in TIER_OPTIONS} == {f.removeprefix("--").replace("-", "_") for f in TIER_FLAGS[:-2:2]} | {
        "no_hbm_caching", "separate_tp_link"}  # the test sets every tier flag (the two switches last)
    child = child_args(replica_args(0, 9000, plan, None))[1]
    for option in TIER_OPTIONS:
        assert getattr(child, option.dest) == getattr(a, option.dest) != option.default, option.flag
    tiers = child_settings(replica_args(0, 9000, plan, None)).knobs.tiers
    assert (tiers.mode, tiers.fetch, tiers.host_policy, tiers.hbm_caching) == ("inclusive", "always", "s3fifo", False)
    assert (tiers.ssd_read_gbps, tiers.ssd_write_gbps) == (13.0, 3.0)  # two drives striped


@pytest.mark.parametrize("command", ["sim", "sweep", "replica", "up"])
def test_vllm_length_and_capacity_flags_are_on_every_command_that_runs_replicas(command):
    module = importlib.import_module({"sim": "kvemu.sim_cmd", "sweep": "kvemu.sweep_cmd", "replica": "kvemu.replica_cmd",
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
    plan = validate(a)
    replica = child_settings(replica_args(0, 8100, plan, None))
    assert (replica.gpu_memory_utilization, replica.capacity_blocks, replica.max_model_len) == (0.85, None, 2048)
    assert replica.resolved_max_model_len() == 2048 and plan.limit_lines[0].startswith("capacity (llama-3-8b): ceil(0.85 x")


def test_up_puts_neither_token_on_a_childs_command_line_but_in_its_environment(tmp_path):
    """What every user of the host can read (/proc/PID/cmdline) holds no secret: up hands both tokens
    on in the environment, which only their owner reads (the test with real processes: test_up.py)."""
    import json
    import sys

    from kvemu.up import Child, Cluster

    plan = up_plan(["--capacity-blocks", "64", "--admin-token", "admin-secret-1", "--cluster-token", "cluster-secret-2"])
    for cmdline in up_cmdlines(plan):
        assert not {"admin-secret-1", "cluster-secret-2", "--admin-token", "--cluster-token"} & set(cmdline), cmdline
    cluster = Cluster(token="cluster-secret-2", admin_token="admin-secret-1")
    out = tmp_path / "env.json"
    child = Child("probe", [sys.executable, "-c", "import json, os, sys; json.dump({k: os.environ.get(k) for k in"
                            " ('KVEMU_CLUSTER_TOKEN', 'KVEMU_ADMIN_TOKEN')}, open(sys.argv[1], 'w'))", str(out)])
    cluster.start(child, str(tmp_path))
    assert child.proc is not None and child.proc.wait(30) == 0
    assert json.loads(out.read_text()) == {"KVEMU_CLUSTER_TOKEN": "cluster-secret-2", "KVEMU_ADMIN_TOKEN": "admin-secret-1"}


def test_each_levels_routing_hit_cost_comes_from_the_level_registry_and_its_name_sets_it():
    """The strategies know levels by index only; the costs start at each kind's in the registry
    (host 0.1, SSD 0.5, a kind registered later its own), and `--set host_hit_cost=...` /
    `ssd_hit_cost=...` (the fields' old names) still set them, by the level's name."""
    from dataclasses import replace

    from kvemu.options.router_flags import routing_settings
    from replica.core.tiers.levels import HOST, LEVELS, SSD, LevelSettings
    from replica.core.tiers.stack import TierSettings
    from shared.errors import InputError

    assert routing_settings(16, []).level_hit_costs == (HOST.hit_cost, SSD.hit_cost) == (0.1, 0.5)
    set_both = routing_settings(16, ["ssd_hit_cost=0.3", "host_hit_cost=0.2", "overlap_weight=2"])
    assert (set_both.level_hit_costs, set_both.overlap_weight) == ((0.2, 0.3), 2.0)
    assert routing_settings(16, ["deeper_hit_costs=0.7,0.9"]).level_hit_costs == (0.1, 0.5, 0.7, 0.9)
    assert routing_settings(16, ["level_hit_costs=0.4"]).level_hit_costs == (0.4,)
    LEVELS["cxl"] = replace(SSD, name="cxl", hit_cost=0.25)  # a third kind, registered in the test alone
    try:
        levels = TierSettings(deeper=(LevelSettings("cxl", blocks=4),)).levels()
        assert routing_settings(16, [], levels).level_hit_costs == (0.1, 0.5, 0.25)
        assert routing_settings(16, ["cxl_hit_cost=0.75"], levels).level_hit_costs == (0.1, 0.5, 0.75)
    finally:
        del LEVELS["cxl"]
    for pair, field in (("ssd_hit_cost=1.5", "ssd_hit_cost"), ("host_hit_cost=x", "host_hit_cost"),
                        ("nvme_hit_cost=0.1", "nvme_hit_cost")):
        with pytest.raises(InputError) as err:
            routing_settings(16, [pair])
        assert err.value.field == field


def test_capacity_blocks_under_radix_is_blocks_of_16_tokens_for_up_and_its_replicas():
    # 100 blocks of 16 tokens: 400 pages of 4; 1,600 tokens are 1 page of 1,024 (and a note says so)
    plan = up_plan(["--matching", "radix", "--page-size", "4", "--capacity-blocks", "100"])
    replica = child_settings(up_cmdlines(plan)[0])
    assert (replica.capacity_blocks, replica.capacity_tokens, replica.resolved_capacity_blocks()) == (None, 1600, 400)
    assert not any(line.startswith("note:") for line in plan.limit_lines)
    plan = up_plan(["--matching", "radix", "--page-size", "1024", "--capacity-blocks", "100", "--max-model-len", "1024"])
    assert child_settings(up_cmdlines(plan)[0]).resolved_capacity_blocks() == 1
    assert list(plan.limit_lines) == ["note: --capacity-blocks 100 (1,600 tokens) is not a whole number of pages of 1024"
                             " tokens: the pool holds 1 (1,024 tokens)"]
    blocks = child_settings(up_cmdlines(up_plan(["--capacity-blocks", "100"]))[0])
    assert (blocks.capacity_blocks, blocks.resolved_capacity_blocks()) == (100, 100)


def test_the_tp_suffix_is_written_and_read_by_one_pair():
    from kvemu.options.gpu import with_tp
    from shared.costmodel import split_tp

    assert with_tp("h200", 1) == "h200" and with_tp("h200", 4) == "h200@tp4"
    assert split_tp(with_tp("h100", 2)) == ("h100", 2) and split_tp("h100") == ("h100", 1)
