"""``kvemu calibrate``: time a model's layer stack on this device and fit the cost model to it.

Builds the stack in torch (replica/backends/torchstack.py: random weights, the model's exact
shapes, ``--layers K`` of them), measures the device's matrix-product rate and memory
bandwidth, times prefill over a grid of (new tokens, cached depth) and decode steps over
(batch, context per sequence) (CUDA graphs where they capture), and on a GPU the host<->device
copies of KV blocks (pinned; one whole copy and one copy per block, scattered). It fits the
cost model's efficiencies (shared/costfit.py), prints each point's fit error, and writes a
device profile that ``--gpu FILE`` / ``--gpu-file FILE`` loads in sim, sweep, replica and up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import asdict, replace

from shared.costfit import DecodePoint, PrefillPoint, errors, fit
from shared.costmodel import CostModel, GpuSpec, get_model
from shared.devprofile import DeviceProfile, load_profile, save_profile
from shared.errors import InputError
from shared.progress import ProgressBar
from shared.validate import check_positive_int

INSTALL = "torch is not installed: pip install 'kvemu[torch]' (CPU or CUDA build from pytorch.org)"
GRIDS = {  # (new tokens, cached depths, batches, contexts per sequence)
    "cpu": ("64,128,256", "0,256,1024", "1,4,16", "128,512"),
    "cuda": ("512,1024,4096,8192", "0,16384,65536", "1,8,32,128", "1024,8192"),
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda", help="cuda (a GPU, default), cuda:N, or cpu")
    p.add_argument("--model", default=None, help="model preset (default: llama-3-8b on a GPU, tiny on the CPU)")
    p.add_argument("--layers", type=int, default=None, help="run this many of the model's layers (default: all); "
                                                              "the fit is per layer, so it holds for the whole model")
    p.add_argument("--new-tokens", default=None, metavar="N1,N2,...", help="prefill grid: new tokens")
    p.add_argument("--cached-depths", default=None, metavar="C1,C2,...", help="prefill grid: cached prefix tokens")
    p.add_argument("--batches", default=None, metavar="B1,B2,...", help="decode grid: sequences per step")
    p.add_argument("--contexts", default=None, metavar="T1,T2,...", help="decode grid: context tokens per sequence")
    p.add_argument("--block-size", type=int, default=16, help="KV block size for the host link copies")
    p.add_argument("--repeats", type=int, default=3, help="timings per point, at least (the minimum counts)")
    p.add_argument("--min-time", type=float, default=None, metavar="SECONDS",
                   help="keep timing a point until this long was spent, up to 100 calls (default: 0.05 on the CPU, 0 on a GPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads torch may use (default: torch's own choice)")
    p.add_argument("--rounds", type=int, default=None,
                   help="passes over the whole grid, each point's minimum kept (default: 5 on the CPU, 1 on a GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="FILE.json", help="device profile (default: profile-DEVICE-MODEL.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _ints(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(field, f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise InputError(field, f"expected integers >= 0, got {text!r}")
    return values


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError("--device", INSTALL) from None
    return torch


def run(args) -> int:
    torch = _torch()
    from replica.backends import calibration as cal

    kind = "cpu" if args.device == "cpu" else "cuda"
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", f"{args.device}: no CUDA device here (use --device cpu)")
    if args.threads is not None:
        torch.set_num_threads(check_positive_int("--threads", args.threads))
    spec = get_model(args.model or ("tiny" if kind == "cpu" else "llama-3-8b"))
    layers = check_positive_int("--layers", args.layers if args.layers is not None else spec.layers)
    grid_p, grid_d = _grids(args, kind)
    min_time = args.min_time if args.min_time is not None else (0.05 if kind == "cpu" else 0.0)
    if not 0 <= min_time < float("inf"):
        raise InputError("--min-time", f"must be a number of seconds >= 0, got {min_time}")
    bench = cal.Calibrator(spec, args.device, layers, args.seed, args.repeats, min_time)
    total = 2 + len(grid_p) + len(grid_d) + (1 if kind == "cuda" else 0)
    bar = ProgressBar(f"calibrate {spec.name} x{layers} layers on {bench.device_name}", total, "point",
                      enabled=not args.quiet)
    gpu = GpuSpec(bench.device_name, bench.matmul_rate(), bench.memory_bandwidth(), bench.memory_bytes(), 450e9)
    bar.update(2)
    secs = _time_grid(bench, [bench.prefill_fn(n, c) for n, c in grid_p] + [bench.decode_fn(b, t) for b, t in grid_d],
                      args.rounds or (5 if kind == "cpu" else 1), bar, args.seed)
    prefill = [PrefillPoint(n, c, s) for (n, c), s in zip(grid_p, secs)]
    decode = [DecodePoint(b, b * t, s) for (b, t), s in zip(grid_d, secs[len(grid_p):])]
    link = bench.host_link(args.block_size) if kind == "cuda" else {}
    if link:
        gpu = with_host_link(gpu, link)
    bar.update_to(total)
    cost = CostModel(replace(spec, layers=layers), gpu)
    source = f"kvemu calibrate on {bench.device_name}, {layers} of {spec.layers} layers, torch {torch.__version__}"
    eff = fit(cost, prefill, decode, source)
    fitted = cost.with_efficiency(eff)
    fit_errors = {"prefill": errors([fitted.prefill_time(p.new_tokens, p.cached_depth) for p in prefill],
                                    [p.seconds for p in prefill]),
                  "decode": errors([fitted.decode_step_time(p.batch, p.kv_tokens) for p in decode],
                                   [p.seconds for p in decode])}
    _print_table(fitted, prefill, decode, fit_errors)
    out = args.out or f"profile-{kind}-{spec.name}.json"
    extra = {"device": bench.device_name, "torch": torch.__version__, "method": cal.METHOD,
             "calibrated": {spec.name: {"layers_run": layers, "dtype": str(bench.stack.dtype)}},
             "host_link": link, "points": {spec.name: {"prefill": [asdict(p) for p in prefill],
                                                       "decode": [asdict(p) for p in decode]}},
             "fit_errors": {spec.name: fit_errors}}
    save_profile(_merged(out, DeviceProfile(gpu, {spec.name: eff}, extra)), out)
    print(f"wrote {out}: use it as --gpu-file {out} (with --model {spec.name})")
    return 0


def _grids(args, kind: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(new tokens, cached depth) and (batch, context per sequence) points to time."""
    if args.rounds is not None:
        check_positive_int("--rounds", args.rounds)
    for name in ("block_size", "repeats"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    grid = GRIDS[kind]
    new_tokens = [n for n in _ints(args.new_tokens or grid[0], "--new-tokens") if n > 0]
    depths = _ints(args.cached_depths or grid[1], "--cached-depths")
    batches = [b for b in _ints(args.batches or grid[2], "--batches") if b > 0]
    contexts = _ints(args.contexts or grid[3], "--contexts")
    return [(n, c) for n in new_tokens for c in depths], [(b, t) for b in batches for t in contexts]


def _merged(path: str, new: DeviceProfile) -> DeviceProfile:
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


def with_host_link(gpu: GpuSpec, link: dict) -> GpuSpec:
    """The link's two coefficients: bandwidth from the whole copy, the cost of a copy call
    from how much longer the same bytes took in one call per block."""
    total = link["blocks"] * link["block_bytes"]
    whole_s = total / (link["h2d_whole_GBps"] * 1e9)
    scattered_s = total / (link["h2d_scattered_GBps"] * 1e9)
    return replace(gpu, host_bandwidth=link["h2d_whole_GBps"] * 1e9,
                   host_copy_overhead_s=max(scattered_s - whole_s, 0.0) / link["blocks"])


def _time_grid(bench, calls: list, rounds: int, bar: ProgressBar, seed: int = 0) -> list[float]:
    """Each call's minimum time over ``rounds`` passes over the whole grid, each pass in its own
    shuffled order: on a shared machine every point then sees the same spread of conditions,
    and a load burst or a drift during a pass does not land on the same corner of the grid."""
    best = [float("inf")] * len(calls)
    order = list(range(len(calls)))
    shuffle = random.Random(seed).shuffle
    for r in range(rounds):
        shuffle(order)
        for i in order:
            best[i] = min(best[i], bench.time(calls[i]))
            if r == rounds - 1:
                bar.update()
    return best


def _print_table(cost: CostModel, prefill: list[PrefillPoint], decode: list[DecodePoint], fit: dict) -> None:
    out = sys.stdout
    out.write(f"{'prefill new':>12} {'cached':>8} {'measured_ms':>12} {'model_ms':>10} {'error':>8}\n")
    for p, e in zip(prefill, fit["prefill"]["per_point"]):
        model = cost.prefill_time(p.new_tokens, p.cached_depth)
        out.write(f"{p.new_tokens:>12} {p.cached_depth:>8} {p.seconds * 1e3:>12.3f} {model * 1e3:>10.3f} {e:>+8.1%}\n")
    out.write(f"{'decode batch':>12} {'kv_tok':>8} {'measured_ms':>12} {'model_ms':>10} {'error':>8}\n")
    for d, e in zip(decode, fit["decode"]["per_point"]):
        model = cost.decode_step_time(d.batch, d.kv_tokens)
        out.write(f"{d.batch:>12} {d.kv_tokens:>8} {d.seconds * 1e3:>12.3f} {model * 1e3:>10.3f} {e:>+8.1%}\n")
    e = cost.efficiency
    out.write(json.dumps({"fit_errors": {k: {"mean_abs": v["mean_abs"], "max_abs": v["max_abs"]} for k, v in fit.items()},
                          "efficiency": {"linear": round(e.linear, 4), "attention": round(e.attention, 4),
                                         "kv_read": round(e.kv_read, 4), "memory": round(e.memory, 4),
                                         "overhead_s": e.overhead_s, "decode_overhead_s": e.decode_overhead_s,
                                         "decode_seq_s": e.decode_seq_s, "decode_kv": e.decode_kv,
                                         "decode_linear": e.decode_linear}}) + "\n")
