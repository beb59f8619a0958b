"""A decode instance's side of disaggregated prefill (replica/core/disagg.py): a request whose prompt
was computed elsewhere waits for its KV (vLLM's ``WAITING_FOR_REMOTE_KVS``).

``reserve`` takes the request's blocks when the transfer starts, as vLLM's scheduler allocates a
remote-prefill request's blocks before the connector loads into them; the blocks the decode instance
already holds are hits (pinned, not transferred), the rest are inserted for the KV that arrives. It
fails (False) when the pool cannot hold them now: the caller falls back to a local prefill. The
lookup is not counted in the pool's hit metrics: the instance computes nothing for it (what it held
is reported as the transfer it saved). ``arrived`` starts the request once its KV is in: it computes
the prompt's last token again (vLLM's decode instance does: that forward yields the first token),
then decodes like any request. ``cancel`` gives the blocks back if the transfer never ends (the
prefill instance went away, the client left): the blocks whose KV never came leave the pool.

Reserved requests are in no queue of the scheduler (vLLM's are neither running nor schedulable), so
no preemption picks them and no step waits on them; the pool's pins count them in its usage. Lower
memory tiers are not consulted for a reservation: what the decode instance lacks in HBM crosses the
network.
"""

from __future__ import annotations

from replica.core.cache.pool import PoolBusyError
from replica.core.cache.types import Lookup
from replica.core.sched.sched_types import SchedRequest
from replica.core.sched.scheduler import Scheduler


def reserve(sched: Scheduler, req: SchedRequest, now: float) -> bool:
    """Take ``req``'s blocks for the KV about to arrive; False when the pool cannot hold them now.
    A request that could never run here raises, as ``submit`` does (``Scheduler.refusal``)."""
    if (why := sched.refusal(req)) is not None:
        sched.refused += 1
        raise why
    extra = sched._extra_at_admission(req)
    try:
        req.alloc = sched.pool.acquire(Lookup(req.hashes, req.session, now, req.input_tokens, False, extra,
                                              req.next_use, req.position))
    except PoolBusyError:
        return False
    req.extra_blocks = extra
    sched._order += 1
    req.order = sched._order
    req.t_queued = now
    return True


def held_blocks(req: SchedRequest) -> int:
    """Blocks of the prompt the decode instance already held when it reserved (not transferred)."""
    return len(req.alloc.hit_idx) if req.alloc is not None else 0


def arrived(sched: Scheduler, req: SchedRequest, now: float) -> None:
    """The KV is in: ``req`` joins the prefill queue with its prompt's last token to compute."""
    assert req.alloc is not None, "arrived() after reserve()"
    sched._admitted += 1
    req.admit_seq = sched._admitted
    req.t_admitted = now
    sched.admissions += 1
    req.segments = [[req.input_tokens - 1, 1]]
    req.cached_tokens = req.input_tokens - 1  # the rest came over the network: computed, not by this instance
    sched.queued_prefill_tokens += 1
    sched.prefill_tokens += 1
    sched.prefilling.append(req)
    sched._dirty = True


def cancel(sched: Scheduler, req: SchedRequest, now: float) -> None:
    """The KV will never arrive: the blocks go back, and those inserted for it leave the pool."""
    alloc = req.alloc
    if alloc is None:
        return
    sched.decode_kv.forget(req)  # its private blocks (a partial prompt tail) go back with it
    sched.pool.release(alloc, now)
    req.alloc = None
    remove = getattr(sched.pool, "remove", None)
    lost = [alloc.hashes[i] for i in alloc.new_idx]
    if lost and remove is not None and not alloc.private:
        remove(lost, computed=False)
    sched._dirty = True
