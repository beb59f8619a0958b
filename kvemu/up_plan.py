"""``kvemu up``'s plan: every flag checked as a child would check it, in one line before any process starts,
and what up starts resolved into one frozen ``UpPlan`` that the rest of up reads (kvemu/up.py starts it).
The namespace the user's flags came in is never written: the plan holds a copy of the flags as the children
are handed them (the combined ``--gpu NAME@tpN`` and ``--model NAME@kv=DTYPE``, the default capacity, the
count of colocated replicas) beside what up decides itself (the topology, the P/D pools, the shared store)."""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

from kvemu.options.gpu import gpu_setting
from kvemu.options.knobs import engine_knobs, naming_flags
from kvemu.options.kv_cache_dtype import model_setting
from kvemu.options.kv_events import kv_events_setting
from kvemu.options.limits import capacity_note, default_capacity, length_warning, replica_capacity
from kvemu.options.matching import matching_setting
from kvemu.options.parallel import parallel_setting, ranks_line
from kvemu.options.prefix_caching import prefix_caching_setting
from kvemu.options.scheduler import check_scheduler_flags
from kvemu.options.tiers import tier_settings
from kvemu.up_pd import plan_pools, plan_topology
from kvemu.up_store import plan_shared
from replica.backends import check_backend, check_backend_flags
from replica.core.disagg import PdCluster, Topology
from replica.core.dp import DpSettings
from replica.core.tiers.shared import SharedSettings
from shared.costmodel import CostModel
from shared.errors import InputError


@dataclass(frozen=True, slots=True)
class UpPlan:
    """What ``kvemu up`` starts, checked: made once by ``validate``, read by everything after it."""

    flags: argparse.Namespace  # the flags as the children are handed them (resolved; never written after)
    topology: Topology  # the colocated replicas and the P/D pools, in start order
    block_size: int  # the replicas' block (or page) in tokens: the router's and the shared store's unit
    pd: PdCluster | None  # the P/D pools' shapes, decider and link (None: a colocated cluster)
    shared: SharedSettings | None  # the shared KV store (None: none)
    limit_lines: tuple[str, ...]  # the capacity and length lines the replicas would each print, printed once

    def members(self) -> list[tuple[str, str]]:
        """``(replica id, role)`` of every replica up starts, in start order."""
        return self.topology.members()


def resolved_flags(a: argparse.Namespace) -> argparse.Namespace:
    """A copy of ``a`` with the values up hands on in place of those it took: ``--gpu``/``--gpu-file``/``--tp``
    as one ``--gpu NAME@tpN``, ``--kv-cache-dtype`` inside ``--model``, vLLM's default capacity where no
    capacity flag is given (before the P/D pools are sized: one on another GPU follows the same rule)."""
    flags = argparse.Namespace(**{**vars(a), "gpu": gpu_setting(a), "tp": 1,
                                  "model": model_setting(a), "kv_cache_dtype": "auto"})
    default_capacity(flags)
    return flags


def validate(a: argparse.Namespace) -> UpPlan:
    """Everything a child would reject, rejected here in one line before any process starts; the plan."""
    flags = resolved_flags(a)
    check_backend(flags.backend, flags.layers)  # no torch: one line here, not one per replica
    check_backend_flags(flags)
    topology = plan_topology(flags)
    if not 1 <= flags.routers <= 64:
        raise InputError("--routers", f"must be 1-64, got {flags.routers}")
    check_scheduler_flags(flags)
    block_size, limit_lines = _check_children(flags, _check_parallel(flags, topology))
    pd = plan_pools(flags, block_size)
    shared = plan_shared(flags, block_size, topology)
    _check_ports(flags, topology)
    return UpPlan(flags, topology, block_size, pd, shared, limit_lines)


