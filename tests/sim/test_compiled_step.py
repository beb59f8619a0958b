"""The scheduler step and the simulator's loop compiled by mypyc (shared/compiled_modules.py) give every
field of ``kvemu sim``'s JSON that their Python source gives; and the one decision of which runs."""

import json
import os

import pytest

from shared import compiled_modules
from shared.compiled_modules import DIGEST_FILE, MODULES, compiled_usable, source_digest, source_path
from tests.support.kvemu_cli import run_kvemu

BUILT = compiled_modules.built_digest() is not None
REQUIRED = os.environ.get("KVEMU_REQUIRE_COMPILED") == "1"

CASES = {
    "batching_default": ["--trace", "mooncake-conversation", "--capacity-blocks", "3000"],
    "reorder_host_tier": ["--workload", "chat", "--duration", "60", "--set", "session_rate=2", "--capacity-gib", "2",
                          "--host-cache-gib", "8", "--scheduler", "reorder"],
    "cluster_inclusive_ssd": ["--workload", "agent", "--duration", "60", "--set", "session_rate=0.3", "--set",
                              "tool_fanout_prob=0", "--set", "subagent_prob=0", "--replicas", "4",
                              "--capacity-gib", "4", "--host-cache-gib", "8", "--ssd-cache-gib", "32",
                              "--tier-mode", "inclusive"],
    "cache_only_8_replicas_host_tier": ["--trace", "mooncake-conversation", "--capacity-blocks", "800", "--replicas", "8",
                                        "--cache-only", "--host-cache-gib", "16"],
    "radix_causal": ["--workload", "chat", "--duration", "40", "--set", "session_rate=1", "--matching", "radix",
                     "--capacity-gib", "8", "--causal"],
    "python_pool_s3fifo_no_decode_kv": ["--trace", "mooncake-conversation", "--capacity-blocks", "3000",
                                        "--policy", "s3fifo", "--python-core", "--no-decode-kv"],
    # the same loop with P/D's component: a colocated replica beside one prefill and one decode instance
    "pd_beside_colocated": ["--workload", "chat", "--duration", "40", "--set", "session_rate=1", "--capacity-gib", "8",
                            "--replicas", "1", "--prefill-replicas", "1", "--decode-replicas", "1"],
    # the same loop with dependent arrivals (loadgen.arrivals, compiled with it) and with DP's component
    "dependent_arrivals": ["--trace", "loadgen/data/agentic_mooncake_sample.jsonl", "--capacity-blocks", "4000",
                           "--replicas", "2"],
    "dp_ranks_routed_by_prefix": ["--workload", "chat", "--duration", "40", "--set", "session_rate=1",
                                  "--capacity-gib", "8", "--replicas", "2", "--data-parallel-size", "2"],
}
ENGINE_FIELDS = ("wall_s", "step_engine", "step_engine_reason")


def sim_runs(tmp_path, name: str, args: list[str], interpreted: bool) -> list[dict]:
    out = tmp_path / f"{name}-{int(interpreted)}.json"
    env = {"KVEMU_INTERPRETED": "1"} if interpreted else {}
    done = run_kvemu("sim", *args, "--quiet", "--jobs", "1", "--json", str(out), env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["runs"]


@pytest.mark.skipif(not (BUILT or REQUIRED), reason="no mypyc build here (a C compiler and mypyc at install make one)")
@pytest.mark.parametrize("name", CASES)
def test_the_compiled_step_reports_what_its_source_reports(tmp_path, name):
    compiled = sim_runs(tmp_path, name, CASES[name], interpreted=False)
    source = sim_runs(tmp_path, name, CASES[name], interpreted=True)
    assert [r["step_engine"] for r in compiled] == ["mypyc"] * len(compiled), compiled[0]["step_engine_reason"]
    assert [(r["step_engine"], r["step_engine_reason"]) for r in source] == [("python", "KVEMU_INTERPRETED is set")]
    for a, b in zip(compiled, source, strict=True):
        for field in ENGINE_FIELDS:
            del a[field], b[field]
        assert a == b


def _tree(tmp_path):
    for module in MODULES:
        path = source_path(module, tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {module}\n")
    return tmp_path


def test_a_build_runs_only_where_it_records_the_digest_of_exactly_its_sources(tmp_path):
    root = _tree(tmp_path)
    assert compiled_usable(root, {}) == (False, "no compiled build (a C compiler and mypyc at install build one)")
    (root / DIGEST_FILE).write_text(json.dumps({"sources_sha256": source_digest(root)}))
    assert compiled_usable(root, {}) == (True, "")
    assert compiled_usable(root, {"KVEMU_INTERPRETED": "1"}) == (False, "KVEMU_INTERPRETED is set")
    assert compiled_usable(root, {"KVEMU_INTERPRETED": "0"}) == (True, "")
    source_path(MODULES[-1], root).write_text("# edited since the build\n")  # one module edited: none runs compiled
    assert compiled_usable(root, {}) == (False, "the compiled build is older than its sources (pip install -e . rebuilds it)")
    (root / DIGEST_FILE).write_text("not json")
    assert compiled_usable(root, {})[0] is False
