"""The deploy files a user hands to other tools: the compose file against the compose-spec
JSON schema (check-jsonschema's vendored copy, what `docker compose config` enforces), and
the Grafana dashboard with its provisioning. That every charted series exists on a running
stack is checked in test_compose.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
PROMETHEUS = REPO / "deploy" / "prometheus.yml"
GRAFANA = REPO / "deploy" / "grafana"
CHECK_JSONSCHEMA = str(Path(sys.executable).with_name("check-jsonschema"))


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def validate_compose_schema(path: Path) -> subprocess.CompletedProcess:
    """check-jsonschema with its vendored compose-spec schema: what `docker compose config` enforces."""
    return subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid_compose_spec(tmp_path):
    proc = validate_compose_schema(COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the validator does catch what Docker Compose rejects: an empty `environment:` (null)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace('      - "8000:8000"', '      - "8000:8000"\n    environment:', 1))
    proc = validate_compose_schema(broken)
    assert proc.returncode == 1 and "$.services.router.environment" in proc.stdout, proc.stdout


def dashboard_metric_names() -> set[str]:
    doc = json.loads((GRAFANA / "dashboards" / "kvemu.json").read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    assert len(exprs) >= 12
    return {m for e in exprs for m in re.findall(r"\b(?:vllm:|kvemu_)[a-z0-9_:]+", e)}


def test_grafana_profile_provisions_the_dashboard():
    services = load_compose()["services"]
    grafana = services["grafana"]
    assert grafana.get("profiles") == ["monitoring"] and "prometheus" in grafana["depends_on"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts == {"./deploy/grafana/provisioning": "/etc/grafana/provisioning",
                      "./deploy/grafana/dashboards": "/var/lib/grafana/dashboards"}
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert source["url"] == "http://prometheus:9090" and source["uid"] == "kvemu-prometheus"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "kvemu.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    doc = json.loads((GRAFANA / "dashboards" / "kvemu.json").read_text())
    uids = {t["datasource"]["uid"] for panel in doc["panels"] for t in panel["targets"]}
    assert uids == {"kvemu-prometheus"}
    assert {"vllm:e2e_request_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
            "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket"} <= dashboard_metric_names()
    # Prometheus keeps one copy of the vLLM series: the router's merged copy is dropped
    router_job = next(j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
                      if j["job_name"] == "kvemu-router")
    assert router_job["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": "vllm:.*",
                                                     "action": "drop"}]
