"""bench/bench_adaptive.py: the seed's 20 mixes, regret and gap recovered worked by hand, a tiny
end-to-end run (JSON shape, adaptive cost fields, the shift check)."""

import json

import pytest

from bench import bench_adaptive as ba
from bench import plot_adaptive


def test_wakman_mixes_are_twenty_distinct_from_pure_types_to_thirds():
    mixes = ba.WAKMAN_MIXES
    assert len(mixes) == 20 and len(set(mixes)) == 20
    assert all(min(m) >= 0 and sum(m) == pytest.approx(1) for m in mixes)
    for must in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0.5, 0.5)]:
        assert must in mixes
    assert any(m == pytest.approx((1 / 3, 1 / 3, 1 / 3)) for m in mixes)


def test_score_regret_and_gap_recovered_by_hand():
    res = {"lru": {"hit_ratio": 0.80}, "s3fifo": {"hit_ratio": 0.70}, "adaptive": {"hit_ratio": 0.78},
           "belady": {"hit_ratio": 0.90}}
    assert ba.score(res) == {"winner": "lru", "static_gap_points": 10.0}
    assert res["s3fifo"]["regret_points"] == 10.0 and res["s3fifo"]["regret_pct"] == 12.5  # 0.10 / 0.80
    assert res["adaptive"]["regret_points"] == 2.0 and res["adaptive"]["gap_recovered"] == 0.8
    assert res["belady"]["regret_points"] == -10.0


def test_summary_median_recovered_only_where_statics_differ_by_more_than_a_point():
    rows = []
    for lru, s3, ada in [(0.80, 0.70, 0.78), (0.60, 0.65, 0.64), (0.50, 0.505, 0.50)]:
        res = {"lru": {"hit_ratio": lru, "wall_s": 1}, "s3fifo": {"hit_ratio": s3, "wall_s": 1},
               "adaptive": {"hit_ratio": ada, "wall_s": 2}}
        rows.append({**ba.score(res), "policies": res})
    s = ba.summarize(rows, ["lru", "s3fifo", "adaptive"])
    assert s["adaptive"]["median_gap_recovered_gt1pt"] == pytest.approx(0.8)  # median of 0.8, 0.8; 0.5-pt mix out
    assert s["adaptive"]["mean_regret_points"] == pytest.approx((2 + 1 + 0.5) / 3, abs=1e-3)
    assert s["adaptive"]["max_regret_points"] == 2.0 and s["lru"]["max_regret_points"] == 5.0
    assert s["s3fifo"]["wall_s"] == 3


def test_tiny_run_end_to_end_both_ways(capsys):
    assert ba.main(["--parts", "mixes,shift", "--mixes", "0,0,1", "--duration", "120", "--capacity", "9000",
                    "--interval", "40", "--jobs", "1", "--variants", "adaptive,adaptive_sampled"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["response_kv"]) == ["keep", "drop"]  # the default: response KV kept, then dropped
    for parts in doc["response_kv"].values():
        (row,) = parts["mixes"]["mixes"]
        assert set(row["policies"]) == {"lru", "s3fifo", "adaptive", "adaptive_sampled", "belady"}
        assert parts["lowest_mean_regret"] in ("lru", "s3fifo", "adaptive", "adaptive_sampled")  # online only
        ada = row["policies"]["adaptive"]
        assert ada["switches"] >= 0 and ada["shadow_blocks"] > row["policies"]["adaptive_sampled"]["shadow_blocks"] > 0
        assert len(ada["running"]) == 2  # decisions at 40 s and 80 s of a 120 s trace
        shift = parts["shift"]
        assert [p["phase"] for p in shift["phases"]] == ["agent", "single", "multi"]
        assert [p["starts_s"] for p in shift["phases"]] == [0, 120, 240]
        assert len(shift["policies"]["adaptive"]["follows_within_two_intervals"]) == 3
    keep, drop = (doc["response_kv"][m]["mixes"]["mixes"][0]["policies"]["lru"]["hit_ratio"] for m in ("keep", "drop"))
    assert keep > drop  # kept responses are hit by the agents' next turns
    text = plot_adaptive.tables(doc)  # the doc's tables: one set per mode
    assert text.index("### response KV keep") < text.index("### response KV drop")
    assert text.count("| **mean regret (points)** |") == 2


def test_one_mode_on_request(capsys):
    assert ba.main(["--parts", "mixes", "--mixes", "0,0,1", "--duration", "60", "--capacity", "9000", "--jobs", "1",
                    "--variants", "", "--no-belady", "--response-kv", "drop"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["response_kv"]) == ["drop"] and doc["response_kv"]["drop"]["lowest_mean_regret"] in ("lru", "s3fifo")


def test_requests_longer_than_the_pool_are_refused_and_the_run_goes_on(capsys):
    """vLLM's length rule: at 10 blocks (160 tokens) requests that do not fit are refused, and counted."""
    assert ba.main(["--parts", "mixes", "--mixes", "1,0,0", "--duration", "30", "--capacity", "10", "--jobs", "1",
                    "--response-kv", "keep"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["response_kv"]["keep"]["mixes"]["mixes"]
    assert all(p["refused"] > 0 and p["hit_ratio"] == 0.0 for p in row["policies"].values())


def test_follow_delays_by_hand():
    phases = [{"starts_s": 0, "winner_alone": "lru"}, {"starts_s": 3600, "winner_alone": "s3fifo"},
              {"starts_s": 7200, "winner_alone": "s3fifo"}]
    running = [(900, "lru"), (1800, "s3fifo"), (2700, "lru"), (3604, "lru"), (4505, "lru"), (5407, "s3fifo"),
               (6307, "s3fifo")]
    assert ba.follow_delays(running, phases) == [0.0, 1807.0, 0.0]  # starts on LRU; already S3-FIFO at 7200
    assert ba.follow_delays([(900, "lru")], phases[1:2]) == [None]  # never within the phase
