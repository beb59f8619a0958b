"""docker-compose.yml, Dockerfile and deploy/prometheus.yml, proven without a Docker engine.

No Docker engine runs where these tests run, so the compose file is executed the way compose
would run it, but as local processes: every service except ``prometheus`` (a profile) and
``redis`` (replaced by a private ``redis-server`` on a free port) is started from its own
``command`` and ``environment``, after compose-style ``${VAR:-default}`` interpolation, with
service host names mapped to 127.0.0.1, every container port remapped to a free local port
(consistently in every command, URL, environment value and healthcheck), ``python`` /
``locust`` replaced by this virtualenv's, and services started in ``depends_on`` order
(waiting for a dependency's own healthcheck when the condition says ``service_healthy``).

Then the wiring is checked end to end: the router sees all replicas, a request goes through,
the replicas' KV events reach Redis (the router routes a repeated prompt as ``cache_hit`` and
the index holds its blocks), the Locust worker joins the master and a run started through the
master's web API reaches the router, every Prometheus target answers ``/metrics``, and every
healthcheck command passes.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml  # PyYAML, in the dev extra
from prometheus_client.parser import text_string_to_metric_families

from shared import tokenizer
from shared.hashing import block_hashes
from tests.conftest import RedisServer, free_port
from tests.support.cluster import redis_lookup, wait_for
from tests.support.procs import http, http_json
from tests.test_deploy_files import dashboard_metric_names

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
PROMETHEUS = REPO / "deploy" / "prometheus.yml"
DOCKERFILE = REPO / "Dockerfile"
KVEMU_SERVICES = ("router", "replica-0", "replica-1", "replica-2")
SKIPPED = ("redis", "prometheus", "grafana")
# Variables a user would export before `docker compose up`: a fast emulation for the test.
COMPOSE_ENV = {"KVEMU_TIME_SCALE": "0.02", "KVEMU_THINK_SCALE": "0.02", "KVEMU_MAX_TOKENS": "8",
               "KVEMU_CAPACITY_BLOCKS": "4000", "KVEMU_CLUSTER_TOKEN": "compose-test-token"}
OWN_PORT_FLAGS = ("--port", "--web-port", "--master-bind-port")  # ports the service itself listens on
PEER_PORT_FLAGS = {"--master-port": "--master-host"}  # port flag -> the flag naming its host
PEER_PORT_ENV = {"LOCUST_MASTER_NODE_PORT": "LOCUST_MASTER_NODE_HOST"}


# ---------------------------------------------------------------- compose semantics

_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<plain>[A-Za-z_]\w*))")


def interpolate(value, env: dict[str, str]):
    """Compose variable substitution: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("plain")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        if op == ":-":
            return current if current else arg
        if op == "-":
            return current if current is not None else arg
        if op in (":?", "?") and (current is None or (op == ":?" and not current)):
            raise AssertionError(f"compose variable {name} is required: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def load_compose(env: dict[str, str] | None = None) -> dict:
    with open(COMPOSE) as fh:
        doc = yaml.safe_load(fh)
    return interpolate(doc, env or {})


def as_list(command) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def env_dict(environment) -> dict[str, str]:
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, os.environ.get(item, "")) for item in environment)
    return {k: "" if v is None else str(v) for k, v in (environment or {}).items()}


def container_ports(service: dict) -> set[int]:
    """Container-side ports a service declares (``ports`` and ``expose``)."""
    out = set()
    for entry in list(service.get("ports") or []) + list(service.get("expose") or []):
        text = str(entry["target"] if isinstance(entry, dict) else entry).split("/")[0]
        out.add(int(text.rsplit(":", 1)[-1]))
    return out


def published_ports(service: dict) -> set[int]:
    out = set()
    for entry in service.get("ports") or []:
        parts = str(entry).split("/")[0].split(":")
        if len(parts) >= 2:
            out.add(int(parts[-2]))
    return out


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {d: (spec or {}).get("condition", "service_started") for d, spec in deps.items()}


def start_order(services: dict) -> list[str]:
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...] = ()) -> None:
        assert name not in trail, f"depends_on cycle: {' -> '.join(trail + (name,))}"
        if name in order:
            return
        for dep in depends_on(services[name]):
            assert dep in services, f"{name} depends on unknown service {dep}"
            visit(dep, trail + (name,))
        order.append(name)

    for name in services:
        visit(name)
    return order


def flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


class LocalMapping:
    """Container world -> this machine: host names to 127.0.0.1, container ports to free ports."""

    def __init__(self, services: dict, redis_port: int):
        self.services = set(services)
        self.ports: dict[tuple[str, int], int] = {}
        for name, svc in services.items():
            for port in sorted(container_ports(svc)):
                self.ports[(name, port)] = redis_port if name == "redis" else free_port()

    def port(self, service: str, port: int) -> int:
        try:
            return self.ports[(service, port)]
        except KeyError:
            raise AssertionError(f"{service} is reached on port {port}, which it neither publishes nor exposes; "
                                 f"declared: {sorted(p for s, p in self.ports if s == service)}") from None

    def value(self, text: str, self_service: str) -> str:
        """Rewrite HOST:PORT (also inside URLs and code strings), bare service names and 0.0.0.0."""
        hosts = "|".join(re.escape(h) for h in sorted(self.services, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w.-])(?P<host>{hosts}|127\.0\.0\.1|localhost|0\.0\.0\.0):(?P<port>\d+)\b")

        def sub(m: re.Match) -> str:
            host = m.group("host")
            service = self_service if host in ("127.0.0.1", "localhost", "0.0.0.0") else host
            return f"127.0.0.1:{self.port(service, int(m.group('port')))}"

        return pattern.sub(sub, text)

    def host(self, text: str) -> str:
        """A value that is a host name by position (``--master-host X``, ``*_HOST=X``, ``--host X``)."""
        return "127.0.0.1" if text in self.services or text in ("0.0.0.0", "localhost") else text

    def command(self, args: list[str], self_service: str) -> list[str]:
        out = []
        for i, tok in enumerate(args):
            prev = args[i - 1] if i else None
            if prev in OWN_PORT_FLAGS:
                tok = str(self.port(self_service, int(tok)))
            elif prev in PEER_PORT_FLAGS:
                peer = flag_value(args, PEER_PORT_FLAGS[prev])
                assert peer in self.services, f"{self_service}: {prev} belongs to unknown host {peer!r}"
                tok = str(self.port(peer, int(tok)))
            elif prev is not None and (prev.endswith("-host") or prev == "--host"):
                tok = self.host(tok)
            else:
                tok = self.value(tok, self_service)
            out.append(tok)
        return executable(out)

    def environment(self, env: dict[str, str], self_service: str) -> dict[str, str]:
        out = {}
        for key, value in env.items():
            if key in PEER_PORT_ENV:
                peer = env.get(PEER_PORT_ENV[key])
                assert peer in self.services, f"{self_service}: {key} belongs to unknown host {peer!r}"
                out[key] = str(self.port(peer, int(value)))
            elif key.endswith("_HOST") and "://" not in value:
                out[key] = self.host(value)
            else:
                out[key] = self.value(value, self_service)
        return out


def executable(args: list[str]) -> list[str]:
    """The image's ``python`` / ``locust`` -> this virtualenv's."""
    if args and args[0] in ("python", "python3"):
        return [sys.executable, *args[1:]]
    if args and args[0] == "locust":
        exe = Path(sys.executable).parent / "locust"
        return [str(exe), *args[1:]] if exe.exists() else [sys.executable, "-m", "locust", *args[1:]]
    return args


def healthcheck_argv(service: dict, mapping: LocalMapping, name: str) -> list[str] | None:
    test = (service.get("healthcheck") or {}).get("test")
    if not test or test == ["NONE"]:
        return None
    if isinstance(test, str):
        return ["sh", "-c", mapping.value(test, name)]
    if test[0] == "CMD":
        return mapping.command(as_list(test[1:]), name)
    if test[0] == "CMD-SHELL":
        return ["sh", "-c", mapping.value(test[1], name)]
    raise AssertionError(f"{name}: unsupported healthcheck form {test!r}")


# ---------------------------------------------------------------- processes


