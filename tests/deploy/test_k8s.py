"""The Kubernetes manifests (deploy/k8s), checked without a cluster: every file against the
Kubernetes API schemas (the real ``kubernetes-validate --strict``), and the wiring between the
objects of each variant (single-router, multi-router) as a cluster would resolve it: selectors,
ports, probes, the Secret, the router's replica list against the StatefulSet and its headless
Service, the Redis index URL, resources, the Prometheus annotations. The router's and the
replicas' command lines are parsed by their own argument parsers and settings, so a wrong
flag fails here. What is not checked: a live deployment (there is no cluster to run it on).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
SECRET_FILE = K8S / "cluster-token.yaml"  # applied (or created with kubectl) apart from the kustomizations
SCALE = K8S / "scale-replicas.sh"
VARIANTS = {"single-router": 1, "multi-router": 3}  # variant directory -> router pods
# The oldest and the newest schemas kubernetes-validate ships (it has 1.25 ... 1.37).
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")
VALIDATE = Path(sys.executable).with_name("kubernetes-validate")
IMAGE = "kvemu:" + tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TOKEN_ENV = "KVEMU_CLUSTER_TOKEN"
WORKLOADS = ("Deployment", "StatefulSet")
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")  # Kubernetes' $(VAR) in command, args and env values


# --- loading ------------------------------------------------------------------------------


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def render(directory: Path) -> list[dict]:
    """What ``kubectl apply -k directory`` applies. The kustomizations use only ``resources:``
    (refused otherwise), so that is the listed files' documents, directories rendered in turn."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kust) - {"apiVersion", "kind", "resources"}
    assert not extra, f"{directory}: kustomization fields this renderer does not apply: {sorted(extra)}"
    out: list[dict] = []
    for entry in kust["resources"]:
        target = (directory / entry).resolve()
        assert target.is_relative_to(K8S), target
        out += render(target) if target.is_dir() else load(target)
    return out


def cluster(variant: str) -> list[dict]:
    """Every object of one variant, with the Secret the pods need."""
    return render(K8S / variant) + load(SECRET_FILE)


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def find(objs: list[dict], kind: str, name: str) -> dict:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


def of_kind(objs: list[dict], *kinds: str) -> list[dict]:
    return [o for o in objs if o["kind"] in kinds]


