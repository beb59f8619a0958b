"""Whole-conversation LRU (the mean-field LRU paper's "whole-content LRU"): a session is resident or absent.

Units are ordered from LRU to MRU. A unit is a session: the blocks it inserted (their
owner in ``ctx.owners``), tracked incrementally as session -> insertion-ordered set of
blocks. A request without a session is its own anonymous unit (its new blocks).

* ``on_access``: the owners of the blocks the request reused move to the MRU end (their
  content was just used, e.g. another session's shared system prompt, or an anonymous
  request whose prefix is reused), then the request's own session, so it is the most
  recent. New blocks join their owner's unit.
* ``victims(need)``: whole units are evicted from the LRU end, every block of each, until
  at least ``need`` blocks are out (usually more than ``need``). A unit with a pinned
  block (its session, or a session whose blocks it shares, has a request running) counts as
  in use, hence most recent: it is passed over and moved to the MRU end. Only if every
  evictable block sits in such units are they handed out whole, least recent first; the pool
  keeps their pinned blocks (the one case where a session is left partially resident), and
  ``on_release`` puts those back in their owner's unit.
* ``pool.set_policy`` hands over resident blocks in an access without a session: they
  are grouped by their owner in ``ctx.owners`` (ownerless ones form one unit).
"""

from __future__ import annotations

from collections import OrderedDict

from replica.core.cache.policies.base import Access, EvictionPolicy


class SessionLRUPolicy(EvictionPolicy):
    name = "session_lru"
    reads_pins = True  # a unit with a pinned block counts as in use

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.clear()

    def on_access(self, acc: Access) -> None:
        hashes = acc.hashes
        units, unit_of = self._units, self._unit_of
        key: object  # a session id, or (None, n) for a request without one
        if acc.session is None:
            self._anon += 1
            key = (None, self._anon)  # a tuple never equals a session id (a str)
        else:
            key = acc.session
        last: object = key
        for i in reversed(acc.touched_idx):
            k = unit_of.get(hashes[i])
            if k is not None and k != last:
                units.move_to_end(k)
                last = k
        if acc.new_idx:
            owner = self.ctx.owners
            for i in acc.new_idx:
                h = hashes[i]
                k = key if acc.session is not None else owner.get(h)
                if k is None:
                    k = key
                blocks = units.get(k)
                if blocks is None:
                    blocks = units[k] = {}
                blocks[h] = None
                unit_of[h] = k
        if key in units:
            units.move_to_end(key)

    def on_release(self, hashes, now: float) -> None:
        unit_of = self._unit_of
        if all(map(unit_of.__contains__, hashes)):
            return
        owners = self.ctx.owners
        for h in hashes:  # given up as victims while pinned: back into their owner's unit
            if h not in unit_of:
                key = owners.get(h)
                blocks = self._units.get(key)
                if blocks is None:
                    blocks = self._units[key] = {}
                blocks[h] = None
                unit_of[h] = key

    def victims(self, need: int) -> list[int]:
        """Whole units, least recent first; a unit in use counts as most recent.

        Being in use is this policy's recency signal, so it reads the pin view; keeping pinned
        blocks resident is the pool's job: when only units in use are left, they are handed
        out whole and the pool keeps their pinned blocks.
        """
        units, unit_of, pinned = self._units, self._unit_of, self.ctx.pinned
        out: list[int] = []
        in_use = []
        while len(out) < need and units:
            key, blocks = units.popitem(last=False)
            if blocks.keys().isdisjoint(pinned.keys()):  # views: walks the smaller one
                out.extend(blocks)
                for h in blocks:
                    del unit_of[h]
            else:
                in_use.append((key, blocks))
        for key, blocks in in_use:  # most recent now, in their previous order
            units[key] = blocks
        while len(out) < need:
            _key, blocks = units.popitem(last=False)
            out.extend(blocks)
            for h in blocks:
                del unit_of[h]
        return out

    def on_remove(self, h: int) -> None:
        k = self._unit_of.pop(h, None)
        if k is not None:
            blocks = self._units[k]
            del blocks[h]
            if not blocks:
                del self._units[k]

    def clear(self) -> None:
        self._units: OrderedDict[object, dict[int, None]] = OrderedDict()  # first = LRU
        self._unit_of: dict[int, object] = {}
        self._anon = 0

    def describe(self) -> dict:
        return {"name": self.name}
