"""How much of a prefill instance's KV pool one client may hold for remote decodes (``--pd-hold-share``).

A prefill leg (``do_remote_decode``) pins its prompt's blocks until a decode instance pulls them, for up to
``--pd-hold-timeout-s`` (480 s) when none does. Anyone who can reach the replica can send one, so a single
client could pin the whole pool: the replica stays "ok" while every other prompt waits for room. A client
without the cluster token (a client address: ``request.remote``) may therefore have at most ``share`` of the
pool's blocks in prefill legs for remote decodes at once, counted at admission by the prompt's full blocks
(the blocks its hold will pin) from the moment it is queued until its hold ends (pulled, released, timed out,
or its client left). The check is at admission because that is where a refusal costs nothing: a prefill
already computed would be wasted, and counting queued legs too keeps a burst of them from overshooting.
Beyond the share the prefill leg gets a 429 naming the flag. Requests that present the cluster token
(kvemu's own router, which also releases each hold as soon as its decode leg ends) are not counted.

kvemu's router names each prefill leg (``X-Kvemu-Hold-Id``, ``HoldNames``) and releases it by that name
(``POST /kv/release {"hold_id"}``), so a hold whose answer it never read (its client left between the legs,
or it gave up on the instance) ends too.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from replica.core.sched.sched_types import SchedRequest
from replica.engine import Handle
from shared.errors import InputError

FLAG = "--pd-hold-share"
# held_usage from which /health says the holds exhaust the pool: what is left cannot admit a long prompt, so a
# router sends it none until holds end (router/cluster.py)
EXHAUSTED_AT = 0.9
NAMES_KEPT = 4096  # names released before their leg was seen, remembered (and named legs kept before a sweep)
SWEEP_AT = 4096  # client entries kept before those whose holds all ended are dropped (a scan of many addresses)


class HoldShareExceeded(InputError):
    """A client over its share of the pool: 429 (the errors middleware reads ``status``)."""

    status = 429


@dataclass(slots=True)
class Charge:
    """A prefill leg counted against its client: the request and the prompt blocks it may hold."""

    req: SchedRequest
    blocks: int


class HoldShares:
    """Each client's prefill legs for remote decodes, and the share they may hold together.

    ``live(req)`` says whether a counted request may still hold blocks (queued, running, or finished and
    held); an entry is dropped the first time it is not, so no path that ends a hold needs to report it."""

    def __init__(self, share: float, capacity_blocks: int, live: Callable[[SchedRequest], bool]) -> None:
        self.share = share
        self.limit = math.floor(share * capacity_blocks)
        self.capacity = capacity_blocks
        self.live = live
        self.by_client: dict[str, list[Charge]] = {}
        self.refused = 0
        self._sweep_at = SWEEP_AT

    def charged(self, client: str) -> int:
        """The blocks ``client``'s legs may hold now (the ended ones dropped)."""
        charges = self.by_client.get(client)
        if not charges:
            return 0
        charges[:] = [c for c in charges if self.live(c.req)]
        if not charges:
            del self.by_client[client]
            return 0
        return sum(c.blocks for c in charges)

    def check(self, client: str, blocks: int) -> None:
        """Refuse (429) a leg of ``blocks`` that would take ``client`` over its share."""
        held = self.charged(client)
        if held + blocks <= self.limit:
            return
        self.refused += 1
        now = f"holds {held:,} blocks in prefills for remote decodes, and this prompt needs {blocks:,} more"
        raise HoldShareExceeded(FLAG.lstrip("-").replace("-", "_"), (
            f"this client {now}: a client without the cluster token may hold at most {self.limit:,} of this"
            f" prefill instance's {self.capacity:,} blocks at once ({FLAG} {self.share:g}); retry once its decode"
            " legs have pulled their KV, send the prefill leg with the cluster token (kvemu's router does), or"
            f" start the replica with a larger {FLAG}"))

    def add(self, client: str, req: SchedRequest, blocks: int) -> None:
        self.by_client.setdefault(client, []).append(Charge(req, blocks))
        if len(self.by_client) >= self._sweep_at:
            for name in list(self.by_client):
                self.charged(name)
            self._sweep_at = max(SWEEP_AT, 2 * len(self.by_client))

    def stats(self) -> dict:
        return {"share": self.share, "limit_blocks": self.limit, "clients": len(self.by_client),
                "refused": self.refused}


class HoldNames:
    """The prefill legs kvemu's router named (``X-Kvemu-Hold-Id``, with the cluster token), so that it can end
    what one holds when it never read the answer, which names the hold (its client left mid-leg, or it gave up
    on a slow prefill instance): by name, before or after the hold exists. A name released before its leg
    arrived is remembered (the ``NAMES_KEPT`` latest), and such a leg refused."""

    def __init__(self, live: Callable[[SchedRequest], bool]) -> None:
        self.live = live
        self.legs: dict[str, Handle] = {}
        self.dropped: OrderedDict[str, None] = OrderedDict()

    def released_already(self, name: str) -> bool:
        return name in self.dropped

    def add(self, name: str, handle: Handle) -> None:
        if len(self.legs) >= NAMES_KEPT:  # names whose release never came: kept while their request may hold
            self.legs = {n: h for n, h in self.legs.items() if self.live(h.req)}
        self.legs[name] = handle

    def pop(self, name: str) -> Handle | None:
        """The leg named ``name`` (None: not seen yet, or released already; remembered as released)."""
        handle = self.legs.pop(name, None)
        if handle is None:
            self.dropped[name] = None
            if len(self.dropped) > NAMES_KEPT:
                self.dropped.popitem(last=False)
        return handle
