"""kvemu against real vLLM runs, end to end: each run's workload replayed in `kvemu sim` with the run's
engine settings, and `kvemu compare`'s figures of the prediction against what the engine served.

The RTX 4090 run (bench/data/llmservingsim: vLLM 0.19.0, Llama-3.1-8B, 300 ShareGPT requests with their
token ids, MIT, from LLMServingSim) is predicted four ways: the GPU from its datasheet (`--gpu rtx-4090`)
or from LLMServingSim's operator profile of that GPU (`kvemu calibrate --from-profile`, fitted to the
profile alone, never to the run), each with the KV blocks vLLM reported for the run (2,588) and with
kvemu's own memory rule (`--gpu-memory-utilization`, as the run set it). The engine's settings (max_num_seqs,
max_num_batched_tokens, max_model_len, block size, prefix caching) come from the run's meta.json.
The DistServe runs (bench/data/distserve: vLLM 0.2.3, OPT-13B on one A100-80GB, 1 and 4 requests/s,
Apache-2.0) are predicted from the A100's datasheet with kvemu's default engine rules (and with
`--distserve-flags`, e.g. another version's rules, beside them).

Every step runs the `kvemu` commands a user would type (printed in the JSON as `command`), in a
temporary folder, the simulations in parallel. stdout: one JSON object (`figures`, side by side per
configuration: measured, predicted, relative error; `per_request_median_abs_error`; `done_when`);
stderr: progress with its ETA.

    .venv/bin/python bench/bench_e2e.py > e2e.json
    .venv/bin/python bench/bench_e2e.py --runs rtx4090 --keep out/e2e   # keep each run's files
"""

import argparse
import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shared.progress import ProgressBar

DATA = Path(__file__).resolve().parent / "data"
LSS = DATA / "llmservingsim"
RUN = LSS / "RTX4090" / "Llama-3.1-8B"
WORKLOAD = LSS / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"
PROFILE = LSS / "perf" / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16"
DISTSERVE = DATA / "distserve"
DISTSERVE_RATES = ("100-1", "400-4")  # vllm-N-R: N requests at R requests/s
MODEL = "llama-3.1-8b"
# kvemu compare's figures this bench reports (seconds; the throughputs per second)
FIGURES = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p90_s",
           "tpot_p99_s", "e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "itl_mean_s", "makespan_s",
           "throughput_rps", "output_tokens_per_s")
# The bar for the shipped run, calibrated from its operator profile: |mean error| and median |error|
DONE_WHEN = {"e2e_mean_s": 0.03, "tpot_mean_s": 0.03, "ttft_mean_s": 0.06, "per_request_median_abs_e2e": 0.05}
DONE_WHEN_CONFIG = "rtx4090/profile/vllm_blocks"


@dataclass(frozen=True, slots=True)
class Engine:
    """The run's engine settings, from its meta.json: what `kvemu sim` is told of the engine."""
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    gpu_memory_utilization: float
    prefix_caching: bool
    num_gpu_blocks: int  # what vLLM reported it could hold
    vllm_version: str

    def sim_flags(self) -> list[str]:
        return ["--max-running", str(self.max_num_seqs), "--token-budget", str(self.max_num_batched_tokens),
                "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size),
                "--prefix-caching", "on" if self.prefix_caching else "off",
                "--hit-mode", "prefix", "--policy", "lru"]  # vLLM reuses a prompt's leading cached blocks, LRU


@dataclass(frozen=True, slots=True)
class Config:
    """One prediction: a workload, the `kvemu sim` flags, and the measured run it is compared with."""
    key: str  # run/device/blocks
    label: str
    workload: str
    flags: tuple[str, ...]
    measured: str
    setup: str = ""  # the command that made the workload a kvemu trace, where one did


def engine_of(meta_path: Path) -> Engine:
    meta = json.loads(meta_path.read_text())
    kwargs, cache = meta["engine_kwargs"], meta["kv_cache"]
    return Engine(kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"], kwargs["max_model_len"],
                  cache["block_size"], cache["gpu_memory_utilization"], cache["enable_prefix_caching"],
                  cache["num_gpu_blocks"], meta["vllm_version"])


def check_workload(meta_path: Path, workload: Path) -> None:
    """The shipped workload is the run's: its uncompressed bytes hash to the run's dataset_hash."""
    want = json.loads(meta_path.read_text())["dataset_hash"]
    with gzip.open(workload, "rb") as fh:
        got = hashlib.sha256(fh.read()).hexdigest()
    if got != want:
        raise SystemExit(f"error: {workload}: sha256 {got} is not the run's dataset_hash {want}")


