"""``--kv-events-config``: vLLM's KV events over ZMQ, for routers and indexers built for vLLM.

One definition for ``kvemu replica`` and ``kvemu up`` (which gives replica ``i`` the endpoint's
port plus ``i`` x its data-parallel ranks, each rank adding its own as vLLM offsets it per rank). The keys and the wire are vLLM's;
``replica.vllm_events`` says what kvemu adds and where it departs."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from shared.kv_events_config import KvEventsConfig

KV_EVENTS_CONFIG = Option(
    "--kv-events-config", None, metavar="JSON",
    help="publish vLLM's KV events over ZMQ: vLLM's KVEventsConfig as JSON, e.g."
         " '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'"
         " (keys: enable_kv_cache_events, publisher, endpoint, replay_endpoint, topic, buffer_steps, hwm,"
         " max_queue_size; kvemu's: event_encoding map|array, hash_algo sha256|sha256_cbor, hash_seed);"
         " without endpoint it binds tcp://127.0.0.1:5557")


def add_kv_events_arg(p: argparse.ArgumentParser) -> None:
    KV_EVENTS_CONFIG.add(p)


def kv_events_setting(args: argparse.Namespace) -> KvEventsConfig | None:
    """The parsed config (InputError naming the flag on bad JSON, keys or values), or None."""
    text = getattr(args, "kv_events_config", None)
    return None if text is None else KvEventsConfig.parse(text)


def kv_events_argv(args: argparse.Namespace, rank: int) -> list[str]:
    """The flag for replica ``rank`` of ``kvemu up``: the same config with its ports offset."""
    config = kv_events_setting(args)
    if config is None:
        return []
    return [KV_EVENTS_CONFIG.flag, config.for_rank(rank).to_json()]
