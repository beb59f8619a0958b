"""The step cost model against measured steps: one packed forward per step, timed on a device.

    python bench/bench_step_cost.py [--device cpu|cuda] [--model tiny] [--layers N] [--threads 1]
                                    [--rounds 5] [--out FILE.json]
    python bench/bench_step_cost.py --device cuda --decode-sweep [--batches 1,4,16,64] [--contexts 1024,8192]

Builds the model's layer stack in torch (replica/backends/torchstack.py, the torch backend's and
``kvemu calibrate``'s), times ``kvemu calibrate``'s grid for the device (prefill, decode and
mixed steps), fits the step form to it (shared/costfit.py), then times a separate set of step
shapes the fit never saw (``TEST_SHAPES``: 16 x 64, 4 x 256 and 1 x 1024 new tokens, decode
batches, mixed steps) and prints JSON: per shape the measured seconds, the model's (the fitted
step form), its error, and the old clock's (each prefill chunk priced as its own forward and the
decoders as another, with the same efficiencies) and its error. On a CPU (default: ``tiny``, one
thread, the thread's CPU time as the clock) this runs in about a minute; on a GPU (``--device
cuda``, default ``llama-3-8b``) it takes the issue's shapes at the model's exact layer shapes.
Every figure is measured in this run: nothing is read from a file.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.study_cli import emit  # noqa: E402
from kvemu.calibrate import GRIDS, describe_step, parse_mixed  # noqa: E402
from shared.costfit import StepPoint, errors, fit  # noqa: E402
from shared.costmodel import CostModel, GpuSpec, StepWork, get_gpu, get_model  # noqa: E402
from shared.progress import ProgressBar  # noqa: E402

TEST_SHAPES = {  # --mixed syntax: held out of the fit
    "cpu": "16x64@0;4x256@0;1x1024@0;1d@512;8d@512;32d@256;32d@1024;1x64@0+16d@512;1x256@512+32d@256;4x64@1024+8d@1024",
    "cuda": ("16x64@0;4x256@0;1x1024@0;1d@1024;32d@1024;256d@1024;1d@32768;32d@32768;64d@8192;"
             "1x512@0+64d@1024;1x512@0+64d@8192;16x64@2048+32d@2048"),
}


def grid(kind: str) -> list[StepPoint]:
    """``kvemu calibrate``'s default grid for the device, as step shapes (seconds to be timed)."""
    new, depths, batches, contexts, mixed = GRIDS[kind]
    shapes = [(((int(n), int(c)),), ()) for n in new.split(",") for c in depths.split(",")]
    shapes += [((), (int(t),) * int(b)) for b in batches.split(",") for t in contexts.split(",")]
    return [StepPoint(c, d, 0.0) for c, d in shapes + parse_mixed(mixed)]


def time_steps(bench, steps: list[StepPoint], rounds: int, bar: ProgressBar) -> list[StepPoint]:
    """Each step's minimum over ``rounds`` passes, each pass in its own shuffled order."""
    calls = [bench.step_fn(list(s.chunks), list(s.contexts)) for s in steps]
    best = [float("inf")] * len(steps)
    order = list(range(len(steps)))
    for _ in range(rounds):
        random.Random(len(best)).shuffle(order)
        for i in order:
            best[i] = min(best[i], bench.time(calls[i]))
            bar.update()
    return [replace(s, seconds=t) for s, t in zip(steps, best)]


