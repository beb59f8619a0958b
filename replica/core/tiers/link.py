"""One link shared by concurrent transfers: processor sharing, in virtual time (pure, no I/O).

Every link kvemu prices uses this one definition: the device link's two directions (host <-> HBM,
which a tensor-parallel all-reduce over PCIe crosses too), each SSD link, and any later link (a
transfer network between prefill and decode instances, a shared KV store's). The rule:

* ``n`` transfers in flight on a link of bandwidth ``B`` each progress at ``B / n`` (a transfer
  may declare a slower rate of its own, an SSD write on a drive that reads faster: its bytes then
  count as ``bytes x B / rate`` of the link's work);
* a transfer's time is its base latency plus its bytes over its share: two equal transfers
  started together both finish at twice the time of one; one started halfway through another
  finishes half a transfer after it.

Base latency (the link's own, plus ``per_copy_s`` for each copy call a transfer takes: scattered
KV blocks are one call each) delays the transfer's delivery but takes none of the link's
bandwidth, as a wire's latency or a driver's per-call cost does not.

The finish time asked for is projected from the transfers known at the moment it is asked: one
started later slows every transfer in flight, so a caller that needs the latest answer asks
again (``finish``). The projection uses the link's virtual clock (each transfer in flight has
received the same service ``v`` so far): a transfer of work ``w`` started at service ``v0``
finishes when ``v`` reaches ``v0 + w``, so transfers finish in the order of those marks and
a projection walks them in order: O(transfers in flight).
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)  # a transfer equals only itself
class Transfer:
    """One transfer on a link: ``mark`` is the service at which it is done; ``end`` its delivery
    (bandwidth phase plus latency) once known, -1 while in flight."""

    mark: float
    seq: int
    nbytes: int
    latency: float
    start: float
    end: float = -1.0

    def __lt__(self, other: Transfer) -> bool:
        return (self.mark, self.seq) < (other.mark, other.seq)


@dataclass(slots=True)
class Link:
    """One direction of one link, shared by the transfers in flight on it (see the module docstring)."""

    name: str
    bandwidth: float  # bytes/s
    per_copy_s: float = 0.0  # latency each copy call adds to its transfer
    latency_s: float = 0.0  # base latency of every transfer
    bytes_moved: int = 0
    busy_s: float = 0.0  # seconds with a transfer in its bandwidth phase, settled up to the link's clock
    _t: float = 0.0  # the link's clock: settled up to here
    _v: float = 0.0  # service each transfer in flight has received by _t (seconds at full bandwidth)
    _active: list[Transfer] = field(default_factory=list)  # in flight, by mark
    _seq: int = 0

    def _advance(self, now: float) -> None:
        """Settle the link up to ``now``: transfers whose bandwidth phase ends by then leave."""
        active, t, v = self._active, self._t, self._v
        while active:
            first = active[0]
            done = t + (first.mark - v) * len(active)
            if done > now:
                break
            self.busy_s += done - t
            t, v = done, first.mark
            first.end = done + first.latency
            active.pop(0)
        if active and now > t:
            v += (now - t) / len(active)
            self.busy_s += now - t
        self._t, self._v = max(t, now), v

    def start(self, now: float, nbytes: int, copies: int = 0, rate: float | None = None) -> Transfer:
        """A transfer of ``nbytes`` in ``copies`` calls starting at ``now`` (at its own ``rate`` if that
        is below the link's bandwidth, e.g. an SSD write). A start before the link's clock starts at
        the clock: the past is settled."""
        self._advance(now)
        work = nbytes / (rate if rate is not None else self.bandwidth)
        self._seq += 1
        tr = Transfer(self._v + work, self._seq, nbytes, self.latency_s + copies * self.per_copy_s, self._t)
        insort(self._active, tr)
        self.bytes_moved += nbytes
        return tr

    def finish(self, tr: Transfer) -> float:
        """When ``tr`` is delivered, projected from the transfers known now."""
        if tr.end >= 0:
            return tr.end
        t, v, n = self._t, self._v, len(self._active)
        for other in self._active:
            t += (other.mark - v) * n
            v, n = other.mark, n - 1
            if other is tr:
                return t + tr.latency
        raise ValueError(f"transfer {tr.seq} is not on link {self.name}")

    def reserve(self, now: float, nbytes: int, copies: int = 0, rate: float | None = None) -> float:
        """``start`` a transfer and return its projected delivery."""
        return self.finish(self.start(now, nbytes, copies, rate))

    def estimate(self, now: float, nbytes: int, copies: int = 0) -> float:
        """Seconds a transfer of ``nbytes`` started at ``now`` would take with the transfers known now
        (nothing is started): what a fetch-or-recompute decision weighs."""
        tr = self.start(now, nbytes, copies)
        seconds = self.finish(tr) - max(now, self._t)
        self.cancel(tr)
        return seconds

    def cancel(self, tr: Transfer) -> None:
        """Take back a transfer started at the link's present (``start`` at the same ``now``, nothing
        settled since): as if it had never started."""
        if tr.end < 0 and tr in self._active:
            self._active.remove(tr)
            self.bytes_moved -= tr.nbytes

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def utilization(self, now: float, since: float = 0.0) -> float:
        """The fraction of ``[since, now]`` the link spent moving bytes (settled up to ``now``)."""
        self._advance(now)
        return self.busy_s / (now - since) if now > since else 0.0
