"""A live replica's side of disaggregated prefill and decode (replica/core/disagg.py), on vLLM's wire.

A client (vLLM's disaggregated proxy, llm-d's routing sidecar, kvemu's router) drives a request in two
legs, as vLLM's NIXL connector expects:

1. **Prefill leg**, to a ``prefill`` (or ``both``) replica, with ``"kv_transfer_params":
   {"do_remote_decode": true}``: the prompt is computed with ``max_tokens`` forced to 1, and the request's
   blocks stay pinned when it finishes (``SchedRequest.hold``). Its answer carries what NIXL's
   ``request_finished`` returns: ``{"do_remote_prefill": true, "do_remote_decode": false,
   "remote_engine_id": <replica id>, "remote_block_ids": [...], "remote_host", "remote_port",
   "remote_request_id", "tp_size"}``. ``remote_block_ids`` are the held blocks' positions in the prompt
   (an emulated pool has no physical block ids; their count is what a decoder may read).
2. **Decode leg**, to a ``decode`` (or ``both``) replica, with those parameters: the replica reserves the
   request's blocks (``Scheduler.reserve_remote``, vLLM's WAITING_FOR_REMOTE_KVS), then pulls the KV it lacks:
   ``POST http://remote_host:remote_port/kv/pull`` with ``{"remote_request_id", "bytes", "decoder"}``,
   presenting the transfer's own credential (below). The prefill replica prices ``bytes`` on its NIC's
   send ``Link`` and answers when they are sent (``{"ok": true, "send_s"}``), releasing the held blocks;
   meanwhile the decode replica prices the
   same bytes on its own receive ``Link``. The KV is delivered when both are done (``disagg.delivered_at``, the
   simulator's rule too); the request then
   computes its last prompt token and decodes (``Scheduler.remote_arrived``). A pull that fails (prefill instance
   unreachable, the request unknown to it, any other error) or a reservation that does not fit falls back
   to a local prefill, counted by reason.

**No secret to an address a request names.** ``remote_host`` / ``remote_port`` come from a request, so a
decoder never presents the cluster token there: a prefill instance issues each hold its own random credential
(``kvemu_transfer_token`` in the answer's ``kv_transfer_params``, beside NIXL's fields; third-party proxies pass
those parameters on whole) and ``/kv/pull`` takes it for that one request (or the cluster token, from the
cluster's own tools). With ``--pd-peers`` a decoder contacts only the prefill instances listed there (`kvemu up`
lists its own); any other address is a 400 before any connection, the same answer whatever listens there.

Held blocks never stay pinned: a pull releases them whatever happens to it, an unpulled request is released
after ``--pd-hold-timeout-s`` (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s, wall clock), a prefill
whose client left is released at once, kvemu's router releases each of its holds once the decode leg ended
(``POST /kv/release``), and shutdown releases what is left. A client without the cluster token may hold at
most ``--pd-hold-share`` of the pool (replica/pd_share.py), and ``/health`` says when holds exhaust it.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import uuid
from collections import Counter as Tally
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry, Histogram

from replica.core.disagg import Nic, delivered_at
from replica.core.sched.sched_types import SchedRequest
from replica.core.tiers.link import Link
from replica.engine import Engine, Handle
from replica.pd_share import EXHAUSTED_AT, HoldNames, HoldShares
from replica.settings import ReplicaSettings
from shared.auth import bearer_header, bearer_matches
from shared.errors import InputError
from shared.protocol import KV_PARAMS, TRANSFER_TOKEN, KvTransferParams

FAILOVER_REASONS = ("no_room", "unreachable", "unknown_request", "prefill_error")
# vLLM's NIXL histograms (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, NixlPromMetrics)
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(1 << k) for k in range(20, 36, 2))  # 1 MiB .. 16 GiB


def check_role(role: str, params: KvTransferParams) -> None:
    """A prefill replica decodes nothing remote, a decode replica prefills for no one: 400 naming the flag."""
    if params.do_remote_decode and role == "decode":
        raise InputError(f"{KV_PARAMS}.do_remote_decode", "this replica's role is decode: it does not prefill for"
                         " another instance (send the prefill leg to a prefill or both replica)")
    if params.do_remote_prefill and role == "prefill":
        raise InputError(f"{KV_PARAMS}.do_remote_prefill", "this replica's role is prefill: it does not decode"
                         " after a remote prefill (send the decode leg to a decode or both replica)")


def _blocks(req: SchedRequest) -> int:
    """The blocks a request's allocation holds (none once they went back)."""
    return len(req.alloc.hashes) if req.alloc is not None else 0


