"""The scheduler tests' fixtures: one Llama-3-8B on an H100, an LRU pool of 16-token blocks, requests of
whole blocks (plus a tail) hashed 0, 1, 2, ... from ``base``, and a drain of every step."""

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from shared.costmodel import CostModel

COST = CostModel.from_names("llama-3-8b", "h100")


def make(capacity=1000, **kw):
    pool = BlockPool(capacity, make_policy("lru"), block_size=16, emit_events=False)
    return pool, Scheduler(pool, COST, SchedulerSettings(**kw))


def req(rid, n_blocks, tail=0, out=3, base=0, t=0.0):
    return SchedRequest(rid, [base + i for i in range(n_blocks)], n_blocks * 16 + tail, out, t)


def drain(sched, now=0.0, horizon=float("inf")):
    results = []
    while sched.has_work():
        res = sched.step(now, horizon)
        results.append(res)
        now += res.duration
    return results, now
