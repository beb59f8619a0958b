"""The thin async layer over the pure scheduler: one task runs steps and sleeps them.

Emulated time advances by each step's cost-model duration; wall time sleeps
``duration * time_scale``. While idle, the emulated clock follows the wall clock
divided by the time scale, so gaps between requests are not lost. With a time scale
above zero every decode step is its own wake-up (tokens stream at emulated times); at
zero the scheduler may fast-forward decode-only runs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from replica.core.build import ReplicaCore
from replica.core.cache.pool import KvEvent
from replica.core.dp import pick_rank
from replica.core.sched.scheduler import SchedRequest, StepResult

INF = float("inf")


class Stepper(Protocol):
    """What the engine's loop steps: one rank's scheduler, or every rank of an expert-parallel group in
    lockstep (replica/dp.py)."""

    def has_work(self) -> bool: ...

    def step(self, now: float, horizon: float = INF) -> StepResult: ...

    def abort(self, r: SchedRequest, now: float) -> bool: ...


@dataclass(slots=True)
class Handle:
    """What a waiting HTTP handler holds for its request."""

    req: SchedRequest
    wall_submitted: float
    first_token: asyncio.Future
    done: asyncio.Future
    tokens: asyncio.Queue | None = None  # streaming: counts of new tokens, None at the end
    wall_first_token: float = 0.0
    wall_done: float = 0.0
    # P/D: a prefill for a remote decode, its answer's kv_transfer_params once held (replica/pd.py);
    # a decode after a remote prefill, the emulated time its KV arrived (-1: it did not come over the network)
    kv_transfer_params: dict | None = None
    kv_arrived: float = -1.0
    dp_rank: int = 0  # the data-parallel rank it runs on (replica/dp.py; 0 in a replica of one rank)

    def timings(self) -> dict:
        r = self.req
        out = {
            "queue_time_s": max(r.waited, 0.0),  # every wait, if it was preempted and queued again
            "ttft_s": r.t_first_token - r.arrival,
            "e2e_s": r.t_finished - r.arrival,
            "wall_ttft_s": self.wall_first_token - self.wall_submitted,
            "wall_e2e_s": self.wall_done - self.wall_submitted,
        }
        if self.kv_arrived >= 0:  # a decode after a remote prefill: the part of its TTFT spent waiting for KV
            out["kv_wait_s"] = self.kv_arrived - r.arrival
        return out


@dataclass(slots=True)
class EngineCounters:
    steps: int = 0
    finished: int = 0
    aborted: int = 0  # requests whose client went away before they finished (``abort``)
    emulated_busy_s: float = 0.0


class Engine:
    def __init__(self, core: ReplicaCore, time_scale: float,
                 on_events: Callable[[list[KvEvent]], None] | None = None,
                 on_first_token: Callable[[float], None] | None = None,
                 on_finished: Callable[[SchedRequest], None] | None = None) -> None:
        self.core = core
        self.pool = core.pool
        self.sched = core.scheduler
        self.stepper: Stepper = core.scheduler  # what the loop steps (replica/dp.py: a lockstep group's ranks)
        self.time_scale = time_scale
        self.on_events = on_events
        self.on_first_token = on_first_token
        self.on_finished = on_finished
        self.handles: dict[int, Handle] = {}
        self.counters = EngineCounters()
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._emu_now = 0.0
        self._wall_idle_since = time.monotonic()
        # Busy periods are paced against one anchor (emulated, wall): each step sleeps until
        # anchor_wall + (emulated end - anchor_emu) * time_scale, so sleeps too short for the
        # event loop to honour (uvloop returns at once below ~0.5 ms) do not add up to drift.
        self._anchor_emu = 0.0
        self._anchor_wall = time.monotonic()
        self._step_end = 0.0  # emulated end of the step under way (or of the last one)
        self._stopping = False

    # ---- clock ------------------------------------------------------------------
    def now(self) -> float:
        """Emulated seconds since start."""
        if self.time_scale > 0 and not self.stepper.has_work():
            return self._emu_now + (time.monotonic() - self._wall_idle_since) / self.time_scale
        return self._emu_now

    # ---- requests ---------------------------------------------------------------
    def _leave_idle(self) -> None:
        """Fold the idle wall time into the emulated clock exactly once, when work arrives."""
        if not self.stepper.has_work():
            self._emu_now = self.now()
            self._wall_idle_since = time.monotonic()
            self._reanchor()

    def _request(self, hashes, prompt_tokens: int, max_tokens: int, session: str | None,
                 response_hashes) -> SchedRequest:
        req = SchedRequest(next(self._ids), hashes, prompt_tokens, max_tokens, self._emu_now, session)
        if response_hashes:
            req.response_hashes = response_hashes
        return req

    def _handle(self, req: SchedRequest, stream: bool) -> Handle:
        loop = asyncio.get_running_loop()
        handle = Handle(req, time.monotonic(), loop.create_future(), loop.create_future(),
                        asyncio.Queue() if stream else None)
        self.handles[req.rid] = handle
        return handle

    def submit(self, hashes, prompt_tokens: int, max_tokens: int, session: str | None, stream: bool,
               response_hashes=None, hold: bool = False, rank: int | None = None) -> Handle:
        """Queue a request; raises InputError subclasses (pool too small, queue full, a ``rank`` this engine
        does not have: vLLM's ``X-data-parallel-rank``). ``hold``: a prefill for a remote decode, whose blocks
        stay pinned when it finishes until ``release_held``."""
        rank = self.pick_rank(rank)
        self._leave_idle()
        req = self._request(hashes, prompt_tokens, max_tokens, session, response_hashes)
        req.hold = hold
        self._queue(req, rank)
        handle = self._handle(req, stream)
        handle.dp_rank = rank
        self._wake.set()
        return handle

    def pick_rank(self, asked: int | None) -> int:
        """The rank a request runs on: this engine's one (a rank named must be 0)."""
        return pick_rank([self.sched], asked)

    def _queue(self, req: SchedRequest, rank: int) -> None:
        self.sched.submit(req)

    # ---- disaggregated prefill / decode (replica/pd.py) ----------------------------
    def reserve(self, hashes, prompt_tokens: int, max_tokens: int, session: str | None, stream: bool,
                response_hashes=None) -> Handle | None:
        """A decode after a remote prefill: its blocks taken for the KV about to arrive (vLLM's
        WAITING_FOR_REMOTE_KVS, ``Scheduler.reserve_remote``); None when the pool cannot hold them now."""
        self._emu_now = self.now()  # the clock where the request arrives (folding idle time is idempotent)
        self._wall_idle_since = time.monotonic()
        req = self._request(hashes, prompt_tokens, max_tokens, session, response_hashes)
        if not self.sched.reserve_remote(req, self._emu_now):
            return None
        return self._handle(req, stream)

    def arrived(self, handle: Handle, at: float) -> None:
        """Its KV is in (at emulated ``at``): the request computes its last prompt token, then decodes."""
        self._leave_idle()
        if self.time_scale <= 0 and not self.sched.has_work():  # no pacing: the clock jumps to the delivery
            self._emu_now = max(self._emu_now, at)
            self._reanchor()
        handle.kv_arrived = max(at, handle.req.arrival)
        self.sched.remote_arrived(handle.req, self._emu_now)
        self._wake.set()

    def cancel_remote(self, handle: Handle) -> None:
        """Its KV will never arrive: the blocks go back (``Scheduler.cancel_remote``), and those inserted for it
        leave the pool and the index."""
        if self.handles.pop(handle.req.rid, None) is None:
            return
        self.sched.cancel_remote(handle.req, self.now())
        self.publish_events()
        self._wake.set()

    def release_held(self, req: SchedRequest) -> None:
        """A prefill for a remote decode is done with (pulled, timed out, or its client left): its
        blocks go back, cached."""
        if req.hold:
            self.sched.release_held(req, max(self._step_end, self.now()))
            self._wake.set()  # the room may admit a waiting request

    def clock(self) -> float:
        """The emulated time of this wall instant (between steps too: ``now`` moves only at step ends)."""
        if self.time_scale > 0 and self.stepper.has_work():
            return max(self._emu_now, self._anchor_emu + (time.monotonic() - self._anchor_wall) / self.time_scale)
        return self.now()

    async def until(self, finish: Callable[[], float]) -> float:
        """Sleep until the emulated clock reaches ``finish()``, asked again at each wake-up (a link's
        later transfers delay it), ``time_scale`` wall seconds per emulated one; its last answer."""
        while True:
            end = finish()
            ahead = end - self.clock()
            if ahead <= 0 or self.time_scale <= 0:
                return end
            await asyncio.sleep(ahead * self.time_scale)

    def abort(self, handle: Handle) -> bool:
        """The client went away: its request leaves the scheduler wherever it is (vLLM aborts it),
        its blocks go back (``Scheduler.abort``), and it counts as aborted, not finished. It takes
        effect where the step under way ends (the next one is planned without it). False: nothing
        to abort, as it finished, or finishes in the step under way (its answer is ready: a finish)."""
        rid = handle.req.rid
        if self.handles.get(rid) is not handle or not self.stepper.abort(handle.req, max(self._step_end, self._emu_now)):
            if handle.kv_transfer_params is None:  # a finished prefill held for a pull nobody was told of
                self.release_held(handle.req)
            return False
        del self.handles[rid]
        self.counters.aborted += 1
        self.publish_events()  # blocks it inserted but never computed leave the index
        return True

    def publish_events(self) -> None:
        """Hand every tier's events since the last call to ``on_events`` (the feed)."""
        if self.on_events is not None:
            events = self.core.drain_events()
            if events:
                self.on_events(events)

    # ---- loop -------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            if not self.stepper.has_work():
                self._wall_idle_since = time.monotonic()
                self._wake.clear()
                if self._stopping:
                    return
                await self._wake.wait()
                self._emu_now = self.now()
                self._wall_idle_since = time.monotonic()
                self._reanchor()
                continue
            now = self._emu_now
            res = self.stepper.step(now, now if self.time_scale > 0 else INF)
            self._step_end = now + res.duration
            self.publish_events()
            await self._pace(now + res.duration)
            self._emu_now = now + res.duration
            self.counters.steps += res.steps
            self.counters.emulated_busy_s += res.duration
            self._deliver(res)

    def _reanchor(self) -> None:
        self._anchor_emu = self._emu_now
        self._anchor_wall = time.monotonic()

    async def _pace(self, emulated_end: float) -> None:
        if self.time_scale <= 0:
            await asyncio.sleep(0)  # as fast as possible; still let handlers run between steps
            return
        delay = self._anchor_wall + (emulated_end - self._anchor_emu) * self.time_scale - time.monotonic()
        if delay < -1.0:
            self._anchor_wall -= delay  # a stall (GC, overload) is forgiven, not repaid in a burst
        await asyncio.sleep(max(delay, 0.0))

    def _deliver(self, res: StepResult) -> None:
        wall = time.monotonic()
        for r in res.first_tokens:
            h = self.handles.get(r.rid)
            if h is None:
                continue
            h.wall_first_token = wall
            if self.on_first_token is not None:
                self.on_first_token(r.t_first_token - r.arrival)
            if not h.first_token.done():
                h.first_token.set_result(True)
            if h.tokens is not None:
                h.tokens.put_nowait(1)
        for r, n in res.decoded:
            h = self.handles.get(r.rid)
            if h is not None and h.tokens is not None and n:
                h.tokens.put_nowait(n)
        for r in res.finished:
            h = self.handles.pop(r.rid, None)
            self.counters.finished += 1
            if self.on_finished is not None:
                self.on_finished(r)
            if h is None:
                continue
            h.wall_done = wall
            if h.tokens is not None:
                h.tokens.put_nowait(None)
            if not h.done.done():
                h.done.set_result(True)

    async def drain(self, timeout: float) -> None:
        """Graceful shutdown: let queued and running requests finish, then stop."""
        self._stopping = True
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self.stepper.has_work() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
