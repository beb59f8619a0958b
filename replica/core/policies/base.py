"""The policy interface: a small synchronous class that owns only an ordering.

The block pool owns residency, hashes, reference counts (pinning) and events. A policy
is told what each request accessed and which blocks became evictable, and is asked for
victims. It never does I/O and never scans the whole cache per eviction.

Contract with the pool:
* ``on_access(acc)`` after the pool has allocated a request's new blocks. ``acc.touched_idx``
  lists the depths of resident blocks the request touched, ``acc.new_idx`` the
  indices of blocks just inserted; both ascending.
* ``on_release(hashes, now)`` when a request finishes: its blocks (ascending depth), which
  are evictable again unless another request still pins them.
* ``victims(need)`` returns at least ``need`` distinct resident, unpinned hashes and forgets
  them (the pool removes them). The pool only asks when that many exist. A policy may
  keep stale entries (for example pinned blocks it has not been told about) and skip them
  lazily, checking ``ctx.pinned``.
* ``on_remove(h)`` when the pool drops a block for another reason (admin removal);
  ``clear()`` on a reset.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from replica.core.types import Access, PolicyContext
from shared.errors import InputError

__all__ = ["Access", "EvictionPolicy", "PolicyContext"]


class EvictionPolicy(ABC):
    name: ClassVar[str] = "base"
    # True for offline oracles that need Access.next_use (simulator only).
    needs_future: ClassVar[bool] = False

    def __init__(self, **params) -> None:
        if params:
            raise InputError("policy", f"{self.name} takes no parameters, got {sorted(params)}")

    ctx: PolicyContext

    def bind(self, ctx: PolicyContext) -> None:
        """Called by the pool before any other hook (again on a live policy switch)."""
        self.ctx = ctx

    @abstractmethod
    def on_access(self, acc: Access) -> None: ...

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        """Default: ordering does not change when a request ends."""

    @abstractmethod
    def victims(self, need: int) -> list[int]: ...

    @abstractmethod
    def on_remove(self, h: int) -> None: ...

    @abstractmethod
    def clear(self) -> None: ...

    def describe(self) -> dict:
        """Policy parameters, for /stats and sim JSON."""
        return {"name": self.name}
