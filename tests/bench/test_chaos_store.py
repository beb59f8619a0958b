"""The shared KV store's chaos scenario (``bench/chaos.py --scenarios store_kill``): the store SIGKILLed under
load and started again; 0 requests lost, every replica resyncs, nothing left pinned."""

import json
import subprocess
import sys

import pytest

from tests.support.procs import REPO


@pytest.mark.slow
def test_killing_the_shared_store_under_load_loses_no_request():
    out = subprocess.run([sys.executable, "bench/chaos.py", "--short", "--scenarios", "store_kill"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)["scenarios"]["store_kill"]
    assert s["sent"] == 120 and s["failed"] == 0, s["failed_by_cause"]
    assert s["store_writes_before_kill"] > 0 and s["replica_store_failures"] > 0  # it was used, and it was missed
    assert s["pinned_blocks_after"] == 0 and s["replicas_resynced_s"] < 10
