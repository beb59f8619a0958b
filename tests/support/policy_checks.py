"""The contract every eviction policy keeps inside a real BlockPool, checked the same way
for each: victims are distinct, resident and enough; the pool never evicts a pinned block
(it skips those, and they come back on release); the pool's events replay to its resident set."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from replica.core.cache.pool import BlockPool, KvEvent, PoolBusyError
from replica.core.cache.types import Lookup


def checked_victims(pool: BlockPool) -> None:
    """Wrap the policy's victims() (distinct, resident, at least `need`) and the pool's eviction
    (only unpinned blocks go, exactly as many as asked)."""
    orig = pool.policy.victims
    evict = pool._evict

    def victims(need):
        out = orig(need)
        assert len(out) >= need
        assert len(set(out)) == len(out)
        assert all(h in pool.resident for h in out)
        return out

    def checked_evict(count, skip=None):
        pinned = set(pool.pin_counts)
        before = set(pool.resident)
        evict(count, skip)
        gone = before - set(pool.resident)
        assert len(gone) >= count and not gone & pinned
        assert skip is None or not any(map(skip, gone))  # serve's own blocks stay too

    pool.policy.victims = victims
    pool._evict = checked_evict


def apply_events(mirror: set[int], events: Iterable[KvEvent]) -> None:
    """Replay stored / removed / cleared events onto `mirror`, as the prefix index does."""
    for ev in events:
        if ev.kind == "stored":
            mirror.update(ev.hashes)
        elif ev.kind == "removed":
            # a block is reported removed once, and only while the index holds it
            assert set(ev.hashes) <= mirror and len(set(ev.hashes)) == len(ev.hashes)
            mirror.difference_update(ev.hashes)
        else:
            mirror.clear()


def run_invariants(pool: BlockPool, trace: Iterable[tuple[str | None, list[int]]], rng: random.Random,
                   extra_check: Callable[[BlockPool], None] | None = None, reset_every: int = 500) -> None:
    """Drive `pool` with `trace` ([(session, hashes)], step k at now=k) and check it after every step.

    About one request in ten is acquired and held (two at most), a held one is released
    with chance 1/4 per step, and every `reset_every` steps the pool is reset through the
    admin path. After each step: the capacity holds, held blocks are resident, the events
    replay to the resident set and `extra_check(pool)` (the policy's own bookkeeping) passes.
    `trace` may be a generator drawing from `rng`: it is read one step at a time.
    """
    checked_victims(pool)
    held = []
    mirror: set[int] = set()
    for step, (session, hashes) in enumerate(trace):
        try:
            if rng.random() < 0.1 and len(held) < 2:
                held.append(pool.acquire(Lookup(hashes, session=session, now=step)))
            else:
                pool.serve(Lookup(hashes, session=session, now=step))
        except PoolBusyError:
            pass
        if held and rng.random() < 0.25:
            pool.release(held.pop(rng.randrange(len(held))))
        if step % reset_every == reset_every - 1:
            pool.reset()  # admin path: on_remove for every unpinned block, clear() if none pinned
        assert pool.used <= pool.capacity
        for a in held:
            assert all(h in pool.resident for h in a.hashes)
        apply_events(mirror, pool.drain_events())
        assert mirror == set(pool.resident)
        if extra_check is not None:
            extra_check(pool)
    assert pool.metrics.block_hits > 0


def run_timed_invariants(pool: BlockPool, trace: Sequence[tuple[float, list[int]]], rng: random.Random,
                         next_uses: Sequence[list[float]] | None = None, reset_at: int | None = None,
                         positions: Sequence[float] | None = None) -> None:
    """Acquire every request of `trace` ([(t, hashes)]) at its time and check the pool after each.

    Before a request, a held one is released with chance 0.3; after it, the request is
    held with chance 0.2 (three at most), else released at once. `next_uses` (per request,
    for the oracles) is passed to acquire; after request number `reset_at` the pool is
    reset once. Checks: blocks of held requests stay resident, the capacity holds and the
    events replay to the resident set.
    """
    mirror: set[int] = set()
    held = []
    for k, (t, req) in enumerate(trace):
        if held and rng.random() < 0.3:
            pool.release(held.pop(rng.randrange(len(held))), now=t)
        try:
            alloc = pool.acquire(Lookup(req, now=t, next_use=None if next_uses is None else next_uses[k],
                                 position=None if positions is None else positions[k]))
        except PoolBusyError:
            continue
        pinned = {h for a in held for h in a.hashes}
        assert pinned <= set(pool.resident)  # pinned blocks are never evicted
        if rng.random() < 0.2 and len(held) < 3:
            held.append(alloc)
        else:
            pool.release(alloc, now=t)
        assert pool.used <= pool.capacity
        apply_events(mirror, pool.drain_events())
        assert mirror == set(pool.resident)
        if k == reset_at:
            pool.reset()
            apply_events(mirror, pool.drain_events())
            assert mirror == set(pool.resident)
