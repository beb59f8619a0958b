"""The routing flags every command that routes takes (`kvemu router`, `kvemu up`, `kvemu sim`,
`kvemu sweep`): the strategy and its settings (``--set``), built into the strategies'
``RoutingSettings``. The router process's own flags (health and dashboard intervals, per-client
limits) are in its front end, ``kvemu.router_cmd``, with ``RouterSettings``'s defaults."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from kvemu.options.limits import RADIX_BLOCK_TOKENS
from kvemu.options.option import Option
from replica.core.tiers.levels import LevelSettings, level_hit_costs
from replica.core.tiers.shared import SharedSettings
from replica.core.tiers.stack import TierSettings
from router.strategies import DEFAULT_STRATEGY, SPECS, RoutingSettings
from shared.errors import InputError
from shared.overrides import apply_overrides, parse_pairs
from shared.validate import check_probability

ROUTING = Option("--routing", DEFAULT_STRATEGY,
                 help=f"routing strategy: {', '.join(SPECS)} (default {DEFAULT_STRATEGY})")
SET = Option("--set", (), metavar="NAME=VALUE", repeat=True,
             help="routing setting, e.g. bounded_load_factor=1.25, balance_abs_threshold=64, ssd_hit_cost=0.3 (a memory"
                  " level's by its name: host_hit_cost, ssd_hit_cost; once per setting)")
ROUTING_OPTIONS = (ROUTING, SET)
def live_levels(shared: bool) -> tuple[LevelSettings, ...]:
    """The levels below HBM a live replica's stack configures (``TierSettings.levels()``: host DRAM, SSD, and the
    shared store last where there is one), as the router prices them: the list ``kvemu sim`` passes for the
    same cluster (its capacities do not matter to routing)."""
    return TierSettings(shared=SharedSettings(blocks=1) if shared else None).levels()


def routing_settings(block_size: int, pairs: Iterable[str] | None,
                     levels: Sequence[LevelSettings] | None = None, mode: str = "blocks") -> RoutingSettings:
    """``--set`` (router, up) or ``--routing-set`` (sim, sweep) pairs onto the strategies' settings, for
    prompts hashed in ``block_size`` tokens. Each memory level's hit cost starts at its kind's in the
    level registry (``replica.core.tiers.levels``), for ``levels`` (default: the ones the tier flags
    make, host DRAM then SSD; the router does not know which its replicas have), by index: the
    strategies know levels only by index. ``<level name>_hit_cost=C`` sets one level's
    (``host_hit_cost``, ``ssd_hit_cost``, the names they had as fields), ``deeper_hit_costs=C3,C4,...``
    those below SSD, ``level_hit_costs=C1,C2,...`` the whole list. Under radix (``mode``),
    ``in_flight_weight`` counts blocks of ``RADIX_BLOCK_TOKENS`` tokens, as ``--capacity-blocks`` does."""
    levels = TierSettings().levels() if levels is None else tuple(levels)
    by_name = {f"{level.kind}_hit_cost": k for k, level in reversed(list(enumerate(levels)))}  # the first of a kind
    given = parse_pairs(pairs)
    named = {name: given.pop(name) for name in list(given) if name in by_name or name == "deeper_hit_costs"}
    load_block = RADIX_BLOCK_TOKENS if mode == "radix" else 0
    settings = apply_overrides(RoutingSettings(block_size=block_size, level_hit_costs=level_hit_costs(levels),
                                               load_block_size=load_block), given)
    costs = list(settings.level_hit_costs)
    for name, raw in named.items():
        at, values = (2, raw.split(",")) if name == "deeper_hit_costs" else (by_name[name], [raw])
        for k, text in enumerate(values, at):
            try:
                cost = float(text)
            except ValueError:
                raise InputError(name, f"expected a fraction of a recompute from 0 to 1, got {text!r}") from None
            check_probability(name, cost)
            costs += [1.0] * (k + 1 - len(costs))  # a level not listed costs as a miss
            costs[k] = cost
    return replace(settings, level_hit_costs=tuple(costs))