def kvemu(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvemu", *args]


def shown(argv: list[str]) -> str:
    """The command as a user types it: `kvemu ...`, paths relative to the checkout where they are in it."""
    root = str(DATA.parent.parent) + os.sep
    words = ["kvemu", *argv[3:]] if argv[1:3] == ["-m", "kvemu"] else ["python", *argv[1:]]
    return shlex.join(w.replace(root, "") for w in words)


def call(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {shown(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def calibrate(out: Path) -> dict:
    argv = kvemu("calibrate", "--from-profile", str(PROFILE), "--gpu", "rtx-4090", "--model", MODEL,
                 "--tp", "1", "-o", str(out), "--quiet")
    call(argv)
    profile = json.loads(out.read_text())
    return {"command": shown(argv), "profile": str(PROFILE.relative_to(DATA.parent.parent)),
            "fit_errors": profile["fit_errors"][MODEL], "kind_weights": profile["calibrated"][MODEL]["kind_weights"]}


def rtx4090_configs(engine: Engine, profile: Path) -> list[Config]:
    devices = {"datasheet": (("--gpu", "rtx-4090"), "the RTX 4090's datasheet (--gpu rtx-4090)"),
               "profile": (("--gpu-file", str(profile)), "LLMServingSim's operator profile (kvemu calibrate --from-profile)")}
    blocks = {"vllm_blocks": (("--capacity-blocks", str(engine.num_gpu_blocks)),
                              f"vLLM's reported count ({engine.num_gpu_blocks:,} blocks)"),
              "memory_rule": (("--gpu-memory-utilization", str(engine.gpu_memory_utilization)),
                              f"kvemu's memory rule (--gpu-memory-utilization {engine.gpu_memory_utilization})")}
    return [Config(f"rtx4090/{d}/{b}", f"{dl}; {bl}", str(WORKLOAD),
                   ("--model", MODEL, *dflags, *bflags, *engine.sim_flags()), str(RUN / "requests.jsonl"))
            for d, (dflags, dl) in devices.items() for b, (bflags, bl) in blocks.items()]


def distserve_configs(tmp: Path, extra: str) -> list[Config]:
    """DistServe's workloads as kvemu traces (bench/distserve_trace.py), datasheet A100, kvemu's defaults."""
    try:  # bench/'s sibling, imported only when these runs are asked for
        from distserve_trace import read_workload
    except ImportError as exc:
        raise SystemExit(f"error: the DistServe runs need bench/distserve_trace.py ({exc}); or give --runs rtx4090") from None

    from loadgen.formats import write_kvemu

    variants: dict[str, tuple[tuple[str, ...], str]] = {
        "default": ((), "the A100's datasheet (--gpu a100-80gb), kvemu's default engine rules")}
    if extra:
        variants["flags"] = (tuple(shlex.split(extra)), f"the same with {extra}")
    configs = []
    for rate in DISTSERVE_RATES:
        trace, workload = tmp / f"distserve-{rate}.jsonl", DISTSERVE / "workload" / f"vllm-{rate}.exp"
        write_kvemu(read_workload(str(workload)), str(trace))
        setup = shown([sys.executable, str(DATA.parent / "distserve_trace.py"), str(workload), "-o", str(trace)])
        for name, (flags, label) in variants.items():
            configs.append(Config(f"distserve-{rate}/{name}", label, str(trace),
                                  ("--model", "opt-13b", "--gpu", "a100-80gb", "--gpu-memory-utilization", "0.9",
                                   "--policy", "lru", *flags), str(DISTSERVE / "measured" / f"vllm-{rate}.exp"), setup))
    return configs


def predict(config: Config, tmp: Path) -> dict:
    """`kvemu sim` on the workload, then `kvemu compare` against the measured run."""
    stem = tmp / config.key.replace("/", "-")
    pred, sim_json, cmp_json = (Path(f"{stem}{suffix}") for suffix in (".jsonl", ".sim.json", ".compare.json"))
    sim = kvemu("sim", "--trace", config.workload, *config.flags, "--requests-out", str(pred),
                "--json", str(sim_json), "--quiet")
    call(sim)
    cmp = kvemu("compare", config.measured, str(pred), "--json", str(cmp_json))
    call(cmp)
    run = json.loads(sim_json.read_text())["runs"][0]
    comparison = json.loads(cmp_json.read_text())
    commands = [c for c in (config.setup, shown(sim), shown(cmp)) if c]
    return {"label": config.label, "commands": commands,
            "kv_blocks": run["capacity_blocks"], "preemptions": run["preemptions"],
            "figures": {k: comparison["figures"][k] for k in FIGURES},
            "per_request_abs_rel_error": comparison["per_request_abs_rel_error"]}


def llmservingsim_errors(summary: Path) -> dict[str, float]:
    """LLMServingSim's own prediction of the run (its summary's Diff% column), as fractions."""
    names = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}
    stats = {"Mean": "mean", "Median": "p50", "P90": "p90", "P95": "p95", "P99": "p99"}
    out = {}
    for line in summary.read_text().splitlines():
        words = line.split()
        if len(words) == 5 and words[0] in names and words[1] in stats and words[4].endswith("%"):
            out[f"{names[words[0]]}_{stats[words[1]]}"] = float(words[4][:-1]) / 100
    return out


def done_when(result: dict) -> dict:
    """The issue's bar on the shipped run from its operator profile, figure by figure."""
    figures, per_request = result["figures"], result["per_request_abs_rel_error"]
    got = {k: figures[k]["rel_error"] for k in DONE_WHEN if k in figures}
    got["per_request_median_abs_e2e"] = per_request["e2e"]["median"]
    met = {k: abs(v) <= DONE_WHEN[k] for k, v in got.items()}
    return {"configuration": DONE_WHEN_CONFIG, "bars": DONE_WHEN, "errors": got, "met": met, "all_met": all(met.values())}


def side_by_side(results: dict[str, dict], run: str) -> dict:
    """Per figure: the measured value once, then each configuration's prediction and relative error."""
    mine = {k: v for k, v in results.items() if k.startswith(run + "/")}
    if not mine:
        return {}
    first = next(iter(mine.values()))
    table = {f: {"measured": first["figures"][f]["measured"],
                 **{k.split("/", 1)[1]: {"predicted": v["figures"][f]["predicted"], "rel_error": v["figures"][f]["rel_error"]}
                    for k, v in mine.items()}} for f in FIGURES}
    table["per_request_median_abs_e2e"] = {k.split("/", 1)[1]: v["per_request_abs_rel_error"]["e2e"]["median"]
                                           for k, v in mine.items()}
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="rtx4090,distserve", help="comma-separated: rtx4090, distserve (default both)")
    p.add_argument("--distserve-flags", default="", help="more `kvemu sim` flags for a second prediction of the "
                   "DistServe runs, e.g. '--vllm-version 0.2.3'")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="simulations at once")
    p.add_argument("--keep", metavar="DIR", help="write every command's files here instead of a temporary folder")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or set(runs) - {"rtx4090", "distserve"}:
        p.error(f"--runs: give rtx4090, distserve or both, got {args.runs!r}")
    if args.jobs < 1:
        p.error(f"--jobs: must be >= 1, got {args.jobs}")
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run_all(runs, args, tmp), indent=1))
    return 0


