"""bench/bench_shared_store.py on a tiny setting: the document's shape, and facts checked by hand."""

from __future__ import annotations

import gzip
import json
import math

from bench import bench_shared_store as bs
from loadgen.formats import read_trace, resolve_trace
from loadgen.trace import response_hashes

HEAD = 200


def test_tiny_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "study.json"
    rc = bs.main(["--workloads", "mooncake", "--head", str(HEAD), "--replicas", "2", "--fractions", "0,W/0.9",
                  "--parts", "grid,link", "--refine", "0", "--jobs", "1", "--out", str(out), "--plots", str(tmp_path)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc == json.loads(capsys.readouterr().out)  # stdout and --out carry the same document

    # the working set by hand: the first 200 requests' distinct block ids, and the response blocks kept
    with gzip.open(resolve_trace("mooncake-conversation"), "rt") as fh:
        rows = [json.loads(line) for _, line in zip(range(HEAD), fh)]
    prompt = {h for r in rows for h in r["hash_ids"]}
    trace = read_trace(resolve_trace("mooncake-conversation"))
    trace.requests[:] = trace.requests[:HEAD]
    kept = prompt.union(*response_hashes(trace))
    ws = doc["working_sets"]["mooncake"]
    assert ws["prompt_blocks"] == len(prompt) and ws["working_set_blocks"] == len(kept)
    assert ws["block_size"] == 512 and ws["requests"] == HEAD
    assert ws["block_bytes"] == 512 * 48 * 4 * 128 * 2 * 2  # qwen3-coder-30b-a3b: 98,304 bytes a token

    grid = doc["grid"]["mooncake"]
    assert {(p["routing"], p["fraction"]) for p in grid} == {(r, f) for r in bs.ROUTINGS for f in ("0", "W/0.9")}
    for p in grid:
        assert p["requests"] == HEAD and p["nic_gbps"] == 400.0 and p["write"] == "through"
        if p["store_blocks"] == 0:  # no store: nothing but HBM, and no store in the run
            assert "store" not in p and p["shared_block_hit_ratio"] == 0.0
            assert p["all_levels_block_hit_ratio"] == p["hbm_block_hit_ratio"]
            continue
        # W / 0.9 (+1): the store never reaches its 90% watermark, so written through, it takes every block of
        # the working set exactly once and evicts or refuses none
        assert p["store_blocks"] == math.ceil(len(kept) / 0.9) + 1
        st = p["store"]
        assert st["blocks"] == p["store_blocks"] and st["writes"] == len(kept) == st["used_blocks"]
        assert st["evictions"] == 0 == st["refused_writes"]
        assert p["all_levels_block_hit_ratio"] <= ws["infinite_cache_block_hit_ratio"] + 1e-9
    assert {p["nic_gbps"] for p in doc["link"]["mooncake"]} == {100.0, 400.0}
    c = doc["crossover"]["mooncake"]
    assert [b for b, _ in c["gaps"]] == [0, math.ceil(len(kept) / 0.9) + 1]
    assert "kvemu sim --trace mooncake-conversation --replicas 2 --routing ROUTING" in doc["commands"]["mooncake"]

    text = bs.tables(doc)  # the markdown of docs/shared-store.md
    assert "| mooncake | 200 |" in text and "| W/0.9 |" in text
    assert sorted(p.name for p in tmp_path.glob("shared-store-*.png")) == [
        "shared-store-gap.png", "shared-store-hit.png", "shared-store-link.png"]
