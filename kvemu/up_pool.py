"""``kvemu up``'s shared KV pool part: with ``--shared-cache-gib G`` up starts the pool processes
(``kvemu pool``, replica/kvpool/service.py) before the replicas, one for the cluster or one per
``--shared-scope K`` replicas in id order (as ``kvemu sim`` groups them), and points each replica at its
group's pool with the same store flags. The cluster token reaches the pools in the environment, as it
reaches every child."""

from __future__ import annotations

import sys

from kvemu.options.option import forward
from kvemu.options.serving import SERVER_OPTIONS
from kvemu.options.shared_pool import STORE_OPTIONS, shared_settings
from shared.costmodel import CostModel
from shared.errors import InputError

# what up does with each shared flag (up's TRANSFORMED): none goes to a child as up took it alone
TRANSFORMED_SHARED = {
    **{o.flag: "to each shared pool (kvemu pool) and to every replica beside --shared-pool-url, its group's pool"
       for o in STORE_OPTIONS},
    "--shared-scope": "up's: one pool per K replicas in id order (0: one for the cluster); no child takes it",
}
POOL_PREFIX = "shared-pool"


def validate_shared(a, block_size: int) -> None:
    """The store flags checked as sim checks them (``a.shared``: the settings, None without a pool)."""
    a.shared = shared_settings(a, CostModel.from_names(a.model, a.gpu), block_size, a.topology.total)
    a.shared_block_size = block_size
    if a.shared is not None and a.topology.disaggregated:
        raise InputError("--shared-cache-gib", "a shared pool runs live beside colocated replicas only (kvemu sim"
                                               " models it under P/D)")


def pool_groups(a) -> int:
    """How many pools up starts (0 without a shared level)."""
    if getattr(a, "shared", None) is None:
        return 0
    return len(a.shared.groups(a.topology.total))


def pool_id(a, k: int) -> str:
    return POOL_PREFIX if pool_groups(a) == 1 else f"{POOL_PREFIX}-{k}"


def pool_args(a, k: int, port: int) -> list[str]:
    """Pool ``k``'s command line: its store flags, the model's block bytes, the replicas' time scale."""
    return [sys.executable, "-m", "kvemu", "pool", "--port", str(port), "--pool-id", pool_id(a, k),
            "--model", a.model, "--gpu", a.gpu, "--block-size", str(a.shared_block_size),
            "--time-scale", repr(float(a.time_scale)), *forward(STORE_OPTIONS, a), *forward(SERVER_OPTIONS, a)]


def replica_shared_argv(a, i: int) -> list[str]:
    """Replica ``i``'s pool: its group's URL and the store flags (nothing without a shared level)."""
    urls = getattr(a, "shared_pool_urls", None)
    if not urls:
        return []
    return ["--shared-pool-url", urls[a.shared.group_of(i, a.topology.total)], *forward(STORE_OPTIONS, a)]



def router_shared_argv(a) -> list[str]:
    """The router's ``--shared-pool`` per pool: its URL, with its group's replica ids where there are
    several pools (one pool serves every replica), so the index answers each replica its own pool's run."""
    urls = getattr(a, "shared_pool_urls", None)
    if not urls:
        return []
    if len(urls) == 1:
        return ["--shared-pool", urls[0]]
    ids = [replica_id for replica_id, _ in a.topology.members()]
    out: list[str] = []
    for url, group in zip(urls, a.shared.groups(a.topology.total), strict=True):
        out += ["--shared-pool", f"{url}={','.join(ids[group.start:group.stop])}"]
    return out
