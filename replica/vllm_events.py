"""vLLM's KV-event protocol, so routers and indexers built for vLLM see a kvemu replica's cache.

``--kv-events-config JSON`` takes vLLM's ``KVEventsConfig`` keys with vLLM's meanings
(``enable_kv_cache_events``, ``publisher: "zmq"``, ``endpoint``, ``replay_endpoint``, ``topic``,
``buffer_steps``, ``hwm``, ``max_queue_size``) and three of kvemu's (``event_encoding``,
``hash_algo``, ``hash_seed``). The wire is vLLM's ``vllm/distributed/kv_events.py``: a PUB socket
sends ``[topic, seq (8 bytes, big-endian), msgpack([ts, events, data_parallel_rank])]`` once per
engine step that changed the cache; events are ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``lora_name``),
``BlockRemoved`` (``block_hashes``, ``medium``) and ``AllBlocksCleared``, tagged as msgspec's
``tag=True`` does: a map with ``"type"`` (``event_encoding: "map"``, recent vLLM) or an array whose
first element is the tag (``"array"``, vLLM releases whose events were ``array_like``). A ROUTER
socket on ``replay_endpoint`` answers ``[id, "", start_seq]`` with every kept batch from that
sequence number on, then ``[id, "", -1, ""]``. ``medium`` names the memory level: ``GPU`` (HBM),
``CPU`` (host DRAM), ``DISK`` (SSD), so a tier-aware consumer sees demotions.

A shared KV store (`kvemu store`, the store every replica of its scope reads and writes) publishes its own
events, as Mooncake's master publishes its store's puts and evictions: ``store_publisher`` gives the store
process a publisher on its own endpoint whose every event has medium ``SHARED`` (``SHARED_MEDIUM``): a
level no replica owns, so a consumer keys it by the publisher (the store's endpoint) and its medium, never as
a replica's GPU blocks. A replica never publishes the shared level (its residency is the store's). The store
knows blocks by kvemu's hashes only (replicas write hashes, not tokens), so its events carry those and no
token ids, as a replica's do for requests that carried only block hashes.

As in vLLM the PUB socket binds when the endpoint has a wildcard (``*``, ``::``) or is ``ipc://``
or ``inproc://`` and connects otherwise. Without ``endpoint`` kvemu binds ``tcp://127.0.0.1:5557``
(vLLM's default, ``tcp://*:5557``, would listen on every interface). Data-parallel rank ``r`` of a replica
publishes on the endpoints' ports plus ``r``, its batches stamped with ``r``, as vLLM's publisher of that rank does;
``kvemu up`` gives replica ``i`` the ports plus ``i`` x the ranks a replica has.

KV cache groups (a model with sliding-window layers, replica/core/cache/group_events.py): as vLLM 0.33's
``BlockPool.cache_full_blocks``, each group's cached blocks are published, a block cached in two groups twice:
an allocation's (a prefill chunk's, a decode step's, a response's) one ``BlockStored`` a group in group order,
as vLLM's ``cache_blocks`` stores them, its parent the block before the run; ``BlockStored`` carries
``group_idx`` and its kind (``kv_cache_spec_kind``: ``full_attention``, ``sliding_window``, ``mamba``) and
``kv_cache_spec_sliding_window`` (a window's tokens), ``BlockRemoved`` its ``group_idx``; ``extra_keys`` (none
here) stands before them. A window group's blocks go (``BlockRemoved``) when evicted, not when the window
passes them (vLLM unpins them then, as kvemu). A model of one group publishes none of these fields, as before
(vLLM's consumers read no ``group_idx`` as group 0).

Block hashes: a request that carried tokens publishes them and vLLM's hashes of its blocks
(``shared.vllm_hashing``), so indexers that recompute hashes from token ids find them; a request
that carried only block hashes publishes those, with no tokens. kvemu caches a response's full
blocks when the request finishes (or is preempted), so decode blocks are published then.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import zmq

from replica.core.cache.groups import group_key
from replica.core.cache.pool import KvEvent
from shared import vllm_hashing
from shared.errors import InputError
from shared.kv_events_config import DEFAULT_ENDPOINT, KvEventsConfig, offset_port
from shared.kv_groups import FULL, STATE, WINDOW, KvGroups

log = logging.getLogger("kvemu.replica.vllm_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIA = ("GPU", "CPU", "DISK")  # level 0, 1, 2; deeper levels are named by their kind
# The medium of a shared KV store's blocks (its kind's name, as deeper levels are named): vLLM's medium is a free
# string (its offloading connector says "GPU" and "CPU"), and neither vLLM, LMCache nor Dynamo names remote storage
SHARED_MEDIUM = "SHARED"
# vLLM's KVCacheSpecKind of each kind of shared/kv_groups.py (vllm/v1/kv_cache_interface.py)
SPEC_KINDS = {FULL: "full_attention", WINDOW: "sliding_window", STATE: "mamba"}




def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, ipc:// or inproc:// endpoint; connect to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class BlockInfo(NamedTuple):
    external: int  # the hash on the wire
    parent: int | None  # the kvemu hash of the block before it (None: first block)
    tokens: tuple[int, ...]  # its token ids (empty: the request carried only hashes)
    digest: bytes | None  # vLLM's full hash (None: no tokens)


class EventTranslator:
    """kvemu's pool events -> vLLM's events. Pure: ``register`` what a request will store, ``translate``
    the pool's events. It keeps what it needs for every block some level holds, and a bounded
    table of blocks registered but not (or no longer) held."""

    def __init__(self, block_size: int, encoding: str = "map", algo: str = vllm_hashing.DEFAULT_HASH_ALGO,
                 seed: str = vllm_hashing.DEFAULT_SEED, level_names: Sequence[str] = (), pending_max: int = 1 << 17,
                 medium: str | None = None, groups: KvGroups | None = None):
        self.block_size = block_size
        # several KV cache groups: each event's group and kind (one group: no group fields, as before)
        self.groups = groups if groups is not None and groups.hybrid else None
        self._slot_hash: dict[int, int] = {}  # a held copy's key in a group >= 1 -> its block's hash
        self.medium = medium  # every event's medium, whatever its level (a shared store's: SHARED_MEDIUM)
        self.encoding = encoding
        self._fn = vllm_hashing.hash_function(algo)
        self._none = vllm_hashing.none_hash(algo, seed)
        self.media = [*MEDIA[:1], *(_medium(k, name) for k, name in enumerate(level_names, 1))]
        self._held: dict[int, tuple[BlockInfo, int]] = {}  # hash -> (info, levels holding it)
        self._pending: OrderedDict[int, BlockInfo] = OrderedDict()
        self.pending_max = pending_max

    def info(self, h: int) -> BlockInfo | None:
        held = self._held.get(h)
        return held[0] if held is not None else self._pending.get(h)

    def register(self, hashes: Sequence[int], tokens: Sequence[int] | None = None) -> None:
        """A request's blocks in order (its prompt's, then its response's), with the tokens they cover."""
        bs, parent = self.block_size, None
        parent_digest: bytes | None = self._none
        for i, h in enumerate(hashes):
            known = self.info(h)
            chunk = tuple(tokens[i * bs:(i + 1) * bs]) if tokens is not None else ()
            if known is not None and (known.digest is not None or len(chunk) < bs):
                info = known
            elif len(chunk) == bs and parent_digest is not None:
                digest = vllm_hashing.block_hash(self._fn, parent_digest, chunk)
                info = BlockInfo(vllm_hashing.external(digest), parent, chunk, digest)
            else:
                info = BlockInfo(h, parent, (), None)
            if h not in self._held:
                self._pending[h] = info
                self._pending.move_to_end(h)
            parent, parent_digest = h, info.digest
        while len(self._pending) > self.pending_max:
            self._pending.popitem(last=False)

    def translate(self, events: Sequence[KvEvent]) -> list[Any]:
        out: list[Any] = []
        for e in events:
            medium = self._medium_of(e.level)
            if e.kind == "stored":
                out += self._stored(e.hashes, medium, e.group)
            elif e.kind == "removed":
                out.append(self._event("BlockRemoved", block_hashes=[self._removed(h, e.group) for h in e.hashes],
                                       medium=medium, **self._group_fields(e.group, False)))
            elif e.kind == "cleared":
                for slot, (info, _) in self._held.items():
                    self._pending[self._slot_hash.get(slot, slot)] = info
                self._held.clear()
                self._slot_hash.clear()
                out.append(self._event("AllBlocksCleared"))
        return out

    def _slot(self, h: int, group: int) -> int:
        """Where a block's copy in ``group`` is held here: group 0's by its hash, another's by the pool's key."""
        if group == 0:
            return h
        slot = group_key(h, group)
        self._slot_hash[slot] = h
        return slot

    def _stored(self, hashes: Sequence[int], medium: str, group: int = 0) -> list[Any]:
        runs: list[list[BlockInfo]] = []
        previous = None
        for h in hashes:
            slot = self._slot(h, group)
            held = self._held.get(slot)
            if held is not None:
                info, levels = held
            else:
                # group 0 takes the block's registration; another group reads it (group 0's copy may follow)
                known = self._pending.pop(h, None) if group == 0 else self.info(h)
                info, levels = known if known is not None else BlockInfo(h, None, (), None), 0
            self._held[slot] = (info, levels + 1)
            if runs and info.parent is not None and info.parent == previous:
                runs[-1].append(info)
            else:
                runs.append([info])
            previous = h
        return [self._block_stored(run, medium, group) for run in runs]

    def _block_stored(self, run: list[BlockInfo], medium: str, group: int = 0) -> Any:
        first = run[0]
        parent = self.info(first.parent) if first.parent is not None else None
        tokens = [t for info in run for t in info.tokens] if all(info.tokens for info in run) else []
        return self._event("BlockStored", block_hashes=[info.external for info in run],
                           parent_block_hash=parent.external if parent is not None else
                           (first.parent if first.parent is not None else None),
                           token_ids=tokens, block_size=self.block_size, lora_id=None, medium=medium, lora_name=None,
                           **self._group_fields(group, True))

    def _group_fields(self, group: int, stored: bool) -> dict[str, Any]:
        """vLLM's group fields of an event of ``group`` (none for a model of one group)."""
        if self.groups is None:
            return {}
        if not stored:
            return {"group_idx": group}
        x = self.groups.groups[group]
        return {"extra_keys": None, "group_idx": group, "kv_cache_spec_kind": SPEC_KINDS[x.kind],
                "kv_cache_spec_sliding_window": x.window if x.kind == WINDOW else None}

    def _removed(self, h: int, group: int = 0) -> int:
        slot = self._slot(h, group)
        held = self._held.pop(slot, None)
        if held is None:
            self._slot_hash.pop(slot, None)
            info = self.info(h)
            return info.external if info is not None else h
        info, levels = held
        if levels > 1:
            self._held[slot] = (info, levels - 1)
        else:
            self._slot_hash.pop(slot, None)
            if h not in self._held:  # the block's registration waits while no group 0 copy is held
                self._pending[h] = info
        return info.external

    def _medium_of(self, level: int) -> str:
        if self.medium is not None:
            return self.medium
        if level < len(self.media):
            return self.media[level]
        return MEDIA[level] if level < len(MEDIA) else f"L{level}"

    def _event(self, tag: str, **values: Any) -> Any:
        """msgspec's ``tag=True`` encoding: a map with "type", or an array led by the tag; with its
        ``omit_defaults``, the group fields left at their default (None) are left out: in a map each of them, in an
        array those that trail."""
        if self.encoding == "array":
            row = [tag, *values.values()]
            while len(row) > 1 and row[-1] is None and len(row) > _LAST_REQUIRED[tag]:
                row.pop()
            return row
        return {"type": tag, **{k: v for k, v in values.items() if v is not None or k not in _DEFAULTED}}


