"""The shipped presets' prefill and decode model against this device's measurements of the same shapes.

Runs `kvemu calibrate` for each model (a subset of layers for the big ones) into one profile,
then prints JSON: per model, each measured prefill point and decode step with the shipped
preset's time for the layers run (its own efficiencies on the preset GPU's rates) and the
fresh fit's, and both errors (predicted / measured - 1). On an H200 this is the check of
docs/calibration.md's table; on other GPUs pass the closest preset with --gpu.

    .venv/bin/python bench/presets_vs_device.py --device cuda --gpu h200 --out h200-presets.json
    .venv/bin/python bench/presets_vs_device.py --device cpu --models tiny --gpu h200   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import replace

from kvemu.cli import main as kvemu
from shared.costfit import errors
from shared.costmodel import CostModel, get_model
from shared.devprofile import load_profile

LAYERS = {"llama-3-8b": 32, "qwen3-8b": 36, "llama-3-70b": 8, "qwen3-coder-30b-a3b": 12}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpu", default="h200", help="the preset the shipped numbers are priced on")
    p.add_argument("--models", default=",".join(LAYERS))
    p.add_argument("--out", default="presets-profile.json")
    args = p.parse_args()
    report = {}
    for name in args.models.split(","):
        layers = LAYERS.get(name, get_model(name).layers)
        with contextlib.redirect_stdout(sys.stderr):  # its table to stderr: stdout is the JSON
            status = kvemu(["calibrate", "--device", args.device, "--model", name, "--layers", str(layers),
                            "--out", args.out, "--quiet"])
        if status != 0:
            raise SystemExit(f"calibrate failed for {name}")
        profile = load_profile(args.out)
        points = profile.extra["points"][name]["prefill"]
        spec = replace(get_model(name), layers=layers)
        preset = CostModel.from_names(name, args.gpu)
        preset = replace(preset, model=spec)
        fitted = CostModel(spec, profile.gpu, profile.models[name])
        measured = [pt["seconds"] for pt in points]
        shapes = [(pt["new_tokens"], pt["cached_depth"]) for pt in points]
        steps = profile.extra["points"][name]["decode"]
        step_shapes = [(pt["batch"], pt["kv_tokens"]) for pt in steps]
        step_measured = [pt["seconds"] for pt in steps]
        report[name] = {
            "layers_run": layers,
            "points": [{"new_tokens": n, "cached_depth": c, "measured_s": m,
                        "preset_s": round(preset.prefill_time(n, c), 6), "fit_s": round(fitted.prefill_time(n, c), 6)}
                       for (n, c), m in zip(shapes, measured)],
            "preset_error": errors([preset.prefill_time(n, c) for n, c in shapes], measured),
            "fit_error": errors([fitted.prefill_time(n, c) for n, c in shapes], measured),
            "decode_points": [{"batch": b, "kv_tokens": kv, "measured_s": m,
                               "preset_s": round(preset.decode_step_time(b, kv), 6),
                               "fit_s": round(fitted.decode_step_time(b, kv), 6)}
                              for (b, kv), m in zip(step_shapes, step_measured)],
            "decode_preset_error": errors([preset.decode_step_time(b, kv) for b, kv in step_shapes], step_measured),
            "decode_fit_error": errors([fitted.decode_step_time(b, kv) for b, kv in step_shapes], step_measured),
        }
    print(json.dumps({"device": profile.extra.get("device"), "preset_gpu": args.gpu, "models": report}, indent=1))


if __name__ == "__main__":
    main()
