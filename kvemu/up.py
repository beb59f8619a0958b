"""``kvemu up``: a router and N replicas as local processes, stopped together.

Children run in their own process group with PR_SET_PDEATHSIG, so they die with this
process even if it is killed with SIGKILL; on Ctrl-C or SIGTERM every child gets SIGTERM
(in-flight requests finish), then SIGKILL after a grace period. No orphans. A child that
dies meanwhile is started again on the same command line (kvemu/up_supervise.py); up stops
everything only for one that cannot start.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvemu.options.backend import BACKEND_OPTIONS
from kvemu.options.config_file import add_config_arg
from kvemu.options.disagg import (
    PD_DECIDER_OPTIONS,
    PD_HOLD_SHARE_OPTION,
    PD_HOLD_TIMEOUT_OPTION,
    PD_LINK_OPTIONS,
    add_pd_args,
)
from kvemu.options.gpu import add_gpu_args
from kvemu.options.index import CLUSTER
from kvemu.options.kv_cache_dtype import KV_CACHE_DTYPE
from kvemu.options.kv_events import add_kv_events_arg, kv_events_argv
from kvemu.options.kv_store import add_shared_args
from kvemu.options.limits import (
    CAPACITY_OPTIONS,
    MAX_MODEL_LEN,
)
from kvemu.options.matching import BLOCK_SIZE, HIT_MODE, MATCHING_OPTION, PAGE_SIZE
from kvemu.options.option import add_options, forward
from kvemu.options.parallel import OPTIONS as PARALLEL_OPTIONS
from kvemu.options.prefix_caching import PREFIX_CACHING
from kvemu.options.replica_flags import ADMIN_TOKEN, ADMIN_TOKEN_ENV, MODEL, POLICY, TIME_SCALE, given_admin_token
from kvemu.options.response_kv import RESPONSE_KV_OPTION
from kvemu.options.reuse import SHARDS_RATE
from kvemu.options.router_flags import ROUTING_OPTIONS
from kvemu.options.scheduler import LIVE_SCHEDULER_OPTIONS
from kvemu.options.serving import (
    COMMAND_LINE_TOKEN_WARNING,
    SERVER_OPTIONS,
    TOKEN_ENV,
    command_line_token_warning,
    given_cluster_token,
)
from kvemu.options.speculative import SPECULATIVE_OPTIONS
from kvemu.options.tiers import TIER_OPTIONS, add_tier_args
from kvemu.router_cmd import ROUTER_OPTIONS
from kvemu.up_pd import pool_args
from kvemu.up_plan import UpPlan, validate
from kvemu.up_store import TRANSFORMED_SHARED, replica_shared_argv, router_shared_argv, store_args, store_groups, store_id
from kvemu.up_supervise import RESTART_ATTEMPTS, RestartPolicy, Supervisor
from shared.errors import InputError, KvemuError
from shared.runtime_dir import shared_cluster_token

PR_SET_PDEATHSIG = 1

# The flags up takes and hands on as they are, each from its one definition (kvemu/options/):
# up adds exactly these to its parser and forwards exactly these, so none is taken and dropped.
# Every other flag up shares with a child is in TRANSFORMED, which says what up hands on instead;
# tests/kvemu/test_options.py compares both with the children's parsers.
TO_REPLICAS = (POLICY, MODEL, TIME_SCALE, HIT_MODE, *LIVE_SCHEDULER_OPTIONS, SHARDS_RATE, RESPONSE_KV_OPTION,
               PREFIX_CACHING, MAX_MODEL_LEN, *SPECULATIVE_OPTIONS, *CAPACITY_OPTIONS, *TIER_OPTIONS, *BACKEND_OPTIONS, *PARALLEL_OPTIONS)
# --matching, --page-size, --block-size: the router hashes prompts in the replicas' blocks or pages; --cluster: the Redis keys'
# namespace (a replica without --index publishes nowhere and ignores it); body limits, connection
# caps, timeouts (the token travels in the environment)
TO_BOTH = (MATCHING_OPTION, PAGE_SIZE, BLOCK_SIZE, CLUSTER, *SERVER_OPTIONS)
TO_ROUTER = (*ROUTING_OPTIONS, *ROUTER_OPTIONS)  # strategy and settings, health and dashboard intervals, client limits
TO_PD_REPLICAS = (*PD_LINK_OPTIONS, PD_HOLD_TIMEOUT_OPTION, PD_HOLD_SHARE_OPTION)  # to P/D replicas only, beside --role
TRANSFORMED = {
    "--port": "up's router port, given to the router as --port; each replica gets a port of its own",
    "--replicas": "up's: how many replicas to start; the router's: their URLs",
    "--index": "memory, redis or a URL: the router gets memory or the Redis URL, each replica the URL (none with memory)",
    "--cluster-token": "through the environment (KVEMU_CLUSTER_TOKEN), never on a command line other users can read",
    "--admin-token": "through the environment (KVEMU_ADMIN_TOKEN), as the cluster token",
    "--gpu": "--gpu, --gpu-file and --tp become one --gpu NAME@tpN (kvemu.options.gpu.gpu_setting)",
    "--gpu-file": "as --gpu",
    "--tp": "as --gpu",
    "--kv-cache-dtype": "joins --model as one --model NAME@kv=DTYPE (kvemu.options.kv_cache_dtype.model_setting)",
    "--kv-events-config": "replica i gets the config with the endpoints' ports plus i x --data-parallel-size"
                          " (kv_events_argv; each rank adds its own, as vLLM's)",
    **{o.flag: "to the prefill and decode replicas only (with their --role): colocated ones move no KV"
       for o in TO_PD_REPLICAS},
    **{o.flag: "to the router only in a P/D cluster (the prefill pool's strategy and the decider: a colocated"
               " cluster has neither)" for o in PD_DECIDER_OPTIONS},
    **TRANSFORMED_SHARED,
}


def _child_setup(parent: int):
    def setup() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)  # own process group: a terminal's Ctrl-C reaches only `kvemu up`, which stops us in order
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:  # not Linux: the parent's signal handlers still stop the children
            pass
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Child:
    name: str
    args: list[str]
    url: str = ""
    proc: subprocess.Popen | None = None
    kind: str = "replica"  # replica, router, store or redis: which secrets it is handed (Cluster.child_env)

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None


@dataclass
class Cluster:
    """The running processes; ``stop()`` is idempotent."""

    children: list[Child] = field(default_factory=list)
    router_url: str = ""
    replica_urls: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)  # each replica's, beside its URL
    redis_url: str | None = None
    store_urls: list[str] = field(default_factory=list)  # the shared KV stores (kvemu/up_store.py)
    tmpdir: str | None = None
    token: str = ""
    token_path: str | None = None  # the shared file the token is in; None for a token given
    admin_token: str = ""  # the replicas' /admin/* token ("": admin endpoints off)
    redis_password: str = ""  # a given Redis URL's password, kept off the children's command lines

    def start(self, child: Child, log_dir: str) -> None:
        log = open(os.path.join(log_dir, f"{child.name}.log"), "ab")
        env = self.child_env(child.kind)
        child.proc = subprocess.Popen(child.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_child_setup(os.getpid()), env=env)
        log.close()  # the child has its own copy; a restarted child gets a new one
        self.children.append(child)

    def respawn(self, child: Child) -> None:
        """``child`` again, after it died: the same command line (so the same port), environment and log."""
        self.children.remove(child)
        self.start(child, self.tmpdir or tempfile.gettempdir())

    def child_env(self, kind: str) -> dict[str, str]:
        """A child's environment: the secrets it uses and no other (the admin token opens a replica's
        /admin/*, the stores and the router have none; redis-server none at all), in the environment,
        which only the owner reads (/proc/PID/environ), never on a command line every user can read."""
        from shared.index.redis_index import PASSWORD_ENV

        env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, ADMIN_TOKEN_ENV, PASSWORD_ENV)}
        if self.token and kind != "redis":
            env[TOKEN_ENV] = self.token
        if self.admin_token and kind == "replica":
            env[ADMIN_TOKEN_ENV] = self.admin_token
        if self.redis_password and kind != "redis":
            env[PASSWORD_ENV] = self.redis_password
        return env

    def stop(self, grace: float = 15.0) -> None:
        alive = [(c.name, c.proc) for c in self.children if c.proc is not None and c.proc.poll() is None]
        # Router first, so no new requests reach replicas that are draining.
        for _, proc in sorted(alive, key=lambda item: item[0] != "router"):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in alive:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.proc and c.proc.poll() is not None]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_healthy(cluster: Cluster, urls: list[str], timeout: float, log_dir: str) -> None:
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        for c in cluster.dead():
            last = _tail(os.path.join(log_dir, f"{c.name}.log"), 1).strip()
            raise KvemuError(f"{c.name} exited with code {c.exit_code} during start-up"
                             + (f": {last.removeprefix('error: ')}" if last else ""))
        pending = [u for u in pending if not _healthy(u)]
        if pending:
            time.sleep(0.1)
    if pending:
        raise KvemuError(f"not healthy after {timeout:.0f} s: {', '.join(pending)}")


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, "rb") as fh:
            return b"\n".join(fh.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


def start_redis(log_dir: str) -> tuple[Child, str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise KvemuError("--index redis needs redis-server on PATH (Debian/Ubuntu: apt-get install redis-server),"
                         " or pass --index redis://host:port/0 for a Redis you run yourself")
    port = free_port()
    child = Child("redis", [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", log_dir], kind="redis")
    return child, f"redis://127.0.0.1:{port}/0"


def replica_args(i: int, port: int, plan: UpPlan, index: str | None, replica_id: str = "", role: str = "both",
                 peers: list[str] | None = None, store_urls: Sequence[str] = ()) -> list[str]:
    """Replica ``i``'s command line: every flag of TO_REPLICAS and TO_BOTH (the capacity one as validate
    checked and defaulted it), and those of TRANSFORMED as up turns them; a P/D replica gets its pool's
    shape (``pool_args``), its ``--role`` and the link flags. ``peers``: the cluster's replicas, the only
    addresses a request may have it contact for KV (--pd-peers); ``store_urls``: the shared KV stores started."""
    flags = plan.flags
    pool = pool_args(flags, plan.pd, role)
    args = [sys.executable, "-m", "kvemu", "replica", "--port", str(port), "--replica-id", replica_id or f"replica-{i}",
            "--gpu", pool.gpu, *forward((*TO_REPLICAS, *TO_BOTH), pool),
            *kv_events_argv(flags, i * flags.data_parallel_size), *(["--pd-peers", ",".join(peers)] if peers else [])]
    if role != "both":
        args += ["--role", role, *forward(TO_PD_REPLICAS, flags)]
    return args + (["--index", index] if index else []) + replica_shared_argv(plan, i, store_urls)


def router_args(port: int, plan: UpPlan, replica_urls: list[str], index: str, roles: list[str] | None = None,
                store_urls: Sequence[str] = ()) -> list[str]:
    """The router's command line: every flag of TO_ROUTER and TO_BOTH, and --replicas (``ROLE=URL`` for a P/D
    replica), --index as up turns them."""
    flags = plan.flags
    urls = [u if not roles or roles[i] == "both" else f"{roles[i]}={u}" for i, u in enumerate(replica_urls)]
    return [sys.executable, "-m", "kvemu", "router", "--port", str(port), "--replicas", ",".join(urls),
            "--index", index, "--workers", str(flags.routers), *forward((*TO_BOTH, *TO_ROUTER), flags),
            *(forward(PD_DECIDER_OPTIONS, flags) if plan.pd is not None else []),
            *router_shared_argv(plan, store_urls)]


def bring_up(plan: UpPlan, log_dir: str | None = None) -> Cluster:
    """Start everything and wait for health; on failure stop what started and raise."""
    a = plan.flags
    log_dir = log_dir or tempfile.mkdtemp(prefix="kvemu-up-")
    cluster = Cluster(tmpdir=log_dir)
    # One token for the whole cluster (replicas' /kv/*), passed through the environment so it
    # is not on command lines: the one given, else the one this user's processes on this host
    # share (shared.runtime_dir: made if missing), so a router or replica started apart finds it.
    cluster.token = given_cluster_token(a) or ""
    cluster.admin_token = given_admin_token(a) or ""
    if not cluster.token:
        cluster.token, cluster.token_path = shared_cluster_token()
    try:
        from shared.index.redis_index import split_password

        index, password = split_password(_index_for(a, cluster, log_dir))
        cluster.redis_password = password or ""
        start_stores(cluster, plan, log_dir, index)
        members = plan.members()
        ports = [a.replica_base_port + i if a.replica_base_port else free_port() for i in range(len(members))]
        peers = [f"127.0.0.1:{port}" for port in ports]  # the roster: no request sends a replica elsewhere
        for i, ((replica_id, role), port) in enumerate(zip(members, ports, strict=True)):
            url = f"http://127.0.0.1:{port}"
            args = replica_args(i, port, plan, index if index != "memory" else None, replica_id, role, peers,
                                cluster.store_urls)
            cluster.start(Child(replica_id, args, url), log_dir)
            cluster.replica_urls.append(url)
            cluster.roles.append(role)
        router_port = a.port or free_port()
        cluster.router_url = f"http://127.0.0.1:{router_port}"
        router = router_args(router_port, plan, cluster.replica_urls, index, cluster.roles, cluster.store_urls)
        cluster.start(Child("router", router, cluster.router_url, kind="router"), log_dir)
        wait_healthy(cluster, cluster.replica_urls + [cluster.router_url], a.start_timeout, log_dir)
        _wait_router_sees_all(cluster.router_url, len(members), a.start_timeout)
    except BaseException:
        cluster.stop(grace=3.0)
        raise
    return cluster


def start_stores(cluster: Cluster, plan: UpPlan, log_dir: str, index: str) -> None:
    """The shared KV stores first (kvemu/up_store.py): every replica checks its store at start. With a Redis
    index each store ships what it holds there too, as the replicas do."""
    for k in range(store_groups(plan)):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        redis = ["--index", index, "--cluster", plan.flags.cluster] if index != "memory" else []
        cluster.start(Child(store_id(plan, k), store_args(plan, k, port) + redis, url, kind="store"), log_dir)
        cluster.store_urls.append(url)
    if cluster.store_urls:
        wait_healthy(cluster, cluster.store_urls, plan.flags.start_timeout, log_dir)


def _index_for(a, cluster: Cluster, log_dir: str) -> str:
    if a.index == "memory":
        return "memory"
    if a.index == "redis":
        child, url = start_redis(log_dir)
        cluster.start(child, log_dir)
        cluster.redis_url = url
        _wait_port(url)
        return url
    if a.index.startswith(("redis://", "rediss://")):
        check_redis(a.index)
        return a.index
    raise InputError("--index", f"expected memory, redis or redis://host:port/db, got {a.index!r}")


def check_redis(url: str) -> None:
    """Fail in one line, before any process starts, when the given Redis does not answer."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise KvemuError(f"cannot reach Redis at {url} ({exc}); start it, or use --index redis (a private"
                         " redis-server) or --index memory") from None


def _wait_port(url: str, timeout: float = 10.0) -> None:
    host, port = url.split("//")[1].split("/")[0].split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise KvemuError(f"redis-server did not start on {url}")


def _wait_router_sees_all(router_url: str, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(router_url + "/health", timeout=1.0) as resp:
                if json.load(resp).get("healthy_replicas") == n:
                    return
        except OSError:
            pass
        time.sleep(0.1)


def add_cluster_args(p: argparse.ArgumentParser, replicas: int = 4) -> None:
    p.add_argument("--replicas", type=int, default=None,
                   help=f"colocated replicas (default {replicas}; 0 beside --prefill-replicas / --decode-replicas)")
    p.set_defaults(default_replicas=replicas)
    from replica.settings import live_policy_names

    POLICY.add(p, help=f"eviction policy: {', '.join(live_policy_names())} (default {POLICY.default})")
    capacity = p.add_mutually_exclusive_group()
    add_options(capacity, CAPACITY_OPTIONS)  # none: vLLM's default (default_capacity)
    add_gpu_args(p)
    KV_CACHE_DTYPE.add(p)
    add_options(p, BACKEND_OPTIONS)
    add_options(p, [o for o in TO_REPLICAS if o not in (POLICY, *CAPACITY_OPTIONS, *TIER_OPTIONS, *BACKEND_OPTIONS)])
    add_options(p, (MATCHING_OPTION, PAGE_SIZE, BLOCK_SIZE))
    CLUSTER.add(p)
    add_options(p.add_argument_group("serving limits (the router and every replica)"), SERVER_OPTIONS)
    add_options(p.add_argument_group("router"), TO_ROUTER)
    p.add_argument("--index", default="memory", help="memory, redis (a private redis-server) or redis://host:port/db")
    p.add_argument("--cluster-token", default=None,
                   help="token the router and replicas share for /kv/* (default: KVEMU_CLUSTER_TOKEN, else the one in"
                        " the runtime directory's cluster-token file, shared with every kvemu process of this user"
                        " on this host: KVEMU_RUNTIME_DIR, else ~/.local/share/kvemu/runtime); warning: a token on a"
                        " command line is readable by every user of this host (ps, /proc/PID/cmdline): prefer"
                        " KVEMU_CLUSTER_TOKEN, which up hands on in the environment")
    ADMIN_TOKEN.add(p)  # handed to the replicas in the environment (TRANSFORMED)
    p.add_argument("--routers", type=int, default=1,
                   help="router processes sharing the router port; a supervisor restarts any that dies")
    p.add_argument("--start-timeout", type=float, default=30.0)
    p.add_argument("--replica-base-port", type=int, default=0, help="replica i listens on BASE+i (default: free ports)")
    add_tier_args(p)
    add_kv_events_arg(p)
    add_pd_args(p)  # the topology, each pool's shape, the decider (the router's) and the link (the P/D replicas')
    PD_HOLD_TIMEOUT_OPTION.add(p)
    PD_HOLD_SHARE_OPTION.add(p)
    add_shared_args(p)  # the shared KV store: up starts it (kvemu/up_store.py)


def configure(p: argparse.ArgumentParser) -> None:
    add_cluster_args(p)
    add_config_arg(p)
    p.add_argument("--port", type=int, default=8000, help="router port")
    p.add_argument("--keep-logs", action="store_true", help="keep the log directory after a clean stop")
    p.add_argument("--restart-attempts", type=int, default=RESTART_ATTEMPTS, metavar="N",
                   help="a child that dies (replica, shared store, router, private redis) is started again on its port,"
                        " waiting 0.5 s doubling to 10 s; up stops everything once N restarts in a row died before"
                        " answering (0: no restart, the first child that dies stops everything; default %(default)s)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="also write the cluster token to PATH (mode 0600); without it the token line names the shared"
                        " file in the runtime directory; not written when the token was given")


def write_token(cluster: Cluster, a: argparse.Namespace) -> str | None:
    """Where an operator finds the token (the guarded endpoints: /kv/*, ?sessions=raw): the shared
    file it is in, or with ``--token-file`` a copy of it there (mode 0600); None when the token was
    given (the operator has it) and then nothing is written."""
    if cluster.token_path is None:
        return None
    path = a.token_file
    if not path:
        return cluster.token_path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise InputError("--token-file", f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # a file that was there keeps its old mode through O_CREAT
        fh.write(cluster.token + "\n")
    return path


def print_limit_lines(plan: UpPlan) -> None:
    """The capacity --gpu-memory-utilization gives and the max_model_len warning (validate's), on stderr."""
    for line in plan.limit_lines:
        print(line, file=sys.stderr, flush=True)


def run(a) -> int:
    plan = validate(a)
    policy = RestartPolicy(attempts=a.restart_attempts)
    print_limit_lines(plan)
    if a.cluster_token:
        print(COMMAND_LINE_TOKEN_WARNING, file=sys.stderr, flush=True)
    if a.admin_token:
        print(command_line_token_warning(ADMIN_TOKEN.flag, ADMIN_TOKEN_ENV), file=sys.stderr, flush=True)
    stop = {"now": False, "starting": True}

    def on_signal(signum, frame):
        stop["now"] = True
        if stop["starting"]:  # interrupt start-up at once; bring_up stops what it started
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log_dir = tempfile.mkdtemp(prefix="kvemu-up-")
    try:
        cluster = bring_up(plan, log_dir)
    except KeyboardInterrupt:
        shutil.rmtree(log_dir, ignore_errors=True)
        print("stopped during start-up", file=sys.stderr)
        return 130
    except KvemuError as exc:
        if not os.listdir(log_dir):  # nothing started: nothing to read
            shutil.rmtree(log_dir, ignore_errors=True)
            raise
        raise KvemuError(f"{exc} (logs kept in {log_dir})") from None
    stop["starting"] = False
    try:
        token_file = write_token(cluster, a)
        print(f"router   {cluster.router_url}")
        print(f"dashboard {cluster.router_url}/dashboard")
        for (replica_id, _), url in zip(plan.members(), cluster.replica_urls, strict=True):
            print(f"{replica_id} {url}")  # a P/D replica's id names its role (prefill-i, decode-i)
        if cluster.redis_url:
            print(f"redis    {cluster.redis_url}")
        for k, url in enumerate(cluster.store_urls):
            print(f"{store_id(plan, k)} {url}")
        print(f"logs     {cluster.tmpdir}")
        if token_file:
            print(f"token    {token_file}")
        print("press Ctrl-C to stop", flush=True)
        supervisor = Supervisor(cluster, policy)
        while not stop["now"]:
            failed = supervisor.step()
            if failed:
                print(f"error: {failed}; stopping (logs kept in {cluster.tmpdir})", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
    finally:
        cluster.stop()
        print("stopped", file=sys.stderr)
    if not a.keep_logs and cluster.tmpdir:
        shutil.rmtree(cluster.tmpdir, ignore_errors=True)  # a failed run returns above and keeps them
    return 0
