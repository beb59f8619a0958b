"""PartialNode RandomCompute (When Fancy Eviction Fails, principle 4): RandomCompute's scoring over runs of a
request's blocks (nodes) instead of single blocks, so evictions take whole tails and leave
fewer holes. Scoring and sampling are RandomCompute's (``random_compute.SampledPolicy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf, log2

from replica.core.cache.policies.base import Access
from replica.core.cache.policies.random_compute import SampledPolicy
from shared.validate import check_positive_int


class _Node:
    """A prefix-tree node: the blocks one request inserted at consecutive depths."""

    __slots__ = ("blocks", "head", "live", "cost", "f", "last", "lw")

    def __init__(self, blocks: list[int], cost: float, now: float, halflife: float) -> None:
        self.blocks = blocks  # depth order; entries whose block left the node are skipped
        self.head = 0  # every block before head has left the node
        self.live = len(blocks)
        self.cost = cost  # recompute cost of the node's resident blocks
        self.f = 1.0
        self.last = now
        self.lw = now / halflife  # log2(f) + last/halflife


class PartialNodePolicy(SampledPolicy):
    """PartialNode RandomCompute: sample blocks, score their nodes, evict a chunk from a node's start.

    A node is the run of new blocks at consecutive depths that one request inserted (a
    request with holes inserts one node per run); a block belongs to it until evicted.
    A node's ``f`` and ``last`` change once per request touching any of its blocks; its
    score uses the mean recompute cost of its resident blocks. The lowest-scoring node of
    the sample (sampled blocks map to their nodes) loses its shallowest run: from its
    first candidate (resident, not in use), consecutive candidates up to ``chunk_blocks``
    (blocks already gone are passed over, the hole just grows; a block in use, which left
    the candidates when a request touched it, ends the run). The whole run is returned even
    when it exceeds ``need``.
    """

    name = "partial_node"

    def __init__(self, sample_size: int = 128, chunk_blocks: int = 32, decay_halflife_s: float = 300.0,
                 seed: int = 0, min_idle_s: float = 1e-3) -> None:
        self.chunk_blocks = check_positive_int("chunk_blocks", chunk_blocks)
        super().__init__(sample_size, decay_halflife_s, seed, min_idle_s)

    def clear(self) -> None:
        super().clear()
        self._node_of: dict[int, tuple[_Node, int]] = {}  # block -> (node, depth)

    def _forget(self, h: int) -> None:
        self._discard(h)
        entry = self._node_of.pop(h, None)
        if entry is not None:
            node, depth = entry
            node.live -= 1
            node.cost -= self.ctx.block_cost(depth)

    def on_access(self, acc: Access) -> None:
        now = acc.now
        self._clock(now)
        hashes, node_of, new = acc.hashes, self._node_of, acc.new_idx
        touched: dict[_Node, None] = {}
        unknown = []
        for i in acc.touched_idx:
            h = hashes[i]  # on_pin took it out of the candidates
            entry = node_of.get(h)
            if entry is None:
                unknown.append(i)  # resident but unseen (e.g. after set_policy): joins a new node
            else:
                touched[entry[0]] = None
        for node in touched:
            node.f = 1.0 + self._decayed(node.f, node.last, now)
            node.last = now
            node.lw = log2(node.f) + now / self.halflife
        if unknown:
            new = sorted(new + unknown)
        cost, start = self.ctx.block_cost, 0
        for r in range(1, len(new) + 1):
            if r == len(new) or new[r] != new[r - 1] + 1:  # a run of consecutive depths ends
                run = new[start:r]
                node = _Node([hashes[i] for i in run], sum(map(cost, run)), now, self.halflife)
                for i in run:
                    node_of[hashes[i]] = (node, i)
                start = r

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        self._clock(now)
        node_of = self._node_of
        for h in hashes:
            if h in node_of:
                self._add(h)

    def victims(self, need: int) -> list[int]:
        self._clock(self.ctx.now)  # score at the incoming request's time
        cands, node_of = self._cands, self._node_of
        now, eps, k = self._now, self.min_idle, self.sample_size
        out: list[int] = []
        while len(out) < need:
            sample = cands if k >= len(cands) else [cands[j] for j in self._draw(k).tolist()]
            best, bnode = inf, None
            for h in sample:  # a node sampled twice scores the same: no need to dedupe
                node = node_of[h][0]
                idle = now - node.last
                s = node.lw + log2(max(node.cost, 1e-300) / (node.live * (idle if idle > eps else eps)))
                if s < best:
                    best, bnode = s, node
            if bnode is None:
                if k >= len(cands):
                    raise RuntimeError(f"{self.name}: asked for victims but none is evictable")
                continue
            run = self._run(bnode)
            for h in run:
                self._forget(h)
            out.extend(run)
        return out

    def _run(self, node: _Node) -> list[int]:
        """The node's shallowest run of candidates: blocks in use left the candidates and end it."""
        blocks, node_of, n, free = node.blocks, self._node_of, len(node.blocks), self._pos

        def mine(h: int) -> bool:
            entry = node_of.get(h)
            return entry is not None and entry[0] is node

        i = node.head
        while i < n and not mine(blocks[i]):
            i += 1
        node.head = i
        while i < n and (blocks[i] not in free or not mine(blocks[i])):
            i += 1  # shallow blocks in use stay; the run starts after them
        run: list[int] = []
        while i < n and len(run) < self.chunk_blocks:
            h = blocks[i]
            if mine(h):
                if h not in free:
                    break
                run.append(h)
            i += 1
        return run

    def on_remove(self, h: int) -> None:
        self._forget(h)

    def describe(self) -> dict:
        return {**super().describe(), "chunk_blocks": self.chunk_blocks}
