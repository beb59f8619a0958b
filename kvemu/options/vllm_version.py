"""``--vllm-version X.Y.Z``: the engine rules of a vLLM release (``replica.core.vllm_versions``), one
definition for sim, sweep, replica and up.

The release's rules become kvemu's settings wherever the user did not give their flag: the step rule
(--step-rule), prefix caching (--prefix-caching), the watermark (--watermark), the step's token budget
(--token-budget: vLLM's max_num_batched_tokens default, which may depend on the model's context window
and the GPU) and the running cap (--max-running: max_num_seqs). A flag given on the command line or in
a --config file wins, even where its value is kvemu's default. Without --vllm-version nothing is filled
in: kvemu's own defaults apply (vLLM NEWEST's scheduler, with kvemu's budget and cap on every GPU)."""

from __future__ import annotations

import argparse
import sys

from kvemu.options.option import Option, given
from replica.core.vllm_versions import NEWEST, EngineSettings, VllmRules, rules_for
from shared.costmodel import CostModel

_NEWEST = ".".join(map(str, NEWEST))
VLLM_VERSION = Option(
    "--vllm-version", None, metavar="X.Y.Z",
    help=f"run the engine rules of this vLLM release (0.1.0 to {_NEWEST}): its step rule (v0 or v1), prefix"
         " caching, watermark and default max_num_batched_tokens / max_num_seqs become --step-rule,"
         " --prefix-caching, --watermark, --token-budget and --max-running, except where those flags are given"
         f" (given flags win); default: kvemu's own settings, which follow vLLM {_NEWEST}'s scheduler"
         " (docs/vllm-conformance.md)")

# EngineSettings' fields, by the flag that sets each (the flags are tracked: kvemu.options.option.given)
FLAGS = {"step_rule": "--step-rule", "prefix_caching": "--prefix-caching", "watermark": "--watermark",
         "token_budget": "--token-budget", "max_running": "--max-running"}


def apply_vllm_version(args: argparse.Namespace, out=None) -> VllmRules | None:
    """Fill in the settings ``--vllm-version`` gives where their flags were not given, and say on ``out``
    (stderr) in one line what was set, what was given, and what of the release kvemu does not model.
    None (nothing done) without the flag; a bad or unknown release is one line naming the flag."""
    text = getattr(args, "vllm_version", None)
    if text is None:
        return None
    rules = rules_for(text, VLLM_VERSION.flag)
    cost = CostModel.from_names(args.model, args.gpu)  # a preset or a device profile, with or without @tpN
    limit = getattr(args, "max_model_len", None) or cost.model.max_context
    engine = rules.settings(limit, cost.gpu.memory_bytes, cost.gpu.name)
    kept = [dest for dest in FLAGS if given(args, dest)]
    for dest in FLAGS:
        if dest not in kept:
            setattr(args, dest, getattr(engine, dest))
    ran = EngineSettings(**{dest: getattr(args, dest) for dest in FLAGS})  # what runs: the given flags' values kept
    print(summary(text, rules, ran, kept), file=out or sys.stderr, flush=True)
    return rules


def summary(text: str, rules: VllmRules, engine: EngineSettings, kept: list[str]) -> str:
    """The one line a command prints when --vllm-version applies: ``engine`` is what runs (given flags kept)."""
    steps = {"v0": "v0 steps (prefills of whole prompts or decodes)", "v1": "v1 steps (mixed, chunked prefill)"}
    parts = [steps[engine.step_rule], f"prefix caching {engine.prefix_caching}", f"watermark {engine.watermark:g}",
             f"token budget {engine.token_budget:,}", f"max running {engine.max_running:,}"]
    where = "" if text.lstrip("v") == rules.release else f" (the rules of {rules.release})"
    line = f"vllm {text}{where}: {', '.join(parts)}"
    if kept:
        line += f"; given, kept: {', '.join(FLAGS[d] for d in kept)}"
    return line + f"; not modelled: {'; '.join(rules.unmodelled())}"