def old_clock(cost: CostModel, work: StepPoint) -> float:
    """What the scheduler charged before one forward per step: a forward per chunk, one for decode."""
    return (sum(cost.prefill_time(n, c) for n, c in work.chunks)
            + cost.decode_step_time(len(work.contexts), sum(work.contexts)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--decode-sweep", action="store_true",
                   help="time only the decode sweep (bench/decode_sweep.py) and write it in the calibration file's format")
    p.add_argument("--batches", default="1,4,16,64", help="decode sweep: batch sizes")
    p.add_argument("--contexts", default=None, help="decode sweep: context tokens a sequence (default 1024,8192; CPU 128,512)")
    args = p.parse_args(argv)
    import torch

    from replica.backends.calibration import Calibrator

    kind = "cpu" if args.device == "cpu" else "cuda"
    if kind == "cpu":
        torch.set_num_threads(args.threads)
    spec = get_model(args.model or ("tiny" if kind == "cpu" else "llama-3-8b"))
    layers = args.layers or spec.layers
    rounds = args.rounds or (5 if kind == "cpu" else 2)
    bench = Calibrator(spec, args.device, layers, repeats=3, min_time_s=0.02 if kind == "cpu" else 0.0)
    if args.decode_sweep:
        return decode_sweep_main(bench, spec, layers, kind, args)
    fit_grid, test = grid(kind), [StepPoint(c, d, 0.0) for c, d in parse_mixed(TEST_SHAPES[kind])]
    bar = ProgressBar(f"step cost {spec.name} x{layers} on {bench.device_name}", (len(fit_grid) + len(test)) * rounds,
                      "step", enabled=sys.stderr.isatty())
    t0 = time.perf_counter()
    gpu = GpuSpec(bench.device_name, bench.matmul_rate(), bench.memory_bandwidth(), bench.memory_bytes())
    measured_fit = time_steps(bench, fit_grid, rounds, bar)
    measured = time_steps(bench, test, rounds, bar)
    bar.close()
    # the packed forward runs eagerly (no CUDA graph): every step pays the eager fixed cost
    base = CostModel(replace(spec, layers=layers), gpu)
    cost = base.with_efficiency(replace(base.efficiency, graph_tokens=0))
    fitted = cost.with_efficiency(fit(cost, measured_fit, f"bench_step_cost on {bench.device_name}"))
    rows = []
    for s in measured:
        model, old = fitted.step_time(s.work), old_clock(fitted, s)
        rows.append({"step": describe_step(s), "tokens": s.work.tokens, "measured_s": round(s.seconds, 7),
                     "model_s": round(model, 7), "error": round(model / s.seconds - 1, 4),
                     "old_clock_s": round(old, 7), "old_clock_error": round(old / s.seconds - 1, 4)})
    e = fitted.efficiency
    by_step = {r["step"]: r for r in rows}
    out = {
        "device": bench.device_name, "torch": torch.__version__, "model": spec.name, "layers": layers,
        "rounds": rounds, "wall_s": round(time.perf_counter() - t0, 1),
        "fit": {"points": len(measured_fit), "in_sample": errors([fitted.step_time(s.work) for s in measured_fit],
                                                                 [s.seconds for s in measured_fit])},
        "efficiency": {k: getattr(e, k) for k in ("linear", "attention", "kv_read", "memory", "decode_kv", "decode_linear",
                                                  "overhead_s", "decode_overhead_s", "decode_seq_s")},
        "steps": rows,
        "held_out": {"model": errors([r["model_s"] for r in rows], [r["measured_s"] for r in rows]),
                     "old_clock": errors([r["old_clock_s"] for r in rows], [r["measured_s"] for r in rows])},
        "ratio_16x64_to_1x1024": {k: round(by_step["16x64@0"][k] / by_step["1x1024@0"][k], 3)
                                  for k in ("measured_s", "model_s", "old_clock_s")},
        "h200_preset_llama_3_8b": preset_ratios(),
    }
    emit(out, args.out)
    return 0


def decode_sweep_main(bench, spec, layers: int, kind: str, args) -> int:
    """The decode sweep alone, as a calibration file (docs/calibration/h200-llama-3-8b.json's format)."""
    import torch
    from decode_sweep import METHOD_NOTE, compare, sweep  # a sibling, as `python bench/bench_step_cost.py` runs

    from replica.backends.calibration import METHOD

    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in (args.contexts or ("128,512" if kind == "cpu" else "1024,8192")).split(",")]
    t0 = time.perf_counter()
    result = sweep(bench, batches, contexts)
    # the shipped preset of this GPU where there is one (H200, H100, A100), else the measured rates
    named = [g for g in ("h200", "h100", "a100") if g in bench.device_name.lower()]
    gpu = get_gpu(named[0]) if named else GpuSpec(bench.device_name, bench.matmul_rate(), bench.memory_bandwidth(),
                                                  bench.memory_bytes())
    at_layers = CostModel(replace(spec, layers=layers), gpu)
    out = {"device": bench.device_name, "torch": torch.__version__, "method": f"{METHOD}; {METHOD_NOTE}",
           "model": spec.name, "layers": layers, "memory_bandwidth_Bps": round(bench.memory_bandwidth()),
           "preset_gpu": {k: getattr(gpu, k) for k in ("name", "peak_flops", "hbm_bandwidth", "memory_bytes")},
           **result, "preset_vs_decode": compare(at_layers, result), "wall_s": round(time.perf_counter() - t0, 1)}
    emit(out, args.out)
    return 0


def preset_ratios() -> dict:
    """The shipped H200 preset (no measurement): 16 x 64 against 1 x 1024, and a chunk beside 32 decoders."""
    cm = CostModel.from_names("llama-3-8b", "h200")
    one, burst = cm.prefill_time(1024), cm.step_time(StepWork.of([(64, 0)] * 16))
    decode = cm.decode_step_time(32, 32 * 1024)
    mixed = cm.step_time(StepWork.of([(64, 0)], 32, 32 * 1024))
    return {"16x64_over_1x1024": round(burst / one, 3), "old_clock_16x64_over_1x1024": round(16 * cm.prefill_time(64) / one, 3),
            "32_decoders_plus_64_chunk_over_32_decoders": round(mixed / decode, 4)}


if __name__ == "__main__":
    sys.exit(main())
