"""``kvemu up``'s shared KV store part: with ``--shared-cache-gib G`` up starts the store processes
(``kvemu store``, replica/kvstore/service.py) before the replicas, one for the cluster or one per
``--shared-scope K`` replicas in id order (as ``kvemu sim`` groups them), and points each replica at its
group's store with the same store flags. The cluster token reaches the stores in the environment, as it
reaches every child."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvemu.options.kv_store import STORE_OPTIONS, shared_settings
from kvemu.options.option import forward
from kvemu.options.serving import SERVER_OPTIONS
from replica.core.disagg import Topology
from replica.core.tiers.shared import SharedSettings
from shared.costmodel import CostModel
from shared.errors import InputError

if TYPE_CHECKING:
    from kvemu.up_plan import UpPlan

# what up does with each shared flag (up's TRANSFORMED): none goes to a child as up took it alone
TRANSFORMED_SHARED = {
    **{o.flag: "to each shared store (kvemu store) and to every replica beside --shared-store-url, its group's store"
       for o in STORE_OPTIONS},
    "--shared-scope": "up's: one store per K replicas in id order (0: one for the cluster); no child takes it",
}
STORE_PREFIX = "shared-store"


def plan_shared(flags: argparse.Namespace, block_size: int, topology: Topology) -> SharedSettings | None:
    """The store flags checked as sim checks them: the store's settings, None without one."""
    shared = shared_settings(flags, CostModel.from_names(flags.model, flags.gpu), block_size, topology.total)
    if shared is not None and topology.disaggregated:
        raise InputError("--shared-cache-gib", "a shared store runs live beside colocated replicas only (kvemu sim"
                                               " models it under P/D)")
    return shared


def store_groups(plan: UpPlan) -> int:
    """How many stores up starts (0 without a shared level)."""
    return 0 if plan.shared is None else len(plan.shared.groups(plan.topology.total))


def store_id(plan: UpPlan, k: int) -> str:
    return STORE_PREFIX if store_groups(plan) == 1 else f"{STORE_PREFIX}-{k}"


def store_args(plan: UpPlan, k: int, port: int) -> list[str]:
    """Store ``k``'s command line: its store flags, the model's block bytes, the replicas' time scale."""
    flags = plan.flags
    return [sys.executable, "-m", "kvemu", "store", "--port", str(port), "--store-id", store_id(plan, k),
            "--model", flags.model, "--gpu", flags.gpu, "--block-size", str(plan.block_size),
            "--time-scale", repr(float(flags.time_scale)), *forward(STORE_OPTIONS, flags),
            *forward(SERVER_OPTIONS, flags)]


def replica_shared_argv(plan: UpPlan, i: int, store_urls: Sequence[str]) -> list[str]:
    """Replica ``i``'s store: its group's URL and the store flags (nothing without a shared level)."""
    if plan.shared is None or not store_urls:
        return []
    return ["--shared-store-url", store_urls[plan.shared.group_of(i, plan.topology.total)],
            *forward(STORE_OPTIONS, plan.flags)]


def router_shared_argv(plan: UpPlan, store_urls: Sequence[str]) -> list[str]:
    """The router's ``--shared-store`` per store: its URL, with its group's replica ids where there are
    several stores (one store serves every replica), so the index answers each replica its own store's run."""
    if plan.shared is None or not store_urls:
        return []
    if len(store_urls) == 1:
        return ["--shared-store", store_urls[0]]
    ids = [replica_id for replica_id, _ in plan.members()]
    out: list[str] = []
    for url, group in zip(store_urls, plan.shared.groups(plan.topology.total), strict=True):
        out += ["--shared-store", f"{url}={','.join(ids[group.start:group.stop])}"]
    return out
