"""The models study (issue 54, item 5; docs/models.md): what a model's kind does to the KV a request holds, to the
cache's hit ratio and to decode speed.

  kv      per model preset (and deepseek-v3 with --kv-cache-dtype fp8): KV bytes a token (one copy over every
          attention layer; and on one GPU at --tp 1 and 8, where MLA's latent is whole on every rank) and the KV a
          request holds at 8K and 64K tokens, in whole blocks: a sliding-window group only the blocks its window
          still reads (replica/core/cache/groups.py's ``skipped_blocks``), a state group its latest state's page
  fp8     per (model, GPU): `kvemu sim` on the agent preset with --kv-cache-dtype auto vs fp8 at a few session
          rates, same trace and seed: the memory rule's blocks, token hit ratio, TTFT p50 / p99, TPOT p50
  spec    deepseek-v3 on 8 H200 with its MTP layer: K = 0..5 draft tokens x acceptance rate 0.5 / 0.7 / 0.9 at a
          light and a heavier load: TPOT p50 / p99 and the tokens a verification keeps; the K of least TPOT
  window  gpt-oss-120b (full and 128-token sliding-window layers) vs its full-attention twin (the same config.json,
          every layer full attention): KV a request holds, requests whose KV fits at once, and the agent preset's
          token hit ratio and TTFT in `kvemu sim` on one H100

Every simulated point is one `kvemu sim` command line, parsed and checked by its own parser (bench_agentic.py's
way); its figures are the sim JSON's.

    nice -n 19 .venv/bin/python bench/bench_models.py --jobs 2 --out docs/models-study.json --plots docs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.study_cli import add_study_flags, known_names, publish, show_saved  # noqa: E402
from kvemu import sim_cmd  # noqa: E402
from replica.core.cache.groups import skipped_blocks, state_blocks  # noqa: E402
from shared import model_kinds as kinds  # noqa: E402
from shared.costmodel import CostModel  # noqa: E402
from shared.gpu_presets import get_gpu  # noqa: E402
from shared.kv_groups import STATE, WINDOW  # noqa: E402
from shared.model_presets import MODELS, get_model  # noqa: E402
from shared.model_spec import ModelSpec  # noqa: E402
from shared.progress import ProgressBar  # noqa: E402
from sim.run import simulate  # noqa: E402

SECTIONS = ("kv", "fp8", "spec", "window")
BLOCK = 16
CONTEXTS = (8192, 65536)  # an 8K and a 64K-token conversation
GIB = 1024**3
CLUSTER = "--gpu-memory-utilization 0.9 --reuse off --quiet --jobs 1 --max-model-len 131072"
# (model, GPU, --tp, session rates): each model on the GPUs it is served on, at rates from light to past its BF16 pool
FP8_SETUPS = (("deepseek-v3", "h200", 8, (0.1, 0.2, 0.3)), ("qwen3-coder-30b-a3b", "h100", 1, (0.01, 0.02, 0.04)))
SPEC_SETUP = ("deepseek-v3", "h200", 8, "mtp", (0.1, 0.3))
SPEC_K = (0, 1, 2, 3, 4, 5)
SPEC_P = (0.5, 0.7, 0.9)
WINDOW_MODEL = "gpt-oss-120b"
WINDOW_SETUP = ("h100", 1, (0.01, 0.02, 0.04))
TWIN = "GPT_OSS_FULL/config.json"  # how a command names the twin's config.json, written to a temporary folder
CONFIGS = Path(__file__).resolve().parent / "data" / "models"
KEYS = ("served", "refused", "token_hit_ratio", "block_hit_ratio", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
        "tpot_p99_s", "preemptions", "mean_batch_size", "saturated", "capacity_blocks")


# ---------------------------------------------------------------- KV held per request


def held_blocks(m: ModelSpec, tokens: int, block_size: int) -> list[int]:
    """Blocks each KV cache group holds for a request of ``tokens`` computed tokens: every block of its tokens in
    a full-attention group, those its window still reads in a sliding-window group, the latest state's page in a
    state group (vLLM's managers between steps; replica/core/cache/groups.py)."""
    n = -(-tokens // block_size)
    out = []
    for g in m.kv_groups.groups:
        if g.kind == WINDOW:
            out.append(n - skipped_blocks(g.window, tokens, block_size))
        elif g.kind == STATE:
            out.append(len(state_blocks(tokens, tokens, block_size)))
        else:
            out.append(n)
    return out


def kv_row(name: str, gpu: str = "h200") -> dict:
    """One model's KV figures (bytes: one copy over the model's layers unless said per GPU)."""
    m = get_model(name)
    costs = {tp: CostModel(m, get_gpu(gpu), tp=tp) for tp in (1, 8)}
    bs = costs[1].kv_block_size(BLOCK)
    block_bytes = costs[1].block_bytes(bs)  # one group's page over the model's layers of that group, one copy
    groups = m.kv_groups
    # a token's KV were every layer full attention (state layers too): the model without its kinds
    every_layer = m.layers * kinds.kv_values(m) * kinds.kv_element_bytes(m.kv_cache_dtype, m.dtype_bytes)
    row: dict[str, Any] = {
        "model": m.name, "setting": name, "kv_cache_dtype": m.kv_cache_dtype, "mla": m.mla is not None,
        "groups": groups.describe(), "block_size": bs, "block_bytes": block_bytes,
        "bytes_a_token": m.kv_bytes_per_token,
        "bytes_a_token_per_gpu": {tp: c.kv_bytes_per_gpu_token for tp, c in costs.items()},
        "max_context": m.max_context, "requests": {}}
    for t in CONTEXTS:
        if m.max_context and t > m.max_context:
            row["requests"][t] = None  # past the model's window: vLLM refuses it
            continue
        held = held_blocks(m, t, bs)
        row["requests"][t] = {"blocks": sum(held), "blocks_by_group": held, "bytes": sum(held) * block_bytes,
                              "full_attention_bytes": -(-t // bs) * bs * every_layer}
    return row


def kv_table(names: list[str] | None = None) -> list[dict]:
    """Every preset but the tiny test shapes, deepseek-v3 with FP8 KV beside it."""
    names = names or [n for n in MODELS if not n.startswith("tiny")] + ["deepseek-v3@kv=fp8"]
    return [kv_row(n) for n in names]


CURVE_TOKENS = tuple(1024 * 2**i for i in range(8))  # 1K .. 128K


def kv_curve(name: str) -> dict[int, int]:
    """Bytes a request of each of ``CURVE_TOKENS`` tokens holds (one copy), up to the model's window."""
    m = get_model(name)
    cost = CostModel(m, get_gpu("h200"))
    bs = cost.kv_block_size(BLOCK)
    return {t: sum(held_blocks(m, t, bs)) * cost.block_bytes(bs) for t in CURVE_TOKENS
            if not m.max_context or t <= m.max_context}


def fits(blocks: int, row: dict, tokens: int) -> int | None:
    """Requests of ``tokens`` tokens whose KV fits in ``blocks`` blocks at once (None: past the window)."""
    r = row["requests"].get(tokens, row["requests"].get(str(tokens)))
    return None if r is None else blocks // r["blocks"]


# ---------------------------------------------------------------- simulated points


def agent_source(duration: float, rate: float, seed: int) -> str:
    return f"--workload agent --duration {duration:g} --set session_rate={rate:g} --seed {seed}"


def sim_argv(source: str, model: str, gpu: str, tp: int, extra: str = "") -> list[str]:
    return f"{source} {CLUSTER} --model {model} --gpu {gpu} --tp {tp} {extra}".split()


def points(a: argparse.Namespace, sections: list[str], twin: str | None) -> list[dict]:
    """Every `kvemu sim` point of the sections asked for (``twin``: the twin's config.json, when gpt-oss-120b
    can run)."""
    out: list[dict] = []
    src = lambda rate: agent_source(a.duration, rate, a.seed)  # noqa: E731
    if "fp8" in sections:
        for model, gpu, tp, rates in a.fp8_setups:
            out += [{"study": "fp8", "model": model, "gpu": gpu, "tp": tp, "rate": r, "kv": kv,
                     "argv": sim_argv(src(r), model, gpu, tp, f"--kv-cache-dtype {kv}")}
                    for r in rates for kv in ("auto", "fp8")]
    if "spec" in sections:
        model, gpu, tp, method, rates = a.spec_setup
        for r in rates:
            for k in SPEC_K:
                for p in (SPEC_P if k else (None,)):
                    spec = f"--speculative-method {method} --num-speculative-tokens {k} --acceptance-rate {p:g}" if k else ""
                    out.append({"study": "spec", "model": model, "gpu": gpu, "tp": tp, "rate": r, "k": k, "p": p,
                                "argv": sim_argv(src(r), model, gpu, tp, spec)})
    if "window" in sections and twin:
        gpu, tp, rates = a.window_setup
        for r in rates:
            for kind, model in (("hybrid", WINDOW_MODEL), ("full twin", twin)):
                out.append({"study": "window", "model": WINDOW_MODEL, "variant": kind, "gpu": gpu, "tp": tp,
                            "rate": r, "argv": sim_argv(src(r), model, gpu, tp)})
    return out


def run_point(point: dict) -> dict:
    """One `kvemu sim` command line's figures: the keys above, the memory rule's terms, speculative counts; a point
    that fails is kept with its error (one line), so that the rest of the study stands."""
    try:
        return _run_point(point)
    except Exception as e:  # noqa: BLE001 - any failure of one point is reported in the document, not raised
        return {**{k: v for k, v in point.items() if k != "argv"}, "command": "kvemu sim " + " ".join(point["argv"]),
                "error": f"{type(e).__name__}: {e}"}


def _run_point(point: dict) -> dict:
    p = argparse.ArgumentParser()
    sim_cmd.configure(p)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args = p.parse_args(point["argv"])
        trace, grid = sim_cmd.runs_of(args)
        run = simulate(trace, grid[0])
        sim_cmd.attach_memory_rules(args, [run], trace.block_size)
    out: dict[str, Any] = {**{k: v for k, v in point.items() if k != "argv"},
                           "command": "kvemu sim " + " ".join(point["argv"]), **{k: run.get(k) for k in KEYS}}
    rule = run.get("memory_rule") or {}
    out["memory_rule_blocks"], out["kv_gib_per_gpu"] = rule.get("blocks"), rule.get("kv_bytes", 0) / GIB
    spec = run.get("speculative") or {}
    out["tokens_a_verification"] = spec.get("mean_accepted_length", 1.0)
    out["acceptance_rate"] = spec.get("acceptance_rate")
    out["requests"], out["wall_s"] = run.get("requests"), run["wall_s"]
    return out


def _weight(pt: dict) -> int:
    """A point's expected seconds (measured): speculative decoding runs every decode step, no fast-forward."""
    base = 6 if pt["model"] == "deepseek-v3" else 2
    return max(1, round(base * pt["rate"] / 0.1 * (3 if pt.get("k") else 1)))


def run_points(grid: list[dict], jobs: int) -> list[dict]:
    """The points on ``jobs`` processes, longest first; progress weighted by expected seconds, with an ETA."""
    if not grid:
        return []
    weights = [_weight(pt) for pt in grid]
    bar = ProgressBar("models study", sum(weights), "s")
    out: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(grid)))) as pool:
        order = sorted(range(len(grid)), key=lambda i: -weights[i])
        futures = {pool.submit(run_point, grid[i]): i for i in order}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                out.append(fut.result())
                bar.set_postfix(f"{len(out)}/{len(grid)} points")
                bar.update(weights[futures[fut]])
    bar.close()
    return sorted(out, key=lambda r: (r["study"], r["model"], r["rate"], r.get("kv", ""), r.get("k", 0),
                                      r.get("p") or 0, r.get("variant", "")))


# ---------------------------------------------------------------- summaries


def spec_summary(runs: list[dict]) -> list[dict]:
    """Per load and acceptance rate: TPOT p50 by K (K = 0, no speculation, shared), the K of least TPOT p50 and
    each K's gain over K - 1 (where it turns negative, another draft token stopped paying)."""
    out = []
    spec = _ok(runs, "spec")
    for rate in sorted({r["rate"] for r in spec}):
        base = next((r for r in spec if r["rate"] == rate and r["k"] == 0), None)
        for p in sorted({r["p"] for r in spec if r["p"] is not None}):
            by = {r["k"]: r for r in spec if r["rate"] == rate and (r["p"] == p or r["k"] == 0)}
            if base is None or len(by) < 2:
                continue
            ks = sorted(by)
            tpot = {k: by[k]["tpot_p50_s"] for k in ks}
            best = min(ks, key=lambda k: tpot[k])
            gain = {k: 1 - tpot[k] / tpot[ks[i - 1]] for i, k in enumerate(ks) if i}
            out.append({"rate": rate, "p": p, "tpot_p50_s_by_k": tpot, "best_k": best,
                        "speedup_at_best": tpot[0] / tpot[best], "gain_by_k": gain,
                        "tokens_by_k": {k: by[k]["tokens_a_verification"] for k in ks}})
    return out


def window_capacity(runs: list[dict], kv: dict[str, dict]) -> list[dict]:
    """Per variant: the memory rule's blocks and the requests of 8K and 64K tokens whose KV fits at once."""
    out = []
    for variant, key in (("hybrid", WINDOW_MODEL), ("full twin", "twin")):
        r = next((x for x in _ok(runs, "window") if x["variant"] == variant), None)
        if r is None or key not in kv:
            continue
        out.append({"variant": variant, "blocks": r["memory_rule_blocks"],
                    "requests_fit": {t: fits(r["memory_rule_blocks"], kv[key], t) for t in CONTEXTS}})
    return out


# ---------------------------------------------------------------- gpt-oss-120b and its full-attention twin


def window_blocker() -> str | None:
    """Why gpt-oss-120b cannot run in `kvemu sim` here (no preset, or the core refuses its window groups); None
    when it can."""
    from replica.core.build import check_groups
    from shared.errors import KvemuError

    if WINDOW_MODEL not in MODELS:
        return f"no {WINDOW_MODEL} preset"
    try:
        check_groups(CostModel.from_names(WINDOW_MODEL, "h100"))
    except KvemuError as e:
        return str(e)
    return None


def write_twin(folder: str) -> str:
    """gpt-oss-120b's config.json with every layer full attention (``layer_types``, no ``sliding_window``): the
    same weights and shape, the KV of a full-attention model. Its path under ``folder``."""
    config = json.loads((CONFIGS / WINDOW_MODEL / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * int(config["num_hidden_layers"])
    config["sliding_window"] = None
    path = Path(folder) / TWIN
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=1))
    return str(path)


# ---------------------------------------------------------------- tables


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024**2:,.1f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.1f}"


