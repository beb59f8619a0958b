"""Synthetic workloads: sessions -> requests carrying chained block hashes.

    trace = generate("mix", duration_s=3600, seed=1, overrides={"agent_frac": "0.5", ...})

Presets (``PRESETS``) are frozen dataclasses of parameters; ``--set name=value`` overrides any
of them (``mix`` nests its profiles: ``multi.turns_mean=8``).  Sessions start as a Poisson
process in [0, duration); later turns may run past it.  Turn j+1 arrives a think-time gap after
turn j arrived (service time is ignored).  Turn j's prompt is everything earlier in the
session (system prompt, prompts, responses) plus its new prompt; only full blocks are hashed,
and block k of a session hashes the same in every turn that contains it.  See
``loadgen/presets/common.py`` for the hashing rules and each preset module for its model.

A trace depends only on (workload, parameters, seed, duration); ``numpy.random.default_rng``
drives every draw.  ``block_size`` only changes hashing, never the token-level workload.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from loadgen.presets.build import build_requests
from loadgen.presets.common import Progress
from loadgen.presets.freeinference import FreeInferencePreset
from loadgen.presets.interactive import AgentPreset, ChatPreset, MixPreset, SinglePreset
from loadgen.presets.scm import ScmPreset
from loadgen.trace import Trace
from shared.errors import InputError, UnknownNameError
from shared.overrides import apply_overrides

PRESETS: dict[str, type] = {
    "chat": ChatPreset,
    "agent": AgentPreset,
    "single": SinglePreset,
    "mix": MixPreset,
    "freeinference": FreeInferencePreset,
    "scm": ScmPreset,
}


def _groups(params) -> list[str]:
    """Fields that hold a nested profile (set as ``group.name``)."""
    return [f.name for f in dataclasses.fields(params) if dataclasses.is_dataclass(getattr(params, f.name))]


def parameters(params) -> dict[str, object]:
    """Flat ``name -> value`` of a preset instance, nested profiles as ``group.name``."""
    out: dict[str, object] = {}
    groups = _groups(params)
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if f.name in groups:
            out.update({f"{f.name}.{k}": v for k, v in parameters(value).items()})
        else:
            out[f.name] = value
    return out


def get_preset(name: str, overrides: Mapping[str, str] | None = None):
    """The parameters of preset ``name`` with string ``overrides`` applied and validated."""
    cls = PRESETS.get(name)
    if cls is None:
        raise UnknownNameError("workload", name, list(PRESETS), " (`kvemu gen --list` shows their parameters)")
    params = cls()
    valid = parameters(params)
    groups = _groups(params)
    flat: dict[str, str] = {}
    nested: dict[str, dict[str, str]] = {}
    for key, value in (overrides or {}).items():
        if key not in valid:
            hint = f"; set {key}.NAME=VALUE" if key in groups else ""
            raise InputError(key, f"unknown parameter of workload {name!r}{hint}; valid: {', '.join(valid)}")
        group, dot, sub = key.partition(".")
        if dot:
            nested.setdefault(group, {})[sub] = value
        else:
            flat[key] = value
    changes = {}
    for group, sub_overrides in nested.items():
        try:
            changes[group] = apply_overrides(getattr(params, group), sub_overrides)
        except InputError as exc:
            raise InputError(f"{group}.{exc.field}", exc.message) from None
    return dataclasses.replace(apply_overrides(params, flat), **changes)


def preset_name(params) -> str:
    for name, cls in PRESETS.items():
        if type(params) is cls:
            return name
    raise InputError("workload", f"not a registered preset: {type(params).__name__}")


def generate(name: str, duration_s: float, seed: int = 0, overrides: Mapping[str, str] | None = None,
             *, progress: Progress | None = None) -> Trace:
    """Generate ``duration_s`` seconds of session arrivals of preset ``name``."""
    return generate_from(get_preset(name, overrides), duration_s, seed, progress=progress)


def generate_from(params, duration_s: float, seed: int = 0, *, progress: Progress | None = None) -> Trace:
    """Like :func:`generate` for an already-built preset instance."""
    name = preset_name(params)
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) \
            or not math.isfinite(duration_s) or duration_s <= 0:
        raise InputError("duration", f"must be a positive number of seconds, got {duration_s!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError("seed", f"must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    batch = params.plan(rng, float(duration_s))
    # the seed is part of every content id, so traces from different seeds never share blocks
    requests = build_requests(batch, params.block_size, f"{name}:{int(seed)}", progress)
    meta = {
        "workload": name,
        "seed": int(seed),
        "duration_s": float(duration_s),
        "sessions": int(len(batch.turns)),
        "params": dataclasses.asdict(params),
    }
    return Trace(requests=requests, block_size=params.block_size, source=name, meta=meta)


def describe_presets() -> str:
    """Every preset with a one-line description and its parameters with defaults."""
    lines = []
    for name, cls in PRESETS.items():
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        lines.append(f"{name}: {doc}")
        for key, value in parameters(cls()).items():
            shown = f"{value:.6g}" if isinstance(value, float) else value
            lines.append(f"    {key}={shown}")
    return "\n".join(lines)
