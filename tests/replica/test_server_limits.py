"""vLLM's length and capacity rules on real processes: ``--max-model-len`` refuses a request whose
prompt plus max_tokens exceeds it with a 400 naming the limit and the request's length (the
router passes it on), the one-line start-up warning where the pool cannot hold one request of
that length, and ``--gpu-memory-utilization`` printed at start."""

import json

from replica.settings import ReplicaSettings
from shared.costmodel import GIB, CostModel
from tests.support.cluster import start_router, stop_all
from tests.support.procs import Proc, http_json, start_replica


def test_a_request_over_max_model_len_is_a_400_naming_the_limit_and_its_length_through_the_router_too():
    rep = start_replica("--max-model-len", "64")
    router = None
    try:
        router = start_router([rep.url])
        for url in (rep.url + "/generate", router.url + "/generate"):
            ok = http_json("POST", url, {"token_ids": list(range(50)), "max_tokens": 14})  # 64 tokens: at the limit
            assert ok[0] == 200, ok
            status, err = http_json("POST", url, {"token_ids": list(range(50)), "max_tokens": 15})
            assert status == 400 and err["error"]["param"] == "max_tokens", err
            message = err["error"]["message"]
            assert "(max_model_len) is 64 tokens" in message and "asks for 65 (50 in the prompt, up to 15" in message
        status, out = http_json("POST", router.url + "/v1/completions",
                                {"model": "m", "prompt": "w " * 80, "max_tokens": 4})
        assert status == 400 and "(max_model_len) is 64 tokens" in out["error"]["message"], out
        _, st = http_json("GET", rep.url + "/stats")
        assert st["scheduler"]["refused"] == 3
    finally:
        stop_all(router, rep)


def _stderr(proc: Proc) -> str:
    proc.stop()
    assert proc.proc.stderr is not None
    return proc.proc.stderr.read().decode()


def test_a_pool_smaller_than_one_request_of_the_window_warns_in_one_line_and_serves_within_its_size():
    rep = start_replica(capacity_blocks=100)  # 1,600 tokens; the default model's window is 262,144
    try:
        status, err = http_json("POST", rep.url + "/generate", {"token_ids": list(range(1590)), "max_tokens": 11})
        assert status == 400 and "(max_model_len) is 1600 tokens" in err["error"]["message"]
    finally:
        lines = _stderr(rep).splitlines()
    warning = [x for x in lines if x.startswith("warning:")]
    assert warning == ["warning: the model's context window (262,144 tokens) needs 16,384 KV blocks of 16 tokens but"
                       " the pool holds 100 (1,600 tokens), where vLLM would refuse to start: give a larger capacity"
                       " (--capacity-gib / --capacity-tokens / --capacity-blocks / --gpu-memory-utilization) or"
                       " --max-model-len 1,600 or"
                       " less; going on with 1,600 tokens as the limit"]


def test_gpu_memory_utilization_sizes_the_pool_and_is_printed_at_start():
    rep = Proc(["-m", "kvemu", "replica", "--port", "0", "--model", "llama-3-8b", "--gpu", "h200",
                "--gpu-memory-utilization", "0.9", "--time-scale", "0"], 0)
    s = ReplicaSettings(model="llama-3-8b", gpu="h200", gpu_memory_utilization=0.9)
    blocks = s.resolved_capacity_blocks()
    assert blocks == 56_225  # shared/memory_rule.py's terms (tests/shared/test_memory_rule.py works them by hand)
    lines = _wait_lines(rep, 3)
    assert lines[0] == ("capacity (llama-3-8b): ceil(0.9 x 139.94 GiB of h200) - 14.96 GiB weights - 0.92 GiB"
                        " activations - 0.25 GiB non-torch = 109.81 GiB of KV per GPU: 56,225 blocks of 16 tokens")
    assert lines[1].startswith("cluster token: ")  # where the internal endpoints' token is
    assert f"({s.knobs.policy}, {blocks} blocks)" in lines[2]
    budget = CostModel.from_names("llama-3-8b", "h200").kv_budget(0.9, 8192, 256, 16)
    assert round(budget.kv_bytes / GIB, 2) == 109.81


def test_stats_and_the_sim_json_carry_the_memory_rule_terms(tmp_path):
    """The terms behind the pool's size, bytes per GPU, where vLLM's memory rule sized it: the replica's
    ``/stats`` and each run of ``kvemu sim --json`` (llama-3-8b, H200 at 0.9: 56,225 blocks, as above)."""
    from kvemu.cli import main
    from tests.conftest import free_port

    port = free_port()
    rep = Proc(["-m", "kvemu", "replica", "--port", str(port), "--model", "llama-3-8b", "--gpu", "h200",
                "--gpu-memory-utilization", "0.9", "--time-scale", "0"], port)
    try:
        rep.wait_healthy()
        _, st = http_json("GET", rep.url + "/stats")
    finally:
        rep.stop()
    rule = st["memory_rule"]
    # ceil(0.9 x 150,255,697,920) - 16,062,619,648 weights - 986,447,872 (the sampler run's peak, above the
    # forward's 838,860,800) - 268,435,456 non-torch = 117,912,625,152 bytes; over 2 MiB a block: 56,225
    assert (rule["requested_bytes"], rule["weight_bytes"], rule["activation_bytes"]) == (135_230_128_128, 16_062_619_648,
                                                                                         986_447_872)
    assert (rule["kv_bytes"], rule["blocks"], rule["terms"]) == (117_912_625_152, 56_225,
                                                                 ["weights", "activations", "non-torch memory"])
    out = tmp_path / "sim.json"
    assert main(["sim", "--workload", "scm", "--duration", "60", "--quiet", "--model", "llama-3-8b", "--gpu", "h200",
                 "--gpu-memory-utilization", "0.9,0.5", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs[0]["memory_rule"] == rule
    # 0.5: ceil(0.5 x 150,255,697,920) = 75,127,848,960, less the same terms = 57,810,345,984 bytes: 27,566 blocks
    assert [(r["capacity_blocks"], r["memory_rule"]["utilization"], r["memory_rule"]["blocks"]) for r in runs] == \
        [(56_225, 0.9, 56_225), (27_566, 0.5, 27_566)]
    assert runs[1]["memory_rule"]["kv_bytes"] == 57_810_345_984


def _wait_lines(proc: Proc, n: int) -> list[str]:
    """The first ``n`` lines the process writes to stderr (it binds port 0, so it is never 'healthy' here)."""
    assert proc.proc.stderr is not None
    try:
        return [proc.proc.stderr.readline().decode().rstrip("\n") for _ in range(n)]
    finally:
        proc.stop()
