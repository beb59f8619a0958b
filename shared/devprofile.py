"""Device profiles: what ``kvemu calibrate`` measured and fitted, as one JSON file.

``--gpu FILE.json`` (or ``--gpu-file FILE``) loads one wherever a GPU preset is named (sim,
sweep, estimate, replica, up): the device's peak rates, and per model the fitted
efficiencies (a model the profile has none for keeps its preset's). The file also keeps the
measured points and the fit errors, so it documents itself::

    {"kvemu_profile": 1, "device": "...", "gpu": {"name", "peak_flops", "hbm_bandwidth",
     "memory_bytes", "link_bandwidth"}, "models": {NAME: {Efficiency fields}},
     "host_link": {...}, "points": {NAME: {...}}, "fit_errors": {NAME: {...}}}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache

from shared.devspecs import Efficiency, GpuSpec
from shared.errors import InputError

FORMAT = 1
FIELD = "--gpu-file"


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    gpu: GpuSpec
    models: dict[str, Efficiency]
    extra: dict = field(default_factory=dict)  # device, host_link, points, fit_errors, ...

    def efficiency_for(self, model: str) -> Efficiency | None:
        return self.models.get(model)

    def to_json(self) -> dict:
        return {"kvemu_profile": FORMAT, **self.extra, "gpu": asdict(self.gpu),
                "models": {name: asdict(e) for name, e in self.models.items()}}


def is_profile_path(spec: str) -> bool:
    return spec.endswith(".json") or os.sep in spec


def save_profile(profile: DeviceProfile, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(profile.to_json(), fh, indent=1)
        fh.write("\n")


def load_profile(path: str) -> DeviceProfile:
    try:
        stat = os.stat(path)
    except OSError:
        raise InputError(FIELD, f"no device profile {path}") from None
    return _load(os.path.abspath(path), stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _load(path: str, _mtime: int) -> DeviceProfile:
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(FIELD, f"{path} is not a readable JSON device profile: {exc}") from None
    if not isinstance(raw, dict) or raw.get("kvemu_profile") != FORMAT:
        raise InputError(FIELD, f"{path} is not a kvemu device profile (kvemu_profile: {FORMAT} missing)")
    gpu = _build(GpuSpec, raw.get("gpu"), f"{path}: gpu")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict):
        raise InputError(FIELD, f"{path}: models must be an object of model name -> efficiencies")
    models = {str(k): _build(Efficiency, v, f"{path}: models.{k}") for k, v in models_raw.items()}
    extra = {k: v for k, v in raw.items() if k not in ("kvemu_profile", "gpu", "models")}
    return DeviceProfile(gpu, models, extra)


def _build(cls, raw, where: str):
    if not isinstance(raw, dict):
        raise InputError(FIELD, f"{where} must be an object")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise InputError(FIELD, f"{where}: unknown field {unknown[0]!r}")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise InputError(FIELD, f"{where}: {exc}") from None


def merged_profile(path: str, new: DeviceProfile) -> DeviceProfile:
    """A profile already at ``path`` for the same device keeps its other models: one file can
    hold every model calibrated on a GPU (the device's rates are the latest run's)."""
    if not os.path.exists(path):
        return new
    old = load_profile(path)
    if old.extra.get("device") != new.extra.get("device"):
        return new
    extra = dict(new.extra)
    for key in ("calibrated", "points", "fit_errors"):
        extra[key] = {**old.extra.get(key, {}), **new.extra.get(key, {})}
    return DeviceProfile(new.gpu, {**old.models, **new.models}, extra)
