"""The figures of bench/bench_models.py's study (docs/models.md): KV a request holds by model; FP8 vs BF16 KV on the
agent preset; TPOT and tokens a verification against speculative tokens and acceptance; gpt-oss-120b vs its
full-attention twin."""

from __future__ import annotations

import os

from shared.plotting import PALETTE, pyplot, save_figure

GIB = 1024**3
KV_LABEL = {"auto": "BF16 KV (auto)", "fp8": "FP8 KV"}


def plot_models(doc: dict, folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    out = []
    if doc.get("kv"):
        out.append(_kv(doc, folder))
    if any(r["study"] == "fp8" for r in doc["runs"]):
        out.append(_fp8(doc, folder))
    if doc.get("spec"):
        out.append(_spec(doc, folder))
    if any(r["study"] == "window" for r in doc["runs"]):
        out.append(_window(doc, folder))
    return out


def _at(d: dict, k):
    return d.get(k, d.get(str(k)))


def _kv(doc: dict, folder: str) -> str:
    plt = pyplot()
    # a model whose window is under 8K tokens has no bar: the table says so
    rows = [r for r in doc["kv"] if any(_at(r["requests"], t) for t in (8192, 65536))]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.6))
    ys = range(len(rows))
    for k, (tokens, colour) in enumerate(((8192, PALETTE[0]), (65536, PALETTE[1]))):
        held = [(_at(r["requests"], tokens) or {}).get("bytes", 0) / GIB for r in rows]
        full = [(_at(r["requests"], tokens) or {}).get("full_attention_bytes", 0) / GIB for r in rows]
        pos = [y + (k - 0.5) * 0.38 for y in ys]
        ax.barh(pos, full, 0.36, color="white", edgecolor=colour, hatch="//",
                label=f"{tokens // 1024}K tokens, were every layer full attention")
        ax.barh(pos, held, 0.36, color=colour, label=f"{tokens // 1024}K-token request")
    ax.set_yticks(list(ys), [f"{r['setting']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("KV a request holds (GiB, one copy over every layer, in whole blocks)")
    ax.set_title("KV a request holds by model: an 8K and a 64K-token conversation\n"
                 "(no 64K bar: past the model's context window)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "models-kv.png"))


def _fp8(doc: dict, folder: str) -> str:
    plt = pyplot()
    runs = [r for r in doc["runs"] if r["study"] == "fp8" and "error" not in r]
    setups = list(dict.fromkeys((r["model"], r["gpu"], r["tp"]) for r in runs))
    fig, axes = plt.subplots(len(setups), 2, figsize=(11, 3.6 * len(setups)), squeeze=False)
    for row, (model, gpu, tp) in enumerate(setups):
        mine = [r for r in runs if (r["model"], r["gpu"], r["tp"]) == (model, gpu, tp)]
        for k, kv in enumerate(("auto", "fp8")):
            pts = sorted((r for r in mine if r["kv"] == kv), key=lambda r: r["rate"])
            xs = [r["rate"] for r in pts]
            blocks = pts[0]["memory_rule_blocks"] if pts else 0
            label = f"{KV_LABEL[kv]}: {blocks:,} blocks"
            axes[row][0].plot(xs, [r["token_hit_ratio"] for r in pts], "o-", color=PALETTE[k], label=label)
            axes[row][1].plot(xs, [r["ttft_p99_s"] for r in pts], "o-", color=PALETTE[k], label=f"{KV_LABEL[kv]} p99")
            axes[row][1].plot(xs, [r["ttft_p50_s"] for r in pts], "s--", color=PALETTE[k], label=f"{KV_LABEL[kv]} p50")
        axes[row][0].set_ylabel("token hit ratio (HBM)")
        axes[row][0].set_ylim(0, 1.05)
        axes[row][1].set_ylabel("TTFT (s, log scale)")
        axes[row][1].set_yscale("log")
        for ax in axes[row]:
            ax.set_xlabel("agent sessions started a second")
            ax.set_title(f"{model}, {tp}x {gpu} (one replica)", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("FP8 vs BF16 KV cache on the agent preset: the same model, GPU, trace and seed", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "models-fp8.png"))


def _spec(doc: dict, folder: str) -> str:
    plt = pyplot()
    summary = doc["spec"]
    rates = sorted({s["rate"] for s in summary})
    fig, axes = plt.subplots(2, len(rates), figsize=(5.5 * len(rates), 7), squeeze=False)
    setup: dict = next((r for r in doc["runs"] if r["study"] == "spec"), {})
    for col, rate in enumerate(rates):
        for k, s in enumerate(x for x in summary if x["rate"] == rate):
            ks = sorted(int(x) for x in s["tpot_p50_s_by_k"])
            tpot = [_at(s["tpot_p50_s_by_k"], x) * 1000 for x in ks]
            colour = PALETTE[k]
            axes[0][col].plot(ks, tpot, "o-", color=colour, label=f"acceptance {s['p']:g}")
            best = s["best_k"]
            axes[0][col].plot([best], [_at(s["tpot_p50_s_by_k"], best) * 1000], "*", color=colour, markersize=14)
            axes[1][col].plot(ks, [_at(s["tokens_by_k"], x) for x in ks], "o-", color=colour,
                              label=f"acceptance {s['p']:g}")
        axes[0][col].set_title(f"{rate:g} agent sessions a second", fontsize=10)
        axes[0][col].set_ylabel("TPOT p50 (ms); star: least")
        axes[1][col].set_ylabel("tokens a verification keeps (mean)")
        for ax in axes[:, col]:
            ax.set_xlabel("draft tokens K (0: no speculative decoding)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][col].set_ylim(0, axes[0][col].get_ylim()[1] * 1.05)
    fig.suptitle(f"Speculative decoding: {setup.get('model', '')} on {setup.get('tp', '')}x {setup.get('gpu', '')}"
                 "\nMTP drafts, each position accepted with the rate given the one before was", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "models-spec.png"))


def _window(doc: dict, folder: str) -> str:
    plt = pyplot()
    runs = [r for r in doc["runs"] if r["study"] == "window" and "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    variants = (("hybrid", "gpt-oss-120b (full + 128-token window layers)"),
                ("full twin", "its full-attention twin"))
    for k, (variant, label) in enumerate(variants):
        curve = doc.get("window_curve", {}).get(variant, {})
        ts = sorted(int(t) for t in curve)
        axes[0].plot([t / 1024 for t in ts], [_at(curve, t) / GIB for t in ts], "o-", color=PALETTE[k], label=label)
        pts = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["rate"])
        xs = [r["rate"] for r in pts]
        blocks = pts[0]["memory_rule_blocks"] if pts else 0
        axes[1].plot(xs, [r["token_hit_ratio"] for r in pts], "o-", color=PALETTE[k], label=f"{label}: {blocks:,} blocks")
        axes[2].plot(xs, [r["ttft_p99_s"] for r in pts], "o-", color=PALETTE[k], label=f"{label}, p99")
        axes[2].plot(xs, [r["ttft_p50_s"] for r in pts], "s--", color=PALETTE[k], label=f"{label}, p50")
    axes[0].set_xscale("log", base=2)
    ticks = sorted({int(t) for c in doc.get("window_curve", {}).values() for t in c})
    axes[0].set_xticks([t / 1024 for t in ticks], [f"{t // 1024}K" for t in ticks])
    axes[0].set_xlabel("conversation length (K tokens, log scale)")
    axes[0].set_ylabel("KV the request holds (GiB, one copy)")
    axes[0].set_title("KV a request holds", fontsize=10)
    axes[1].set_ylabel("token hit ratio (HBM)")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("agent preset: prefix hits", fontsize=10)
    axes[2].set_ylabel("TTFT (s, log scale)")
    axes[2].set_yscale("log")
    axes[2].set_title("agent preset: TTFT", fontsize=10)
    gpu, tp = (runs[0]["gpu"], runs[0]["tp"]) if runs else ("", "")
    for ax in axes[1:]:
        ax.set_xlabel("agent sessions started a second")
    low, high = axes[2].get_ylim()
    axes[2].set_ylim(low, high * 30)  # room above the lines for the legend
    for ax, where in zip(axes, ("upper left", "lower left", "upper left")):  # clear of the lines drawn
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc=where)
    fig.suptitle(f"gpt-oss-120b vs a full-attention model of the same size, {tp}x {gpu} (one replica)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "models-window.png"))
