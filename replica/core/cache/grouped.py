"""A pool of KV cache groups: one block table per group per request over one ``BlockPool``, as vLLM's hybrid
KV cache manager keeps them (``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``).

The scheduler sees a request's blocks as before (its prompt's hashes, then private blocks); this pool holds
each of them once per group: group ``g``'s copy of block ``h`` is keyed ``group_key(h, g)`` (groups.py), a
private block is one private block per group. The rules are vLLM's:

* **Admission** (``acquire``): the hit is the longest prefix every group serves (``hit_blocks``), at most
  the request's tokens but one, as vLLM's ``get_computed_blocks`` asks; a window group skips the blocks
  the window has already passed at the hit (``skipped_blocks``: vLLM pads them with its null block). Each
  group pins its hit's blocks; the whole sequence (a window's capped) and the first chunk must fit.
* **Each prefill chunk** (``extend``, vLLM's ``allocate_slots``): every group takes the chunk's blocks as it
  is scheduled; one another running request holds is a new block (a private copy), as vLLM shares only hits.
* **Every step** (``slide``, vLLM's ``remove_skipped_blocks`` in ``allocate_slots``): a window group
  frees the leading blocks its window has passed at the request's computed tokens: a hashed one is
  unpinned (cached still, evictable, its tail first), a private one goes back free.
* **Release** (``release``): group by group in group order, each group's blocks tail first (vLLM's
  ``coordinator.free``), so the free queue hands out group 0's tail first.

Sizes are in physical blocks (one group's page): ``capacity``, ``room``, ``pinned`` and ``private`` are the
underlying pool's; ``width`` is how many physical blocks one more block of a request takes (every group's).
Prefix hit mode only (a hole in one group is not one in another); the compiled pool is not its twin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from replica.core.cache.groups import group_key, hit_blocks, skipped_blocks, state_chunk_tokens, window_of
from replica.core.cache.pool import BlockPool, PoolBusyError, fill_picks
from replica.core.cache.state_table import StateHeld, StateTables, state_held, state_new_block
from replica.core.cache.types import Allocation, Lookup
from shared.errors import InputError
from shared.kv_groups import FULL, STATE, WINDOW, KvGroups


@dataclass(slots=True)
class GroupedAllocation(Allocation):
    """What one request got, with each group's table: the keys it still pins (its window's passed blocks
    gone), how many leading blocks each group has freed, and how many of those were private blocks."""

    tables: list[list[int]] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # per group, the end of the blocks taken (a window: chunk by chunk)
    owed: list[int] = field(default_factory=list)  # per group, blocks of the request not taken yet (a window's)
    slid_private: int = 0  # private blocks the scheduler counts that the base pool does not (freed, or not yet taken)
    copies: set[int] = field(default_factory=set)  # keys it holds as a private copy (another request pinned them)
    state: StateHeld = field(default_factory=StateHeld)  # its state groups' blocks (state_table.py)


class GroupedPool:
    """A ``SchedulerPool`` over ``base`` for a model of several KV cache groups (see the module's doc)."""

    def __init__(self, base: BlockPool, groups: KvGroups) -> None:
        if base.hit_mode != "prefix":
            raise InputError("hit_mode", "KV cache groups reuse a leading run of blocks: use --hit-mode prefix")
        if not base.prefix_caching:
            raise InputError("prefix_caching", "KV cache groups run with prefix caching on")
        self.base = base
        self.groups = groups
        self.width = len(groups.groups)
        self.capacity = base.capacity
        self.block_size = base.block_size
        self._windows = [(g, x.window) for g, x in enumerate(groups.groups) if x.kind == WINDOW]
        # the group whose pins stand for a block's: a full group's (it holds every block a window group does)
        self._window_ids = {g for g, _ in self._windows}
        # tokens scheduled but not settled, vLLM's max_in_flight_tokens: two steps' (--max-num-batched-tokens) with
        # its default async scheduling; what a window's admission cap counts beside the window
        self.in_flight = 2 * 8192
        # the tokens an admission's first chunk may take (the step's budget left), set by the scheduler while it
        # admits: vLLM allocates that chunk's blocks at admission, so they must be free too; None: not checked
        self.chunk_tokens: int | None = None
        kinds = [x.kind for x in groups.groups]
        self._ref = kinds.index(FULL) if FULL in kinds else next((g for g, k in enumerate(kinds) if k != WINDOW), 0)
        # state groups (state_table.py): one or two blocks a request, cached only where a step ends on a block's end
        self.states = StateTables(tuple(g for g, k in enumerate(kinds) if k == STATE))

    # ---- what the scheduler reads -------------------------------------------------------------
    @property
    def private(self) -> int:
        return self.base.private

    @property
    def pinned(self) -> int:
        return self.base.pinned

    @property
    def room(self) -> int:
        return self.base.room

    @property
    def pin_counts(self) -> Mapping[int, int]:
        return self.base.pin_counts

    def pins_of(self, hashes: Sequence[int]) -> list[int]:
        """Per block, the running requests pinning its copy in a full group (admission's room arithmetic, and
        which filled blocks a request pins in place of its private ones)."""
        ref = self._ref
        return self.base.pins_of(hashes if ref == 0 else [group_key(h, ref) for h in hashes])

    def held_per_group(self, alloc: GroupedAllocation, extra_blocks: int) -> list[int]:
        """Blocks a request holds in each group (``extra_blocks``: its private blocks, per group)."""
        n = len(alloc.hashes)
        total = n + extra_blocks
        states = self.states.ids
        return [state_held(alloc.state, g, alloc.tables[g], total, alloc.freed[g], n) if g in states
                else total - alloc.freed[g] - alloc.owed[g] for g in range(self.width)]

    def new_step(self) -> None:
        """A scheduler step starts: the states cached in the last one are computed now (vLLM's new_step_starts)."""
        self.states.new_step()

    def _cap(self, window: int) -> int:
        """The most blocks vLLM's admission counts a window group at: the window's tokens and a step's in flight,
        one more for a window not starting at a block's start (SlidingWindowSpec.max_admission_blocks_per_request)."""
        return -(-(window - 1 + self.in_flight) // self.block_size) + 1

    def usage(self) -> float:
        return self.base.usage()

    def admission_need(self, blocks: int) -> int:
        """Physical blocks admitting a request of ``blocks`` blocks counts at most on an idle pool (its hit's blocks
        evictable, so counted): each full group's, each window group's capped (vLLM's full_sequence_must_fit), a
        state group's hit block and its new one (vLLM's startup rule: 'align' mode's two). The refusal's measure:
        above the pool's capacity it could never run, at or below it an idle pool admits it."""
        return sum(min(blocks, self._cap(x.window)) if x.kind == WINDOW else min(blocks, 2) if x.kind == STATE
                   else blocks for x in self.groups.groups)

    # ---- a request's life ---------------------------------------------------------------------
    def acquire(self, lookup: Lookup) -> GroupedAllocation:
        """Pin each group's blocks from its first unskipped one, the hit every group serves counted as hit."""
        base, bs, hashes = self.base, self.block_size, lookup.hashes
        n = len(hashes)
        keys = [[group_key(h, g) for h in hashes] for g in range(self.width)]
        resident = base.resident
        most = n if lookup.input_tokens is None else min(n, max(lookup.input_tokens - 1, 0) // bs)
        hit = hit_blocks(self.groups, lambda g, i: keys[g][i] in resident, most, bs)
        freed = [0] * self.width
        for g, window in self._windows:
            freed[g] = skipped_blocks(window, hit * bs, bs)
        states = self.states.ids
        for g in states:  # a state group holds the hit's last block only, and takes one new block at a time
            freed[g] = max(hit - 1, 0)
            if hit and keys[g][hit - 1] in self.states.cached_now:  # its state is computed in this step: wait
                raise PoolBusyError("the hit's state is cached in this step, computed only by its end")
        junction = self._junction(keys, hit, most) if states else 0
        if states and self.chunk_tokens is not None and lookup.input_tokens is not None:
            # vLLM's waiting loop stops where a state group's cut leaves its first chunk no token (no block's end in
            # reach of the step's budget left); the budget is half the tokens in flight (two steps')
            left = min(self.chunk_tokens, lookup.input_tokens - hit * bs)
            if left > 0 and not state_chunk_tokens(hit * bs, left, lookup.input_tokens, lookup.input_tokens, bs,
                                                   self.in_flight // 2, junction):
                raise PoolBusyError("no block's end in reach of the step's budget left: its first chunk waits")
        # each group holds its hit's blocks (a window's in the window) now, the rest chunk by chunk as they are
        # scheduled (``extend``, vLLM's allocate_slots); what the whole sequence needs, a window's capped, must
        # fit now (vLLM's full_sequence_must_fit at admission)
        tables = [keys[g][freed[g]:max(hit, freed[g])] for g in range(self.width)]
        total = n + lookup.extra
        later = sum(min(1, max(0, total - hit)) if x.kind == STATE else
                    max(0, (min(total, self._cap(x.window)) if x.kind == WINDOW else total) - max(freed[g], hit))
                    for g, x in enumerate(self.groups.groups))
        taken = sum(1 for table in tables for p in base.pins_of(table) if not p)
        need = taken + later
        if self.chunk_tokens is not None and lookup.input_tokens is not None:  # and its first chunk's blocks now
            first = -(-min(lookup.input_tokens, hit * bs + self.chunk_tokens) // bs)
            need = max(need, taken + sum(min(1 if g in states else total, max(0, min(total, first) - max(f, hit)))
                                         for g, f in enumerate(freed)))
        if need > base.room:
            raise PoolBusyError(f"need {need} blocks over the KV cache groups, only {base.room} free or evictable")
        base.acquire(Lookup([k for table in tables for k in table], lookup.session, lookup.now, lookup.input_tokens,
                            False, 0, None, lookup.position))
        ref = self._ref
        touched = [i for i in range(n) if keys[ref][i] in resident]
        held = [max(hit, f) for f in freed]
        alloc = GroupedAllocation(hashes, list(range(hit)), list(range(hit, n)), touched, lookup.session,
                                  tables=tables, freed=freed, held=held, owed=[total - h for h in held],
                                  slid_private=lookup.extra * self.width)
        if states:
            alloc.state = StateHeld({g: [hit - 1] if hit else [] for g in states}, {g: [] for g in states},
                                    junction)
        if lookup.record:
            base.metrics.record_request(alloc, n, lookup.input_tokens, lookup.now)
        return alloc

    def _junction(self, keys: list[list[int]], hit: int, most: int) -> int:
        """Tokens of the prefix the full groups hold beyond a state group's hit (vLLM's shared_prefix_boundary: a
        prefill chunk stops there, so its state is kept for the requests sharing it); 0 where none."""
        full = [g for g, x in enumerate(self.groups.groups) if x.kind == FULL]
        resident = self.base.resident
        run = hit
        while run < most and all(keys[g][run] in resident for g in full):
            run += 1
        return run * self.block_size if run > hit else 0

    def extend(self, alloc: GroupedAllocation, end_tokens: int, blocks: int, now: float = 0.0) -> None:
        """A prefill chunk ends at ``end_tokens``: each group takes the blocks up to it (of the request's ``blocks``,
        hashed and private), as vLLM's allocate_slots for the chunk; ``PoolBusyError`` if none is left."""
        n, want = len(alloc.hashes), -(-end_tokens // self.block_size)
        keys: list[int] = []
        states = self.states.ids
        # a state group's one new block: hashed where the chunk ends on its last token, else private
        new_states = [(g, last) for g in states
                      if (last := state_new_block(end_tokens, blocks, alloc.held[g], self.block_size)) >= 0]
        hashed_states = [(g, last) for g, last in new_states if last < n and end_tokens == (last + 1) * self.block_size]
        private = len(new_states) - len(hashed_states)
        for g in range(self.width):  # in group order: vLLM's cache_blocks stores (and publishes) group by group
            end = min(blocks, max(want, alloc.held[g]))
            start = alloc.held[g]
            if g in states:
                keys += [group_key(alloc.hashes[last], g) for s, last in hashed_states if s == g]
            elif end > start:
                keys += [group_key(alloc.hashes[i], g) for i in range(start, min(end, n))]
                private += max(0, end - max(start, n))
        if not keys and not private:
            return
        base = self.base
        # a block past the hit is a new block in vLLM, even where another running request holds the same one:
        # that one it holds as a private copy (the same room), the rest it pins
        pins = base.pins_of(keys)
        copies = [k for k, p in zip(keys, pins) if p]
        if len(keys) + private > base.room:
            raise PoolBusyError("a prefill chunk finds no free or evictable block")
        if len(copies) < len(keys):
            base.acquire(Lookup([k for k, p in zip(keys, pins) if not p], alloc.session, now, None, False))
        base.take_private(private + len(copies))
        alloc.slid_private -= private
        alloc.copies.update(copies)
        for g, last in new_states:
            if (g, last) in hashed_states:
                key = group_key(alloc.hashes[last], g)
                alloc.tables[g].append(key)
                alloc.state.at[g].append(last)
                self.states.cached_now.add(key)
            elif last < n:
                alloc.state.private[g].append(last)
            alloc.held[g] = last + 1
        for g in range(self.width):
            end = min(blocks, max(want, alloc.held[g]))
            if end > alloc.held[g] and g not in states:
                alloc.tables[g] += [group_key(alloc.hashes[i], g) for i in range(alloc.held[g], min(end, n))]
                alloc.owed[g] = max(0, alloc.owed[g] - (end - alloc.held[g]))
                alloc.held[g] = end

    def slide(self, alloc: GroupedAllocation, computed_tokens: int, now: float = 0.0,
              fills: Sequence[Allocation] = (), response: Sequence[int] = (), kept: int = 0) -> None:
        """Each window group frees the leading blocks its window passed at ``computed_tokens``: its prompt's
        table first, then the blocks decoding filled (``fills``; ``response``: the hashes of the blocks after
        the prompt's, in order, the first ``kept`` of them in the allocation), the rest private blocks."""
        n = len(alloc.hashes)
        for g, window in self._windows:
            skip = skipped_blocks(window, computed_tokens, self.block_size)
            start = alloc.freed[g]
            if skip <= start:
                continue
            hashed = max(0, min(skip, n) - start)  # the table's leading keys
            gone = alloc.tables[g][:hashed]
            alloc.tables[g] = alloc.tables[g][hashed:]
            private = self._past_prompt(g, n, range(max(start, n), skip), gone, fills, response, kept)
            self._let_go(alloc, gone, private, now)
            alloc.freed[g] = skip
        for g in self.states.ids:
            self._slide_state(alloc, g, computed_tokens, now, fills, response, kept)

    def _past_prompt(self, g: int, n: int, blocks: range, gone: list[int], fills: Sequence[Allocation],
                     response: Sequence[int], kept: int) -> int:
        """Group ``g``'s ``blocks`` past a request's allocation of ``n`` leaving it: a block decoding filled is taken
        from its holder in ``fills`` onto ``gone``; the rest are private blocks, counted."""
        private = 0
        for i in blocks:
            j = i - n + kept
            key = group_key(response[j], g) if 0 <= j < len(response) else None
            holder = next((f for f in fills if isinstance(f, GroupedAllocation) and key in f.tables[g]), None)
            if holder is None or key is None:
                private += 1
            else:
                holder.tables[g].remove(key)
                gone.append(key)
        return private

    def _let_go(self, alloc: GroupedAllocation, gone: list[int], private: int, now: float) -> None:
        """Blocks a request's group stops holding: its hashed ones unpinned (its private copies freed), deepest first
        into the free queue as vLLM's remove_skipped_blocks frees them, and ``private`` private blocks."""
        gone = self._drop_copies(alloc, gone)
        if gone:
            self.base.release(Allocation(gone, [], [], [], alloc.session), now)
        if private:
            self.base.free_private(private)
            alloc.slid_private += private

    def _slide_state(self, alloc: GroupedAllocation, g: int, computed_tokens: int, now: float,
                     fills: Sequence[Allocation], response: Sequence[int], kept: int) -> None:
        """State group ``g`` frees every block before the state after ``computed_tokens`` (vLLM's
        remove_skipped_blocks: ``get_num_skipped_tokens`` is ``computed - 1``, a window of two tokens)."""
        skip = skipped_blocks(window_of(self.groups.groups[g]), computed_tokens, self.block_size)
        start, n = alloc.freed[g], len(alloc.hashes)
        if skip <= start:
            return
        at, table = alloc.state.at[g], alloc.tables[g]
        gone = [k for k, b in zip(table, at) if b < skip]
        alloc.tables[g] = [k for k, b in zip(table, at) if b >= skip]
        alloc.state.at[g] = [b for b in at if b >= skip]
        mine = alloc.state.private[g]
        private = sum(1 for b in mine if b < skip)
        alloc.state.private[g] = [b for b in mine if b >= skip]
        private += self._past_prompt(g, n, range(max(start, n), skip), gone, fills, response, kept)
        self._let_go(alloc, gone, private, now)
        alloc.freed[g] = skip

    def release(self, alloc: Allocation, now: float = 0.0) -> None:
        """Unpin group by group, each tail first; the private blocks a window freed were given back already,
        so they are not freed twice when the scheduler frees the request's private blocks (``free_private``)."""
        self.release_request(alloc, (), now)

    def release_request(self, alloc: Allocation, fills: Sequence[Allocation], now: float = 0.0) -> None:
        """A request's blocks back, its prompt's (``alloc``) and those decoding filled (``fills``, in the order
        they filled): group by group, each group's whole table tail first, as vLLM's ``coordinator.free``."""
        allocs = [alloc, *fills]
        for g in range(self.width):
            keys = [k for a in allocs if isinstance(a, GroupedAllocation) for k in a.tables[g]]
            if isinstance(alloc, GroupedAllocation):
                keys = self._drop_copies(alloc, keys)
            if keys:
                self.base.release(Allocation(keys, [], [], [], alloc.session), now)
        for a in allocs:
            if isinstance(a, GroupedAllocation):
                a.tables = [[] for _ in a.tables]
                self.base.private += a.slid_private
                a.slid_private = 0

    def _drop_copies(self, alloc: GroupedAllocation, keys: list[int]) -> list[int]:
        """Of ``keys`` leaving ``alloc``, its private copies go back free; the rest are returned to unpin."""
        copies = alloc.copies
        if not copies or not keys:
            return keys
        mine = [k for k in keys if k in copies]
        if mine:
            self.base.free_private(len(mine))
            copies.difference_update(mine)
        return [k for k in keys if k not in copies and k not in mine]

    # ---- response KV (a ResponseStore): what decoding fills, and a finished request's response -------------
    def fill(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> GroupedAllocation | None:
        """Blocks decoding just filled, in every group (vLLM caches a full block in each group's table): those
        no other running request pins (``fill_picks`` on a full group's pins: it pins every block a window
        group does) are pinned in place of one private block per group. The allocation's ``hashes`` are the
        blocks taken, ``tables`` each group's keys (a window's are unpinned as it slides past them)."""
        take = fill_picks(hashes, self.pins_of(hashes))
        if not take:
            return None
        keys = [[group_key(h, g) for h in take] for g in range(self.width)]
        self.base.fill([k for table in keys for k in table], session, now)
        for g in self.states.ids:  # the state a decode step ends on a block's end: findable, computed by its end
            self.states.cached_now.update(keys[g])
        return GroupedAllocation(take, [], [], [], session, tables=keys, freed=[0] * self.width)

    def store(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> list[int]:
        """A finished (or preempted) request's response blocks cached: a full group's as ``BlockPool.store``;
        every other group stores the same blocks the full group newly stored (those decoding filled are cached
        already, and a window's it slid past were freed then, as vLLM's, not stored again), each group in group
        order, as vLLM's cache_blocks stores and publishes them. Returns the full group's new blocks."""
        ref, base = self._ref, self.base
        back = {group_key(h, ref): h for h in hashes}
        # the full group's new blocks are known before any group stores (its ``store``'s rule), so a group before it
        # stores first; a state group's states were kept as steps ended on them, none later
        room = max(base.room, 0)  # storing releases at once: the room each group's store sees
        new = [h for h in dict.fromkeys(hashes) if group_key(h, ref) not in base.resident][:room]
        for g in range(self.width) if new else ():
            if g == ref:
                new = [back[k] for k in base.store([group_key(h, ref) for h in hashes], session, now)]
            elif g not in self.states.ids:
                base.store([group_key(h, g) for h in new], session, now)
        return new

    def remove(self, hashes: Sequence[int], computed: bool = True) -> None:
        """Drop unpinned blocks in every group (an aborted prefill's blocks whose KV was never computed)."""
        self.base.remove([group_key(h, g) for g in range(self.width) for h in hashes], computed)

    def serve(self, lookup: Lookup) -> GroupedAllocation:
        """A request served alone (the simulator's cache-only path, no scheduler): the hit every group serves, then
        each group's blocks from its first unskipped one cached, group by group (a request's groups never held at
        once: nothing is pinned between requests)."""
        base, bs, hashes = self.base, self.block_size, lookup.hashes
        n = len(hashes)
        keys = [[group_key(h, g) for h in hashes] for g in range(self.width)]
        most = n if lookup.input_tokens is None else min(n, max(lookup.input_tokens - 1, 0) // bs)
        hit = hit_blocks(self.groups, lambda g, i: keys[g][i] in base.resident, most, bs)
        touched = [i for i in range(n) if keys[self._ref][i] in base.resident]
        for g in range(self.width):
            skip = skipped_blocks(self.groups.groups[g].window, hit * bs, bs) if g in self._window_ids else 0
            # a state group: the hit's state and the one at the last block's end before the prompt's last token
            table = [keys[g][i] for i in sorted({hit - 1, most - 1}) if i >= 0] if g in self.states.ids \
                else keys[g][skip:]
            base.serve(Lookup(table, lookup.session, lookup.now, lookup.input_tokens, False, 0, None,
                              lookup.position))
        alloc = GroupedAllocation(hashes, list(range(hit)), list(range(hit, n)), touched, lookup.session,
                                  tables=[[] for _ in keys], freed=[0] * self.width)
        if lookup.record:
            base.metrics.record_request(alloc, n, lookup.input_tokens, lookup.now)
        return alloc

    def take_private(self, n: int) -> None:
        """``n`` more blocks of a request: one in every group."""
        self.base.take_private(n * self.width)

    def free_private(self, n: int) -> None:
        self.base.free_private(n * self.width)
