"""``kvemu calibrate``: time a model's layer stack on this device and fit the cost model to it.

Builds the stack in torch (replica/backends/torchstack.py: random weights, the model's exact
shapes, ``--layers K`` of them), measures the device's matrix-product rate and memory
bandwidth, times prefill over a grid of (new tokens, cached depth), decode steps over
(batch, context per sequence) (CUDA graphs where they capture) and mixed steps (prefill chunks
and decoders in one packed forward, ``--mixed``), and on a GPU the host<->device
copies of KV blocks (pinned; one whole copy and one copy per block, scattered). It fits the
step form of the cost model (one forward per step) to all of them (shared/costfit.py), prints each point's fit error, and writes a
device profile that ``--gpu FILE`` / ``--gpu-file FILE`` loads in sim, sweep, replica and up.

``--from-profile DIR`` fits the same form to an operator profile someone published instead
(LLMServingSim's or Vidur's; no torch, no device): each of its steps priced as that simulator
sums its operators, the kinds weighed as a serving run exercises them (``--kind-weights``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from dataclasses import asdict, replace

from kvemu.options.gpu import add_gpu_args
from shared.costfit import DecodePoint, PrefillPoint, StepPoint, errors, fit
from shared.costmodel import CostModel, GpuSpec, get_model
from shared.devprofile import DeviceProfile, merged_profile, save_profile
from shared.errors import InputError
from shared.progress import ProgressBar
from shared.validate import check_positive_int

INSTALL = "torch is not installed: pip install 'kvemu[torch]' (CPU or CUDA build from pytorch.org)"
GRIDS = {  # (new tokens, cached depths, batches, contexts per sequence, mixed steps)
    "cpu": ("64,128,256", "0,256,1024", "1,4,16", "128,512", "4x64@0;2x128@256+4d@256;1x64@0+8d@512"),
    "cuda": ("512,1024,4096,8192", "0,16384,65536", "1,8,32,128", "1024,8192",
             "16x64@0;4x256@0;1x512@0+64d@1024;1x512@0+64d@8192;2x1024@8192+32d@4096"),
}
DEFAULT_WEIGHTS = "prefill=0.05,decode=0.75,mixed=0.20"
MIXED_HELP = ("mixed steps, one forward each, separated by ';': each a '+' of KxN@C (K prefill chunks of N new "
              "tokens after C cached) and Bd@T (B decoders of T context tokens each)")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-profile", default=None, metavar="DIR",
                   help="fit to a published operator profile instead of timing this device: LLMServingSim's "
                        "perf/<hw>/<org>/<model>/<dtype>/ folder, or Vidur's (bench/data/vidur); needs no torch")
    add_gpu_args(p)
    p.set_defaults(gpu=None)  # --from-profile: the GPU the profile was measured on (by default, its own name)
    p.add_argument("--kind-weights", default=DEFAULT_WEIGHTS, metavar="prefill=W,decode=W,mixed=W",
                   help=f"--from-profile: each kind's share of the fit (default {DEFAULT_WEIGHTS}: a serving run's "
                        "share of GPU time in steps of that kind; docs/calibration.md)")
    p.add_argument("--device", default="cuda", help="cuda (a GPU, default), cuda:N, or cpu")
    p.add_argument("--model", default=None, help="model preset (default: llama-3-8b on a GPU, tiny on the CPU)")
    p.add_argument("--layers", type=int, default=None, help="run this many of the model's layers (default: all); "
                                                              "the fit is per layer, so it holds for the whole model")
    p.add_argument("--new-tokens", default=None, metavar="N1,N2,...", help="prefill grid: new tokens")
    p.add_argument("--cached-depths", default=None, metavar="C1,C2,...", help="prefill grid: cached prefix tokens")
    p.add_argument("--batches", default=None, metavar="B1,B2,...", help="decode grid: sequences per step")
    p.add_argument("--contexts", default=None, metavar="T1,T2,...", help="decode grid: context tokens per sequence")
    p.add_argument("--mixed", default=None, metavar="STEPS", help=MIXED_HELP + "; '' for none")
    p.add_argument("--block-size", type=int, default=16, help="KV block size for the host link copies")
    p.add_argument("--repeats", type=int, default=3, help="timings per point, at least (the minimum counts)")
    p.add_argument("--min-time", type=float, default=None, metavar="SECONDS",
                   help="keep timing a point until this long was spent, up to 100 calls (default: 0.05 on the CPU, 0 on a GPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads torch may use (default: torch's own choice)")
    p.add_argument("--rounds", type=int, default=None,
                   help="passes over the whole grid, each point's minimum kept (default: 5 on the CPU, 1 on a GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", default=None, metavar="FILE.json",
                   help="device profile (default: profile-DEVICE-MODEL.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _ints(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(field, f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise InputError(field, f"expected integers >= 0, got {text!r}")
    return values


def parse_mixed(text: str) -> list[tuple[tuple[tuple[int, int], ...], tuple[int, ...]]]:
    """``"16x64@0;1x512@0+64d@1024"`` -> [(16 chunks of (64, 0), no decoders), ((512, 0), 64 x 1024)]."""
    steps = []
    for step in (s.strip() for s in text.split(";")):
        if not step:
            continue
        chunks: list[tuple[int, int]] = []
        contexts: list[int] = []
        for part in step.split("+"):
            count, sep, rest = part.strip().partition("x")
            if not sep:
                count, sep, rest = part.strip().partition("d")
            size, at, depth = rest.partition("@")
            try:
                k, n, c = int(count), int(size or 0), int(depth)
            except ValueError:
                raise InputError("--mixed", f"{part!r} is neither KxN@C nor Bd@T ({MIXED_HELP})") from None
            if not at or k < 1 or c < 0 or (sep == "x" and n < 1) or (sep == "d" and size):
                raise InputError("--mixed", f"{part!r}: counts must be >= 1, depths >= 0 ({MIXED_HELP})")
            if sep == "x":
                chunks += [(n, c)] * k
            else:
                contexts += [c] * k
        steps.append((tuple(chunks), tuple(contexts)))
    return steps


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError("--device", INSTALL) from None
    return torch


def run(args) -> int:
    if args.from_profile is not None:
        from kvemu.calibrate_profile import run_from_profile

        return run_from_profile(args)
    if args.gpu is not None or args.tp != 1:
        raise InputError("--gpu" if args.gpu is not None else "--tp",
                         "only with --from-profile: without it calibrate measures this device's own rates")
    return _run_on_device(args)


def _run_on_device(args) -> int:
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
    grid_m = parse_mixed(GRIDS[kind][4] if args.mixed is None else args.mixed)
    min_time = args.min_time if args.min_time is not None else (0.05 if kind == "cpu" else 0.0)
    if not 0 <= min_time < float("inf"):
        raise InputError("--min-time", f"must be a number of seconds >= 0, got {min_time}")
    bench = cal.Calibrator(spec, args.device, layers, args.seed, args.repeats, min_time)
    total = 2 + len(grid_p) + len(grid_d) + len(grid_m) + (1 if kind == "cuda" else 0)
    bar = ProgressBar(f"calibrate {spec.name} x{layers} layers on {bench.device_name}", total, "point",
                      enabled=not args.quiet)
    gpu = GpuSpec(bench.device_name, bench.matmul_rate(), bench.memory_bandwidth(), bench.memory_bytes(), 450e9)
    bar.update(2)
    calls = ([bench.prefill_fn(n, c) for n, c in grid_p] + [bench.decode_fn(b, t) for b, t in grid_d]
             + [bench.step_fn(list(c), list(d)) for c, d in grid_m])
    secs = _time_grid(bench, calls, args.rounds or (5 if kind == "cpu" else 1), bar, args.seed)
    prefill = [PrefillPoint(n, c, s) for (n, c), s in zip(grid_p, secs)]
    decode = [DecodePoint(b, b * t, s) for (b, t), s in zip(grid_d, secs[len(grid_p):])]
    mixed = [StepPoint(c, d, s) for (c, d), s in zip(grid_m, secs[len(grid_p) + len(grid_d):])]
    link = bench.host_link(args.block_size) if kind == "cuda" else {}
    if link:
        gpu = with_host_link(gpu, link)
    bar.update_to(total)
    # the decode steps replay a CUDA graph where one captures (dense models on a GPU): steps up
    # to the largest such batch pay a graph's fixed cost, the rest (prefills, mixed) run eagerly
    graphed = max((b for b, _ in grid_d), default=0) if kind == "cuda" and not spec.moe else 0
    prior = CostModel(spec, gpu).efficiency
    cost = CostModel(replace(spec, layers=layers), gpu, replace(prior, graph_tokens=graphed))
    source = f"kvemu calibrate on {bench.device_name}, {layers} of {spec.layers} layers, torch {torch.__version__}"
    eff = fit(cost, [*prefill, *decode, *mixed], source)
    fitted = cost.with_efficiency(eff)
    fit_errors = {"prefill": errors([fitted.prefill_time(p.new_tokens, p.cached_depth) for p in prefill],
                                    [p.seconds for p in prefill]),
                  "decode": errors([fitted.decode_step_time(p.batch, p.kv_tokens) for p in decode],
                                   [p.seconds for p in decode]),
                  "mixed": errors([fitted.step_time(p.work) for p in mixed], [p.seconds for p in mixed])}
    _print_table(fitted, prefill, decode, mixed, fit_errors)
    out = args.out or f"profile-{kind}-{spec.name}.json"
    extra = {"device": bench.device_name, "torch": torch.__version__, "method": cal.METHOD,
             "calibrated": {spec.name: {"layers_run": layers, "dtype": str(bench.stack.dtype)}},
             "host_link": link, "points": {spec.name: {"prefill": [asdict(p) for p in prefill],
                                                       "decode": [asdict(p) for p in decode],
                                                       "mixed": [asdict(p) for p in mixed]}},
             "fit_errors": {spec.name: fit_errors}}
    save_profile(merged_profile(out, DeviceProfile(gpu, {spec.name: eff}, extra)), out)
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


def _print_table(cost: CostModel, prefill: list[PrefillPoint], decode: list[DecodePoint], mixed: list[StepPoint],
                 fit: dict) -> None:
    out = sys.stdout
    out.write(f"{'prefill new':>12} {'cached':>8} {'measured_ms':>12} {'model_ms':>10} {'error':>8}\n")
    for p, e in zip(prefill, fit["prefill"]["per_point"]):
        model = cost.prefill_time(p.new_tokens, p.cached_depth)
        out.write(f"{p.new_tokens:>12} {p.cached_depth:>8} {p.seconds * 1e3:>12.3f} {model * 1e3:>10.3f} {e:>+8.1%}\n")
    out.write(f"{'decode batch':>12} {'kv_tok':>8} {'measured_ms':>12} {'model_ms':>10} {'error':>8}\n")
    for d, e in zip(decode, fit["decode"]["per_point"]):
        model = cost.decode_step_time(d.batch, d.kv_tokens)
        out.write(f"{d.batch:>12} {d.kv_tokens:>8} {d.seconds * 1e3:>12.3f} {model * 1e3:>10.3f} {e:>+8.1%}\n")
    if mixed:
        out.write(f"{'mixed step':>40} {'measured_ms':>12} {'model_ms':>10} {'error':>8}\n")
    for m, e in zip(mixed, fit["mixed"]["per_point"]):
        out.write(f"{describe_step(m):>40} {m.seconds * 1e3:>12.3f} {cost.step_time(m.work) * 1e3:>10.3f} {e:>+8.1%}\n")
    e = cost.efficiency
    out.write(json.dumps({"fit_errors": {k: {"mean_abs": v["mean_abs"], "max_abs": v["max_abs"]} for k, v in fit.items()},
                          "efficiency": {"linear": round(e.linear, 4), "attention": round(e.attention, 4),
                                         "kv_read": round(e.kv_read, 4), "memory": round(e.memory, 4),
                                         "overhead_s": e.overhead_s, "decode_overhead_s": e.decode_overhead_s,
                                         "decode_seq_s": e.decode_seq_s, "decode_kv": e.decode_kv,
                                         "decode_linear": e.decode_linear, "graph_tokens": e.graph_tokens}}) + "\n")


def describe_step(p: StepPoint) -> str:
    """A step in ``--mixed`` syntax: runs of equal chunks and of equal decoders."""
    parts = [f"{len(list(g))}x{n}@{c}" for (n, c), g in itertools.groupby(p.chunks)]
    parts += [f"{len(list(g))}d@{t}" for t, g in itertools.groupby(p.contexts)]
    return "+".join(parts)
