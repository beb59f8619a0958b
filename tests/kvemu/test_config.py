"""`--config FILE.toml` for `kvemu up`, `sweep` and `sim`: every flag settable, flags win."""

import argparse
import csv
from pathlib import Path

import pytest

from kvemu import sweep_cmd, up
from kvemu.cli import main, parse_args

REPO = Path(__file__).resolve().parents[2]


def options(configure) -> dict[str, argparse.Action]:
    p = argparse.ArgumentParser()
    configure(p)
    return {a.option_strings[-1][2:]: a for a in p._actions
            if a.option_strings and a.option_strings[-1] not in ("--help", "--config")}


def sample(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "true"
    if action.choices:
        return f'"{list(action.choices)[-1]}"'
    if isinstance(action, argparse._AppendAction):
        return '["x=1"]'
    return "7" if action.type in (int, float) else '"7"'


@pytest.mark.parametrize("command,configure", [("up", up.configure), ("sweep", sweep_cmd.configure)])
def test_every_flag_is_settable_in_the_file(tmp_path, command, configure):
    opts = options(configure)
    # the other member of each mutually exclusive group is set
    exclusive = {"workload", "capacity-tokens", "capacity-gib", "gpu-memory-utilization"}
    keys = {name: sample(a) for name, a in opts.items() if name not in exclusive}
    path = tmp_path / "all.toml"
    path.write_text("".join(f"{name.replace('-', '_')} = {value}\n" for name, value in keys.items()))
    args = parse_args([command, "--config", str(path)])
    for name, value in keys.items():
        got = getattr(args, opts[name].dest)
        expect = {"true": True, "7": 7 if opts[name].type is int else 7.0}.get(value, value.strip('"'))
        if value == '["x=1"]':
            expect = ["x=1"]
        assert got == expect, (name, got, expect)


def test_flags_override_the_file_and_exclusive_flags_replace_it(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('replicas = 3\npolicy = "s3fifo"\ncapacity_blocks = 5000\n[set]\nbounded_load_factor = 1.5\n')
    args = parse_args(["up", "--config", str(path), "--replicas", "2", "--capacity-gib", "8", "--set", "x=1"])
    assert (args.replicas, args.policy, args.capacity_gib, args.capacity_blocks) == (2, "s3fifo", 8.0, None)
    assert args.set == ["x=1"]  # a repeatable flag given on the command line replaces the file's list
    assert parse_args(["up", "--config", str(path)]).set == ["bounded_load_factor=1.5"]


def test_the_shipped_examples_parse(tmp_path):
    a = parse_args(["up", "--config", str(REPO / "deploy" / "cluster.toml")])
    assert (a.replicas, a.capacity_gib, a.routing, a.port, a.set) == (4, 24.0, "cache_aware", 8000,
                                                                      ["bounded_load_factor=1.25"])
    s = parse_args(["sweep", "--config", str(REPO / "deploy" / "sweep.toml")])
    assert (s.trace, s.policy, s.capacity_blocks, s.routing, s.replicas) == (
        "mooncake-conversation", "lru,s3fifo,belady", "2000,8000,32000", "cache_aware,session", "1,4")


def test_a_sweep_runs_from_a_file(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    path = tmp_path / "sweep.toml"
    path.write_text(f'workload = "scm"\nduration = 120\npolicy = ["lru", "s3fifo"]\ncapacity_blocks = [1000]\n'
                    f'out = "{out}"\ncsv = "{out.with_suffix(".csv")}"\njobs = 1\nquiet = true\n')
    assert main(["sweep", "--config", str(path), "--policy", "lru"]) == 0
    with open(out.with_suffix(".csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["policy"], r["capacity_blocks"]) for r in rows] == [("lru", "1000")]


@pytest.mark.parametrize("text,message", [
    ("replicas = [", "is not valid TOML"),
    ("nope = 1", "unknown key 'nope'; valid: "),
    ("keep_logs = 3", "keep_logs: expected true or false, got 3"),
    ("policy = {a = 1}", "policy: expected a string or a number, got dict"),
])
def test_a_bad_file_is_one_error_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    assert main(["up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_a_missing_file(capsys):
    assert main(["sweep", "--config", "nope.toml"]) == 2
    assert capsys.readouterr().err == "error: --config: no file nope.toml\n"
