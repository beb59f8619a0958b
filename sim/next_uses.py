"""What the offline oracles (Belady and its kin) are told of the future: each block access's next use, in the
order the cache sees accesses. Compiled with the simulator's loop (shared/compiled_modules.py), which asks it
at every arrival."""

from __future__ import annotations

from itertools import chain

import numpy as np

from loadgen.trace import Trace


class NextUses:
    """What the offline oracles are told: for every block access, the position of the next
    access to the same block in the order the cache sees accesses (request order, then the
    block's place in its request), ``inf`` when there is none; 8 bytes per block access.

    Positions, not timestamps: requests that share a timestamp keep their order.
    """

    def __init__(self, trace: Trace) -> None:
        reqs = trace.requests
        lengths = np.fromiter((len(r.hash_ids) for r in reqs), dtype=np.int64, count=len(reqs))
        self.starts = np.zeros(len(reqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])
        flat = np.fromiter(chain.from_iterable(r.hash_ids for r in reqs), dtype=np.uint64, count=int(self.starts[-1]))
        order = np.argsort(flat, kind="stable")  # equal hashes stay in access order
        same = flat[order[1:]] == flat[order[:-1]]
        self.next = np.full(len(flat), np.inf)
        self.next[order[:-1][same]] = order[1:][same]

    def of(self, k: int) -> list[float]:
        """Request ``k``'s next-use positions, one per block."""
        return self.next[self.starts[k]:self.starts[k + 1]].tolist()

    def position(self, k: int) -> float:
        """Where request ``k``'s first block sits in the access order."""
        return float(self.starts[k])
