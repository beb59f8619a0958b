"""docs/python-api.md's example runs as written, and its rows are the command line's."""

import json
import re
from pathlib import Path

import pytest

from kvemu import api
from kvemu.cli import main
from shared.errors import InputError, UnknownNameError

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def test_the_documented_example_runs_and_matches_the_cli(tmp_path, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    ns: dict = {}
    exec(compile(blocks[0], str(DOC), "exec"), ns)
    printed = capsys.readouterr().out
    # what the page says it prints is what it prints, every number
    (shown,) = re.findall(r"It prints[^\n]*\n\n```text\n(.*?)```", DOC.read_text(), re.S)
    assert printed == shown
    rows = ns["rows"]
    assert [(r["policy"], r["capacity_blocks"]) for r in rows] == [("lru", 4000), ("lru", 18279),
                                                                    ("s3fifo", 4000), ("s3fifo", 18279)]
    assert all(r["replicas"] == 4 and r["routing"] == "session" for r in rows)
    out = tmp_path / "cli.json"
    assert main(["sim", "--trace", "mooncake-conversation", "--policy", "lru,s3fifo", "--capacity-blocks",
                 "4000,18279", "--replicas", "4", "--routing", "session", "--no-reuse-distances", "--quiet",
                 "--json", str(out)]) == 0
    cli = json.loads(out.read_text())["runs"]
    for mine, theirs in zip(rows, cli):
        mine, theirs = dict(mine), dict(theirs)
        mine.pop("wall_s"), theirs.pop("wall_s")
        assert mine == theirs
    assert ns["best"]["block_hit_ratio"] == max(r["block_hit_ratio"] for r in rows)
    capsys.readouterr()  # the command's table

    # the estimate is `kvemu estimate --json`'s object
    assert main(["estimate", "--set", "arrival_rate=1.5", "--set", "think_mean=45", "--capacity-blocks", "2275",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(ns["mean_field"]))  # tuples: lists
    needed = ns["needed"]
    assert needed["target_hit_ratio"] == 0.3 and needed["hit_ratio"] >= 0.3 - 1e-9


def test_the_documented_drop_ratios_are_what_a_run_gives():
    """The page's sentence on ``response_kv="drop"``: its four hit ratios, in the example's order."""
    text = " ".join(DOC.read_text().split())
    said = re.search(r'With `response_kv="drop"`.*?\(lru 4,000: (0\.\d+); 18,279: (0\.\d+); s3fifo (0\.\d+), (0\.\d+)\)',
                     text)
    assert said, "the sentence on response_kv=\"drop\" moved"
    trace = api.load_trace("mooncake-conversation")
    rows = api.simulate(trace, policies=["lru", "s3fifo"], capacity_blocks=[4000, 18279], replicas=4,
                        routing="session", reuse="off", response_kv="drop")
    assert [f"{r['block_hit_ratio']:.4f}" for r in rows] == list(said.groups())


def test_bad_input_names_the_field():
    trace = api.generate_trace("scm", duration_s=60, seed=1)
    with pytest.raises(InputError, match="^max_runing: not a simulation setting"):
        api.simulate(trace, ["lru"], [1000], max_runing=1)
    with pytest.raises(UnknownNameError, match="unknown policy 'lur'"):
        api.simulate(trace, ["lur"], [1000])
    with pytest.raises(InputError, match="^capacity_blocks: give exactly one"):
        api.estimate(arrival_rate=1.0)


def test_capacity_blocks_under_radix_are_blocks_of_16_tokens_as_on_the_command_line():
    trace = api.generate_trace("chat", duration_s=30, seed=1, block_size=1)  # cut into pages of one token
    (row,) = api.simulate(trace, capacity_blocks=[100], matching="radix", hit_mode="prefix", cache_only=True)
    assert (row["capacity_blocks"], row["block_size"], row["capacity_tokens"]) == (1600, 1, 1600)


def test_kv_cache_dtype_halves_a_blocks_bytes_and_the_row_says_so():
    trace = api.generate_trace("chat", duration_s=20, seed=1)
    bf16, fp8 = (api.simulate(trace, capacity_blocks=[64], model="tiny", kv_cache_dtype=d)[0] for d in ("auto", "fp8"))
    # tiny: 4 layers x 2 KV heads x 32 values x K and V = 512 values a token; 64 blocks of 16 tokens
    assert (bf16["kv_cache_dtype"], bf16["capacity_bytes"]) == ("auto", 64 * 16 * 512 * 2)
    assert (fp8["kv_cache_dtype"], fp8["capacity_bytes"]) == ("fp8", 64 * 16 * 512 * 1)
    with pytest.raises(InputError, match="--kv-cache-dtype: unknown KV cache dtype 'int4'"):
        api.simulate(trace, capacity_blocks=[64], model="tiny", kv_cache_dtype="int4")
