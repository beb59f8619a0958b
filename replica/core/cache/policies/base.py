"""The policy interface: a small synchronous class that owns only an ordering.

The block pool owns residency, hashes, reference counts (pinning) and events. A policy
is told what each request accessed and which blocks became evictable, and is asked for
victims. It never does I/O and never scans the whole cache per eviction.

Contract with the pool:
* ``on_access(acc)`` after the pool has allocated a request's new blocks. ``acc.touched_idx``
  lists the depths of resident blocks the request touched, ``acc.new_idx`` the
  indices of blocks just inserted; both ascending. All of them are pinned now.
* ``on_release(hashes, now)`` with the blocks (ascending depth) that just became evictable: the
  last request holding each has ended. It may include blocks the policy gave up as victims
  while they were pinned (below); the policy puts them back in its order.
* ``on_pin(hashes)``, only for a policy with ``takes_pins = True``: resident blocks a request
  just pinned (no other request held them), before any eviction for that request. Such a
  policy keeps only evictable blocks in its order (vLLM's free queue): they leave it here
  and come back through ``on_release``. Other policies leave pinned blocks in place.
* ``victims(need)`` returns at least ``need`` distinct hashes from the policy's order and forgets
  them; the pool only asks when the order holds that many. Policies never look at pins: the pool
  (``BlockPool._evict``, the one place) evicts the unpinned ones, and a pinned one leaves the
  order until ``on_release`` returns it, as blocks leave vLLM's free queue while in use.
* ``on_remove(h)`` when the pool drops a block for another reason (admin removal);
  ``clear()`` on a reset.
* ``on_pool_op(op)``, only for a policy with ``observes_pool = True`` (adaptive): after each lookup
  (``SERVE`` / ``ACQUIRE``), ``RELEASE`` and ``STORE`` the pool ran, the call itself (``PoolOp``), so a
  shadow pool can run the same calls through the pool's own rules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

from replica.core.cache.types import Access, PolicyContext, PoolOp
from shared.errors import InputError

__all__ = ["Access", "AgeOrdered", "EvictionPolicy", "PolicyContext", "hand_over"]


@runtime_checkable
class AgeOrdered(Protocol):
    """A policy that can list its resident blocks oldest first (LRU does): the adaptive policy then
    keeps no recency queue of its own while it runs."""

    def age_order(self) -> list[int]: ...


class EvictionPolicy(ABC):
    name: ClassVar[str] = "base"
    # True for offline oracles that need Access.next_use (simulator only).
    needs_future: ClassVar[bool] = False
    # True for policies whose order holds only evictable blocks: the pool calls on_pin.
    takes_pins: ClassVar[bool] = False
    # True for policies that read ``ctx.pinned``: the pool then pins the blocks of a request served
    # alone too (``BlockPool.serve`` otherwise only keeps them out of that request's own evictions).
    reads_pins: ClassVar[bool] = False
    # True for policies that hear every pool call (``on_pool_op``): the adaptive policy's shadow replay.
    observes_pool: ClassVar[bool] = False

    def __init__(self, **params) -> None:
        if params:
            raise InputError("policy", f"{self.name} takes no parameters, got {sorted(params)}")

    ctx: PolicyContext

    def bind(self, ctx: PolicyContext) -> None:
        """Called by the pool before any other hook (again on a live policy switch)."""
        self.ctx = ctx

    @abstractmethod
    def on_access(self, acc: Access) -> None: ...

    def on_pin(self, hashes: Sequence[int]) -> None:
        """Blocks a request just pinned leave the order (called only when ``takes_pins``)."""

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        """Default: ordering does not change when a request ends."""

    def on_pool_op(self, op: PoolOp) -> None:
        """A call the pool just ran (called only when ``observes_pool``)."""

    @abstractmethod
    def victims(self, need: int) -> list[int]: ...

    @abstractmethod
    def on_remove(self, h: int) -> None: ...

    @abstractmethod
    def clear(self) -> None: ...

    def describe(self) -> dict:
        """Policy parameters, for /stats and sim JSON."""
        return {"name": self.name}


def hand_over(policy: EvictionPolicy, ctx: PolicyContext, newest_first: Sequence[int], now: float) -> None:
    """Give a fresh policy the resident blocks, newest first (a live switch).

    It sees them as one request whose last block goes first, so age order carries over; the
    unpinned ones are released at once, the pinned ones when their requests end.
    """
    policy.bind(ctx)
    if newest_first:
        policy.on_access(Access(newest_first, [], list(range(len(newest_first))), now, None, None))
        pinned = ctx.pinned
        policy.on_release([h for h in newest_first if h not in pinned], now)

