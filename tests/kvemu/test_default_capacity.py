"""vLLM's defaults by default: with no capacity flag sim, sweep, replica, up and the Python API size the pool
as ``--gpu-memory-utilization 0.9`` does (vLLM's default, one memory rule), and a prompt's hits are its leading
run of cached blocks (``--hit-mode prefix``, vLLM's), holes counted only when asked for.

Hand-worked: OPT-13B on an A100-80GB at the default token budget (8,192) and running limit (256) is
ceil(0.9 x 79.54 GiB) - 23.92 GiB of weights - 0.78 GiB of activations - 0.25 GiB non-torch = 46.63 GiB of KV,
3,820 blocks of 16 tokens (OPT-13B's 40 layers x 5,120 x 2 x 2 bytes = 800 KiB a token, 12.5 MiB a block)."""

from __future__ import annotations

import argparse

import pytest

from kvemu import api, replica_cmd, sim_cmd, up
from kvemu.options.limits import DEFAULT_GPU_MEMORY_UTILIZATION
from kvemu.options.matching import matching_setting
from loadgen.formats import write_kvemu
from loadgen.trace import Trace, TraceRequest
from shared.errors import InputError

OPT_ON_A100 = ["--model", "opt-13b", "--gpu", "a100-80gb"]
BLOCKS_AT_09 = 3_820


def parsed(configure, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(argv)


def small_trace(path) -> str:
    write_kvemu(Trace([TraceRequest(0.0, "a", 0, [1, 2], 32, 2)], block_size=16), str(path))
    return str(path)


def test_the_default_is_vllms():
    assert DEFAULT_GPU_MEMORY_UTILIZATION == 0.9


def test_sim_without_a_capacity_flag_runs_the_blocks_of_0_9(tmp_path, capsys):
    trace = small_trace(tmp_path / "t.jsonl")
    _, grid = sim_cmd.runs_of(parsed(sim_cmd.configure, ["--trace", trace, *OPT_ON_A100]))
    _, explicit = sim_cmd.runs_of(parsed(sim_cmd.configure, ["--trace", trace, *OPT_ON_A100,
                                                             "--gpu-memory-utilization", "0.9"]))
    assert [s.capacity_blocks for s in grid] == [s.capacity_blocks for s in explicit] == [BLOCKS_AT_09]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == lines[1] and lines[0].endswith("= 46.63 GiB of KV per GPU: 3,820 blocks of 16 tokens")
    _, cache_only = sim_cmd.runs_of(parsed(sim_cmd.configure, ["--trace", trace, *OPT_ON_A100, "--cache-only"]))
    assert cache_only[0].capacity_blocks == BLOCKS_AT_09


def test_a_capacity_flag_given_is_what_runs(tmp_path):
    trace = small_trace(tmp_path / "t.jsonl")
    _, grid = sim_cmd.runs_of(parsed(sim_cmd.configure, ["--trace", trace, *OPT_ON_A100, "--capacity-blocks", "77"]))
    assert [s.capacity_blocks for s in grid] == [77]


def test_a_replica_without_a_capacity_flag_has_the_blocks_of_0_9():
    settings = replica_cmd.settings_from_args(parsed(replica_cmd.configure, OPT_ON_A100))
    assert (settings.gpu_memory_utilization, settings.resolved_capacity_blocks()) == (0.9, BLOCKS_AT_09)


def test_ups_plan_without_a_capacity_flag_hands_every_replica_0_9():
    a = parsed(up.configure, [*OPT_ON_A100, "--replicas", "2"])
    plan = up.validate(a)
    argv = up.replica_args(0, 9000, plan, None)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9" and "--capacity-blocks" not in argv
    assert a.gpu_memory_utilization is None  # the plan holds the default, the flags as given stay
    assert plan.limit_lines[0].endswith(": 3,820 blocks of 16 tokens")  # up prints it once, at start


def test_the_python_api_without_capacity_runs_the_blocks_of_0_9():
    trace = Trace([TraceRequest(0.0, "a", 0, [1, 2], 32, 2)], block_size=16)
    [run] = api.simulate(trace, model="opt-13b", gpu="a100-80gb")
    assert run["capacity_blocks"] == BLOCKS_AT_09


def test_a_model_that_does_not_fit_at_0_9_is_one_line_naming_the_ways_out(tmp_path):
    args = parsed(sim_cmd.configure, ["--trace", small_trace(tmp_path / "t.jsonl"), "--model", "llama-2-70b",
                                      "--gpu", "h100"])
    with pytest.raises(InputError, match=r"nothing left for KV: 0\.9 x .*0\.9 where no capacity flag is given,"
                                         r" vLLM's default.*--capacity-gib / --capacity-tokens / --capacity-blocks"):
        sim_cmd.runs_of(args)


def test_the_default_hit_mode_reuses_only_the_leading_run():
    """Two prompts of three blocks: the second shares the first's blocks 1 and 3, not 2 (a hole at 9). Prefix,
    the default: block 1 only is reused (1 of 6 prompt blocks); holes, asked for: 1 and 3 (2 of 6)."""
    assert matching_setting(argparse.Namespace()).hit_mode == "prefix"
    trace = Trace([TraceRequest(0.0, "a", 0, [1, 2, 3], 48, 1), TraceRequest(10.0, "b", 0, [1, 9, 3], 48, 1)],
                  block_size=16)
    [prefix] = api.simulate(trace, capacity_blocks=[100])
    [holes] = api.simulate(trace, capacity_blocks=[100], hit_mode="holes")
    assert (prefix["hit_mode"], prefix["block_hit_ratio"], prefix["holes"]["mean_per_request"]) == ("prefix", 1 / 6, 0)
    assert (holes["hit_mode"], holes["block_hit_ratio"], holes["holes"]["mean_per_request"]) == ("holes", 2 / 6, 0.5)
