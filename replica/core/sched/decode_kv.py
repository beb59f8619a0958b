"""The blocks a running request holds beyond its prompt's hashed ones (vLLM's block accounting).

A request's KV fills ``ceil(tokens / block_size)`` blocks: at admission its prompt (the hashed
full blocks plus a partial last one) and, if it was preempted after its first token, the tokens
it had generated; then one more each time decoding crosses a block boundary. The blocks beyond
the hashed ones are the pool's ``private`` blocks: they take room (evicting cached blocks). When a
decode step needs a block and none is free or evictable, the scheduler preempts
(``Decoding._grow_now``, decoding.py).

Where response KV is kept (``fills``), each of those blocks is hashed once decoding has filled it
(its hash is the next of ``SchedRequest.response_hashes``): vLLM caches every full block in the step
that schedules its last token, so a request arriving while this one still decodes finds it. ``filled``
says which blocks are full by a tick; the scheduler hands them to the pool (``BlockPool.fill``), which
pins them in place of private blocks (``SchedRequest.fill_pins``).

Per step the work is proportional to the blocks handed out and filled: each decoding request sits in
a heap by the decode tick at which it next needs a block and in another by the tick at which its
next block is full (at tick ``t`` it writes the KV of token ``t - base``, so it holds
``input_tokens + t - base`` tokens).
"""

from __future__ import annotations

import heapq

from replica.core.cache.types import SchedulerPool
from replica.core.sched.sched_types import SchedRequest


