"""Replay a trace against a running cluster: open loop in time, causal within a session.

Turn 0 of a session leaves at its trace time divided by the speed-up; turn j+1 leaves
only after turn j's answer, plus turn j+1's trace gap divided by the speed-up. A request that
waits for others (an agent's ``after``, with dependent arrivals) leaves when the last of them has
been answered, plus its ``gap_s`` divided by the speed-up; when one of them fails it is never sent
and counts as failed (``loadgen.arrivals`` is the rule, the simulator's too). Requests
go to ``/generate`` as msgpack with the trace's block hashes, so the cluster sees exactly
the trace's blocks; to a cluster that matches by token (``--matching radix``), a trace cut
into blocks of one token goes as ``token_ids`` (``tokens_of``), with the tokens its response
will be. Connections are bounded; every request yields one record. A request not answered
within the timeout is dropped: its connection closes, the router and the replica see the
client leave and the replica aborts it (vLLM does), and its record says it timed out.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import aiohttp
import msgpack

from loadgen.arrivals import Arrivals
from loadgen.critical_path import Span, session_paths, summarize_paths
from loadgen.trace import Trace, TraceRequest, response_hashes
from shared.histogram import LogHistogram
from shared.progress import ProgressBar
from shared.ratios import ratio
from shared.tokenizer import VOCAB_SIZE


@dataclass(slots=True)
class Record:
    session: str
    turn: int
    status: int
    replica: str
    prompt_tokens: int
    cached_tokens: int
    prompt_blocks: int
    cached_blocks: int
    ttft_s: float  # emulated
    e2e_s: float  # emulated
    wall_s: float
    sent_at_s: float
    error: str = ""
    timed_out: bool = False  # no answer within the timeout: dropped (the replica aborts it)
    # a P/D cluster's path (the router's X-Kvemu-Pd: remote, local, fallback, colocated; "" otherwise) and the
    # prefill instance of a remote one
    pd_path: str = ""
    prefill_replica: str = ""
    route_reason: str = ""  # why the router chose the replica (its X-Kvemu-Route-Reason: cache_hit, ...; "" direct)
    # the request's place among those replayed, its computed arrival (s from the replay's start: when the schedule
    # released it) and the replica's queue time (emulated, as ttft_s): what an agent session's critical path reads
    index: int = -1
    arrival_s: float = 0.0
    queue_s: float = 0.0


def _names(cls: type) -> set[str]:
    """The names of ``cls`` and of every class below it."""
    names = {cls.__name__}
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        names |= _names(sub)
    return names


# aiohttp's errors for a connection that was never made (refused, no route, no such host): a record keeps
# the error's type name first (``Replayer._send``), which is how a failure's cause is told apart.
CANNOT_CONNECT = frozenset(_names(aiohttp.ClientConnectorError))
DEPENDENCY_FAILED = "dependency failed"  # never sent: a request it waits for failed


def failure(rec: Record) -> str:
    """A failed request's cause in two words, for the progress line ("" for an answer): ``cannot
    connect``, ``HTTP 503``, ``timed out``, or the client error's type."""
    if rec.status == 200:
        return ""
    if rec.timed_out:
        return "timed out"
    if rec.error.startswith("not sent:"):
        return DEPENDENCY_FAILED
    if rec.status:
        return f"HTTP {rec.status}"
    kind = rec.error.split(":", 1)[0]
    return "cannot connect" if kind in CANNOT_CONNECT else kind or "failed"


class Progress:
    """Progress over the requests (the shared reporter: rate-based ETA), with failures by cause (the
    commonest two: "failed 443 (cannot connect 440, HTTP 503 3)") and how far sending runs behind the
    trace's schedule (a cluster that cannot keep up makes sessions start late)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.done = self.failed = 0
        self.causes: dict[str, int] = defaultdict(int)
        self.behind_s = 0.0
        self.bar = ProgressBar("replay", total, "req", enabled=enabled)

    def sent(self, late_s: float) -> None:
        """A request left ``late_s`` seconds after its scheduled time (trace time / speed-up)."""
        self.behind_s = max(late_s, 0.0)

    def tick(self, cause: str = "") -> None:
        """A request ended: answered (``cause`` "") or failed for ``cause`` (``failure``)."""
        self.done += 1
        if cause:
            self.failed += 1
            self.causes[cause] += 1
        schedule = f"behind schedule {self.behind_s:.1f}s" if self.behind_s >= 1.0 else "on schedule"
        top = sorted(self.causes.items(), key=lambda kv: -kv[1])[:2]
        why = f" ({', '.join(f'{c} {n}' for c, n in top)})" if top else ""
        self.bar.set_postfix(f"failed {self.failed}{why}, {schedule}")
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


def tokens_of(hashes) -> list[int]:
    """Token ids for a prompt cut into blocks of one token: each chained hash folded into the vocabulary.
    Two prompts get the same ids up to the token where their streams part (the hashes are equal
    there) and, but for a chance of one in the vocabulary's size at the first one, different ids after."""
    return [h % VOCAB_SIZE for h in hashes]


