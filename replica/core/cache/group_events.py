"""A pool of KV cache groups' events per group (replica/core/cache/grouped.py), as vLLM publishes them.

The pool keys group ``g``'s copy of block ``h`` by ``group_key(h, g)`` (groups.py), so its events carry those
keys. vLLM's events name a block by its hash and its group by ``group_idx`` (vLLM 0.33's
``vllm/distributed/kv_events.py``: ``BlockStored`` and ``BlockRemoved`` carry it; ``BlockPool.cache_full_blocks``
publishes each group's cached blocks, every group's): ``GroupKeys.resolve`` turns each key back into ``(h, g)``,
its events plain hashes with their group (``KvEvent.group``): a drained ``stored`` event (one allocation's
blocks, every group's: a prefill chunk's, a decode step's fill, a response stored) one event per group in group
order, as vLLM's ``cache_blocks`` publishes them, a ``removed`` one a run of one group an event.

It is taught each request's blocks as it is submitted (``teach``: its prompt's and its response's hashes, what
the pool will ever key), and each group-0 block it sees stored (group 0's key is the hash itself). The keys of a
block stay known while any level holds it in any group, and at most ``keep`` blocks' beyond (the oldest taught
go first); a key never taught reads as group 0's.

The router's prefix index follows one group, ``index_group``: the first full-attention group, whose leading
run of blocks is a prompt's prefix (a window group's early blocks go as the window passes them). A block held
in several groups is then one entry, as Dynamo's indexer keys a block by its group and gates out the
sliding-window ones; a window's blocks at the hit point are held wherever the full group's are but in rare
evictions, which the replica's own hit rule then settles.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice

from replica.core.cache.groups import group_key
from replica.core.cache.types import KvEvent
from shared.kv_groups import FULL, KvGroups


def index_group(groups: KvGroups) -> int:
    """The group the prefix index follows: the first full-attention one (none: group 0)."""
    return next((g for g, x in enumerate(groups.groups) if x.kind == FULL), 0)


def for_index(events: Sequence[KvEvent], group: int) -> list[KvEvent]:
    """The events of ``group`` (and ``cleared``, every group's), as group 0's: what the prefix index applies."""
    return [e if e.group == 0 else KvEvent(e.kind, e.hashes, e.level)
            for e in events if e.kind == "cleared" or e.group == group]


class GroupKeys:
    """The keys of the blocks some level holds in some group: ``key -> (hash, group)`` (see the module's doc)."""

    def __init__(self, groups: KvGroups, keep: int = 1 << 17) -> None:
        self.width = len(groups.groups)
        self.index_group = index_group(groups)
        self.keep = keep
        self._origin: dict[int, tuple[int, int]] = {}  # a key of group >= 1 -> (block hash, group)
        self._keys: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # block hash -> its keys in groups 1.., taught
        self._held: dict[int, int] = {}  # key (group 0's: the hash) -> mask of the levels holding it
        self._sweep = False

    def resolve(self, events: Sequence[KvEvent]) -> list[KvEvent]:
        """The pool's events as each group's, in order; what they change is remembered (call once per event)."""
        out: list[KvEvent] = []
        for e in events:
            if e.kind == "cleared":
                self._clear(e.level)
                out.append(e)
                continue
            stored, bit = e.kind == "stored", 1 << e.level
            for k in e.hashes:
                h = self._origin.get(k, (k, 0))[0]
                if stored:
                    if k == h and h not in self._keys:
                        self._teach(h)
                    self._held[k] = self._held.get(k, 0) | bit
                else:
                    mask = self._held.pop(k, 0) & ~bit
                    if mask:
                        self._held[k] = mask
                    else:
                        self._forget(h)
            out += self._runs(e)
        if self._sweep:
            self._sweep = False
            for h in [h for h in self._keys if not self._any_held(h)]:
                self._drop(h)
        return out

    def teach(self, *hashes: Iterable[int] | None) -> None:
        """A submitted request's blocks (its prompt's hashes, its response's): their keys in every group."""
        for part in hashes:
            for h in map(int, part if part is not None else ()):  # a trace's hashes may be numpy's
                if h in self._keys:
                    self._keys.move_to_end(h)
                else:
                    self._teach(h)
        excess = len(self._keys) - self.keep
        for h in list(islice(self._keys, excess)) if excess > 0 else ():  # the oldest taught
            if self._any_held(h):
                self._keys.move_to_end(h)  # known while held (at most the pool's blocks: keep is more)
            else:
                self._drop(h)

    def lookup(self, events: Sequence[KvEvent]) -> list[KvEvent]:
        """Events of blocks held now (a resync's snapshot) as each group's, remembering nothing."""
        return [r for e in events for r in ([e] if e.kind == "cleared" else self._runs(e))]

    def index_events(self, events: Sequence[KvEvent]) -> list[KvEvent]:
        """``resolve``, then what the prefix index applies (``for_index``)."""
        return for_index(self.resolve(events), self.index_group)

    def __len__(self) -> int:
        return len(self._origin)

    # ---- inside --------------------------------------------------------------------------------
    def _runs(self, e: KvEvent) -> list[KvEvent]:
        """``e``'s keys as their groups' events: a ``stored`` one event per group in group order (one allocation's
        blocks: vLLM's cache_blocks publishes group by group), a ``removed`` a run of one group an event in the
        order the blocks went (vLLM publishes each eviction as it happens)."""
        if e.kind == "stored":
            by_group: dict[int, list[int]] = {}
            for k in e.hashes:
                h, g = self._origin.get(k, (k, 0))
                by_group.setdefault(g, []).append(h)
            return [KvEvent(e.kind, tuple(by_group[g]), e.level, g) for g in sorted(by_group)]
        runs: list[tuple[int, list[int]]] = []
        for k in e.hashes:
            h, g = self._origin.get(k, (k, 0))
            if runs and runs[-1][0] == g:
                runs[-1][1].append(h)
            else:
                runs.append((g, [h]))
        return [KvEvent(e.kind, tuple(hashes), e.level, g) for g, hashes in runs]

    def _teach(self, h: int) -> None:
        keys = tuple(group_key(h, g) for g in range(1, self.width))
        self._keys[h] = keys
        for g, k in enumerate(keys, 1):
            self._origin[k] = (h, g)

    def _any_held(self, h: int) -> bool:
        return h in self._held or any(k in self._held for k in self._keys.get(h, ()))

    def _forget(self, h: int) -> None:
        """No level holds ``h``'s copy in some group any more: its keys go once no copy is held."""
        if h in self._keys and not self._any_held(h):
            self._drop(h)

    def _drop(self, h: int) -> None:
        for k in self._keys.pop(h):
            del self._origin[k]

    def _clear(self, level: int) -> None:
        """A level dropped every block (its ``stored`` of what it kept follows): the keys stay taught until this
        call's events are read, for those stored again may come in any group order."""
        keep = ~(1 << level)
        self._held = {k: mask & keep for k, mask in self._held.items() if mask & keep}
        self._sweep = True
