"""What a simulation keeps of each request it finished, for its exact latency figures, ``kvemu sim
--requests-out`` and the agent sessions' critical paths: eight numbers a request in typed arrays (64 bytes; a
histogram would lose the exact percentiles, a record object a request would cost three times more). The
definitions are ``loadgen.request_metrics``'s and ``loadgen.critical_path``'s."""

from __future__ import annotations

from array import array

import numpy as np

from loadgen.critical_path import Span
from loadgen.request_metrics import RequestRecord, summary_of
from loadgen.trace import Trace
from replica.core.sched.sched_types import SchedRequest


class FinishedRequests:
    __slots__ = ("rid", "arrival", "first", "finish", "waited", "cached", "preemptions", "out", "inp", "replica")

    def __init__(self) -> None:
        self.rid, self.cached, self.preemptions = array("q"), array("q"), array("q")
        self.out, self.inp = array("q"), array("q")
        self.arrival, self.first, self.finish, self.waited = array("d"), array("d"), array("d"), array("d")
        self.replica: list[str] = []  # the replica ids are shared strings: a pointer a request

    def add(self, r: SchedRequest, replica_id: str) -> None:
        """``r`` finished on ``replica_id``: its arrival as it ran (``--causal`` moves later turns), its first
        token, its end, its seconds waiting for admission (every wait, as a live replica's ``queue_time_s``), the
        prompt tokens it found cached at its (last) admission, its preemptions."""
        self.rid.append(r.rid)
        self.arrival.append(r.arrival)
        self.first.append(r.t_first_token)
        self.finish.append(r.t_finished)
        self.waited.append(r.waited)
        self.cached.append(r.cached_tokens)
        self.preemptions.append(r.preemptions)
        self.inp.append(r.input_tokens)
        self.out.append(r.output_tokens)
        self.replica.append(replica_id)

    def summary(self, requests: int) -> dict:
        """Exact means and percentiles of TTFT, TPOT and E2E, the makespan and the throughput; ``requests``:
        the trace's, refused ones included. The simulator prices steps, some of them fast-forwarded runs of
        decode steps, so it gives no single token's gap: ITL is None."""
        col = np.frombuffer
        return summary_of(requests, col(self.arrival), col(self.first), col(self.finish),
                          col(self.out, dtype=np.int64))

    def records(self, trace: Trace, ran: list[int] | None) -> list[RequestRecord]:
        """One record per request of ``trace`` (the trace as read), in its order. ``ran``: the trace's index of
        each request the run was given (None: all of them, in order); the others were refused, never run."""
        out = [RequestRecord(k, r.t, None, None, r.input_tokens, r.output_tokens, None, None, None)
               for k, r in enumerate(trace.requests)]
        for i, rid in enumerate(self.rid):
            k = rid if ran is None else ran[rid]
            out[k] = RequestRecord(k, self.arrival[i], self.first[i], self.finish[i], self.inp[i], self.out[i],
                                   self.cached[i], self.preemptions[i], self.replica[i])
        return out

    def spans(self, trace: Trace, ran: list[int] | None) -> list[Span]:
        """Every request of ``trace`` as ``loadgen.critical_path`` reads it, on the simulated clock, as the live
        replay's are read: its queue (its waits, at most its TTFT), prefill (TTFT less the queue) and decode (its
        first token to its finish); a request never run (refused, or what it waited for was) never finished."""
        out = [Span(r.session, r.id, r.after, r.t, 0.0, 0.0, 0.0, None) for r in trace.requests]
        for i, rid in enumerate(self.rid):
            k = rid if ran is None else ran[rid]
            r, arrival, first = trace.requests[k], self.arrival[i], self.first[i]
            queue = min(self.waited[i], first - arrival)
            out[k] = Span(r.session, r.id, r.after, arrival, queue, first - arrival - queue, self.finish[i] - first,
                          self.finish[i])
        return out
