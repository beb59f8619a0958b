"""The figure of a ``kvemu sweep`` (matplotlib, Agg, imported only when a plot is asked for).

Panels: (a) block hit ratio against per-replica capacity, one line per policy, one panel per
(routing, replicas) combination (only the first one when there are more than ``MAX_PANELS``),
with the LRU miss-ratio curve, the mean-field estimate (one replica, or a routing that keeps
conversations on one replica) and the infinite-cache bound overlaid;
(b) CSR against capacity, same panels; (c) requests and block hit ratio per replica for one
point (the largest-capacity LRU run with the most replicas).

The miss-ratio curve of a multi-replica run is the access-weighted mean of the replicas' own
curves, ``H(c) = Σ a_i·h_i(c) / Σ a_i`` (``a_i`` the accesses replica i tracked): each replica
is an LRU of ``c`` blocks over the requests routed to it. It is exact for one replica serving
one request at a time in ``holes`` mode; otherwise it assumes the routing and the batching of
the run it comes from (the largest capacity) would stay the same at every capacity.
"""

from __future__ import annotations

import numpy as np

from router.strategies import SPECS
from shared.plotting import pyplot

MAX_PANELS = 4
# routings that keep a conversation on one replica, so R replicas of N blocks act like one
# cache of R·N for the mean-field estimate; with the others a next turn lands anywhere
AFFINE = tuple(name for name, spec in SPECS.items() if spec.keeps_sessions)


def require_matplotlib() -> None:
    pyplot()