def _at(d: dict, k: Any) -> Any:
    """A JSON document read back keys its numbers by strings."""
    return d.get(k, d.get(str(k)))


def kv_lines(rows: list[dict]) -> list[str]:
    lines = ["| model (KV dtype) | KV cache groups | bytes a token | a GPU's at --tp 1 / 8 | 8K-token request (MiB)"
             " | 64K-token request (MiB) | 64K as full attention (MiB) |", "|" + " --- |" * 7]
    for r in rows:
        groups = ", ".join(f"{g['kind']}{' ' + str(g['window']) if g.get('window') else ''} x{g['layers']}"
                           for g in r["groups"])
        per = r["bytes_a_token_per_gpu"]
        req = [_at(r["requests"], t) for t in CONTEXTS]
        lines.append(f"| {r['setting']} ({r['kv_cache_dtype']}) | {groups} | {r['bytes_a_token']:,} |"
                     f" {_at(per, 1):,.0f} / {_at(per, 8):,.0f} | {_mib(req[0] and req[0]['bytes'])} |"
                     f" {_mib(req[1] and req[1]['bytes'])} | {_mib(req[1] and req[1]['full_attention_bytes'])} |")
    return lines


def fp8_lines(runs: list[dict]) -> list[str]:
    lines = ["| model, GPU | sessions/s | KV dtype | blocks (memory rule) | token hit ratio | TTFT p50 / p99 (ms) |"
             " TPOT p50 (ms) | preemptions |", "|" + " --- |" * 8]
    for r in _ok(runs, "fp8"):
        lines.append(f"| {r['model']}, {r['tp']}x {r['gpu']} | {r['rate']:g} | {r['kv']} | {r['memory_rule_blocks']:,}"
                     f" | {r['token_hit_ratio']:.4f} | {_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])} |"
                     f" {_ms(r['tpot_p50_s'])} | {r['preemptions']:,} |")
    return lines


