"""Sweep engine: a grid of virtual-time runs in worker processes, appended to a JSONL file.

Every grid point is one ``simulate()`` call on a ``sim.cells`` runner: the local process pool,
or a Dask cluster (``--dask``). Either way the trace reaches each worker once, never with each
point. The parent is the only writer: it appends one JSON line per finished point to the
results file and flushes it, so a killed sweep loses only the points that were running.

A point's id is a hash of the trace's identity (a digest of the file's bytes, its format and
block size; or the preset, its resolved parameters, duration and seed) and every field of its
``SimSettings``. Resuming skips ids already in the file; a torn last line (the process was
killed mid-write) is ignored and recomputed.

Records are the ``simulate()`` run dict plus ``id``, ``kind`` (``grid``, or ``mrc`` for the
extra LRU run with reuse distances that the capacity plot's miss-ratio curve comes from),
``trace`` and ``settings``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from loadgen.formats import resolve_trace
from loadgen.trace import Trace
from shared.errors import KvemuError
from shared.progress import ProgressBar
from sim.cells import CellError, Runner, RunnerLost
from sim.simulator import SimSettings

GRID, MRC = "grid", "mrc"

CSV_COLUMNS = ("id", "trace", "policy", "capacity_blocks", "capacity_gib", "routing", "replicas", "hit_mode",
               "max_running", "block_hit_ratio", "token_hit_ratio", "csr", "holes_mean", "ttft_p50_s",
               "ttft_p99_s", "load_imbalance", "saturated", "requests", "served", "refused", "evictions", "wall_s")


@dataclass(frozen=True)
class Point:
    id: str
    kind: str
    settings: SimSettings

    def describe(self) -> str:
        s = self.settings
        extra = " +reuse" if self.kind == MRC else ""
        # a P/D cluster by its pools (its colocated replicas, s.replicas, are often none)
        where = f"{s.pd.prefill}P:{s.pd.decode}D" + (f"+{s.replicas}" if s.replicas else "") if s.pd else f"x{s.replicas}"
        return f"{s.knobs.policy} @ {s.capacity_blocks:,} blocks, {s.routing} {where}{extra}"


# ---------------------------------------------------------------- identities


def file_identity(path: str, fmt: str, block_size: int) -> dict:
    """What makes a trace file the same trace: its bytes, how they are read, the block size."""
    h = xxhash.xxh3_128()
    with open(resolve_trace(path), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return {"digest": h.hexdigest(), "format": fmt, "block_size": block_size}


def workload_identity(trace: Trace, duration_s: float) -> dict:
    """A generated trace is fixed by its preset's resolved parameters, duration and seed."""
    meta = trace.meta
    params = {k: v for k, v in meta.get("params", {}).items() if LATER_PARAMS.get(k, ...) != v}
    return {"workload": meta.get("workload", trace.source), "params": params,
            "duration_s": float(duration_s), "seed": meta.get("seed"), "block_size": trace.block_size}


# Preset parameters added after sweeps were first written, left out at their default (scm's block of
# the model, which was block_size until block_size became the hashing unit alone).
LATER_PARAMS = {"block_tokens": 16}
# Settings added after sweeps were first written: left out of a point's identity at their
# default, so results written before them keep their ids and `--resume` still finds them.
LATER_DEFAULTS = {"scheduler": "fcfs", "prefix_caching": "on", "max_model_len": None, "pd": None,
                  "data_parallel_size": 1, "expert_parallel": False, "arrivals": "dependent",
                  "speculative": None}
# The same within nested settings: memory levels below SSD, and their routing hit costs.
LATER_NESTED_DEFAULTS = {("tiers", "deeper"): (), ("tiers", "shared"): None, ("routing_settings", "deeper_hit_costs"): (),
                         ("routing_settings", "load_block_size"): 0}


def settings_dict(s: SimSettings) -> dict:
    """What a point's id hashes and its record shows: every field of ``s``, the knobs' as if they were its own (as
    they were before they were one record: ids written then still match). A knob added later goes in LATER_DEFAULTS."""
    out = dataclasses.asdict(s)
    out.update(out.pop("knobs"))
    routing = out.get("routing_settings")
    if isinstance(routing, dict) and "level_hit_costs" in routing:  # as they were named before the list
        costs = tuple(routing.pop("level_hit_costs")) + (1.0, 1.0)  # was generic: ids of old points hold
        routing.update(host_hit_cost=costs[0], ssd_hit_cost=costs[1], deeper_hit_costs=costs[2:-2])
    for name, default in LATER_DEFAULTS.items():
        if out.get(name) == default:
            del out[name]
    for (outer, field), unset in LATER_NESTED_DEFAULTS.items():
        inner = out.get(outer)
        if isinstance(inner, dict) and inner.get(field) == unset:
            del inner[field]
    return out


