"""Adaptive eviction (WAKMan, Workload Aware KVCache Manager): run the candidate that won the last interval's shadow replay.

A delegating policy: it owns one inner policy instance (a candidate; LRU first, or the first
candidate when LRU is not one) and forwards every hook to it. It records each interval's calls on
the pool (``observes_pool``: lookups, releases, and the response blocks a finished request stores;
``replica/core/analysis/shadow.py``); at the first lookup at or after the interval's end it replays
them through one cold shadow pool per candidate, which runs the same calls through the pool's own
rules (responses stored, pins held as long, hits counted by the pool's hit mode), with capacity =
the interval's mean ``capacity - private``, and runs the winner for the next interval. Time is the
calls' ``now`` (trace seconds in the simulator, emulated seconds on a live replica).

Rule: the winner is the candidate with the highest shadow hit ratio; the running policy is
replaced only when the winner beats the running one's shadow ratio by more than ``margin``.
``margin=0`` is WAKMan's plain rule (any strict gain; ties keep the running policy); the
default 0.01 won over it in bench/bench_adaptive.py (docs/choosing-a-policy.md).

Hand-over at a switch: the new policy is built, bound to the same context and fed the resident
set as ``BlockPool.set_policy`` does: one access listing every resident block newest first
(all as new), then a release of the unpinned ones. Pinned blocks are released later by their
requests. Age order (vLLM free-queue order: a request's blocks move to the tail on release,
deepest first) comes from the running policy's ``age_order()`` where it has one (LRU: its queue,
so no extra bookkeeping while LRU runs); otherwise this policy keeps its own recency queue,
maintained only while such a policy runs. The old instance is dropped with all its state:
switching to LRU discards S3-FIFO's ghost queue, as in WAKMan.

``adapt_interval``: the interval halves (down to 1/4 of ``interval_s``) when the winner differs
from the previous interval's, and doubles (up to 4x) when it is the same.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Sequence

from replica.core.analysis.shadow import ShadowRecorder, estimate
from replica.core.cache.policies.base import Access, AgeOrdered, EvictionPolicy, PolicyContext, hand_over
from replica.core.cache.types import RELEASE, STORE, PoolOp
from shared.errors import InputError
from shared.validate import check_number

ESTIMATORS = ("full", "sampled")
KEEP_DECISIONS = 100


def _flag(field: str, value) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise InputError(field, f"must be true or false, got {value!r:.60}")


def _candidates(value) -> list[str]:
    from replica.core.cache.policies import policy_class, policy_names

    raw = value.split(",") if isinstance(value, str) else value
    if not isinstance(raw, (list, tuple)) or not all(isinstance(n, str) for n in raw):
        raise InputError("candidates", f"expected policy names, e.g. 'lru,s3fifo', got {value!r:.60}")
    names = [n.strip().lower() for n in raw]
    if not names or not all(names) or len(set(names)) != len(names):
        raise InputError("candidates", f"expected distinct policy names, e.g. 'lru,s3fifo', got {value!r:.60}")
    for n in names:
        if n == "adaptive" or n not in policy_names():
            raise InputError("candidates", f"{n!r} is not an online policy; choose from {policy_names()}")
        if policy_class(n).needs_future:
            raise InputError("candidates", f"{n} is an offline oracle and cannot run live")
    return names


class AdaptivePolicy(EvictionPolicy):
    name = "adaptive"
    takes_pins = True  # forwarded to the running policy when it takes them
    observes_pool = True  # the shadows replay the pool's calls

    def __init__(self, candidates="lru,s3fifo", interval_s: float = 900.0, margin: float = 0.01,
                 adapt_interval=False, estimator: str = "full", sample_rate: float = 0.1) -> None:
        self.candidates = _candidates(candidates)
        self.interval_s = check_number("interval_s", interval_s, above=0)
        self.margin = check_number("margin", margin, 0, 1)
        self.adapt_interval = _flag("adapt_interval", adapt_interval)
        if estimator not in ESTIMATORS:
            raise InputError("estimator", f"must be one of {', '.join(ESTIMATORS)}, got {estimator!r:.60}")
        self.estimator = estimator
        self.sample_rate = check_number("sample_rate", sample_rate, above=0, maximum=1)
        self.current = "lru" if "lru" in self.candidates else self.candidates[0]
        self.decisions: deque[dict] = deque(maxlen=KEEP_DECISIONS)
        self.decision_counts: dict[str, int] = {}
        self.switches = 0
        self.shadow_blocks = 0  # block accesses replayed per candidate, all intervals (cost)
        self.shadow_cpu_s = 0.0  # CPU seconds spent replaying shadows, all intervals (cost)
        self._interval = self.interval_s
        self._start: float | None = None
        self._recency: OrderedDict[int, None] = OrderedDict()
        self._recorder = self._new_recorder()

    def _new_recorder(self) -> ShadowRecorder:
        return ShadowRecorder(self.sample_rate if self.estimator == "sampled" else 1.0)

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        from replica.core.cache.policies import make_policy

        self.inner = make_policy(self.current)
        self.inner.bind(ctx)
        self._tracking = not isinstance(self.inner, AgeOrdered)  # keep our own recency queue

    # ---- forwarded hooks ------------------------------------------------------------
    def on_pin(self, hashes: Sequence[int]) -> None:
        if self.inner.takes_pins:
            self.inner.on_pin(hashes)

    def on_access(self, acc: Access) -> None:
        self.inner.on_access(acc)
        if self._tracking:
            hashes, recency = acc.hashes, self._recency
            for i in acc.new_idx:
                recency[hashes[i]] = None

    def on_pool_op(self, op: PoolOp) -> None:
        # A hand-over (BlockPool.set_policy) reaches on_access only: it is no traffic, and not recorded.
        if op.kind != RELEASE and op.kind != STORE:  # a lookup: it may open the next interval
            if self._start is None:
                self._start = op.now
            elif op.now >= self._start + self._interval:
                self._decide(op.now)  # on the interval before this lookup, which opens the next
        self._recorder.record(op, self.ctx.capacity)

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        self.inner.on_release(hashes, now)
        if self._tracking:
            recency = self._recency
            move = recency.move_to_end
            for h in reversed(hashes):
                if h in recency:
                    move(h)
                else:
                    recency[h] = None  # given up as a victim while pinned: back now

    def victims(self, need: int) -> list[int]:
        out = self.inner.victims(need)
        if self._tracking:
            pop = self._recency.pop
            for h in out:
                pop(h, None)
        return out

    def on_remove(self, h: int) -> None:
        self.inner.on_remove(h)
        self._recency.pop(h, None)

    def clear(self) -> None:
        self.inner.clear()
        self._recency.clear()

    # ---- decisions -----------------------------------------------------------------
    def _decide(self, now: float) -> None:
        rec = self._recorder
        t0 = time.process_time()
        cap, ratios = estimate(rec, self.candidates, self.ctx.hit_mode)
        self.shadow_cpu_s += time.process_time() - t0
        self.shadow_blocks += rec.blocks
        best = max(self.candidates, key=lambda n: (ratios[n], n == self.current))
        switch = best != self.current and ratios[best] - ratios[self.current] > self.margin
        previous = self.decisions[-1]["winner"] if self.decisions else None
        self.decisions.append({"at": now, "interval_s": self._interval, "shadow_capacity": cap,
                               "accesses": rec.blocks, "hit_ratio": ratios, "winner": best,
                               "running": best if switch else self.current, "switched": switch})
        chosen = best if switch else self.current
        self.decision_counts[chosen] = self.decision_counts.get(chosen, 0) + 1
        if switch:
            self._switch_to(best, now)
        if self.adapt_interval and previous is not None:
            factor = 0.5 if best != previous else 2.0
            self._interval = min(4 * self.interval_s, max(self.interval_s / 4, self._interval * factor))
        self._start = now
        self._recorder = self._new_recorder()

    def _switch_to(self, name: str, now: float) -> None:
        from replica.core.cache.policies import make_policy

        ctx = self.ctx
        newest_first = self._newest_first()
        policy = make_policy(name)
        hand_over(policy, ctx, newest_first, now)
        self.inner = policy
        self.current = name
        self.switches += 1
        self._tracking = not isinstance(policy, AgeOrdered)
        self._recency = OrderedDict.fromkeys(reversed(newest_first)) if self._tracking else OrderedDict()

    def _newest_first(self) -> list[int]:
        """Every resident block once, newest first (O(resident), at a switch only)."""
        owners, inner = self.ctx.owners, self.inner
        if isinstance(inner, AgeOrdered):  # exactly when not self._tracking
            return list(reversed(inner.age_order()))
        newest_first = [h for h in reversed(self._recency) if h in owners]
        if len(newest_first) != len(owners):  # blocks set aside while pinned: they go last
            known = set(newest_first)
            newest_first += [h for h in reversed(list(owners)) if h not in known]
        return newest_first

    def describe(self) -> dict:
        return {"name": self.name, "candidates": ",".join(self.candidates), "interval_s": self.interval_s,
                "margin": self.margin, "adapt_interval": self.adapt_interval, "estimator": self.estimator,
                "sample_rate": self.sample_rate, "current": self.current, "current_interval_s": self._interval,
                "switches": self.switches, "decision_counts": dict(self.decision_counts),
                "shadow_blocks": self.shadow_blocks, "shadow_cpu_s": round(self.shadow_cpu_s, 4),
                "decisions": list(self.decisions)}
