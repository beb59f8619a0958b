"""router/metrics.py ``merge_vllm``: several replicas' ``vllm:*`` series as one exposition that Prometheus'
text parser reads, each family declared once (HELP and TYPE), every replica's samples under it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.metrics import merge_vllm


def replica_text(replica_id: str, running: int, counter_type_name: str = "vllm:prompt_tokens_total") -> str:
    """One replica's page: a gauge, a counter (its TYPE line as ``counter_type_name`` declares it), a histogram,
    and a kvemu series the merge leaves out."""
    labels = f'model_name="m",replica_id="{replica_id}"'
    return (f"# HELP vllm:num_requests_running Requests running.\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {running}.0\n"
            f"# HELP {counter_type_name} Prompt tokens.\n# TYPE {counter_type_name} counter\n"
            f"vllm:prompt_tokens_total{{{labels}}} {10 * running}.0\n"
            f"# HELP vllm:e2e_request_latency_seconds E2E latency.\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
            f'vllm:e2e_request_latency_seconds_bucket{{le="1.0",{labels}}} 1.0\n'
            f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",{labels}}} 2.0\n'
            f"vllm:e2e_request_latency_seconds_count{{{labels}}} 2.0\n"
            f"vllm:e2e_request_latency_seconds_sum{{{labels}}} 3.0\n"
            f"# HELP kvemu_csr CSR.\n# TYPE kvemu_csr gauge\nkvemu_csr{{{labels}}} 0.5\n")


def declarations(text: str) -> list[str]:
    return [line.rsplit(" ", 1)[0] if line.startswith("# TYPE") else " ".join(line.split()[:3])
            for line in text.splitlines() if line.startswith(("# HELP", "# TYPE"))]


def test_two_replicas_pages_merge_into_one_declaration_per_family():
    text = merge_vllm([replica_text("a", 1), replica_text("b", 2)]).decode()
    assert declarations(text) == [
        "# HELP vllm:num_requests_running", "# TYPE vllm:num_requests_running",
        "# HELP vllm:prompt_tokens_total", "# TYPE vllm:prompt_tokens_total",
        "# HELP vllm:e2e_request_latency_seconds", "# TYPE vllm:e2e_request_latency_seconds"]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert sorted(families) == ["vllm:e2e_request_latency_seconds", "vllm:num_requests_running", "vllm:prompt_tokens"]
    assert [(s.labels["replica_id"], s.value) for s in families["vllm:prompt_tokens"].samples] == [("a", 10.0), ("b", 20.0)]
    assert len(families["vllm:e2e_request_latency_seconds"].samples) == 8  # 2 buckets + count + sum, per replica


def test_a_counter_declared_without_total_by_one_replica_is_still_one_family():
    """``# TYPE vllm:prompt_tokens counter`` (the other spelling of a counter's TYPE line) over samples named
    ``vllm:prompt_tokens_total``: the parser hands those samples over as an untyped family of their own, which
    the merge folds back into the counter instead of declaring ``vllm:prompt_tokens_total`` a second time."""
    text = merge_vllm([replica_text("a", 1), replica_text("b", 2, counter_type_name="vllm:prompt_tokens")]).decode()
    assert declarations(text).count("# HELP vllm:prompt_tokens_total") == 1
    assert declarations(text).count("# TYPE vllm:prompt_tokens_total") == 1
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:prompt_tokens"]
    assert fam.type == "counter" and [s.value for s in fam.samples] == [10.0, 20.0]
