"""``kvemu kv-events``: read vLLM's KV events from a replica (or from vLLM itself) and print them.

A consumer written from vLLM's format (``vllm/distributed/kv_events.py``): it subscribes to the
PUB endpoint, or asks the replay endpoint for every kept batch from ``--from-seq`` on (then goes on
live with ``--endpoint``), decodes each ``[topic, seq, msgpack([ts, events, dp_rank])]`` message with
either event encoding (map- or array-tagged) and prints one JSON line a batch:
``{"seq", "topic", "ts", "data_parallel_rank", "events": [{"type": ..., ...}]}``. Block hashes
that arrive as bytes (vLLM without int block hashes) print as hex.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import msgpack
import zmq

from shared.errors import InputError

FIELDS = {  # the positional fields of each array-tagged event, in vLLM's order
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                    "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", default=None, help="PUB endpoint to subscribe to (default tcp://127.0.0.1:5557"
                                                     " unless only --replay is given)")
    p.add_argument("--replay", default=None, metavar="ENDPOINT", help="ROUTER endpoint to ask for kept batches first")
    p.add_argument("--from-seq", type=int, default=0, help="with --replay: the first sequence number to resend")
    p.add_argument("--topic", default="", help="topic prefix to subscribe to")
    p.add_argument("--batches", type=int, default=0, help="stop after this many batches (0: run until Ctrl-C)")
    p.add_argument("--timeout", type=float, default=10.0, help="give up after this many seconds without a batch")


def decode_event(raw: Any) -> dict:
    """One event, map-tagged (``{"type": ...}``) or array-tagged (``[tag, field, ...]``), as a map."""
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return {k: _plain(v) for k, v in raw.items()}
    if isinstance(raw, (list, tuple)) and raw and raw[0] in FIELDS:
        return {"type": raw[0], **{k: _plain(v) for k, v in zip(FIELDS[raw[0]], raw[1:])}}
    raise ValueError(f"not a KV event: {raw!r:.80}")


def decode_batch(topic: bytes, seq: bytes, payload: bytes) -> dict:
    batch = msgpack.unpackb(payload, raw=False)
    if isinstance(batch, dict):  # a map-encoded EventBatch
        ts, events, rank = batch.get("ts"), batch.get("events", []), batch.get("data_parallel_rank")
    else:
        ts, events, *rest = batch
        rank = rest[0] if rest else None
    return {"seq": int.from_bytes(seq, "big", signed=True), "topic": topic.decode(errors="replace"), "ts": ts,
            "data_parallel_rank": rank, "events": [decode_event(e) for e in events]}


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _frames(sock: zmq.Socket, endpoint: str, timeout_ms: int, flag: str, silence: tuple[str, str]) -> list[bytes]:
    """The next message: vLLM's three frames; else a one-line error (``silence``: the flag and words when none came)."""
    if not sock.poll(timeout_ms):
        raise InputError(*silence)
    frames = sock.recv_multipart()
    if len(frames) != 3:
        raise InputError(flag, f"{endpoint} sent {len(frames)} frames, not vLLM's three")
    return frames


def _replayed(ctx: zmq.Context, endpoint: str, first: int, timeout_ms: int) -> Iterator[dict]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", first.to_bytes(8, "big")])
    while True:
        _, seq, payload = _frames(dealer, endpoint, timeout_ms, "--replay",
                                  ("--replay", f"no answer from {endpoint} within the timeout; is it a replay endpoint?"))
        if int.from_bytes(seq, "big", signed=True) == -1:
            return
        yield decode_batch(b"", seq, payload)


def _live(ctx: zmq.Context, endpoint: str, topic: str, timeout_ms: int) -> Iterator[dict]:
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    while True:
        yield decode_batch(*_frames(sub, endpoint, timeout_ms, "--endpoint",
                                    ("--timeout", f"no batch from {endpoint} within {timeout_ms / 1000:g} s")))


def run(a) -> int:
    if a.batches < 0 or a.from_seq < 0 or not a.timeout > 0:
        raise InputError("--batches", "--batches and --from-seq must be >= 0 and --timeout > 0")
    if a.from_seq and a.replay is None:
        raise InputError("--from-seq", "needs --replay (the live socket has no history)")
    endpoint = a.endpoint or (None if a.replay else "tcp://127.0.0.1:5557")
    ctx = zmq.Context()
    timeout_ms = int(a.timeout * 1000)
    printed = 0
    try:
        sources = []
        if a.replay:
            sources.append(_replayed(ctx, a.replay, a.from_seq, timeout_ms))
        if endpoint:
            sources.append(_live(ctx, endpoint, a.topic, timeout_ms))
        for source in sources:
            for batch in source:
                print(json.dumps(batch), flush=True)
                printed += 1
                if a.batches and printed >= a.batches:
                    return 0
    except KeyboardInterrupt:
        return 0
    except InputError:
        raise
    except (ValueError, msgpack.ExtraData, zmq.ZMQError) as exc:
        raise InputError("--endpoint", f"cannot read the events: {exc}") from None
    finally:
        ctx.destroy(linger=0)
    print(f"{printed} batches (the replay endpoint had no more)", file=sys.stderr)
    return 0