def sessions_of(trace: Trace, max_requests: int | None) -> dict[str, list[TraceRequest]]:
    chosen = trace.requests[:max_requests] if max_requests else trace.requests
    by: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in chosen:
        by[r.session].append(r)
    for reqs in by.values():
        reqs.sort(key=lambda r: (r.turn, r.t))
    return by


GIVE_UP_S = 5.0  # kvemu up starts a dead router again within a second or two: longer than that, it is gone


class Unreachable(Exception):
    """Every request for ``seconds`` failed to connect (the last with ``cause``): the cluster is gone."""

    def __init__(self, seconds: float, cause: str) -> None:
        super().__init__(f"no request could connect for {seconds:.1f} s ({cause})")
        self.seconds, self.cause = seconds, cause


class Replayer:
    def __init__(self, url: str, trace: Trace, speedup: float, max_requests: int | None = None,
                 connections: int = 256, timeout_s: float = 600.0, progress: bool = True,
                 tokens: bool = False, give_up_s: float = GIVE_UP_S, dependent: bool = False) -> None:
        self.url = url.rstrip("/")
        self.trace = trace
        self.tokens = tokens  # send token ids (the trace is cut into blocks of one token)
        self.speedup = speedup
        self.chosen = trace.requests[:max_requests] if max_requests else trace.requests
        # each session's turns chained as before; an agent's requests after what they wait for (dependent)
        self.arrivals = Arrivals(self.chosen, dependent=dependent, chain_sessions=True)
        self.released: dict[int, float] = {}  # request index -> its computed arrival, s from the replay's start
        self.responses = {id(r): h for r, h in zip(trace.requests, response_hashes(trace))}
        self.total = len(self.chosen)
        self.connections = connections
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.records: list[Record] = []
        self.progress = Progress(self.total, progress)
        self.slots = asyncio.Semaphore(connections)
        self.t0 = 0.0
        self.give_up_s = give_up_s  # 0: never give up
        self.down_since: float | None = None  # when the first of the connect failures since the last answer was sent

    async def run(self) -> list[Record]:
        """Every request's record; on cancellation (Ctrl-C), or ``Unreachable`` when no request could
        connect for ``give_up_s``, the ones finished so far stay in ``self.records``, and the in-flight
        ones are dropped."""
        conn = aiohttp.TCPConnector(limit=self.connections)
        try:
            async with aiohttp.ClientSession(connector=conn, timeout=self.timeout) as http:
                self.t0 = time.monotonic()
                tasks: set[asyncio.Future] = set()
                try:
                    await self._dispatch(http, tasks)
                except Unreachable:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
        finally:
            self.progress.close()
        return self.records

    async def _dispatch(self, http: aiohttp.ClientSession, tasks: set[asyncio.Future]) -> None:
        """Start each request as it is released (a task that waits for its time, then sends it), until every
        request has been sent or lost; each answer releases what waited for it."""
        self._release(http, tasks)
        while tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                tasks.discard(task)
                task.result()  # Unreachable ends the run
            self._release(http, tasks)

    def _release(self, http: aiohttp.ClientSession, tasks: set[asyncio.Future]) -> None:
        while self.arrivals.peek() != float("inf"):
            at, k = self.arrivals.pop()  # at: trace seconds
            self.released[k] = at / self.speedup
            tasks.add(asyncio.ensure_future(self._one(http, k)))

    def _now(self) -> float:
        """The trace's clock: seconds since the replay started, times the speed-up."""
        return (time.monotonic() - self.t0) * self.speedup

    async def _one(self, http: aiohttp.ClientSession, k: int) -> None:
        r = self.chosen[k]
        due = self.t0 + self.released[k]
        await self._sleep_until(due)
        async with self.slots:  # a free connection: how late this request leaves is the schedule lag
            sent = time.monotonic()
            self.progress.sent(sent - due)
            rec = await self._send(http, r)
        rec.index, rec.arrival_s = k, self.released[k]
        self.records.append(rec)
        self.progress.tick(failure(rec))
        if rec.status == 200 and not rec.error:
            self.arrivals.finished(k, self._now())
        else:
            for lost in self.arrivals.failed(k, self._now()):
                self._lose(lost, r)
        self._watch(rec, sent)

    def _lose(self, k: int, failed: TraceRequest) -> None:
        """Request ``k`` waited for one that failed: never sent, counted as failed."""
        r = self.chosen[k]
        rec = Record(r.session, r.turn, 0, "", r.input_tokens, 0, len(r.hash_ids), 0, 0.0, 0.0, 0.0,
                     time.monotonic() - self.t0, error=f"not sent: request {failed.id!r} it waits for failed",
                     index=k)
        self.records.append(rec)
        self.progress.tick(DEPENDENCY_FAILED)

    def _watch(self, rec: Record, sent: float) -> None:
        """Raise ``Unreachable`` once every request sent over ``give_up_s`` failed to connect. An answer
        (any status) starts the count again; other failures (a connection cut) leave it as it is."""
        if rec.status:
            self.down_since = None
        elif failure(rec) == "cannot connect":
            if self.down_since is None:
                self.down_since = sent
            elif self.give_up_s and time.monotonic() - self.down_since >= self.give_up_s:
                raise Unreachable(time.monotonic() - self.down_since, rec.error)

    @staticmethod
    async def _sleep_until(deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _send(self, http: aiohttp.ClientSession, r: TraceRequest) -> Record:
        bs = self.trace.block_size
        input_tokens = max(r.input_tokens, len(r.hash_ids) * bs)
        body: dict = {"block_hashes": r.hash_ids, "input_tokens": input_tokens, "max_tokens": max(r.output_tokens, 1)}
        response = self.responses.get(id(r))
        if self.tokens:
            body = {"token_ids": tokens_of(r.hash_ids), "max_tokens": body["max_tokens"]}
            if response:  # the tokens the response will be (the next turn's): a replica keeps their KV
                body["response_token_ids"] = tokens_of(response)
        elif response:  # what the response's blocks hash to: a replica that keeps response KV caches them
            body["response_block_hashes"] = response
        headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack", "X-Session-Id": r.session}
        sent = time.monotonic()
        rec = Record(r.session, r.turn, 0, "", input_tokens, 0, len(r.hash_ids), 0, 0.0, 0.0, 0.0,
                     sent - self.t0)
        try:
            async with http.post(self.url + "/generate", data=msgpack.packb(body), headers=headers) as resp:
                data = await resp.read()
                rec.status = resp.status
                rec.replica = resp.headers.get("X-Kvemu-Replica", "")
                rec.pd_path = resp.headers.get("X-Kvemu-Pd", "")
                rec.prefill_replica = resp.headers.get("X-Kvemu-Prefill-Replica", "")
                rec.route_reason = resp.headers.get("X-Kvemu-Route-Reason", "")
                if resp.status == 200:
                    out = msgpack.unpackb(data)
                    rec.cached_tokens, rec.cached_blocks = out["cached_tokens"], out["cached_blocks"]
                    rec.ttft_s, rec.e2e_s = out["ttft_s"], out["e2e_s"]
                    rec.queue_s = out.get("queue_time_s", 0.0)
                else:
                    rec.error = data[:200].decode(errors="replace")
        except TimeoutError:  # aiohttp's total timeout, and its socket timeouts (ServerTimeoutError)
            rec.timed_out = True
            rec.error = f"timed out after {self.timeout.total:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.wall_s = time.monotonic() - sent
        return rec


def summarize(records: list[Record], block_size: int) -> dict:
    """The run's figures. Hit ratios are HBM's, as ``kvemu sim`` and each replica's ``/stats`` define them
    (shared/ratios.py): ``block_hit_ratio`` the prompt blocks found in HBM (``cached_blocks``) over those looked up,
    ``token_hit_ratio`` their tokens (``block_size`` each, the replicas' block or page, at most the prompt) over
    prompt tokens. ``cached_token_ratio``: the replicas' ``cached_tokens`` over prompt tokens, what vLLM's usage
    reports: prompt tokens not computed, from HBM or a lower level (host, SSD, a shared store), a prompt cached
    whole computing its last block again."""
    ok = [r for r in records if r.status == 200]
    ttft, wall = LogHistogram(), LogHistogram()
    per: dict[str, dict] = defaultdict(lambda: {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                                "prompt_blocks": 0, "cached_blocks": 0, "hit_tokens": 0})
    for r in ok:
        ttft.add(r.ttft_s)
        wall.add(r.wall_s)
        p = per[r.replica]
        p["requests"] += 1
        for key in ("prompt_tokens", "cached_tokens", "prompt_blocks", "cached_blocks"):
            p[key] += getattr(r, key) or 0  # (cached_blocks: None where a replica could not say)
        p["hit_tokens"] += min((r.cached_blocks or 0) * block_size, r.prompt_tokens)
    for p in per.values():
        p["token_hit_ratio"] = ratio(p["hit_tokens"], p["prompt_tokens"])
        p["block_hit_ratio"] = ratio(p["cached_blocks"], p["prompt_blocks"])
        p["cached_token_ratio"] = ratio(p["cached_tokens"], p["prompt_tokens"])
    loads = [p["requests"] for p in per.values()]
    mean = sum(loads) / len(loads) if loads else 0.0
    tokens = sum(r.prompt_tokens for r in ok)
    blocks = sum(r.prompt_blocks for r in ok)
    statuses: dict[int, int] = defaultdict(int)
    for r in records:
        statuses[r.status] += 1
    return {
        "requests": len(records), "ok": len(ok), "failed": len(records) - len(ok),
        "timed_out": sum(r.timed_out for r in records),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "token_hit_ratio": ratio(sum(p["hit_tokens"] for p in per.values()), tokens),
        "block_hit_ratio": ratio(sum(p["cached_blocks"] for p in per.values()), blocks),
        "cached_token_ratio": ratio(sum(r.cached_tokens for r in ok), tokens),
        "ttft_p50_s": ttft.quantile(0.5), "ttft_p99_s": ttft.quantile(0.99),
        "wall_latency_p50_s": wall.quantile(0.5), "wall_latency_p99_s": wall.quantile(0.99),
        "load_imbalance": max(loads) / mean if mean else 0.0,
        "per_replica": dict(sorted(per.items())),
        "session_moves": session_moves(ok),
        **_pd_summary(ok),
    }


def session_moves(ok: list[Record]) -> dict:
    """Later turns of sessions (answered, after an answered turn of theirs) and those answered by another replica
    than the turn before, by the router's reason for the move ("unknown" where no router said): what a
    cache-aware run gave up of its ceiling, and why (load_over_cache, imbalance_guard, session_overflow, ...)."""
    turns: dict[str, list[Record]] = defaultdict(list)
    for r in ok:
        if r.session:
            turns[r.session].append(r)
    later = 0
    by_reason: dict[str, int] = defaultdict(int)
    for recs in turns.values():
        recs.sort(key=lambda r: r.turn)
        for prev, r in zip(recs, recs[1:]):
            later += 1
            if r.replica != prev.replica:
                by_reason[r.route_reason or "unknown"] += 1
    return {"turns": later, "left": sum(by_reason.values()), "by_reason": dict(sorted(by_reason.items()))}


def _pd_summary(ok: list[Record]) -> dict:
    """A P/D cluster's answers by path and remote prefills by prefill instance (nothing for a colocated one)."""
    if not any(r.pd_path for r in ok):
        return {}
    paths: dict[str, int] = defaultdict(int)
    prefills: dict[str, int] = defaultdict(int)
    for r in ok:
        paths[r.pd_path or "unknown"] += 1
        if r.prefill_replica:
            prefills[r.prefill_replica] += 1
    return {"pd_paths": dict(sorted(paths.items())), "prefill_replicas": dict(sorted(prefills.items()))}


def agent_spans(records: list[Record], requests: Sequence[TraceRequest]) -> list[Span]:
    """The records as ``loadgen.critical_path`` reads them (``requests``: those replayed, by ``Record.index``), in
    the replay's wall seconds: arrival, then the replica's queue, prefill (TTFT less the queue) and decode (E2E less
    TTFT), finished when the answer came back; an unanswered request never finished."""
    out = []
    for rec in records:
        if rec.index < 0:
            continue
        r = requests[rec.index]
        ok = rec.status == 200 and not rec.error
        queue = min(rec.queue_s, rec.ttft_s)
        out.append(Span(r.session, r.id, r.after, rec.arrival_s, queue, rec.ttft_s - queue, rec.e2e_s - rec.ttft_s,
                        rec.sent_at_s + rec.wall_s if ok else None))
    return out


def agent_sessions(records: list[Record], requests: Sequence[TraceRequest]) -> dict:
    """Per agent session (one with dependencies) its task time and critical path, and their p50 / p99 across
    sessions (``loadgen.critical_path``); ``paths`` one row a session."""
    paths, incomplete = session_paths(agent_spans(records, requests))
    return {**summarize_paths(paths, incomplete), "paths": [p._asdict() for p in paths]}


def records_json(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