class DecodeBlocks:
    def __init__(self, pool: SchedulerPool, enabled: bool = True, fills: bool = False, draft_slots: int = 0,
                 admit_slots: int = 0, cap: int = 0) -> None:
        self.pool = pool
        self.enabled = enabled  # False: no request ever holds a block beyond its hashed ones
        self.fills = enabled and fills  # blocks are hashed as decoding fills them (response KV kept)
        self.block_size = pool.block_size
        # physical blocks one more block of a request takes: one per KV cache group (cache/grouped.py)
        self.width: int = getattr(pool, "width", 1)
        # Speculative decoding (spec_decode.py): KV slots a decode step takes beyond its sampled token's (K
        # drafts and a draft model's lookahead), those an admission takes beyond its tokens' (the lookahead),
        # and the most slots a request ever takes (vLLM's max_model_len rule; 0: none). A request then jumps
        # several tokens a step, so a block it needs or fills may fall due before the step being planned:
        # it is due at that step (``floor``, set by the scheduler), in admission order as vLLM's running list.
        self.draft_slots = draft_slots
        self.admit_slots = admit_slots
        self.cap = cap
        self.floor = 0
        self._heap: list[tuple[int, int, SchedRequest]] = []  # (tick, admission number, request)
        self._full: list[tuple[int, int, SchedRequest]] = []  # (tick its next block is full, admission, request)

    def need(self, r: SchedRequest, generated: int) -> int:
        """Private blocks beyond its hashed ones that ``r`` needs holding ``generated`` tokens after its prompt."""
        if not self.enabled:
            return 0
        return max(0, -(-self._slots(r.input_tokens + generated + self.admit_slots) // self.block_size)
                   - len(r.hashes) - r.kept - r.fill_pins)

    def most(self, r: SchedRequest) -> int:
        """Blocks ``r`` holds at its last decode step (its last token's KV is never written; drafts' slots are)."""
        if not self.enabled:
            return len(r.hashes)
        slots = self._slots(r.input_tokens + max(r.output_tokens - 1, 0) + self.draft_slots)
        return max(len(r.hashes), -(-slots // self.block_size))

    def _slots(self, tokens: int) -> int:
        return min(tokens, self.cap) if self.cap else tokens

    def track(self, r: SchedRequest) -> None:
        """A decoding request: queue the tick of its next block, unless it finishes first."""
        held = len(r.hashes) + r.kept + r.fill_pins + r.extra_blocks
        t = r.base + held * self.block_size - r.input_tokens - self.draft_slots + 1
        if self.draft_slots:
            t = max(t, self.floor) if not self.cap or self.cap > held * self.block_size else r.base + r.output_tokens
        if self.enabled and t < r.base + r.output_tokens:
            r.grow_at = t
            heapq.heappush(self._heap, (t, r.admit_seq, r))
        else:
            r.grow_at = -1

    def start(self, r: SchedRequest) -> None:
        """``r`` starts (or, after a preemption, resumes) decoding: queue its next block and its next full one."""
        self.track(r)
        self._track_full(r)

    def retrack(self, r: SchedRequest) -> None:
        """``r``'s decode tick moved (speculative decoding kept several tokens): its next needs again."""
        if r.grow_at >= 0:
            self.track(r)
        if r.fill_at >= 0:
            self._track_full(r)

    def _track_full(self, r: SchedRequest) -> None:
        """Queue the tick whose step fills ``r``'s next response block (its KV then holds the block's last
        token), unless it has no hash or ``r`` finishes first (its last token's KV is never written)."""
        t = r.base + (len(r.hashes) + r.full + 1) * self.block_size - r.input_tokens
        if self.draft_slots:
            t = max(t, self.floor)
        if self.fills and r.full < len(r.response_hashes) and t < r.base + r.output_tokens:
            r.fill_at = t
            heapq.heappush(self._full, (t, r.admit_seq, r))
        else:
            r.fill_at = -1

    def filled(self, tick: int) -> list[tuple[SchedRequest, list[int]]]:
        """The blocks decoding fills in the steps up to ``tick`` (each request's, in the order their first
        is due): the hashes of each request's newly full response blocks. ``full`` moves past them."""
        heap, bs, out = self._full, self.block_size, []
        while heap and heap[0][0] <= tick:
            t, seq, r = heapq.heappop(heap)
            if t != r.fill_at or seq != r.admit_seq:  # stale: preempted, finished or re-admitted
                continue
            last = min(tick, r.base + r.output_tokens - 1)  # the tick of its last step
            full = min(len(r.response_hashes), (r.input_tokens + last - r.base) // bs - len(r.hashes))
            out.append((r, list(r.response_hashes[r.full:full])))
            r.full = full
            self._track_full(r)
        return out

    def forget(self, r: SchedRequest) -> None:
        """``r`` stopped running (finished or preempted): its private blocks go back to the pool (the
        scheduler releases its hashed ones)."""
        self.pool.free_private(r.extra_blocks)
        r.extra_blocks = 0
        r.grow_at = -1
        r.fill_at = -1

    def due(self, tick: int) -> SchedRequest | None:
        """The next request (oldest admission first) that needs a block at a tick up to ``tick``."""
        heap = self._heap
        while heap and heap[0][0] <= tick:
            t, seq, r = heapq.heappop(heap)
            if t == r.grow_at and seq == r.admit_seq:  # else stale: preempted, finished or re-admitted
                return r
        return None

    def grant(self, r: SchedRequest) -> bool:
        """One more block for ``r`` if one is free or evictable (then its next need is queued)."""
        if self.pool.room < self.width:
            return False
        self.pool.take_private(1)
        r.extra_blocks += 1
        self.track(r)
        return True

    def ahead(self, tick: int, steps: int) -> int:
        """Blocks for the decode ticks ``tick + 1 .. tick + steps - 1`` of a decode-only run (no
        request joins or leaves it before its end): handed out in one allocation while they last;
        returns the steps the run can take, ending before the first tick whose block is missing."""
        heap, room, end = self._heap, self.pool.room // self.width, tick + steps
        taken: list[tuple[int, SchedRequest]] = []
        while heap and heap[0][0] < end:
            t, seq, r = heap[0]
            if t != r.grow_at or seq != r.admit_seq:
                heapq.heappop(heap)
                continue
            if len(taken) >= room:
                end = t  # the run stops before this need; the step at tick t preempts
                break
            heapq.heappop(heap)
            taken.append((t, r))
            r.extra_blocks += 1
            self.track(r)
        while taken and taken[-1][0] >= end:  # taken at the tick the run now stops before: give back
            t, r = taken.pop()
            r.extra_blocks -= 1
            r.grow_at = t
            heapq.heappush(self._heap, (t, r.admit_seq, r))
        if taken:
            self.pool.take_private(len(taken))
        return end - tick