def run_all(runs: list[str], args, tmp: Path) -> dict:
    out: dict = {"runs": {}}
    configs: list[Config] = []
    steps = ("rtx4090" in runs) + 4 * ("rtx4090" in runs) + \
        len(DISTSERVE_RATES) * (1 + bool(args.distserve_flags)) * ("distserve" in runs)
    bar = ProgressBar("bench_e2e", steps, "step", enabled=not args.quiet, log_every_s=2.0)
    if "rtx4090" in runs:
        engine = engine_of(RUN / "meta.json")
        check_workload(RUN / "meta.json", WORKLOAD)
        bar.set_postfix("calibrating from the operator profile")
        out["calibration"] = calibrate(tmp / "rtx4090-profile.json")
        bar.update()
        configs += rtx4090_configs(engine, tmp / "rtx4090-profile.json")
        out["runs"]["rtx4090"] = {"measured": str(RUN.relative_to(DATA.parent.parent) / "requests.jsonl"),
                                  "workload": str(WORKLOAD.relative_to(DATA.parent.parent)),
                                  "engine": {k: getattr(engine, k) for k in Engine.__slots__},
                                  "llmservingsim_rel_error": llmservingsim_errors(RUN / "llmservingsim-summary.txt")}
    if "distserve" in runs:
        configs += distserve_configs(tmp, args.distserve_flags)
        for rate in DISTSERVE_RATES:
            out["runs"][f"distserve-{rate}"] = {
                "measured": str((DISTSERVE / "measured" / f"vllm-{rate}.exp").relative_to(DATA.parent.parent)),
                "workload": str((DISTSERVE / "workload" / f"vllm-{rate}.exp").relative_to(DATA.parent.parent))}
    bar.set_postfix("simulating")
    with ThreadPoolExecutor(args.jobs) as pool:  # each job is its own `kvemu sim` process
        futures = {c.key: pool.submit(predict, c, tmp) for c in configs}
        results = {}
        for key, fut in futures.items():
            results[key] = fut.result()
            bar.update()
    bar.close()
    out["configurations"] = results
    out["figures"] = {run: side_by_side(results, run) for run in out["runs"]}
    if DONE_WHEN_CONFIG in results:
        out["done_when"] = done_when(results[DONE_WHEN_CONFIG])
    return out


if __name__ == "__main__":
    sys.exit(main())