@dataclass(slots=True)
class Held:
    """A finished prefill whose blocks wait for a decode instance's pull."""

    req: SchedRequest
    timer: asyncio.TimerHandle
    token: str  # the credential its pull presents (TRANSFER_TOKEN)


@dataclass(slots=True)
class PdCounters:
    held_total: int = 0  # prefills held for a remote decode
    expired: int = 0  # held prefills nobody pulled before the timeout (vllm:nixl_num_kv_expired_reqs)
    pulls_unknown: int = 0  # pulls naming a request this replica does not hold
    remote_requests: int = 0  # decodes whose KV came over the network
    waiting_for_kv: int = 0  # decodes reserved, their KV not in yet
    failovers: Tally = field(default_factory=Tally)  # by reason: decodes that prefilled locally instead
    kv_wait_s: float = 0.0  # emulated seconds remote decodes waited for their KV (reserve to delivery)
    first_decode_s: float = 0.0  # ... and from delivery to their first token
    first_tokens: int = 0  # remote decodes whose first token came (first_decode_s's count)
    last_kv_wait_s: float | None = None
    released: int = 0  # holds ended by a /kv/release before any pull (the router's decode leg ended first)


class PdRuntime:
    """One replica's P/D state: its NIC (``disagg.Nic``, as the simulator's network has it), the prefills it
    holds for a pull, the pulls it makes as a decode instance, and what both count."""

    def __init__(self, settings: ReplicaSettings, engine: Engine, kv_bytes_per_token: int,
                 registry: CollectorRegistry, labels: list[str]) -> None:
        self.settings = settings
        self.engine = engine
        self.kv_bytes_per_token = kv_bytes_per_token
        self.nic = Nic.of(settings.replica_id, settings.nic_bytes_per_s(), settings.pd.link_latency_s)
        self.sent_transfers = self.recv_transfers = 0
        self.held: dict[str, Held] = {}
        self.counters = PdCounters()
        # what one client without the cluster token may hold (replica/pd_share.py)
        self.shares = HoldShares(settings.pd_hold_share, settings.resolved_capacity_blocks(), self._may_hold)
        self.names = HoldNames(self._may_hold)  # the legs kvemu's router named, to release them by name
        self.session: aiohttp.ClientSession | None = None  # set by the app's pd_ctx
        values = (settings.model, settings.replica_id)
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds", "Emulated seconds of each KV transfer this"
                                   " decode instance received (reserve to delivery).", labels, buckets=XFER_BUCKETS,
                                   registry=registry).labels(*values)
        self.xfer_bytes = Histogram("vllm:nixl_bytes_transferred", "Bytes of each KV transfer this decode instance"
                                    " received.", labels, buckets=BYTES_BUCKETS, registry=registry).labels(*values)

    # ---- prefill side ---------------------------------------------------------------
    def advertised_host(self) -> str:
        host = self.settings.serving.host
        return socket.gethostname() if host in ("", "0.0.0.0", "::") else host

    def hold(self, handle: Handle) -> dict:
        """A finished prefill for a remote decode: keep its blocks for a pull (or the timeout); what its
        answer's ``kv_transfer_params`` say (NIXL's ``request_finished``)."""
        req = handle.req
        rid = f"pd-{self.settings.replica_id}-{uuid.uuid4().hex[:16]}"
        blocks = len(req.alloc.hashes) if req.alloc is not None and req.hold else 0
        token = secrets.token_urlsafe(24)
        if req.hold:  # (a prefill whose client left was released already: nothing to pull)
            timer = asyncio.get_running_loop().call_later(self.settings.pd_hold_timeout_s, self._expire, rid)
            self.held[rid] = Held(req, timer, token)
            self.counters.held_total += 1
        handle.kv_transfer_params = {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.settings.replica_id,
            "remote_block_ids": list(range(blocks)), "remote_host": self.advertised_host(),
            "remote_port": self.settings.port, "remote_request_id": rid, "tp_size": self.engine_tp(),
            TRANSFER_TOKEN: token}
        return handle.kv_transfer_params

    def may_pull(self, rid: str, given: str) -> bool:
        """Whether ``Authorization`` value ``given`` opens the pull of held request ``rid``: its own credential."""
        held = self.held.get(rid)
        return held is not None and bearer_matches(given, held.token)

    def engine_tp(self) -> int:
        from shared.costmodel import split_tp

        return split_tp(self.settings.gpu)[1]

    def _unhold(self, rid: str) -> Held | None:
        """Hold ``rid`` taken off the held list with its timer stopped (None: not held here); the caller
        gives its blocks back."""
        held = self.held.pop(rid, None)
        if held is not None:
            held.timer.cancel()
        return held

    def _expire(self, rid: str) -> None:
        held = self._unhold(rid)
        if held is not None:
            self.counters.expired += 1
            self.engine.release_held(held.req)

    def release(self, rid: str) -> int | None:
        """The hold ``rid`` released before any pull (the router's decode leg ended without one): its
        block count, or None where it is not held (pulled already, timed out, never held here)."""
        held = self._unhold(rid)
        if held is None:
            return None
        blocks = _blocks(held.req)
        self.counters.released += 1
        self.engine.release_held(held.req)
        return blocks

    def release_named(self, name: str) -> int | None:
        """The prefill leg kvemu's router named ``name`` released, wherever it is: held (by its request id),
        or still queued or computing, or done and not yet held (aborted: it never will be). Its block count,
        or None where it holds nothing (and a leg of that name that comes later is refused)."""
        handle = self.names.pop(name)
        if handle is None:
            return None
        if handle.kv_transfer_params is not None:  # answered: held under its request id, if at all
            return self.release(handle.kv_transfer_params["remote_request_id"])
        if not self._may_hold(handle.req):
            return None
        blocks = _blocks(handle.req)
        self.counters.released += 1
        self.engine.abort(handle)
        return blocks

    def _may_hold(self, req: SchedRequest) -> bool:
        """Whether a prefill leg may still hold blocks: queued or running (its handle is the engine's), or
        finished with its blocks held (``hold`` clears when they go back; an abort takes its allocation)."""
        return req.hold and (req.rid in self.engine.handles or req.alloc is not None)

    def hold_health(self) -> dict:
        """``/health``'s part: the distinct blocks holds pin (two holds of one prompt pin its blocks once), their
        share of the pool, and ``holds: exhausted`` from ``EXHAUSTED_AT`` on (routers then send it no prompts)."""
        pinned = len({h for held in self.held.values() if held.req.alloc is not None for h in held.req.alloc.hashes})
        usage = pinned / self.shares.capacity
        return {"held_blocks": pinned, "held_usage": usage, "holds": "exhausted" if usage >= EXHAUSTED_AT else "ok"}

    @property
    def held_blocks(self) -> int:
        return sum(_blocks(h.req) for h in self.held.values())

    async def pull(self, rid: str, nbytes: int) -> float:
        """Send ``nbytes`` of held request ``rid`` on this NIC's send link, then release its blocks;
        the emulated seconds the send took. KeyError: no such request held here."""
        held = self._unhold(rid)
        if held is None:
            raise KeyError(rid)
        try:
            start = self.engine.clock()
            tr = self.nic.send.start(start, nbytes)
            self.sent_transfers += 1
            end = await self.engine.until(lambda: self.nic.send.finish(tr))
        finally:  # whatever happens to the pull (the decoder left, shutdown), the blocks go back
            self.engine.release_held(held.req)
        return end - start

    def release_all(self) -> None:
        """Shutdown: nothing stays pinned."""
        for rid in list(self.held):
            held = self._unhold(rid)
            if held is not None:
                self.engine.release_held(held.req)

    # ---- decode side ----------------------------------------------------------------
    def check_peer(self, host: str, port: int, field: str) -> None:
        """A 400 naming ``field`` for an address outside ``--pd-peers`` (when given), before any connection:
        the same answer whatever listens there, so a request cannot use this replica to probe ports."""
        peers = self.settings.pd_peers
        if peers is not None and f"{host.strip('[]').lower()}:{port}" not in peers:
            raise InputError(field, f"{host}:{port} is not a prefill instance this replica knows (--pd-peers);"
                                    " send the parameters its prefill leg's answer gave, or add it to --pd-peers")

    def transfer_bytes(self, req: SchedRequest) -> int:
        tokens = self.settings.pd.transfer_tokens(req.input_tokens, self.engine.sched.reserved_hits(req),
                                                    self.settings.block_size)
        return tokens * self.kv_bytes_per_token

    async def fetch(self, handle: Handle, params: KvTransferParams) -> str | None:
        """Pull a reserved request's KV from its prefill instance while pricing it on this NIC's receive
        link; once both are done the request runs (``Engine.arrived``). None, or why it failed (the
        caller cancels the reservation and prefills locally)."""
        req = handle.req
        nbytes = self.transfer_bytes(req)
        start = self.engine.clock()
        tr = self.nic.recv.start(start, nbytes)
        self.recv_transfers += 1
        self.counters.waiting_for_kv += 1
        try:
            (why, send_s), end = await asyncio.gather(self._post_pull(params, nbytes),
                                                      self.engine.until(lambda: self.nic.recv.finish(tr)))
        finally:
            self.counters.waiting_for_kv -= 1
        if why is not None:
            return why
        delivered = delivered_at(start + send_s, end)
        self.engine.arrived(handle, delivered)
        wait = handle.kv_arrived - req.arrival
        c = self.counters
        c.remote_requests += 1
        c.kv_wait_s += wait
        c.last_kv_wait_s = wait
        self.xfer_time.observe(delivered - start)
        self.xfer_bytes.observe(nbytes)
        handle.first_token.add_done_callback(lambda _f: self._first_token(handle))
        return None

    def _first_token(self, handle: Handle) -> None:
        self.counters.first_tokens += 1
        self.counters.first_decode_s += handle.req.t_first_token - handle.kv_arrived

    async def _post_pull(self, params: KvTransferParams, nbytes: int) -> tuple[str | None, float]:
        host = params.remote_host or ""
        url = f"http://{f'[{host}]' if ':' in host else host}:{params.remote_port}/kv/pull"
        # the hold's own credential, never the cluster token: the address came from a request
        headers = bearer_header(params.transfer_token)
        body = {"remote_request_id": params.remote_request_id, "bytes": nbytes, "decoder": self.settings.replica_id}
        assert self.session is not None, "the app's pd_ctx opens the session"
        timeout = aiohttp.ClientTimeout(total=self.settings.pd_hold_timeout_s + 60, sock_connect=10)
        try:
            async with self.session.post(url, json=body, headers=headers, timeout=timeout) as resp:
                if resp.status == 404:
                    return "unknown_request", 0.0
                if resp.status != 200:
                    return "prefill_error", 0.0
                answer = await resp.json()
                return None, float(answer["send_s"])
        except (aiohttp.ClientError, OSError, TimeoutError):
            return "unreachable", 0.0
        except (ValueError, KeyError, TypeError):  # an answer that is not the pull's
            return "prefill_error", 0.0

    def failover(self, reason: str) -> None:
        self.counters.failovers[reason] += 1

    # ---- views ----------------------------------------------------------------------
    def link_stats(self, link: Link, transfers: int) -> dict:
        utilization = link.utilization(self.engine.clock())  # settles the link up to now
        return {"transfers": transfers, "bytes": link.bytes_moved, "in_flight": link.in_flight,
                "busy_s": link.busy_s, "utilization": utilization}

    def stats(self) -> dict:
        """``/stats``' ``pd`` part."""
        s, c = self.settings, self.counters
        return {
            "role": s.role, "link_gbps": self.nic.send.bandwidth * 8 / 1e9, "link_latency_us": s.pd.link_latency_s * 1e6,
            "transfer": s.pd.transfer, "hold_timeout_s": s.pd_hold_timeout_s, "response_kv": s.stored_response_kv,
            "send": self.link_stats(self.nic.send, self.sent_transfers),
            "recv": self.link_stats(self.nic.recv, self.recv_transfers),
            "held_requests": len(self.held), "held_blocks": self.held_blocks, "held_total": c.held_total,
            "expired": c.expired, "released": c.released, "hold_share": self.shares.stats(),
            "pulls_unknown": c.pulls_unknown, "remote_requests": c.remote_requests,
            "waiting_for_kv": c.waiting_for_kv, "failovers": {r: c.failovers[r] for r in FAILOVER_REASONS},
            "ttft_split": {"requests": c.remote_requests, "kv_wait_s_total": c.kv_wait_s,
                           "kv_wait_s_mean": c.kv_wait_s / c.remote_requests if c.remote_requests else None,
                           "kv_wait_s_last": c.last_kv_wait_s, "first_tokens": c.first_tokens,
                           "first_decode_s_total": c.first_decode_s,
                           "first_decode_s_mean": c.first_decode_s / c.first_tokens if c.first_tokens else None},
        }