def spec_lines(summary: list[dict]) -> list[str]:
    ks = sorted({int(k) for s in summary for k in s["tpot_p50_s_by_k"]})
    lines = [f"| sessions/s | acceptance | TPOT p50 (ms) at K = {' / '.join(map(str, ks))} |"
             " tokens a verification at K = " + " / ".join(map(str, ks)) + " | least TPOT at K | speed-up |",
             "|" + " --- |" * 6]
    for s in summary:
        tpot = " / ".join(_ms(_at(s["tpot_p50_s_by_k"], k)) for k in ks)
        tokens = " / ".join(f"{_at(s['tokens_by_k'], k):.2f}" for k in ks)
        lines.append(f"| {s['rate']:g} | {s['p']:g} | {tpot} | {tokens} | {s['best_k']} | {s['speedup_at_best']:.2f}x |")
    return lines


def window_lines(doc: dict) -> list[str]:
    lines = kv_lines(doc.get("window_kv", [])) + ["", "| variant | blocks (memory rule) | 8K / 64K requests that fit |",
                                                  "| --- | --- | --- |"]
    for c in doc.get("window_capacity", []):
        fit = " / ".join(str(_at(c["requests_fit"], t)) for t in CONTEXTS)
        lines.append(f"| {c['variant']} | {c['blocks']:,} | {fit} |")
    lines += ["", "| variant | sessions/s | token hit ratio | TTFT p50 / p99 (ms) | TPOT p50 (ms) | preemptions |"
              " refused |", "|" + " --- |" * 7]
    for r in _ok(doc["runs"], "window"):
        lines.append(f"| {r['variant']} | {r['rate']:g} | {r['token_hit_ratio']:.4f} |"
                     f" {_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])} | {_ms(r['tpot_p50_s'])} |"
                     f" {r['preemptions']:,} | {r['refused']:,} |")
    return lines