def _die_with_parent() -> None:  # between fork and exec: no orphans even if pytest is SIGKILLed
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Stack:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("LOCUST_", "KVEMU_"))}
        log = open(self.log_dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=REPO, env={**base, **env}, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_ok(argv: list[str], timeout: float = 10.0) -> bool:
    try:
        return subprocess.run(argv, cwd=REPO, capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_healthcheck(stack: Stack, name: str, argv: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        if run_ok(argv):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}'s healthcheck did not pass within {timeout}s:\n{stack.tail(name)}")


def post_form(url: str, fields: dict) -> dict:
    data = urllib.parse.urlencode(fields).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


# ---------------------------------------------------------------- tests


def test_compose_file_shape():
    """What a reader of the brief expects, checked statically (defaults, only the required token set)."""
    with pytest.raises(AssertionError, match="KVEMU_CLUSTER_TOKEN is required"):
        load_compose()  # 0.0.0.0 inside containers: no start without the cluster token
    doc = load_compose({"KVEMU_CLUSTER_TOKEN": "t"})
    services = doc["services"]
    assert {"redis", "router", "replica-0", "replica-1", "replica-2", "locust-master", "locust-worker",
            "prometheus"} <= set(services)
    assert services["prometheus"].get("profiles") == ["monitoring"]
    assert any(str(v).startswith("./deploy/prometheus.yml:") for v in services["prometheus"].get("volumes", []))
    for name in KVEMU_SERVICES:
        args = as_list(services[name]["command"])
        assert flag_value(args, "--host") == "0.0.0.0", name
        assert flag_value(args, "--index") == "redis://redis:6379/0", name
        assert "/health" in json.dumps(services[name]["healthcheck"]["test"]), name
        assert services[name]["environment"]["KVEMU_CLUSTER_TOKEN"] == "t", name
    replica_ports = [int(flag_value(as_list(services[f"replica-{i}"]["command"]), "--port")) for i in range(3)]
    assert len(set(replica_ports)) == 3, replica_ports
    ids = [flag_value(as_list(services[f"replica-{i}"]["command"]), "--replica-id") for i in range(3)]
    assert len(set(ids)) == 3, ids
    # every published host port distinct: the stack's ports also fit side by side on one host
    published = [p for svc in services.values() for p in published_ports(svc)]
    assert len(published) == len(set(published)), published
    master = as_list(services["locust-master"]["command"])
    assert "--master" in master and flag_value(master, "--web-port") == "8089"
    assert 8089 in container_ports(services["locust-master"])
    assert flag_value(master, "--web-host") == "0.0.0.0" and flag_value(master, "--master-bind-host") == "0.0.0.0"
    assert "--worker" in as_list(services["locust-worker"]["command"])

    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    assert ".[locust]" in dockerfile
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", dockerfile, re.M) for p in line.split()}
    for name in ("router", "replica-0", "replica-1", "replica-2", "locust-master"):
        assert container_ports(services[name]) <= exposed, (name, exposed)

    prom = yaml.safe_load(PROMETHEUS.read_text())
    targets = {t.split(":")[0] for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == set(KVEMU_SERVICES), targets


def test_compose_stack_runs_locally(tmp_path):
    doc = load_compose(COMPOSE_ENV)
    services = {name: svc for name, svc in doc["services"].items() if not svc.get("profiles")}
    order = [name for name in start_order(services) if name not in SKIPPED]
    redis = RedisServer()
    stack = Stack(tmp_path)
    try:
        redis.start()
        mapping = LocalMapping(doc["services"], redis.port)
        url = {name: f"http://127.0.0.1:{mapping.port(name, min(container_ports(services[name])))}"
               for name in KVEMU_SERVICES}
        checks = {}
        for name in order:
            svc = services[name]
            for dep, condition in depends_on(svc).items():
                if condition == "service_healthy" and dep in checks:
                    wait_healthcheck(stack, dep, checks[dep])
            stack.start(name, mapping.command(as_list(svc["command"]), name),
                        mapping.environment(env_dict(svc.get("environment")), name))
            argv = healthcheck_argv(svc, mapping, name)
            if argv is not None:
                checks[name] = argv

        # the router sees every replica healthy
        router = url["router"]
        wait_for(lambda: http_json("GET", router + "/health", timeout=2)[1].get("healthy_replicas") == 3,
                 timeout=30, what="3 healthy replicas behind the router")
        assert http_json("GET", router + "/health")[1]["index"] == "redis"

        # a request through the router; the replica's KV events reach Redis
        messages = [{"role": "system", "content": tokenizer.filler_text(300, seed=11)},
                    {"role": "user", "content": "compose wiring check"}]
        body = {"model": "kvemu", "messages": messages, "max_tokens": 4}
        status, hdrs, data = http("POST", router + "/v1/chat/completions", body, headers={"X-Session-Id": "c1"})
        assert status == 200, data[:500]
        served_by = hdrs["X-Kvemu-Replica"]
        assert json.loads(data)["choices"][0]["message"]["content"]
        hashes = block_hashes(tokenizer.encode(tokenizer.chat_template(messages)), 16)
        cluster_name = flag_value(as_list(services["router"]["command"]), "--cluster")
        wait_for(lambda: redis_lookup(redis.url, cluster_name, hashes).get(served_by) == len(hashes), timeout=10,
                 what=f"{served_by}'s {len(hashes)} blocks in the Redis index")

        def routed_by_cache():
            status, h, _ = http("POST", router + "/v1/chat/completions", body, headers={"X-Session-Id": "c2"})
            assert status == 200
            return h.get("X-Kvemu-Route-Reason") == "cache_hit" and h.get("X-Kvemu-Replica") == served_by

        wait_for(routed_by_cache, timeout=10, interval=0.2, what="a repeated prompt routed as cache_hit")

        # Locust: the worker joins the master; a run started through the web API reaches the router
        master = f"http://127.0.0.1:{mapping.port('locust-master', 8089)}"
        wait_for(lambda: get_json(master + "/stats/requests").get("worker_count") == 1, timeout=30,
                 what="the locust worker connected to the master")
        started = post_form(master + "/swarm", {"user_count": 3, "spawn_rate": 3})
        assert started.get("success"), started
        assert started.get("host") == router, started  # LOCUST_HOST=http://router:8000, mapped

        def locust_counts():
            stats = get_json(master + "/stats/requests")["stats"]
            rows = {(s["method"], s["name"]): s for s in stats}
            posts = sum(s["num_requests"] for (m, _), s in rows.items() if m == "POST")
            ttft = sum(s["num_requests"] for (m, _), s in rows.items() if m == "TTFT")
            return (posts, ttft, rows) if posts >= 3 and ttft >= 3 else None

        posts, ttft, rows = wait_for(locust_counts, timeout=20, interval=0.5, what="locust requests via the worker")
        post_form(master + "/stop", {})
        failures = sum(s["num_failures"] for (m, n), s in rows.items() if n != "Aggregated")
        assert failures == 0, rows
        aggregated = next(s for (m, n), s in rows.items() if n == "Aggregated")
        assert aggregated["num_requests"] == posts, rows  # real HTTP requests only, no TTFT samples

        # /metrics on every target Prometheus scrapes
        prom = yaml.safe_load(PROMETHEUS.read_text())
        scraped = []
        for job in prom["scrape_configs"]:
            path = job.get("metrics_path", "/metrics")
            for static in job["static_configs"]:
                for target in static["targets"]:
                    local = mapping.value(target, "prometheus")
                    status, _, text = http("GET", f"http://{local}{path}", timeout=5)
                    assert status == 200, (job["job_name"], target, status)
                    assert b"# TYPE" in text, (target, text[:200])
                    scraped.append(target.split(":")[0])
        assert set(scraped) == set(KVEMU_SERVICES), scraped
        # every series the Grafana dashboard charts exists on the running stack
        exposed = set()
        for name in KVEMU_SERVICES:
            text = http("GET", url[name] + "/metrics")[2].decode()
            exposed |= {smp.name for fam in text_string_to_metric_families(text) for smp in fam.samples}
        assert dashboard_metric_names() <= exposed, dashboard_metric_names() - exposed
        status, _, text = http("GET", url["replica-0"] + "/metrics")
        assert b"vllm:prefix_cache_queries" in text

        # every healthcheck, as written in the compose file, passes against the running stack
        for name, argv in checks.items():
            assert run_ok(argv), f"{name}'s healthcheck failed: {argv}"
        stack.check_alive()
    finally:
        stack.stop()
        redis.stop()
