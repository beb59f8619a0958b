"""The one path a request takes through the router, whatever the cluster: its context (``RequestContext``: the
body parsed once, its prompt's hashes, the client's headers, the index's overlap), the one ``pick`` of a replica
in a pool, the one retry loop (``answer_from`` over ``try_pool``) that the colocated path and both legs of a P/D
request (router/pd_legs.py) run, and the one exchange with a replica (``exchange``, then ``relay`` for the answer the
client reads).

Every path keeps the same books: a pick counts the request in flight on its replica (``RoutingStep.route``) and
its prefill as queued there, the answer's head (its first token) takes the prefill out (``prefilled``), the end
of the exchange, whatever it was, takes the request out (``done``), and out of the data-parallel rank it named
(``ReplicaHandle.rank_in_flight``, the load ``chosen_rank`` balances ranks on); the per-replica gauges
(``kvemu_router_replica_in_flight`` / ``_queued_tokens``) follow each of those steps. A replica that answers
busy (503 + Retry-After) is backed off and another tried, without using up the request's failure retries; one
that fails is taken out and another tried, up to ``--retries``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import aiohttp
from aiohttp import web

from router.cluster import ReplicaHandle, unexhausted
from router.strategies import NoHealthyReplica, RouteDecision, RouteRequest, RoutingStep, chosen_rank, fold_ranks
from router.upstream import ReplicaBusy, ReplicaFailed, UpstreamRefused, Watch, check_status, failure, no_replica_answer, pass_stream
from shared import protocol
from shared.http_server import ClientGone
from shared.index import IndexUnavailable, MemoryIndex

FORWARD_HEADERS = ("Content-Type", "Accept", "X-Session-Id", "Authorization")  # the client's, passed on
T = TypeVar("T")


@dataclass(slots=True)
class RequestContext:
    """One client request on its way through the router: what every leg of it reads."""

    request: web.Request
    raw: bytes  # the body every leg that sends it unchanged sends
    spec: protocol.GenerateSpec  # parsed once (shared/offload.py): the prompt's hashes and tokens, the session
    view: RouteRequest  # what the routing steps count it as
    headers: dict[str, str]  # the client's headers passed on (FORWARD_HEADERS)
    overlap: dict[str, int] = field(default_factory=dict)  # the index's cached blocks per replica (lookup)
    predicted: bool = False  # the index was consulted: its prediction is scored against the replica's answer
    obj: dict | None = None  # the body decoded (body()): only where a leg rewrites it
    dp_rank: int | None = None  # the data-parallel rank the request goes to; sent as X-data-parallel-rank
    # a replica of data-parallel ranks: the rank holding its longest prefix (router.strategies.fold_ranks)
    ranks: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, request: web.Request, raw: bytes, spec: protocol.GenerateSpec) -> RequestContext:
        headers = {k: request.headers[k] for k in FORWARD_HEADERS if k in request.headers}
        return cls(request, raw, spec, RouteRequest(spec.session, len(spec.hashes), spec.prompt_tokens), headers)

    @property
    def content_type(self) -> str:
        return self.request.content_type or ""

    def body(self) -> dict:
        """The body as an object, decoded the first time it is asked for and kept."""
        if self.obj is None:
            self.obj = protocol.decode_body(self.raw, self.content_type)
        return self.obj


class Pool(NamedTuple):
    """Where a leg goes: ``replica`` (a colocated cluster's replicas), ``decode`` or ``prefill`` (a P/D
    cluster's pools, router/pd_legs.py), and the routing step that chooses there."""

    name: str
    step: RoutingStep
    replicas: list[ReplicaHandle]


class Target(NamedTuple):
    """A pool's pick for this request: the replica and the decision that chose it."""

    pool: Pool
    rep: ReplicaHandle
    decision: RouteDecision


class Upstream(NamedTuple):
    """A replica's answer whose head arrived (status checked), and the watch over what follows."""

    response: aiohttp.ClientResponse
    watch: Watch


class Rewrite(NamedTuple):
    """How an answer changes on its way to the client: each event of a stream, or a whole body answered 200
    (``body(raw, content_type)``)."""

    event: Callable[[bytes], bytes]
    body: Callable[[bytes, str], bytes]


class NoAnswer(Exception):
    """Every replica of a pool the request could go to was busy or failed (or none was healthy)."""

    def __init__(self, busy: int, failures: int) -> None:
        super().__init__(busy, failures)
        self.busy, self.failures = busy, failures


async def lookup(state, ctx: RequestContext, decider: bool = False) -> None:
    """The index's overlap per replica into ``ctx``, when the strategy reads it (or ``decider``: P/D's prefix
    decider reads the decoder's); ``ctx.predicted`` when it was consulted (a timeout or an unavailable index
    routes on load alone)."""
    if not ((state.router.uses_index or decider) and ctx.spec.hashes):
        return
    t0 = time.perf_counter()
    try:
        if isinstance(state.index, MemoryIndex):  # in-process and never blocks: no task, no timer
            overlap = state.index.lookup_sync(ctx.spec.hashes)
        else:
            async with asyncio.timeout(state.settings.index_timeout_s):  # no extra task, unlike wait_for
                overlap = await state.index.lookup(ctx.spec.hashes)
        ctx.overlap, ctx.ranks = fold_ranks(overlap)  # each replica weighed by its best rank
        state.metrics.index_latency.observe(time.perf_counter() - t0)
        ctx.predicted = True
    except (TimeoutError, IndexUnavailable):
        state.metrics.count("index_errors")
        state.metrics.count("load_only_decisions")


def pick(state, ctx: RequestContext, pool: Pool, excluded: set[str]) -> Target:
    """The strategy's choice in ``pool`` less ``excluded`` (counted in flight, and as a decision of that pool).
    The strategies never choose an unhealthy replica (and count a session moved off one as such); a replica
    backing off after a busy answer is passed over while a healthy one that is not is left; one whose pool
    prefills held for remote decodes exhaust is skipped in the prefill pool (the decoder prefills instead), and
    elsewhere only while another is left (router/cluster.py)."""
    now = time.monotonic()
    usable = [r for r in pool.replicas if r.replica_id not in excluded] if excluded else pool.replicas
    usable = [r for r in usable if not r.holds_exhausted] if pool.name == "prefill" else unexhausted(usable)
    ready = [r for r in usable if r.busy_until <= now]
    if not any(r.state.healthy for r in ready):  # every healthy one backing off: try them anyway rather than refuse
        ready = usable
    if not ready:
        raise NoHealthyReplica(len(pool.replicas))
    step = pool.step
    turns = step.session_turns
    decision, pos = step.route([r.state for r in ready], ctx.view, ctx.overlap)
    if pool.name != "replica":
        state.metrics.pd_decided(pool.name, decision.reason)
    if pool.name != "prefill":  # the router's decisions (the dashboard's): a colocated cluster's, a decode pool's
        state.metrics.decided(state.settings.routing, decision.reason)
        if step.session_turns != turns:  # a later turn of a session: did it leave its replica, and why
            state.metrics.session_turn(step.last_moved)
    rep = ready[pos]
    state.metrics.sent(rep.replica_id)
    # the rank holding the prefix the decision counted on, unless the ranks' loads are imbalanced; none held: the
    # replica balances its ranks
    loads = {r: rep.rank_in_flight.get(r, 0) for r in range(rep.dp_size)} if rep.replica_id in ctx.ranks else {}
    ctx.dp_rank = chosen_rank(ctx.ranks, rep.replica_id, decision.predicted_cached_blocks, loads, step.settings)
    return Target(pool, rep, decision)


def load_gauges(state, rep: ReplicaHandle) -> None:
    state.metrics.load(rep.replica_id, rep.state.in_flight, rep.state.queued_tokens)


async def try_pool(state, ctx: RequestContext, pool: Pool, attempt: Callable[[Target], Awaitable[T]]) -> T:
    """``attempt`` on the pool's pick until one answers: a busy replica is backed off and another tried (as many
    as the pool has), a failed one taken out and another tried (``--retries``); ``NoAnswer`` when none is left.
    Whatever ends an attempt, the request stops counting against its replica."""
    excluded: set[str] = set()
    failures = busy = 0
    while failures <= state.settings.retries and busy < len(pool.replicas):
        if failures or busy:
            state.metrics.count("retries")
        try:
            target = pick(state, ctx, pool, excluded)
        except NoHealthyReplica:
            break
        rep = target.rep
        load_gauges(state, rep)
        rank = ctx.dp_rank  # named: in flight on that rank until the attempt ends
        if rank is not None:
            rep.rank_in_flight[rank] = rep.rank_in_flight.get(rank, 0) + 1
        try:
            result = await attempt(target)
            rep.busy_strikes = 0
            return result
        except (ReplicaBusy, ReplicaFailed) as exc:
            excluded.add(rep.replica_id)
            if await state.cluster.set_aside(rep, exc):
                busy += 1
            else:
                failures += 1
        finally:
            pool.step.done(rep.state, ctx.view)
            if rank is not None:
                rep.rank_in_flight[rank] -= 1
            load_gauges(state, rep)
    raise NoAnswer(busy, failures)


async def answer_from(state, ctx: RequestContext, pool: Pool,
                      attempt: Callable[[Target], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """The client's answer from the first of ``pool``'s replicas that gives one (``try_pool``). Each attempt runs
    ``async with until_client_gone(ctx.request)``: a client that goes closes the replica's connection (the
    replica aborts the request, as vLLM does), answered 499 here; a replica's 4xx that a leg did not pass on
    itself (``UpstreamRefused``) is the client's answer."""
    try:
        return await try_pool(state, ctx, pool, attempt)
    except ClientGone:
        state.metrics.outcome("client_disconnected")
        return web.Response(status=499)  # nobody reads it
    except UpstreamRefused as refused:
        state.metrics.outcome("client_error")
        return web.Response(body=refused.body, status=refused.status, headers={"Content-Type": refused.content_type})
    except NoAnswer as none:
        return no_replica_answer(state.metrics, none.busy, none.failures, "" if pool.name == "replica"
                                 else f"{pool.name} ")


async def exchange(state, ctx: RequestContext, target: Target, data: bytes, headers: dict[str, str]) -> Upstream:
    """``data`` posted to the target replica (the client's path), watched (router.upstream.Watch: a replica
    that stops answering fails the leg over). At the answer's head the request's prefill stops counting as
    queued there (router/strategies/step.py); a busy or failed status raises as ``check_status`` says (the
    answer released). The caller reads the answer inside ``async with up.response``."""
    rep = target.rep
    if ctx.dp_rank is not None:
        headers[protocol.DP_RANK_HEADER] = str(ctx.dp_rank)
    watch = Watch(state.cluster, rep, state.settings.upstream_first_byte_timeout_s)
    try:
        async with watch:
            response = await state.cluster.session.post(rep.url + ctx.request.path, data=data, headers=headers,
                                                        timeout=state.request_timeout)
    except (TimeoutError, aiohttp.ClientError, OSError, ReplicaFailed) as exc:
        raise failure(exc) from None
    target.pool.step.prefilled(rep.state, ctx.view)  # its head: the first token is out (or it was refused)
    load_gauges(state, rep)
    try:
        check_status(response.status, response.headers)
    except (ReplicaBusy, ReplicaFailed):
        response.release()
        await response.wait_for_close()
        raise
    return Upstream(response, watch)


async def read_body(up: Upstream) -> bytes:
    """A whole answer's body, watched: a replica that stops sending fails the leg."""
    try:
        async with up.watch:
            return await up.response.read()
    except (TimeoutError, aiohttp.ClientError, ReplicaFailed) as exc:
        raise ReplicaFailed(f"connection lost: {failure(exc)}") from None


async def relay(state, ctx: RequestContext, up: Upstream, out: dict[str, str],
                rewrite: Rewrite | None = None) -> web.StreamResponse:
    """The replica's answer to the client with headers ``out``: a stream as it comes, in whole events, or the
    whole body (each changed by ``rewrite``)."""
    response = up.response
    ctype = response.headers.get("Content-Type", "application/json")
    if ctype.startswith("text/event-stream"):
        return await pass_stream(ctx.request, response, out, state.metrics, up.watch,
                                 None if rewrite is None else rewrite.event)
    body = await read_body(up)
    if rewrite is not None and response.status == 200:
        body = rewrite.body(body, ctype)
    state.metrics.outcome("ok" if response.status < 400 else "client_error")
    return web.Response(body=body, status=response.status, headers=out)


def record_prediction(state, expected: int | None, actual: str | None) -> None:
    """The index's prediction of the cached tokens scored against the replica's ``X-Kvemu-Cached-Tokens``."""
    if expected is not None and actual is not None and actual.isdigit():
        state.metrics.record_prediction(expected, int(actual))