def _check_children(flags: argparse.Namespace, dp: DpSettings) -> tuple[int, tuple[str, ...]]:
    """The replicas' and the router's settings built as each child builds them (a refusal names the flag);
    the block size and the lines the replicas would print to their logs."""
    from kvemu.options.router_flags import routing_settings
    from kvemu.options.serving import serving_settings
    from replica.settings import ReplicaSettings, check_live_policy
    from router.settings import RouterSettings
    from router.strategies import get_strategy

    matching = matching_setting(flags)
    check_live_policy(flags.policy)
    knobs = engine_knobs(flags, matching)  # the tiers below: checked with the prefix caching flag, as each replica does
    with naming_flags():  # a field's name is its flag's, less the "_s" of seconds
        serving = serving_settings(argparse.Namespace(**{**vars(flags), "host": "127.0.0.1"}), find_token=False)
        note = capacity_note(flags, matching.block_size, matching.mode)  # a pool of no block or page: one line
        replica = ReplicaSettings(knobs=knobs, **replica_capacity(flags, matching.mode), max_model_len=flags.max_model_len,
                                  model=flags.model, gpu=flags.gpu, block_size=matching.block_size,
                                  time_scale=flags.time_scale, max_waiting=flags.max_waiting, serving=serving,
                                  backend=flags.backend, dp=dp)
        RouterSettings(replicas=("http://127.0.0.1:1",), block_size=matching.block_size, serving=serving,
                       health_interval_s=flags.health_interval, dashboard_interval_s=flags.dashboard_interval,
                       client_max_in_flight=flags.client_max_in_flight, client_rate=flags.client_rate,
                       client_burst=flags.client_burst, upstream_first_byte_timeout_s=flags.upstream_first_byte_timeout)
    tiers = tier_settings(flags, CostModel.from_names(flags.model, flags.gpu), matching.block_size)
    prefix_caching_setting(flags, tiers, flags.backend)  # as each replica checks it
    get_strategy(flags.routing)
    routing_settings(matching.block_size, flags.set, mode=matching.mode)
    unit = "pages" if matching.mode == "radix" else "blocks"
    each = f"each of a replica's {dp.size} DP ranks: " if dp.size > 1 else ""
    lines = [each + replica.kv_budget().line()] if flags.gpu_memory_utilization is not None else []
    lines += filter(None, [ranks_line(dp, replica.resolved_capacity_blocks(), unit), note,
                           length_warning(replica.asked_max_model_len(), flags.max_model_len is not None,
                                          replica.resolved_capacity_blocks(), replica.kv_block_size(), matching.mode)])
    return matching.block_size, tuple(lines)


def _check_parallel(flags: argparse.Namespace, topology: Topology) -> DpSettings:
    """--data-parallel-size and --enable-expert-parallel as each replica checks them, P/D refused; every replica's
    ranks' KV-event ports can be offset (bad JSON, keys or values: one line before anything starts)."""
    dp = parallel_setting(flags, CostModel.from_names(flags.model, flags.gpu).model)
    if dp.size > 1 and topology.disaggregated:
        raise InputError("--data-parallel-size", "DP ranks inside P/D instances are not emulated: drop one of them")
    kv_events = kv_events_setting(flags)
    if kv_events is not None:
        for i in range(topology.total * dp.size):
            kv_events.for_rank(i)
    return dp


def _check_ports(flags: argparse.Namespace, topology: Topology) -> None:
    """The router's port and the replicas' (``--replica-base-port``) free now, or one line naming the flag."""
    wanted = [("--port", flags.port)] if flags.port else []
    if flags.replica_base_port:
        wanted += [("--replica-base-port", flags.replica_base_port + i) for i in range(topology.total)]
    for flag, port in wanted:
        if not port_free(port):
            raise InputError(flag, f"port {port} on 127.0.0.1 is in use; pick another, or stop what listens there")


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now. With SO_REUSEADDR, as the servers bind
    (``shared.http_server.bind``): without it the connections of a cluster stopped a minute ago, still in
    TIME-WAIT, would read as a port in use while nothing listens; a listener still refuses it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
