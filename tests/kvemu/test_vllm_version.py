"""`--vllm-version X.Y.Z` on sim, sweep, replica and up: a release's rules fill in the scheduler's settings
where their flags were not given; a flag given (on the command line or in --config) wins, even at kvemu's
default value; a bad release is one line naming the flag."""

import argparse

import pytest

from kvemu import replica_cmd, sim_cmd, sweep_cmd, up
from kvemu.cli import main, parse_args
from kvemu.options.scheduler import check_scheduler_flags

OPT_ON_A100 = ["--model", "opt-13b", "--gpu", "a100"]


def parsed(configure, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(argv)


def sim_args(*extra: str) -> argparse.Namespace:
    return parsed(sim_cmd.configure, ["--trace", "t.jsonl", "--capacity-blocks", "100", *OPT_ON_A100, *extra])


def scheduler(args) -> tuple:
    return args.step_rule, args.prefix_caching, args.watermark, args.token_budget, args.max_running


def test_the_release_fills_in_what_was_not_given(capsys):
    args = sim_args("--vllm-version", "0.2.3")
    check_scheduler_flags(args)
    assert scheduler(args) == ("v0", "off", 0.01, 2048, 256)  # max(OPT-13B's 2,048-token window, 2048)
    line = capsys.readouterr().err.strip()
    assert line.startswith("vllm 0.2.3 (the rules of 0.2.2): v0 steps (prefills of whole prompts or decodes), prefix"
                           " caching off, watermark 0.01, token budget 2,048, max running 256; not modelled: no CUDA"
                           " graphs (every step eager);") and "\n" not in line


def test_a_flag_given_wins_even_at_kvemus_default_value(capsys):
    args = sim_args("--vllm-version", "0.2.3", "--token-budget", "8192", "--prefix-caching", "on",
                    "--max-model-len", "1024")
    check_scheduler_flags(args)
    assert scheduler(args) == ("v0", "on", 0.01, 8192, 256)  # 8192 and on are kvemu's defaults, given: kept
    assert "token budget 8,192" in capsys.readouterr().err  # the line says what runs ...
    args = sim_args("--vllm-version", "0.2.3", "--max-model-len", "4096")  # ... and the window given sets the rule's
    check_scheduler_flags(args)
    assert args.token_budget == 4096


def test_a_flag_in_a_config_file_counts_as_given(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('vllm_version = "0.2.3"\nwatermark = 0.0\n')
    args = parse_args(["sim", "--config", str(path), "--trace", "t.jsonl", "--capacity-blocks", "100", *OPT_ON_A100])
    check_scheduler_flags(args)
    assert scheduler(args) == ("v0", "off", 0.0, 2048, 256)
    assert "given, kept: --watermark;" in capsys.readouterr().err


def test_without_the_flag_nothing_is_filled_in(capsys):
    args = sim_args()
    check_scheduler_flags(args)
    assert scheduler(args) == ("v1", "on", 0.0, 8192, 256) and capsys.readouterr().err == ""


def test_the_newest_release_on_h200_takes_vllms_serve_defaults(capsys):
    args = parsed(sweep_cmd.configure, ["--trace", "t.jsonl", "--capacity-blocks", "100", "--out", "o.jsonl",
                                        "--model", "llama-3-8b", "--gpu", "h200", "--vllm-version", "0.33.0"])
    check_scheduler_flags(args)
    assert scheduler(args) == ("v1", "on", 0.0, 8192, 1024)


def test_the_replica_and_up_take_it_and_up_hands_the_settings_to_its_replicas(capsys):
    args = parsed(replica_cmd.configure, ["--capacity-blocks", "100", *OPT_ON_A100, "--vllm-version", "0.2.3"])
    settings = replica_cmd.settings_from_args(args)
    knobs = settings.knobs
    assert (knobs.step_rule, knobs.prefix_caching, knobs.watermark, knobs.token_budget) == \
        ("v0", "off", 0.01, 2048)
    a = parsed(up.configure, ["--capacity-blocks", "100", *OPT_ON_A100, "--vllm-version", "0.2.3", "--max-running", "64"])
    child = parsed(replica_cmd.configure, up.replica_args(0, 8100, up.validate(a), None)[4:])  # as the replica parses it
    assert scheduler(child) == ("v0", "off", 0.01, 2048, 64)  # --max-running given to up: kept


@pytest.mark.parametrize("version, message", [
    ("0.2", "--vllm-version: expected a vLLM release as X.Y.Z (e.g. 0.2.3), got '0.2'"),
    ("0.99.0", "--vllm-version: kvemu follows vLLM up to 0.33.0; the rules of 0.99.0 are not known here: give 0.33.0"
               " or an earlier release"),
])
def test_a_bad_release_is_one_line(capsys, tmp_path, version, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 0, "session": "s", "turn": 0, "hash_ids": [1], "input_tokens": 16, "output_tokens": 2}\n')
    assert main(["sim", "--trace", str(trace), "--capacity-blocks", "100", "--vllm-version", version, "--quiet"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
