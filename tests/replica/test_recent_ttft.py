"""The replica's window of recent TTFTs behind /stats' ``ttft`` (what the dashboard draws)."""

from replica.runtime import RecentTtft


def test_percentiles_over_the_window_only():
    w = RecentTtft(window_s=10.0)
    assert w.summary(now=0.0) == {"window_s": 10.0, "requests": 0, "p50_s": None, "p90_s": None, "p99_s": None}
    for i in range(100):  # 0.01 .. 1.00 s, one per 0.1 s of wall time
        w.add((i + 1) / 100, now=i * 0.1)
    assert w.summary(now=9.9) == {"window_s": 10.0, "requests": 100, "p50_s": 0.51, "p90_s": 0.91, "p99_s": 1.0}
    # 5 s later the first 50 (added before t=4.95) have left the window
    assert w.summary(now=14.95) == {"window_s": 10.0, "requests": 50, "p50_s": 0.76, "p90_s": 0.96,
                                    "p99_s": 1.0}


def test_bounded():
    w = RecentTtft(window_s=60.0, maxlen=3)
    for v in (5.0, 1.0, 2.0, 3.0):
        w.add(v, now=0.0)
    assert w.summary(now=1.0)["requests"] == 3 and w.summary(now=1.0)["p99_s"] == 3.0