def _ok(runs: list[dict], study: str) -> list[dict]:
    return [r for r in runs if r["study"] == study and "error" not in r]


def tables(doc: dict) -> str:
    lines = kv_lines(doc.get("kv", []))
    for part in (fp8_lines(doc["runs"]), spec_lines(doc.get("spec", [])), window_lines(doc)):
        lines += [""] + part
    lines += [f"failed: {r['command']}: {r['error']}" for r in doc["runs"] if "error" in r]
    if doc.get("window_missing"):
        lines += ["", f"window study not run: {doc['window_missing']}"]
    return "\n".join(lines)


def plot_study(doc: dict, folder: str) -> list[str]:
    from bench.models_plots import plot_models

    return plot_models(doc, folder)


# ---------------------------------------------------------------- main


def settings(a: argparse.Namespace) -> None:
    """The setups a run takes: the study's, or ``--tiny``'s one light point each (the test's)."""
    if a.tiny:
        a.duration = min(a.duration, 30.0)
        a.fp8_setups = (("deepseek-v3", "h200", 8, (0.1,)),)
        a.spec_setup = SPEC_SETUP[:4] + ((0.1,),)
        a.window_setup = WINDOW_SETUP[:2] + ((0.1,),)
    else:
        a.fp8_setups, a.spec_setup, a.window_setup = FP8_SETUPS, SPEC_SETUP, WINDOW_SETUP


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_flags(p, "models-kv.png, models-fp8.png, models-spec.png and models-window.png")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--duration", type=float, default=1200.0, help="the agent preset's seconds of session starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="one light point a section (seconds; the test's mode)")
    a = p.parse_args(argv)
    if show_saved(a, tables, plot_study):
        return 0
    sections = known_names(p, "--sections", a.sections, SECTIONS)
    settings(a)
    blocker = window_blocker() if "window" in sections else None
    with tempfile.TemporaryDirectory() as folder:
        twin = write_twin(folder) if "window" in sections and blocker is None else None
        kv = kv_table() if "kv" in sections else []
        twin_kv = {WINDOW_MODEL: kv_row(WINDOW_MODEL), "twin": kv_row(twin)} if twin else {}
        curves = {"hybrid": kv_curve(WINDOW_MODEL), "full twin": kv_curve(twin)} if twin else {}
        runs = run_points(points(a, sections, twin), a.jobs)
    for r in runs:  # the twin's config.json was a temporary file: say what it was
        r["command"] = r["command"].replace(str(Path(folder) / TWIN), TWIN)
    if "twin" in twin_kv:
        twin_kv["twin"]["setting"] = TWIN
    doc = {"settings": {"sections": sections, "duration": a.duration, "seed": a.seed, "tiny": a.tiny,
                        "fp8_setups": a.fp8_setups, "spec_setup": a.spec_setup, "window_setup": a.window_setup},
           "twin": f"{TWIN}: bench/data/models/{WINDOW_MODEL}/config.json with every layer_types entry"
                   " full_attention and sliding_window null (bench_models.write_twin)",
           "kv": kv, "runs": runs, "spec": spec_summary(runs),
           "window_kv": list(twin_kv.values()), "window_capacity": window_capacity(runs, twin_kv),
           "window_curve": curves,
           "window_missing": blocker}
    print(tables(doc), file=sys.stderr)
    publish(a, doc, plot_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
