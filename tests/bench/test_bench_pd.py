"""bench/bench_pd.py on a tiny setting: the document's shape, and facts checked by hand."""

from __future__ import annotations

import json

from bench import bench_pd as bp

# qwen3-coder-30b-a3b (kvemu's default model): 48 layers x 4 KV heads x 128 dims x 2 (K and V) x 2 bytes
KV_BYTES_PER_TOKEN = 48 * 4 * 128 * 2 * 2  # 98,304


def test_tiny_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "pd.json"
    rc = bp.main(["--workloads", "chat", "--configs", "colocated,1P:3D always", "--parts", "goodput,estimate",
                  "--duration", "30", "--doublings", "0", "--steps", "0", "--start-scale", "0.05",
                  "--estimate-capacities", "4000", "--estimate-sessions", "50", "--jobs", "1", "--out", str(out),
                  "--plots", str(tmp_path)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc == json.loads(capsys.readouterr().out)  # stdout and --out carry the same document
    assert doc["objectives"]["chat"] == {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05, "rate": "session_rate",
                                         "unit": "sessions/s"}
    assert set(doc["goodput"]["chat"]) == {"colocated", "1P:3D always"}
    for config in ("colocated", "1P:3D always"):
        g = doc["goodput"]["chat"][config]
        assert len(g["points"]) == 1 and g["points"][0]["rate"] == 0.2  # 4 sessions/s x 0.05, the one point tried
        at = g["at_goodput"]
        assert at is not None and at["meets"] and g["capped"]  # a light load meets both objectives
        assert at["rps"] == round(at["requests"] / 30, 4)  # requests/s: the window's requests over its 30 s
        assert g["goodput_rps"] == at["rps"]
    pd = doc["goodput"]["chat"]["1P:3D always"]["at_goodput"]["pd"]
    # decider always: every request through the one prefill instance, none failed over
    assert pd["requests"]["remote"] == doc["goodput"]["chat"]["1P:3D always"]["at_goodput"]["served"]
    assert pd["requests"]["local"] == 0 == pd["requests"]["failover"]
    assert pd["transfer_bytes"] == pd["transfer_tokens"] * KV_BYTES_PER_TOKEN > 0
    assert set(pd["pools"]) == {"prefill", "decode"} and pd["pools"]["prefill"]["replicas"] == 1
    assert "pd" not in doc["goodput"]["chat"]["colocated"]["at_goodput"]
    assert "kvemu sim --workload chat --duration 30.0 --set session_rate=RATE" in doc["commands"]["chat"]["colocated"]
    est = {p["mode"]: p for p in doc["estimate"]["points"]}
    assert set(est) == {"pd", "colocated"} and est["pd"]["failover"] == 0
    assert est["pd"]["estimate"] == est["colocated"]["estimate"]  # one estimate, two simulated caches
    assert est["pd"]["difference"] == round(est["pd"]["sim_steady"] - est["pd"]["estimate"], 5)
    text = bp.tables(doc)  # the markdown of docs/pd.md
    assert "| chat (TTFT p99 <= 1 s, TPOT p99 <= 50 ms) |" in text and "| 4,000 |" in text
    # the figures of the parts it ran (no link or routing part: none of theirs)
    assert sorted(p.name for p in tmp_path.glob("pd-*.png")) == ["pd-estimate.png", "pd-goodput.png",
                                                                 "pd-ttft-split.png"]
