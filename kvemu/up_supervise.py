"""``kvemu up``'s supervision: a child that dies (a replica of any role, a shared KV store, the router, the
private redis-server) is started again on the same command line, so on the same port, with an exponential
back-off, while the rest keep serving (replicas serve without the shared store, the router routes around a
dead replica, replicas resync a Redis that came back empty). Each restart is one line on stderr and in the
child's log. Up gives up only on a child that cannot start: ``attempts`` restarts in a row that died before
answering (its ``/health``, or redis-server's port); then it stops everything, naming the child and its last
log line. ``attempts`` 0: no restart, the first child that dies stops everything (what up did before).

The back-off starts at ``first_s`` and doubles with each restart up to ``max_s``; a child that stays up
``stable_s`` starts again from ``first_s`` at its next death."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from shared.errors import InputError

if TYPE_CHECKING:
    from kvemu.up import Child, Cluster

RESTART_ATTEMPTS = 5  # --restart-attempts' default


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    attempts: int = RESTART_ATTEMPTS  # restarts in a row that die before answering: then up gives up; 0: none
    first_s: float = 0.5
    max_s: float = 10.0
    stable_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.attempts <= 100:
            raise InputError("--restart-attempts", f"must be 0-100, got {self.attempts}")

    def backoff(self, restarts: int) -> float:
        """The wait before restart number ``restarts`` (1, 2, ...) since the child was last stable."""
        return min(self.first_s * 2 ** (restarts - 1), self.max_s)


@dataclass(slots=True)
class Tended:
    """One child's restart state."""

    started_at: float
    answered: bool = True  # answered since its last start (start-up waited for the first one)
    restarts: int = 0  # since it last stayed up stable_s: sets the back-off
    failed_starts: int = 0  # restarts in a row that died before answering
    due: float | None = None  # when it is started again; None: running
    last_code: int | None = None


def exit_text(code: int | None) -> str:
    """``code -9 (SIGKILL)`` for a signal, ``code 2`` for an exit status."""
    if code is not None and code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


def answers(child: Child) -> bool:
    """Whether a restarted child has come up: any HTTP answer on its ``/health`` (a router with no healthy
    replica yet answers 503), or, for redis-server, a connection to its port."""
    if child.url:
        try:
            with urllib.request.urlopen(child.url + "/health", timeout=0.5):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
    port = child.args[child.args.index("--port") + 1] if "--port" in child.args else None
    if port is None:
        return True
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=0.2).close()
        return True
    except OSError:
        return False


class Supervisor:
    """``step()`` once in a while from up's main loop: restarts what died; a give-up message (str) when a child
    cannot start, else None."""

    def __init__(self, cluster: Cluster, policy: RestartPolicy, err: TextIO = sys.stderr) -> None:
        self.cluster, self.policy, self.err = cluster, policy, err
        now = time.monotonic()
        self.tended = {c.name: Tended(started_at=now) for c in cluster.children}

    def step(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        for child in list(self.cluster.children):
            t = self.tended.setdefault(child.name, Tended(started_at=now))
            if t.due is not None:
                if now >= t.due:
                    try:
                        self.cluster.respawn(child)
                    except OSError as exc:  # its program gone, no memory left to fork: nothing to wait for
                        return f"{child.name} cannot start: {exc}"
                    t.due, t.started_at, t.answered = None, now, False
                continue
            code = child.proc.poll() if child.proc is not None else None
            if code is None:
                self._running(child, t, now)
                continue
            refusal = self._died(child, t, code, now)
            if refusal is not None:
                return refusal
        return None

    def _running(self, child: Child, t: Tended, now: float) -> None:
        if not t.answered and answers(child):
            t.answered, t.failed_starts = True, 0
            self._say(child, f"{child.name} is back (restart {t.restarts})")
        if t.answered and t.restarts and now - t.started_at >= self.policy.stable_s:
            t.restarts = 0  # stayed up: the next death waits first_s again

    def _died(self, child: Child, t: Tended, code: int, now: float) -> str | None:
        t.last_code = code
        if self.policy.attempts == 0:
            return f"{child.name} exited with {exit_text(code)}"
        if not t.answered:
            t.failed_starts += 1
            if t.failed_starts >= self.policy.attempts:
                last = self.last_log_line(child)
                return (f"{child.name} cannot start: it exited {t.failed_starts} times in a row before answering"
                        f" (last with {exit_text(code)})" + (f": {last.removeprefix('error: ')}" if last else ""))
        t.restarts += 1
        wait = self.policy.backoff(t.restarts)
        t.due = now + wait
        self._say(child, f"{child.name} exited with {exit_text(code)}; restarting it in {wait:g} s"
                         f" (attempt {t.restarts})")
        return None

    def _say(self, child: Child, line: str) -> None:
        """One line on up's stderr and in the child's log (where its next start's output follows)."""
        print(f"kvemu up: {line}", file=self.err, flush=True)
        if self.cluster.tmpdir:
            try:
                with open(os.path.join(self.cluster.tmpdir, f"{child.name}.log"), "a") as fh:
                    fh.write(f"--- kvemu up: {line} ---\n")
            except OSError:
                pass

    def last_log_line(self, child: Child) -> str:
        """Its log's last line of its own (not one of ours)."""
        if not self.cluster.tmpdir:
            return ""
        try:
            with open(os.path.join(self.cluster.tmpdir, f"{child.name}.log"), "rb") as fh:
                lines = fh.read()[-8192:].decode(errors="replace").splitlines()
        except OSError:
            return ""
        own = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("--- kvemu up:")]
        return own[-1] if own else ""