# The fields vLLM's events give a default (None), which msgspec's omit_defaults leaves out when it is one
_DEFAULTED = frozenset({"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"})
# ... and the length of each event's array up to its last required field (the tag first)
_LAST_REQUIRED = {"BlockStored": 8, "BlockRemoved": 3, "AllBlocksCleared": 1}


def store_publisher(config: KvEventsConfig, block_size: int) -> ZmqEventPublisher:
    """vLLM's KV events of a shared KV store, on the store's own endpoint (``config``, from its ``--kv-events-config``):
    ``publish(store.drain_events())`` after each change (``stored`` / ``removed``, any level: all are the store's,
    medium ``SHARED``; ``cleared`` when it starts over), ``shutdown()`` when it stops. Raises InputError naming
    ``--kv-events-config`` when the endpoint cannot be opened."""
    translator = EventTranslator(block_size, config.event_encoding, config.hash_algo, config.hash_seed,
                                 medium=SHARED_MEDIUM)
    return ZmqEventPublisher(config, translator)


def _medium(level: int, kind: str) -> str:
    return MEDIA[level] if level < len(MEDIA) else kind.upper()


@dataclass(slots=True)
class PublisherCounters:
    batches: int = 0
    events: int = 0
    dropped_batches: int = 0  # the queue to the sending thread was full
    replay_requests: int = 0
    replayed_batches: int = 0


