"""Requests in flight per session, as the router sees them: an agent's fan-out (parallel tool calls, subagents)
arrives as several requests of one session at once (the preset's children keep the parent's session id,
loadgen/presets/fanout.py), so the most requests a session has had at once since it last had none is its fan-out
as the router can know it (a request carries its session, ``X-Session-Id`` or the body's, not which turn it waits
for). The dashboard draws these (router/dashboard.py). One router process's own: under ``--workers`` each worker
counts the requests it serves."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple


class SessionFlight(NamedTuple):
    """One session now: its requests in flight, the most it has had at once since it last had none, and since
    when it has had one in flight (``time.time()``)."""

    session: str | None  # as the view labels it (a keyed hash on a public page)
    in_flight: int
    widest: int
    since: float


class FlightsNow(NamedTuple):
    """The sessions in flight now: how many, how many fanned out (more than one request at once), the requests they
    have in flight, the widest of them, and the ``top`` with the most requests in flight."""

    sessions: int
    fanned_out: int
    requests: int
    widest: int
    top: list[SessionFlight]


class SessionFlights:
    def __init__(self) -> None:
        self._now: dict[str, list] = {}  # session -> [in flight, widest since it had none, since]

    @contextmanager
    def flight(self, session: str | None) -> Iterator[None]:
        """One request of ``session`` in flight for the block (a request without a session counts for none)."""
        if not session:
            yield
            return
        entry = self._now.get(session)
        if entry is None:
            entry = self._now[session] = [0, 0, time.time()]
        entry[0] += 1
        entry[1] = max(entry[1], entry[0])
        try:
            yield
        finally:
            entry[0] -= 1
            if entry[0] == 0:  # a session with none in flight is forgotten: the table stays as long as the load
                del self._now[session]

    def now(self, top: int, label: Callable[[str], str | None] = str) -> FlightsNow:
        """The sessions in flight now; ``top`` of them, most requests first (ties: widest, then oldest), their ids
        as ``label`` shows them."""
        rows = sorted(self._now.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[1][2]))
        return FlightsNow(len(rows), sum(1 for _, e in rows if e[0] > 1), sum(e[0] for _, e in rows),
                          max((e[1] for _, e in rows), default=0),
                          [SessionFlight(label(s), e[0], e[1], e[2]) for s, e in rows[:top]])