def point_id(identity: dict, s: SimSettings) -> str:
    blob = json.dumps({"trace": identity, "settings": settings_dict(s)}, sort_keys=True, default=str,
                      separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_point(identity: dict, s: SimSettings, kind: str = GRID) -> Point:
    return Point(point_id(identity, s), kind, s)


def mrc_sources(identity: dict, grid: list[Point]) -> list[Point]:
    """Per (routing, replicas), the LRU run with reuse distances at the largest capacity.

    That is the grid's own LRU point when it already tracks reuse distances
    (``--reuse-distances``), else an extra point of kind ``mrc``.
    """
    by_id = {p.id: p for p in grid}
    top = max(p.settings.capacity_blocks for p in grid)
    out = []
    for combo in combinations(grid):
        base = next(p.settings for p in grid if (p.settings.routing, p.settings.replicas) == combo)
        knobs = dataclasses.replace(base.knobs, policy="lru", policy_params=())
        s = dataclasses.replace(base, knobs=knobs, capacity_blocks=top, reuse="exact")
        point = make_point(identity, s, MRC)
        out.append(by_id.get(point.id, point))
    return out


def combinations(points: list[Point]) -> list[tuple[str, int]]:
    """(routing, replicas) pairs in first-seen order."""
    return list(dict.fromkeys((p.settings.routing, p.settings.replicas) for p in points))


# ---------------------------------------------------------------- the results file


def read_records(path: str) -> tuple[dict[str, dict], int]:
    """Records by id (the last line wins) and the number of unreadable lines skipped."""
    records: dict[str, dict] = {}
    bad = 0
    if not os.path.exists(path):
        return records, bad
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                records[rec["id"]] = rec
            else:
                bad += 1
    return records, bad


def _open_for_append(path: str):
    """Append mode; a torn last line (killed mid-write) is ended first so new lines stay whole."""
    needs_newline = False
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as tail:
            tail.seek(-1, os.SEEK_END)
            needs_newline = tail.read(1) != b"\n"
    fh = open(path, "a")
    if needs_newline:
        fh.write("\n")
    return fh


def make_record(point: Point, trace_info: dict, run: dict) -> dict:
    return {"id": point.id, "kind": point.kind, "trace": trace_info, "settings": settings_dict(point.settings), **run}


def csv_row(rec: dict) -> dict:
    row = {k: rec.get(k) for k in CSV_COLUMNS}
    trace = rec.get("trace")
    row["trace"] = trace.get("source") if isinstance(trace, dict) else trace
    row["holes_mean"] = rec.get("holes", {}).get("mean_per_request")
    row["max_running"] = rec.get("settings", {}).get("max_running", rec.get("max_running"))
    return row


def sort_key(rec: dict):
    return (rec["routing"], rec["replicas"], rec["policy"], rec["capacity_blocks"])


def write_csv(records, path: str) -> int:
    """The main scalar columns of every grid record, one row each; returns the row count."""
    return write_rows(sorted((r for r in records if r.get("kind") == GRID), key=sort_key), path, CSV_COLUMNS)


def write_rows(records: list[dict], path: str, columns=CSV_COLUMNS) -> int:
    """``csv_row`` of each record (a sweep record or a ``simulate()`` run) under ``columns``."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for rec in records:
            w.writerow(csv_row(rec))
    return len(records)


# ---------------------------------------------------------------- running


class Progress:
    """``sweep`` progress over points (ETA), with one line per finished point above the bar."""

    def __init__(self, total: int, quiet: bool = False, out=None) -> None:
        self.bar = ProgressBar("sweep", total, "point", enabled=not quiet, out=out, log_every_s=0.0)

    @property
    def done(self) -> int:
        return self.bar.done

    def __call__(self, point: Point, rec: dict) -> None:
        self.bar.note(f"  {point.describe()}: block hit (HBM) {rec['block_hit_ratio']:.4f}, {rec['wall_s']:.1f} s")
        self.bar.update()


def run_points(trace: Trace, trace_info: dict, points: list[Point], out_path: str, runner: Runner,
               on_done: Callable[[Point, dict], None] | None = None) -> list[dict]:
    """Run ``points`` on ``runner``, appending each record to ``out_path`` as it finishes."""
    if not points:
        return []
    records = []
    with _open_for_append(out_path) as fh:
        def finished(index: int, run: dict) -> None:
            rec = make_record(points[index], trace_info, run)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            records.append(rec)
            if on_done:
                on_done(points[index], rec)

        try:
            runner.run(trace, [p.settings for p in points], finished)
        except CellError as exc:
            point = points[exc.index]
            raise KvemuError(f"point {point.id} ({point.describe()}) failed: {exc.error!r}; "
                             "finished points are saved, rerun with --resume") from exc
        except RunnerLost as exc:
            raise KvemuError(f"{exc}; finished points are saved, rerun with --resume") from exc
    return records


# ---------------------------------------------------------------- mean-field overlay


def mean_field(trace: Trace, workload: str | None, overrides: dict[str, str]):
    """``(fn(capacity_per_replica, replicas) -> hit ratio, label)`` from ``sim.estimate``, or None.

    ``scm``: the model with the sweep's ``--set`` parameters; any other source: primitives
    measured on the trace (None when the estimator cannot take it, e.g. no multi-turn session).
    R replicas of N blocks count as one cache of R·N: with sessions spread evenly each replica
    sees λ/R, and d(t) depends on λ/N only.
    """
    from shared.overrides import apply_overrides
    from sim import estimate as est

    try:
        if workload == "scm":
            work, label = apply_overrides(est.ScmModel(), overrides).workload(), "LRU estimate, mean-field (scm model)"
        else:
            work, label = est.workload_from_trace(trace), "LRU estimate, mean-field (from trace statistics)"
    except KvemuError:  # the estimator cannot take this source (e.g. no multi-turn session)
        return None
    return (lambda capacity, replicas: est.estimate(work, capacity * replicas).hit_ratio), label
