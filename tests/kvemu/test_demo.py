"""`kvemu demo`: the README's main job, end to end as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.support.kvemu_cli import REPO, ChildWatcher, kill_all, kvemu_cmd, wait_dead

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

BUDGET_S = 60.0


def test_demo_reports_and_shuts_down_within_a_minute(tmp_path):
    out, png = tmp_path / "demo.json", tmp_path / "demo.png"
    started = time.monotonic()
    proc = subprocess.Popen(kvemu_cmd("demo", "--json", str(out), "--plot", str(png)), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watcher = ChildWatcher(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        children = watcher.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftover = wait_dead(children, 3.0)
        kill_all(children)
    elapsed = time.monotonic() - started
    print(f"\nkvemu demo: {elapsed:.1f} s wall, {len(children)} child processes")
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr

    # router + 4 replicas, all gone once the demo returned
    assert sorted(c.split(" -m kvemu ")[1].split()[0] for c in children.values()) == ["replica"] * 4 + ["router"]
    assert leftover == {}, f"processes outlived kvemu demo: {leftover}"

    m = re.search(r"token hit ratio \(HBM\) (\d\.\d+)\s+block hit ratio \(HBM\) (\d\.\d+)\s+CSR (\d\.\d+)", stdout)
    assert m, stdout
    token_hit, block_hit, csr = map(float, m.groups())
    assert 0.3 < token_hit <= 1 and 0.3 < block_hit <= 1 and 0.3 < csr <= 1
    m = re.search(r"TTFT \(emulated\) p50 ([\d.]+) ms\s+p99 ([\d.]+) ms", stdout)
    assert m and 0 < float(m.group(1)) <= float(m.group(2)), stdout
    assert re.search(r"requests\s+[\d,]+ \([\d,]+ ok, 0 failed\)", stdout), stdout
    assert re.search(r"hotspots: (none|replica-\d)", stdout), stdout
    # this run's rows: replica, requests, tok_hit, blk_hit, CSR, evictions, aborted; then the lifetime rows
    rows = re.findall(r"^\s+(replica-\d)\s+([\d,]+)\s+(\d\.\d+)\s+(\d\.\d+)\s+(\d\.\d+)\s+([\d,]+)\s+([\d,]+)$",
                      stdout, re.M)
    lifetime = re.findall(r"^\s+(replica-\d)\s+(\d\.\d+)\s+(\d\.\d+)\s+([\d,]+)\s+(\d\.\d+)$", stdout, re.M)
    assert sorted(r[0] for r in lifetime) == [f"replica-{i}" for i in range(4)], stdout
    assert sorted(r[0] for r in rows) == [f"replica-{i}" for i in range(4)], stdout
    assert all(int(r[1].replace(",", "")) > 0 for r in rows), "a replica got no load"
    assert all(r[6] == "0" for r in rows), "a demo request was aborted"
    reported = float(re.search(r"demo finished in ([\d.]+) s", stdout).group(1))
    assert reported <= elapsed
    # It ends by writing one summary figure and saying where it is.
    assert stdout.rstrip().splitlines()[-1] == f"summary figure: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000

    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["failed"] == 0 and s["ok"] == len(doc["records"]) > 100
    assert s["token_hit_ratio"] == round(token_hit, 4) or abs(s["token_hit_ratio"] - token_hit) < 1e-4
    assert sum(p["requests"] for p in s["per_replica"].values()) == s["ok"]
    assert set(doc["cluster"]["replicas"]) == {f"replica-{i}" for i in range(4)}

    assert elapsed < BUDGET_S, f"kvemu demo took {elapsed:.1f} s (budget {BUDGET_S:.0f} s)"