class ZmqEventPublisher:
    """vLLM's ``ZmqEventPublisher``: batches queue to a thread that sends them and serves replays."""

    def __init__(self, config: KvEventsConfig, translator: EventTranslator, data_parallel_rank: int = 0) -> None:
        self.config = config
        self.translator = translator
        self.rank = data_parallel_rank
        # vLLM's rule for a DP rank's publisher: its endpoints' ports offset by the rank (ipc / inproc: "_dp<rank>")
        self.endpoint = offset_port(config.endpoint or DEFAULT_ENDPOINT, data_parallel_rank) or DEFAULT_ENDPOINT
        self.replay_endpoint = offset_port(config.replay_endpoint, data_parallel_rank)
        self.counters = PublisherCounters()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=config.max_queue_size)
        self._ctx: zmq.Context = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket | None = None
        try:
            if config.endpoint is None or binds(self.endpoint):
                self._pub.bind(self.endpoint)
            else:
                self._pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close()
            where = self.replay_endpoint if self._replay is not None else self.endpoint
            raise InputError("--kv-events-config", f"cannot open {where}: {exc.strerror}; give another endpoint"
                                                   " or port") from None
        self._topic = config.topic.encode()
        self._buffer: list[tuple[int, bytes]] = []
        self._next_seq = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: Sequence[KvEvent]) -> None:
        """One engine step's pool events (called on the event loop: translate, queue, never block)."""
        wire = self.translator.translate(events)
        if not wire:
            return
        payload = msgpack.packb([time.time(), wire, self.rank], use_bin_type=True)
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.counters.dropped_batches += 1
            return
        self.counters.events += len(wire)

    def stats(self) -> dict:
        c = self.counters
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint, "data_parallel_rank": self.rank,
                "topic": self.config.topic,
                "event_encoding": self.config.event_encoding, "hash_algo": self.config.hash_algo,
                "next_seq": self._next_seq, "batches": c.batches, "events": c.events,
                "dropped_batches": c.dropped_batches, "replay_requests": c.replay_requests,
                "replayed_batches": c.replayed_batches, "queued": self._queue.qsize()}

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (for at most ``timeout``), then close the sockets."""
        self._running = False
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._close()

    def _close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        keep = self.config.buffer_steps
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                payload = self._queue.get(timeout=0.05)
            except queue.Empty:
                if not self._running:
                    return
                continue
            if payload is None:
                return
            seq = self._next_seq
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError as exc:  # a closed or broken socket: the batch is lost, the loop goes on
                log.warning("kv events: batch %d not sent: %s", seq, exc)
            self._next_seq = seq + 1
            self.counters.batches += 1
            self._buffer.append((seq, payload))
            if len(self._buffer) > 2 * keep:  # trim in bulk: O(1) amortized, at most 2x the kept steps
                del self._buffer[:-keep]

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        self.counters.replay_requests += 1
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv events: malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer[-self.config.buffer_steps:]:
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
                self.counters.replayed_batches += 1
        self._replay.send_multipart((client, b"", END_SEQ, b""))