def combined_mrc(rec: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(capacities, hit ratios) of the access-weighted mean of the replicas' MRCs, or None."""
    curves = [(p["reuse"]["accesses"], p["reuse"]["mrc"]) for p in rec.get("per_replica", ())
              if p.get("reuse") and p["reuse"].get("mrc")]
    total = sum(a for a, _ in curves)
    if not total:
        return None
    xs = np.array(sorted({c for _, m in curves for c, _ in m if c >= 1}), dtype=np.float64)
    ys = np.zeros_like(xs)
    for accesses, mrc in curves:
        cs = np.array([c for c, _ in mrc], dtype=np.float64)
        hs = np.array([h for _, h in mrc], dtype=np.float64)
        keep = cs >= 1
        ys += accesses / total * np.interp(np.log(xs), np.log(cs[keep]), hs[keep])
    return xs, ys


def _by_combo(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        out.setdefault((r["routing"], r["replicas"]), []).append(r)
    return out


def _policy_lines(ax, recs: list[dict], key: str, colors: dict) -> None:
    by_policy: dict[str, list[dict]] = {}
    for r in recs:
        by_policy.setdefault(r["policy"], []).append(r)
    for policy in sorted(by_policy, key=list(colors).index):
        rs = sorted(by_policy[policy], key=lambda r: r["capacity_blocks"])
        ax.plot([r["capacity_blocks"] for r in rs], [r[key] for r in rs], marker="o", ms=4, color=colors[policy],
                label=policy)


def _overlays(ax, combo, caps, mrc_rec, mean_field, ceiling) -> None:
    lo, hi = min(caps), max(caps)
    if mrc_rec is not None and (curve := combined_mrc(mrc_rec)) is not None:
        xs, ys = curve
        inside = (xs > lo) & (xs < hi)
        grid = np.concatenate(([lo], xs[inside], [hi]))
        ax.plot(grid, np.interp(np.log(grid), np.log(xs), ys), "k--", lw=1.2, label="LRU MRC (reuse distances)")
    if mean_field is not None and (combo[1] == 1 or combo[0] in AFFINE):
        fn, label = mean_field
        grid = np.geomspace(lo, hi, 48) if hi > lo else np.array([lo])
        ax.plot(grid, [fn(float(c), combo[1]) for c in grid], ":", color="0.35", lw=1.8, label=label)
    if ceiling is not None:
        ax.axhline(ceiling, color="0.6", lw=0.8, label=f"infinite cache ({ceiling:.3f})")


def _style(ax, caps, ylabel: str, title: str) -> None:
    ax.set_xlabel("capacity per replica (blocks)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(caps) > 2 and max(caps) / min(caps) >= 4:
        ax.set_xscale("log")
        ax.minorticks_off()
    if len(caps) <= 10:  # more would overlap; matplotlib's own ticks then
        ax.set_xticks(caps, [_short(c) for c in caps])


def _short(n: int) -> str:
    """2000 -> 2K, 18279 -> 18.3K, 1500000 -> 1.5M."""
    for div, unit in ((1_000_000, "M"), (1_000, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def load_point(records: list[dict]) -> dict:
    """The largest-capacity LRU run (any policy if none is LRU) with the most replicas."""
    pool = [r for r in records if r["policy"] == "lru"] or records
    return max(pool, key=lambda r: (r["replicas"], r["capacity_blocks"], r["routing"] == "cache_aware"))


def _load_chart(ax, rec: dict) -> None:
    per = rec["per_replica"]
    names = [p.get("replica", str(i)).replace("replica-", "r") for i, p in enumerate(per)]
    ax.bar(names, [p["requests"] for p in per], color="tab:blue", alpha=0.75, label="requests")
    ax.set_ylabel("requests")
    ax2 = ax.twinx()
    ax2.plot(names, [p["block_hit_ratio"] for p in per], "o-", color="tab:orange", label="block hit ratio")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("block hit ratio")
    ax.set_title(f"per replica: {rec['policy']} @ {rec['capacity_blocks']:,} blocks, {rec['routing']} "
                 f"x{rec['replicas']} (imbalance {rec['load_imbalance']:.2f})", fontsize=10)
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower right")


def _axes(plt, ncombos: int):
    """(figure, hit-ratio axes, CSR axes, load axis, legend axis or None)."""
    if ncombos == 1:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        return fig, [axes[0]], [axes[1]], axes[2], None
    fig = plt.figure(figsize=(4.6 * ncombos, 10.5))
    gs = fig.add_gridspec(3, ncombos)
    hit = [fig.add_subplot(gs[0, i]) for i in range(ncombos)]
    csr = [fig.add_subplot(gs[1, i]) for i in range(ncombos)]
    legend = fig.add_subplot(gs[2, -1])
    legend.axis("off")
    return fig, hit, csr, fig.add_subplot(gs[2, :-1]), legend


def plot_sweep(records: list[dict], mrc_records: list[dict], path: str, mean_field=None,
               ceiling: float | None = None) -> None:
    """Write the sweep figure of grid ``records`` to ``path`` (see the module docstring)."""
    plt = pyplot()
    groups = _by_combo(records)
    combos = list(groups)
    shown = combos if len(combos) <= MAX_PANELS else combos[:1]
    mrc_by = {(r["routing"], r["replicas"]): r for r in mrc_records}
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {p: cycle[i % len(cycle)] for i, p in enumerate(dict.fromkeys(r["policy"] for r in records))}
    fig, hit_axes, csr_axes, load_ax, legend_ax = _axes(plt, len(shown))
    for combo, ax_h, ax_c in zip(shown, hit_axes, csr_axes):
        recs = groups[combo]
        caps = sorted({r["capacity_blocks"] for r in recs})
        _policy_lines(ax_h, recs, "block_hit_ratio", colors)
        _overlays(ax_h, combo, caps, mrc_by.get(combo), mean_field, ceiling)
        _style(ax_h, caps, "block hit ratio", f"block hit ratio, {combo[0]} x{combo[1]}")
        _policy_lines(ax_c, recs, "csr", colors)
        _style(ax_c, caps, "CSR", f"compute-savings ratio, {combo[0]} x{combo[1]}")
        ax_h.set_ylim(bottom=0)
        ax_c.set_ylim(bottom=0)
    if legend_ax is None:
        hit_axes[0].legend(fontsize=7, framealpha=0.8)
    else:
        legend_ax.legend(*hit_axes[0].get_legend_handles_labels(), loc="center", fontsize=9)
    _load_chart(load_ax, load_point(records))
    first = records[0]
    more = ""
    if len(shown) < len(combos):
        more = f"; {len(combos) - 1} more routing x replicas combination(s) in the results only"
    source = str(first.get("trace", {}).get("source", "")).rsplit("/", 1)[-1]
    fig.suptitle(f"{source}: {first['hit_mode']} hits, max_running {first['settings']['max_running']}, "
                 f"{first['model']} on {first['gpu']}{more}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90, pil_kwargs={"optimize": True})
    plt.close(fig)


def infinite_cache_hit_ratio(trace) -> float | None:
    """1 - distinct blocks / block accesses: no capacity, policy or replica count does better."""
    seen: set[int] = set()
    accesses = 0
    for r in trace.requests:
        seen.update(r.hash_ids)
        accesses += len(r.hash_ids)
    return 1.0 - len(seen) / accesses if accesses else None