def key(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def containers(workload: dict) -> list[dict]:
    return workload["spec"]["template"]["spec"]["containers"]


def template_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def selects(selector: dict | None, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_port(port: int | str, container: dict) -> int | None:
    """The container port a Service targetPort / probe port names (by name or number), if declared."""
    for p in container.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    return None


def kvemu_container(workload: dict, module: str) -> dict | None:
    """The container running ``python -m kvemu <module>`` (router or replica), if any."""
    for c in containers(workload):
        if c.get("command", [])[:4] == ["python", "-m", "kvemu", module]:
            return c
    return None


# --- the containers' command lines, as the processes would read them ------------------------


def secret_value(objs: list[dict], ref: dict) -> str | None:
    for s in of_kind(objs, "Secret"):
        if s["metadata"]["name"] == ref["name"]:
            data = {**s.get("data", {}), **s.get("stringData", {})}
            return data.get(ref["key"])
    return None


def container_env(objs: list[dict], container: dict, pod_name: str) -> dict[str, str]:
    """The environment Kubernetes gives the container (values, the pod's name, Secret keys)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = VAR.sub(lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
        elif "secretKeyRef" in e.get("valueFrom", {}):
            value = secret_value(objs, e["valueFrom"]["secretKeyRef"])
            if value is not None:
                env[e["name"]] = value
    return env


def command_line(objs: list[dict], container: dict, pod_name: str) -> tuple[list[str], dict[str, str]]:
    """The container's arguments after Kubernetes' ``$(VAR)`` expansion, and its environment."""
    env = container_env(objs, container, pod_name)
    args = [VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in container.get("args", [])]
    return args, env


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """The tokens the processes read from the environment, exactly as the container has them."""
    names = (TOKEN_ENV, "KVEMU_ADMIN_TOKEN")
    saved = {n: os.environ.pop(n, None) for n in names}
    os.environ.update({n: env[n] for n in names if n in env})
    try:
        yield
    finally:
        for n, v in saved.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def parse(module: str, argv: list[str], env: dict[str, str]):
    """``python -m <module> argv`` as far as its settings (argument parser, then validation)."""
    cmd = importlib.import_module(f"kvemu.{module}_cmd")  # what `python -m <module>` runs
    p = argparse.ArgumentParser(prog=f"python -m {module}")
    cmd.configure(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), environment(env):
            return cmd.settings_from_args(p.parse_args(argv))
    except SystemExit:
        raise ValueError(err.getvalue().strip().splitlines()[-1]) from None
    except Exception as exc:  # InputError and the like: what the process would refuse at start
        raise ValueError(str(exc)) from None


# --- the wiring checks -------------------------------------------------------------------


def generic_problems(objs: list[dict]) -> list[str]:
    """What holds for any set of manifests: names, selectors, ports, probes, Secrets, resources."""
    problems = []
    for (kind, name), n in Counter((o["kind"], o["metadata"]["name"]) for o in objs).items():
        if n > 1:
            problems.append(f"{kind}/{name} is defined {n} times")
    workloads = of_kind(objs, *WORKLOADS)
    for w in workloads:
        labels = template_labels(w)
        if not selects(w["spec"]["selector"].get("matchLabels"), labels):
            problems.append(f"{key(w)}: selector {w['spec']['selector']} does not match its pod labels {labels}")
        for t in w["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            if not selects(t["labelSelector"].get("matchLabels"), labels):
                problems.append(f"{key(w)}: topologySpreadConstraints select other pods than its own")
        for c in containers(w):
            where = f"{key(w)} container {c['name']}"
            for section in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in c.get("resources", {}).get(section, {}):
                        problems.append(f"{where}: no resources.{section}.{resource}")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe not in c:
                    if probe != "startupProbe":
                        problems.append(f"{where}: no {probe}")
                    continue
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = c[probe].get(handler, {}).get("port")
                    if port is not None and container_port(port, c) is None:
                        problems.append(f"{where}: {probe} port {port!r} is not a declared container port")
            defined: set[str] = set()
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and secret_value(objs, ref) is None:
                    problems.append(f"{where}: env {e['name']} needs Secret {ref['name']} with key {ref['key']!r},"
                                    " which no manifest defines")
                defined.add(e["name"])
            for text in c.get("command", []) + c.get("args", []):
                for var in VAR.findall(text):
                    if var not in defined:
                        problems.append(f"{where}: $({var}) is not in its env (Kubernetes would pass it literally)")
    for svc in of_kind(objs, "Service"):
        sel = svc["spec"].get("selector")
        targets = [w for w in workloads if selects(sel, template_labels(w))]
        if not targets:
            problems.append(f"{key(svc)}: selector {sel} selects no pod template")
        for w in targets:
            for sp in svc["spec"]["ports"]:
                target = sp.get("targetPort", sp["port"])
                if not any(container_port(target, c) for c in containers(w)):
                    problems.append(f"{key(svc)}: targetPort {target!r} is not a container port of {key(w)}")
    for sts in of_kind(objs, "StatefulSet"):
        name = sts["spec"].get("serviceName")
        svc = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == name]
        if not svc or svc[0]["spec"].get("clusterIP") != "None" or not selects(svc[0]["spec"].get("selector"),
                                                                               template_labels(sts)):
            problems.append(f"{key(sts)}: serviceName {name!r} is not a headless Service selecting its pods")
    for pdb in of_kind(objs, "PodDisruptionBudget"):
        if not any(selects(pdb["spec"]["selector"].get("matchLabels"), template_labels(w)) for w in workloads):
            problems.append(f"{key(pdb)}: selects no pod template")
    for pol in of_kind(objs, "NetworkPolicy"):
        guarded = [w for w in workloads if selects(pol["spec"]["podSelector"].get("matchLabels"), template_labels(w))]
        if not guarded:
            problems.append(f"{key(pol)}: podSelector selects no pod template")
        for rule in pol["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if not any(selects(peer["podSelector"].get("matchLabels"), template_labels(w)) for w in workloads):
                    problems.append(f"{key(pol)}: ingress from {peer['podSelector']} selects no pod template")
            for p in rule.get("ports", []):
                if not all(any(container_port(p["port"], c) for c in containers(w)) for w in guarded):
                    problems.append(f"{key(pol)}: port {p['port']!r} is not a container port of the pods it guards")
    return problems


def service_port(objs: list[dict], host: str, port: int) -> tuple[dict, int] | None:
    """The workload and container port behind ``host:port``, a Service's short or in-cluster name."""
    name = host.split(".")[0]
    rest = host[len(name) + 1:]
    if rest and not re.fullmatch(r"[a-z0-9-]+(\.svc(\.cluster\.local)?)?", rest):
        return None
    for svc in of_kind(objs, "Service"):
        if svc["metadata"]["name"] != name:
            continue
        for sp in svc["spec"]["ports"]:
            if sp["port"] == port:
                for w in of_kind(objs, *WORKLOADS):
                    if selects(svc["spec"].get("selector"), template_labels(w)):
                        for c in containers(w):
                            found = container_port(sp.get("targetPort", port), c)
                            if found:
                                return w, found
    return None


def kvemu_problems(objs: list[dict]) -> list[str]:
    """kvemu's own wiring: the processes' flags, the replica list, the index, the token, metrics."""
    problems = []
    workloads = of_kind(objs, *WORKLOADS)
    replica_sets = [w for w in workloads if kvemu_container(w, "replica")]
    routers = [w for w in workloads if kvemu_container(w, "router")]
    if len(replica_sets) != 1 or replica_sets[0]["kind"] != "StatefulSet" or not routers:
        return problems + ["expected one StatefulSet of replicas and at least one router Deployment"]
    sts = replica_sets[0]
    name, headless, count = sts["metadata"]["name"], sts["spec"]["serviceName"], sts["spec"]["replicas"]
    rep = kvemu_container(sts, "replica")
    for w in routers + replica_sets:
        for c in containers(w):
            if c["image"] != IMAGE:
                problems.append(f"{key(w)}: image {c['image']} is not {IMAGE} (the Dockerfile's server target)")
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        ports = {str(p["containerPort"]) for c in containers(w) for p in c.get("ports", [])}
        if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/path") != "/metrics":
            problems.append(f"{key(w)}: pods lack prometheus.io/scrape \"true\" and prometheus.io/path /metrics")
        if ann.get("prometheus.io/port") not in ports:
            problems.append(f"{key(w)}: prometheus.io/port {ann.get('prometheus.io/port')!r} is not a container port")

    replica_settings = {}
    for i in range(count):
        pod = f"{name}-{i}"
        args, env = command_line(objs, rep, pod)
        try:
            s = replica_settings[pod] = parse("replica", args, env)
        except ValueError as exc:
            problems.append(f"{key(sts)} pod {pod}: replica refuses its command line: {exc}")
            continue
        if s.replica_id != pod:
            problems.append(f"{key(sts)} pod {pod}: --replica-id is {s.replica_id!r}, not its pod name")
        if s.serving.host not in ("0.0.0.0", "::"):
            problems.append(f"{key(sts)}: replica binds {s.serving.host}, unreachable from other pods")
        if container_port(s.port, rep) is None:
            problems.append(f"{key(sts)}: replica listens on {s.port}, not a declared container port")
        if not s.serving.cluster_token or TOKEN_ENV not in env:
            problems.append(f"{key(sts)}: no cluster token in {TOKEN_ENV}")
    if len(set(s.replica_id for s in replica_settings.values())) != len(replica_settings):
        problems.append(f"{key(sts)}: replica ids repeat")
    if not replica_settings:
        return problems
    first = next(iter(replica_settings.values()))

    token_refs = {str(e["valueFrom"]["secretKeyRef"]) for w in routers + replica_sets for c in containers(w)
                  for e in c.get("env", []) if e["name"] == TOKEN_ENV and "valueFrom" in e}
    if len(token_refs) != 1:
        problems.append(f"router and replicas take {TOKEN_ENV} from different places: {sorted(token_refs)}")

    for w in routers:
        c = kvemu_container(w, "router")
        args, env = command_line(objs, c, w["metadata"]["name"])
        try:
            r = parse("router", args, env)
        except ValueError as exc:
            problems.append(f"{key(w)}: router refuses its command line: {exc}")
            continue
        if r.serving.host not in ("0.0.0.0", "::"):
            problems.append(f"{key(w)}: router binds {r.serving.host}, unreachable from its Service")
        if container_port(r.port, c) is None:
            problems.append(f"{key(w)}: router listens on {r.port}, not a declared container port")
        if not r.serving.cluster_token or r.serving.cluster_token != first.serving.cluster_token:
            problems.append(f"{key(w)}: the router's cluster token is not the replicas'")
        listed = set()
        for url in r.replicas:
            u = urlsplit(url)
            host = u.hostname or ""
            pod, _, rest = host.partition(".")
            m = re.fullmatch(re.escape(name) + r"-(\d+)", pod)
            svc, _, suffix = rest.partition(".")
            if not m or int(m.group(1)) >= count:
                problems.append(f"{key(w)}: replica URL {url}: {pod} is no pod of {key(sts)} (replicas: {count})")
            elif svc != headless or (suffix and not re.fullmatch(r"[a-z0-9-]+\.svc(\.cluster\.local)?", suffix)):
                problems.append(f"{key(w)}: replica URL {url}: not the pod's name under the headless Service {headless}")
            elif u.scheme != "http" or container_port(u.port or 80, rep) != first.port:
                problems.append(f"{key(w)}: replica URL {url}: port {u.port} is not the replica's port {first.port}")
            else:
                listed.add(pod)
        for i in range(count):
            if f"{name}-{i}" not in listed:
                problems.append(f"{key(w)}: the router does not list {name}-{i} (the StatefulSet has {count})")
        # the index the router reads is the Redis the replicas publish to
        idx = urlsplit(r.index)
        behind = service_port(objs, idx.hostname or "", idx.port or 6379) if idx.scheme == "redis" else None
        if behind is None or not any("redis" in cc["image"] for cc in containers(behind[0])):
            problems.append(f"{key(w)}: --index {r.index} is not the Redis Service's name and port")
        else:
            redis = next(cc for cc in containers(behind[0]) if "redis" in cc["image"])
            rargs = redis.get("args", [])
            if "--port" in rargs and int(rargs[rargs.index("--port") + 1]) != behind[1]:
                problems.append(f"{key(behind[0])}: redis-server --port is not its container port {behind[1]}")
            bind = rargs[rargs.index("--bind") + 1] if "--bind" in rargs else "127.0.0.1"  # redis.conf's default
            if bind != "0.0.0.0":
                problems.append(f"{key(behind[0])}: redis-server does not bind 0.0.0.0 (the Service cannot reach it)")
        for pod, s in replica_settings.items():
            for field in ("index", "cluster", "block_size"):
                if getattr(s, field) != getattr(r, field):
                    problems.append(f"{key(w)}: --{field.replace('_', '-')} {getattr(r, field)} differs from replica"
                                    f" {pod}'s {getattr(s, field)}")
    return problems


def wiring_problems(objs: list[dict]) -> list[str]:
    return generic_problems(objs) + kvemu_problems(objs)


# --- kubernetes-validate --------------------------------------------------------------------


def kubernetes_validate(path: Path, strict: bool = True) -> tuple[bool, str]:
    """``kubernetes-validate --strict -k V ...`` on one file. Passing means exit 0 and an INFO
    "passed" line for every document and version: it exits 0 with only a WARN for a kind it has no
    schema for (a typo in ``kind`` included), which is no validation."""
    cmd = [str(VALIDATE), *(["--strict"] if strict else [])]
    for v in KUBERNETES_VERSIONS:
        cmd += ["-k", v]
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    passed = re.findall(r"^INFO .* passed for resource .* against version (\S+)$", out, re.M)
    ok = (proc.returncode == 0 and "WARN" not in out and len(passed) == len(load(path)) * len(KUBERNETES_VERSIONS)
          and set(passed) == {v.rsplit(".", 1)[0] for v in KUBERNETES_VERSIONS})  # those schemas, not older ones
    return ok, out


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_passes_kubernetes_validate_strict(path):
    ok, out = kubernetes_validate(path)
    assert ok, out


def test_kubernetes_validate_rejects_an_invalid_field_and_an_unknown_kind(tmp_path):
    router = (K8S / "single-router" / "router.yaml").read_text()
    typo = tmp_path / "typo.yaml"
    typo.write_text(router.replace("readinessProbe:", "readinesProbe:", 1))
    ok, out = kubernetes_validate(typo)
    assert not ok and "ERROR" in out and "readinesProbe" in out, out
    assert kubernetes_validate(typo, strict=False)[0]  # only --strict refuses unknown fields
    wrong_type = tmp_path / "type.yaml"
    wrong_type.write_text(router.replace("replicas: 1", "replicas: one", 1))
    ok, out = kubernetes_validate(wrong_type, strict=False)
    assert not ok and "spec.replicas" in out, out
    kind = tmp_path / "kind.yaml"
    kind.write_text(router.replace("kind: Deployment", "kind: Deploymnet", 1))
    ok, out = kubernetes_validate(kind)
    assert not ok and "WARN" in out, out  # exit status 0: only the missing INFO line catches it


# --- the layout and the variants --------------------------------------------------------------


def test_every_manifest_file_is_in_a_variant():
    used = {SECRET_FILE}

    def walk(directory: Path) -> None:
        for entry in yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]:
            target = (directory / entry).resolve()
            walk(target) if target.is_dir() else used.add(target)

    for variant in VARIANTS:
        walk(K8S / variant)
    assert set(manifest_files()) == used


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_render_is_what_kubectl_kustomize_makes(variant):
    """Cross-check of the renderer with kubectl's built-in kustomize, where kubectl is installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here; the renderer applies `resources:` only (checked in render)")
    proc = subprocess.run([kubectl, "kustomize", str(K8S / variant)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr

    def order(objs):
        return sorted(objs, key=key)

    assert order(yaml.safe_load_all(proc.stdout)) == order(render(K8S / variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_wiring(variant):
    assert wiring_problems(cluster(variant)) == []


def test_the_variants_differ_in_the_router_count_only():
    single, multi = cluster("single-router"), cluster("multi-router")
    for variant, routers in VARIANTS.items():
        assert find(cluster(variant), "Deployment", "kvemu-router")["spec"]["replicas"] == routers
    a, b = find(single, "Deployment", "kvemu-router"), find(multi, "Deployment", "kvemu-router")
    assert containers(a) == containers(b)  # same flags, replica list and index
    args = kvemu_container(b, "router")["args"]
    assert args[args.index("--index") + 1].startswith("redis://")  # several routers share the Redis index
    assert "--workers" not in args  # one process per pod: its /metrics describes the pod
    base = {key(o) for o in single}
    assert {key(o) for o in multi} - base == {"PodDisruptionBudget/kvemu-router"}


def test_image_and_user_match_the_dockerfile():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+ AS server$", dockerfile, re.M)
    uid = int(re.search(r"--uid (\d+)", dockerfile).group(1))
    for variant in VARIANTS:
        for w in of_kind(cluster(variant), *WORKLOADS):
            if any(c["image"] == IMAGE for c in containers(w)):
                assert w["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid, key(w)


# --- the checks can fail -------------------------------------------------------------------------


def _container(objs, kind, name):
    return containers(find(objs, kind, name))[0]


def _set_arg(objs, kind, name, flag, value):
    args = _container(objs, kind, name)["args"]
    args[args.index(flag) + 1] = value


def _env(objs, kind, name, var):
    return next(e for e in _container(objs, kind, name)["env"] if e["name"] == var)


BREAKAGES = {
    "service selector typo": (
        lambda o: find(o, "Service", "kvemu-router")["spec"]["selector"].update(
            {"app.kubernetes.io/component": "routr"}),
        "Service/kvemu-router: selector"),
    "workload selector typo": (
        lambda o: find(o, "StatefulSet", "kvemu-replica")["spec"]["selector"]["matchLabels"].update(
            {"app.kubernetes.io/component": "replicas"}),
        "StatefulSet/kvemu-replica: selector"),
    "targetPort typo": (
        lambda o: find(o, "Service", "kvemu-replica")["spec"]["ports"][0].update({"targetPort": "htp"}),
        "targetPort 'htp'"),
    "probe on an undeclared port": (
        lambda o: _container(o, "Deployment", "kvemu-router")["readinessProbe"]["httpGet"].update({"port": 9000}),
        "readinessProbe port 9000"),
    "fewer replicas than the router lists": (
        lambda o: find(o, "StatefulSet", "kvemu-replica")["spec"].update({"replicas": 2}),
        "kvemu-replica-2 is no pod"),
    "more replicas than the router lists": (
        lambda o: find(o, "StatefulSet", "kvemu-replica")["spec"].update({"replicas": 4}),
        "does not list kvemu-replica-3"),
    "replica URL on the wrong port": (
        lambda o: _env(o, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS").update(
            value=_env(o, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS")["value"].replace(":8100", ":8101")),
        "is not the replica's port"),
    "replica URL under another service": (
        lambda o: _env(o, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS").update(
            value=_env(o, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS")["value"].replace(
                ".kvemu-replica:", ".kvemu-replicas:")),
        "headless Service"),
    "secret key typo": (
        lambda o: _env(o, "StatefulSet", "kvemu-replica", "KVEMU_CLUSTER_TOKEN")["valueFrom"]["secretKeyRef"].update(
            {"key": "tokn"}),
        "needs Secret kvemu-cluster-token with key 'tokn'"),
    "index on the wrong port": (
        lambda o: _set_arg(o, "Deployment", "kvemu-router", "--index", "redis://kvemu-redis:6380/0"),
        "is not the Redis Service"),
    "index on another host": (
        lambda o: _set_arg(o, "Deployment", "kvemu-router", "--index", "redis://redis:6379/0"),
        "is not the Redis Service"),
    "replicas publish elsewhere": (
        lambda o: _set_arg(o, "StatefulSet", "kvemu-replica", "--cluster", "other"),
        "--cluster default differs"),
    "block sizes differ": (
        lambda o: _set_arg(o, "Deployment", "kvemu-router", "--block-size", "32"),
        "--block-size 32 differs"),
    "no resource requests": (
        lambda o: _container(o, "Deployment", "kvemu-redis")["resources"].pop("requests"),
        "no resources.requests.cpu"),
    "unknown router flag": (
        lambda o: _container(o, "Deployment", "kvemu-router")["args"].__setitem__(0, "--bind"),
        "router refuses its command line"),
    "router on loopback": (
        lambda o: _set_arg(o, "Deployment", "kvemu-router", "--host", "127.0.0.1"),
        "router binds 127.0.0.1"),
    "fixed replica id": (
        lambda o: _set_arg(o, "StatefulSet", "kvemu-replica", "--replica-id", "gpu"),
        "not its pod name"),
    "no token for the replicas": (
        lambda o: _container(o, "StatefulSet", "kvemu-replica")["env"].remove(
            _env(o, "StatefulSet", "kvemu-replica", "KVEMU_CLUSTER_TOKEN")),
        "replica refuses its command line"),  # it will not bind 0.0.0.0 without one
    "scrape port undeclared": (
        lambda o: find(o, "StatefulSet", "kvemu-replica")["spec"]["template"]["metadata"]["annotations"].update(
            {"prometheus.io/port": "9100"}),
        "prometheus.io/port '9100'"),
    "network policy admits nobody": (
        lambda o: find(o, "NetworkPolicy", "kvemu-redis")["spec"]["ingress"][0]["from"][0]["podSelector"][
            "matchLabels"].update({"app.kubernetes.io/component": "routers"}),
        "NetworkPolicy/kvemu-redis: ingress from"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_wiring_check_reports_a_broken_copy(breakage):
    objs = copy.deepcopy(cluster("single-router"))
    mutate, expected = BREAKAGES[breakage]
    mutate(objs)
    problems = wiring_problems(objs)
    assert any(expected in p for p in problems), problems


def test_a_missing_secret_is_reported():
    problems = wiring_problems(render(K8S / "single-router"))  # the kustomization alone, no Secret applied
    assert any("needs Secret kvemu-cluster-token with key 'token'" in p for p in problems), problems


# --- scaling -----------------------------------------------------------------------------------


def test_scale_script_prints_the_routers_replica_list():
    for variant in VARIANTS:
        objs = cluster(variant)
        listed = _env(objs, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS")["value"]
        count = find(objs, "StatefulSet", "kvemu-replica")["spec"]["replicas"]
        out = subprocess.run([str(SCALE), "--urls", str(count)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == listed, out
    five = subprocess.run([str(SCALE), "--urls", "5"], capture_output=True, text=True, timeout=30).stdout.strip()
    objs = copy.deepcopy(cluster("multi-router"))
    find(objs, "StatefulSet", "kvemu-replica")["spec"]["replicas"] = 5
    _env(objs, "Deployment", "kvemu-router", "KVEMU_REPLICA_URLS")["value"] = five
    assert wiring_problems(objs) == []  # what the script sets is a consistent cluster
    bad = subprocess.run([str(SCALE), "--urls", "0"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr


def _fake_kubectl(tmp_path: Path, replicas: int) -> tuple[dict, Path]:
    """A ``kubectl`` on PATH that logs its arguments and says the StatefulSet has ``replicas``."""
    log = tmp_path / "kubectl.log"
    fake = tmp_path / "bin" / "kubectl"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *" get statefulset "*|"get statefulset "*)'
                    f' echo {replicas};; esac\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}, log


@pytest.mark.parametrize("current, target, order", [
    # grow: the new pods are ready before the routers list them
    (3, 5, ["scale", "rollout statefulset", "set env", "rollout deployment"]),
    # shrink: the routers see the last pods go (and clear them from the index) before the new list
    (5, 2, ["scale", "wait pod/kvemu-replica-2", "wait pod/kvemu-replica-3", "wait pod/kvemu-replica-4", "set env",
            "rollout deployment"]),
])
def test_scale_script_changes_the_statefulset_then_the_list(tmp_path, current, target, order):
    env, log = _fake_kubectl(tmp_path, current)
    proc = subprocess.run([str(SCALE), "-n", "kvemu", str(target)], capture_output=True, text=True, timeout=30,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert all(c.startswith("-n kvemu ") for c in calls), calls
    steps = []
    for c in calls[1:]:  # the first is the `get statefulset`
        if " scale statefulset kvemu-replica --replicas=" in c:
            assert c.endswith(f"--replicas={target}")
            steps.append("scale")
        elif " set env deployment/kvemu-router KVEMU_REPLICA_URLS=" in c:
            urls = c.split("KVEMU_REPLICA_URLS=", 1)[1].split(",")
            assert urls == [f"http://kvemu-replica-{i}.kvemu-replica:8100" for i in range(target)]
            steps.append("set env")
        elif " rollout status " in c:
            steps.append("rollout " + c.split(" rollout status ", 1)[1].split("/")[0])
        elif " wait --for=delete " in c:
            steps.append("wait " + c.split(" wait --for=delete ", 1)[1].split()[0])
    assert steps == order, calls


# --- the command lines, run as written ---------------------------------------------------------

SMOKE = r'''
import ctypes, json, os, signal, subprocess, sys, time, urllib.request
import redis
plan = json.load(open(sys.argv[1]))
work = os.path.dirname(sys.argv[1])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open(os.path.join(work, "hosts"), "w") as f:  # the in-cluster names, as cluster DNS would answer
    f.write("127.0.0.1 localhost " + " ".join(plan["names"]) + "\n")
subprocess.run(["mount", "--bind", os.path.join(work, "hosts"), "/etc/hosts"], check=True)

def die_with_parent():
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: none outlives a killed driver

procs = [subprocess.Popen(cmd, env={**os.environ, **env}, cwd=work, stdout=open(os.path.join(work, name + ".log"), "w"),
                          stderr=subprocess.STDOUT, preexec_fn=die_with_parent) for name, cmd, env in plan["procs"]]

def get(url, body=None):
    req = urllib.request.Request(url, data=body and json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)

out = {}
try:
    deadline = time.monotonic() + 30
    while get("http://kvemu-router:8000/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    out["router_health"] = get("http://kvemu-router:8000/health")
    out["replica_health"] = get("http://kvemu-replica-0.kvemu-replica:8100/health")
    body = {"model": "qwen3-coder-30b-a3b", "prompt": "kubernetes smoke " * 40, "max_tokens": 4}
    out["completions"] = [get("http://kvemu-router:8000/v1/completions", body) for _ in range(2)]
    out["metrics"] = get("http://kvemu-router:8000/metrics")
    out["kv_events_open"] = get("http://kvemu-replica-0.kvemu-replica:8100/kv/events")[0]
    out["redis_keys"] = redis.Redis(host="kvemu-redis", port=6379).dbsize()  # what the replica published
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=20)
json.dump(out, sys.stdout)
'''


def test_the_command_lines_start_and_serve_under_their_in_cluster_names(tmp_path):
    """Redis, replica kvemu-replica-0 and a router, each started with its container's command line
    (as Kubernetes expands it), in a private network namespace whose /etc/hosts answers the
    Service and pod names: the flags start the processes, and the router finds the replica and the
    Redis index by those names. One replica only (all bind the same port on one loopback); the
    router's other two replicas stay unresolved and unhealthy. Not Kubernetes: no image, no probes."""
    redis_server, unshare = shutil.which("redis-server"), shutil.which("unshare")
    if not (redis_server and unshare and shutil.which("ip")):
        pytest.skip("needs redis-server, unshare and ip")
    if subprocess.run([unshare, "-rnm", "true"], capture_output=True, timeout=10).returncode != 0:
        pytest.skip("no unprivileged user/network/mount namespaces here")
    objs = cluster("multi-router")
    redis = containers(find(objs, "Deployment", "kvemu-redis"))[0]
    rep = kvemu_container(find(objs, "StatefulSet", "kvemu-replica"), "replica")
    router = kvemu_container(find(objs, "Deployment", "kvemu-router"), "router")
    rep_args, rep_env = command_line(objs, rep, "kvemu-replica-0")
    router_args, router_env = command_line(objs, router, "kvemu-router-0")
    base = {"PYTHONPATH": str(REPO)}
    plan = {"names": ["kvemu-redis", "kvemu-router", "kvemu-replica-0.kvemu-replica"],
            "procs": [["redis", [redis_server, *redis["args"], "--dir", str(tmp_path)], {}],
                      ["replica", [sys.executable, "-m", "kvemu", "replica", *rep_args], {**base, **rep_env}],
                      ["router", [sys.executable, "-m", "kvemu", "router", *router_args], {**base, **router_env}]]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "smoke.py").write_text(SMOKE)
    proc = subprocess.run([unshare, "-rnm", sys.executable, str(tmp_path / "smoke.py"), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=90)
    logs = "\n".join(f"{p.name}: {p.read_text()[-2000:]}" for p in tmp_path.glob("*.log"))
    assert proc.returncode == 0, proc.stderr + logs
    out = json.loads(proc.stdout)
    status, health = out["router_health"]
    assert status == 200, (out, logs)
    health = json.loads(health)
    assert health["index"] == "redis" and health["healthy_replicas"] == 1 and health["replicas"] == 3, health
    assert json.loads(out["replica_health"][1])["replica_id"] == "kvemu-replica-0"  # the pod name
    (s1, first), (s2, second) = out["completions"]
    assert s1 == s2 == 200, out["completions"]
    assert json.loads(first)["kvemu"]["replica_id"] == "kvemu-replica-0"
    assert json.loads(second)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prefix came back
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="qwen3-coder-30b-a3b",replica_id="kvemu-replica-0"}' in \
        out["metrics"][1]
    assert out["redis_keys"] > 0, out
    assert out["kv_events_open"] == 401  # bound beyond loopback, the internal feed wants the cluster token
