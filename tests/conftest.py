"""Shared fixtures: a private redis-server on a free loopback port (never the machine's own)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.formats import BUILTIN_TRACES, resolve_trace

# Parsed-trace cache (loadgen/trace_cache.py) of this test run: never the user's ~/.cache.
os.environ["KVEMU_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvemu-test-cache-")
# The runtime directory (shared/runtime_dir.py) of this test process (each xdist worker its own, 0700)
# and of every process it starts: the cluster token that routers and replicas started without one
# share is made there, never in the user's ~/.local/share/kvemu/runtime.
os.environ["KVEMU_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="kvemu-test-runtime-")

REPO = Path(__file__).resolve().parent.parent
# The sample traces shipped in the package (loadgen/data), by built-in name.
SAMPLE_TRACES = {name: Path(resolve_trace(name)) for name in BUILTIN_TRACES}
MOONCAKE_CONVERSATION = SAMPLE_TRACES["mooncake-conversation"]
MOONCAKE_SYNTHETIC = SAMPLE_TRACES["mooncake-synthetic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process on 127.0.0.1:<free port>, data kept in a temp dir."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed; run scripts/test, which installs it")
        self.exe = exe
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kvemu-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    """A started RedisServer; on leaving, stopped and its data folder removed."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: counts are of the tests that run
def pytest_collection_modifyitems(config, items) -> None:
    """On an xdist worker (scripts/test: ``--dist loadfile --no-loadscope-reorder``, files handed out in
    this order), the files holding an end-to-end test (marked ``slow``) first, in collection order, then the
    others, most tests first as xdist's own reorder would. xdist's reorder alone puts one-test files last,
    and the longest files are one-test ones (the chaos suite, minutes): started last, one kept a worker busy
    while the other sat idle. Files stay whole and in their own order; a run without xdist is untouched."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)  # xdist's loadfile unit
    slow = {name for name, its in files.items() if any(it.get_closest_marker("slow") for it in its)}
    order = sorted(files, key=lambda name: (name not in slow, 0 if name in slow else -len(files[name])))
    items[:] = [item for name in order for item in files[name]]


@pytest.fixture(scope="session")
def redis_server():
    with running_redis() as server:
        yield server


@pytest.fixture(params=sorted(SAMPLE_TRACES))
def sample_trace(request) -> Path:
    """Each shipped sample trace in turn (the one fixture for them; tests needing one name use
    ``SAMPLE_TRACES[name]`` or ``mooncake_conversation``)."""
    return SAMPLE_TRACES[request.param]


@pytest.fixture
def mooncake_conversation() -> Path:
    return MOONCAKE_CONVERSATION
