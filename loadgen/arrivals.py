"""When each request of a trace arrives, as the run goes: the one rule the simulator's clock and a live replay
share (``--arrivals``, kvemu/options/arrivals.py).

* A request that waits for others (``after``, dependent arrivals) arrives when the last of them has finished,
  plus its ``gap_s`` (the tool's or the agent's own time): ``max(finish of its after) + gap_s``. An agent's turns,
  a fan-out's children and the turn that joins them arrive as the cluster serves them, not as a recorded run did.
* A request that waits for none arrives at its recorded time ``t``.
* A session with no dependencies behaves as before them: with ``chain_sessions`` (``kvemu replay`` always, ``kvemu
  sim --causal``) its turn j+1 waits for turn j plus their recorded gap (``t`` of j+1 minus ``t`` of j), else each
  turn arrives at its ``t``. With ``dependent`` off (``--arrivals recorded``) a session that has dependencies keeps
  its recorded times.

A name in ``after`` that none of ``requests`` has (a trace cut short by ``--max-requests``) is not waited for.
A request that fails releases nothing that waits for it: its dependents, and theirs, never arrive (``failed``
names them); a session's chained next turn still arrives, as it always has. Pure: no clock, no I/O; the caller
says when each request finished."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from loadgen.trace import TraceRequest

INF = float("inf")
ARRIVAL_MODES = ("dependent", "recorded")  # --arrivals (kvemu/options/arrivals.py): dependent runs `after`


class Arrivals:
    """The requests' arrivals, earliest first: ``peek`` the next one's time, ``pop`` it (time, index), and say
    when each popped request ``finished`` (or ``failed``), which releases those waiting for it."""

    __slots__ = ("_heap", "_waiting", "_latest", "_gap", "_dependents", "_explicit", "_dead")

    def __init__(self, requests: Sequence[TraceRequest], dependent: bool = True, chain_sessions: bool = False) -> None:
        n = len(requests)
        self._waiting = [0] * n
        self._latest = [-INF] * n
        self._gap = [0.0] * n
        self._dependents: list[list[int]] = [[] for _ in range(n)]
        self._explicit = bytearray(n)  # 1: the request waits for its `after`, 0: for nothing or its session's turn
        self._dead = bytearray(n)  # 1: waits for a request that failed, so never arrives
        with_dependencies = {r.session for r in requests if r.after}
        if dependent:
            self._wait_explicitly(requests, with_dependencies)
        if chain_sessions:
            self._chain(requests, with_dependencies)
        self._heap = [(r.t, k) for k, r in enumerate(requests) if self._waiting[k] == 0]
        heapq.heapify(self._heap)

    def _wait_explicitly(self, requests: Sequence[TraceRequest], sessions: set[str]) -> None:
        index = {r.id: k for k, r in enumerate(requests) if r.id is not None}
        for k, r in enumerate(requests):
            if r.session not in sessions:
                continue
            deps = [index[name] for name in r.after if name in index]
            if deps:
                self._explicit[k] = 1
                self._gap[k] = r.gap_s
                self._waiting[k] = len(deps)
                for j in deps:
                    self._dependents[j].append(k)

    def _chain(self, requests: Sequence[TraceRequest], sessions: set[str]) -> None:
        """Turn j+1 of each session without dependencies waits for turn j, plus their recorded gap."""
        by: dict[str, list[int]] = {}
        for k, r in enumerate(requests):
            if r.session not in sessions:
                by.setdefault(r.session, []).append(k)
        for ks in by.values():
            ks.sort(key=lambda k: (requests[k].turn, requests[k].t))  # as loadgen.replay orders a session
            for prev, k in zip(ks, ks[1:]):
                self._gap[k] = max(requests[k].t - requests[prev].t, 0.0)
                self._waiting[k] = 1
                self._dependents[prev].append(k)

    def peek(self) -> float:
        """The next arrival's time; INF when none is released (all popped, or the rest wait on running requests)."""
        return self._heap[0][0] if self._heap else INF

    def pop(self) -> tuple[float, int]:
        """The next arrival: its time and its index in ``requests``."""
        return heapq.heappop(self._heap)

    def finished(self, k: int, end: float) -> None:
        """Request ``k`` finished at ``end``: those that waited for it and for nothing else still running arrive
        at the latest finish among what they waited for, plus their gap."""
        for d in self._dependents[k]:
            if not self._dead[d]:
                self._release(d, end)

    def failed(self, k: int, end: float) -> list[int]:
        """Request ``k`` failed at ``end``: the requests that waited for it (``after``), and those that waited for
        them, never arrive (returned, each once, to be counted as failed); a session's chained next turn
        arrives as if ``k`` had finished (only ``k`` can have one: a chained session has no dependencies)."""
        lost: list[int] = []
        stack = [k]
        while stack:
            j = stack.pop()
            for d in self._dependents[j]:
                if self._dead[d]:
                    continue
                if self._explicit[d]:
                    self._dead[d] = 1
                    lost.append(d)
                    stack.append(d)
                elif j == k:
                    self._release(d, end)
        return lost

    def _release(self, d: int, end: float) -> None:
        if end > self._latest[d]:
            self._latest[d] = end
        self._waiting[d] -= 1
        if self._waiting[d] == 0:
            heapq.heappush(self._heap, (self._latest[d] + self._gap[d], d))
