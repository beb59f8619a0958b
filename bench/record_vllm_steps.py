"""Record vLLM's own v1 scheduler step by step and compare kvemu's with it (docs/vllm-conformance.md).

    python bench/record_vllm_steps.py --all           # re-record tests/replica/core/sched/vllm_golden/
    python bench/record_vllm_steps.py --random 200    # 200 random workloads: agreement, preemptions (JSON)
    python bench/record_vllm_steps.py --random 100 --hybrid   # ... with full and sliding-window KV cache groups
    python bench/record_vllm_steps.py --check         # the golden files against kvemu (no vLLM needed)
    python bench/record_vllm_steps.py --state         # the state-layer cases into vllm_golden/
    python bench/record_vllm_steps.py --chat 600 --seed 52   # a 200-request multi-turn chat, 600-block pool

vLLM runs in a virtualenv of its own (``.vllm-venv`` in the repository root, or ``$KVEMU_VLLM_VENV``),
made here with the pinned version when absent; the project never imports vLLM (bench/in_vllm_venv/step_driver.py
runs inside that virtualenv and reads the workloads on stdin). The model is a config.json written
from kvemu's preset (``--model``), no weights; the hub stays offline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from replica.core.sched.steptrace import compare, expand, kvemu_trace  # noqa: E402
from shared.costmodel import get_model  # noqa: E402
from shared.errors import InputError  # noqa: E402
from shared.kv_groups import FULL, STATE, WINDOW, group_layers  # noqa: E402

VLLM_VERSION = "0.33.0"
GOLDEN = REPO / "tests" / "replica" / "core" / "sched" / "vllm_golden"
# recorded cases kvemu's scheduler does not run yet (state layers): checked against the core's rules only
DRIVER = Path(__file__).resolve().parent / "in_vllm_venv" / "step_driver.py"  # apart from bench/*.py: it imports vLLM
DEFAULTS = {"block_size": 16, "num_blocks": 1000, "max_num_batched_tokens": 2048, "max_num_seqs": 16,
            "max_model_len": 8192, "prefix_caching": True}


def venv_dir() -> Path:
    return Path(os.environ.get("KVEMU_VLLM_VENV", REPO / ".vllm-venv"))


def venv_python(create: bool = True) -> Path | None:
    """The recorder's Python (vLLM ``VLLM_VERSION`` installed), made when absent if ``create``."""
    py = venv_dir() / "bin" / "python"
    if py.exists():
        return py
    if not create:
        return None
    print(f"making {venv_dir()} with vllm=={VLLM_VERSION} (about 9.5 GB, minutes)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv_dir())], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"vllm=={VLLM_VERSION}"], check=True)
    return py


def model_dir(preset: str) -> Path:
    """A directory holding a Llama-style config.json of kvemu's ``preset`` (its shape, no weights)."""
    m = get_model(preset)
    d = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvemu" / f"vllm-model-{m.name}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.hidden,
           "intermediate_size": m.intermediate, "num_attention_heads": m.q_heads, "num_hidden_layers": m.layers,
           "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab,
           "max_position_embeddings": m.max_context or 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "torch_dtype": "float16", "tie_word_embeddings": m.tied_embeddings, "hidden_act": "silu"}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def _driver_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


def record(workloads: list[dict], preset: str) -> list[dict]:
    """vLLM's traces of ``workloads`` ({"header", "steps"} each), from one run of the driver."""
    py = venv_python()
    lines = [json.dumps({"model_dir": str(model_dir(preset))})] + [json.dumps(expand(w)) for w in workloads]
    out = subprocess.run([str(py), str(DRIVER)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         env=_driver_env())
    if out.returncode:
        raise SystemExit(f"vLLM's driver failed:\n{out.stderr[-4000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


class LiveRecorder:
    """One driver kept running: ``record(workload)`` answers at once (the hypothesis test's recorder)."""

    def __init__(self, py: Path, preset: str = "llama-3-8b") -> None:
        self.proc = subprocess.Popen([str(py), str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=_driver_env())
        self._send({"model_dir": str(model_dir(preset))})

    def _send(self, obj: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def record(self, workload: dict) -> dict:
        self._send(expand(workload))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("vLLM's driver ended (run bench/in_vllm_venv/step_driver.py by hand to see why)")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _w(name: str, requests: list[dict], aborts: list[dict] | None = None, **settings) -> dict:
    s = {**DEFAULTS, **settings}
    # vLLM refuses to start when its pool (less the null block) cannot hold one max_model_len request: every full
    # group's blocks, each window group's at most its cap (SlidingWindowSpec.max_memory_usage_bytes)
    s["max_model_len"] = min(s["max_model_len"], (s["num_blocks"] - 1) * s["block_size"])
    while _blocks_for(s, s["max_model_len"]) > s["num_blocks"] - 1:
        s["max_model_len"] -= s["block_size"]
    return {"name": name, "settings": s, "requests": requests, "aborts": aborts or []}


def _blocks_for(s: dict, tokens: int) -> int:
    """Blocks one request of ``tokens`` holds at most over the workload's KV cache groups (vLLM's startup rule; a
    window's cap counts two steps in flight, its async scheduling; a state group's two blocks, 'align' mode's
    MambaSpec.max_memory_usage_bytes)."""
    bs = s["block_size"]
    blocks = -(-tokens // bs)
    return sum(blocks if kind == FULL else min(blocks, 2) if kind == STATE else
               min(blocks, -(-(window - 1 + 2 * s["max_num_batched_tokens"]) // bs) + 1)
               for kind, window in s.get("kv_groups") or [[FULL, 0]])


def _r(rid: str, arrive: int, prompt: list, out: int, tag: int | None = None) -> dict:
    return {"id": rid, "arrive": arrive, "prompt": prompt, "output": [[tag if tag is not None else 900 + len(rid)
                                                                       + sum(map(ord, rid)), out]]}


def golden_workloads() -> list[dict]:
    """The recorded cases (docs/vllm-conformance.md lists what each exercises)."""
    shared = [[1, 512]]
    return [
        _w("shared_prefix_together", [_r(f"a{i}", 0, [*shared, [10 + i, 100]], 20) for i in range(4)]),
        _w("shared_prefix_apart", [_r(f"a{i}", t, [*shared, [10 + i, 100]], 20) for i, t in enumerate((0, 5, 30, 60))]),
        _w("shared_prefix_while_prefilling", [_r("long", 0, [[2, 3000], [3, 40]], 10),
                                              _r("late", 1, [[2, 3000], [4, 40]], 10)]),
        _w("long_prompts_beside_decodes", [*[_r(f"s{i}", 0, [[20 + i, 200]], 80) for i in range(3)],
                                           _r("long1", 3, [[30, 5000]], 10), _r("long2", 10, [[31, 4500]], 10)]),
        _w("block_aligned_full_hit", [_r("x", 0, [[5, 256]], 5), _r("y", 10, [[5, 256]], 5)]),
        _w("small_pool_preempts", [_r(f"p{i}", 0, [[40 + i, 100]], 150) for i in range(6)], num_blocks=40),
        _w("small_pool_staggered", [_r(f"p{i}", 2 * i, [[50 + i, 60 + 20 * i]], 120) for i in range(6)],
           num_blocks=36),
        _w("prefix_caching_off", [_r(f"a{i}", 0, [*shared, [10 + i, 100]], 20) for i in range(4)],
           prefix_caching=False),
        _w("prefix_caching_off_small_pool", [_r(f"p{i}", i, [[60 + i, 120]], 100) for i in range(5)],
           num_blocks=30, prefix_caching=False),
        _w("max_num_seqs_binding", [_r(f"m{i}", 0, [[70 + i, 50 + 30 * i]], 15 + 3 * i) for i in range(6)],
           max_num_seqs=2),
        _w("abort_mid_prefill", [_r("big", 0, [[80, 6000]], 10), _r("after", 3, [[80, 6000], [81, 30]], 10),
                                 _r("other", 1, [[82, 300]], 20)], [{"id": "big", "step": 1}]),
        _w("abort_mid_decode", [_r("d0", 0, [[83, 400]], 50), _r("d1", 0, [[84, 300]], 50),
                                _r("d2", 12, [[83, 400], [85, 20]], 10)], [{"id": "d0", "step": 10}]),
        _w("over_model_len", [_r("fits", 0, [[86, 900]], 100), _r("over", 0, [[87, 1000]], 100),
                              _r("next", 2, [[88, 200]], 30)], max_model_len=1024),
        _w("multi_turn_hits_response", [_r("t1", 0, [[90, 300]], 64, tag=91),
                                        _r("t2", 80, [[90, 300], [91, 64], [92, 50]], 20)]),
        _w("many_chunks", [_r(f"c{i}", 0, [[100 + i, 700]], 12) for i in range(10)]),
        _w("preempted_mid_prefill", [_r("d", 0, [[110, 400]], 200), _r("long", 1, [[111, 2100]], 10)],
           num_blocks=160, max_num_batched_tokens=64),
        # the next turn (its prompt holds t1's whole output) arrives while t1 still decodes: it finds
        # the 28 blocks t1 has filled so far (448 tokens), not only t1's 18 prompt blocks
        _w("overlapping_turns", [_r("t1", 0, [[90, 300]], 200, tag=91),
                                 _r("t2", 150, [[90, 300], [91, 200], [92, 50]], 20)]),
        # 200 requests of 63 sessions, 2,035 evictions in a 700-block pool; 103 later turns (of 45 sessions)
        # arrive while the turn before still decodes
        chat_workload(random.Random(52), "multi_turn_chat", num_blocks=700),
        *spec_workloads(),
        *hybrid_workloads(),
    ]


def kv_groups(kinds: list[tuple[str, int]]) -> list[list]:
    """The ``[kind, window]`` of each KV cache group shared/kv_groups.py forms from a model's layers (vLLM's
    hybrid manager's groups), what vLLM's driver and kvemu's scheduler both build."""
    return [[g.kind, g.window] for g in group_layers(kinds).groups]


def hybrid_workloads() -> list[dict]:
    """Full and sliding-window KV cache groups (docs/vllm-conformance.md, "KV cache groups"): gpt-oss's layers
    (window and full alternating: two groups), Gemma 3's (five local layers to one global: five window groups and
    a full one), a window of 32 tokens beside full attention."""
    oss = kv_groups([(WINDOW, 128), (FULL, 0)] * 12)
    gemma = kv_groups([(FULL, 0) if (i + 1) % 6 == 0 else (WINDOW, 64) for i in range(12)])
    w32 = kv_groups([(FULL, 0), (WINDOW, 32)])
    return [
        # 80 requests, 1,189 evictions in a 1,000-block pool (two groups): windows' blocks evicted before the full
        # group's, later turns hitting what both still hold
        chat_workload(random.Random(56), "hybrid_multi_turn", requests=80, span=600, num_blocks=1000, kv_groups=oss),
        _w("hybrid_long_prompt", [_r("long", 0, [[2, 3000], [3, 40]], 40), _r("late", 1, [[2, 3000], [4, 40]], 10),
                                  _r("after", 60, [[2, 3000], [3, 40]], 10), _r("mid", 70, [[2, 1500]], 5)],
           kv_groups=w32),
        _w("hybrid_small_pool_preempts", [_r(f"p{i}", i, [[40 + i, 100]], 150) for i in range(6)], num_blocks=120,
           kv_groups=gemma),
        with_spec(_w("hybrid_spec", [_r("t1", 0, [[90, 300]], 200, tag=91),
                                     _r("t2", 60, [[90, 300], [91, 200], [92, 50]], 20),
                                     *[_r(f"p{i}", 2 * i, [[40 + i, 100]], 120) for i in range(4)]],
                     num_blocks=80, kv_groups=w32), 3, 5),
    ]


def with_spec(w: dict, k: int, seed: int, method: str = "ngram") -> dict:
    """``w`` under speculative decoding with ``k`` drafts a step: each request's verifications accept a seeded
    list of 0..k drafts (the same list vLLM's driver and kvemu's scheduler are forced with)."""
    rng = random.Random(seed)
    w["settings"]["speculative"] = {"method": method, "k": k}
    for r in w["requests"]:
        r["accept"] = [rng.randint(0, k) for _ in range(sum(n for _, n in r["output"]))]
    return w


def spec_workloads() -> list[dict]:
    """Speculative decoding with forced acceptances (docs/speculative.md)."""
    one = _w("spec_one_sequence", [_r("s", 0, [[120, 30]], 6)])
    one["settings"]["speculative"] = {"method": "ngram", "k": 2}
    one["requests"][0]["accept"] = [2, 0, 1]
    return [
        one,
        with_spec(_w("spec_shared_prefix", [_r(f"a{i}", 2 * i, [[1, 512], [10 + i, 100]], 60) for i in range(5)]), 3, 1),
        with_spec(_w("spec_small_pool_preempts", [_r(f"p{i}", i, [[40 + i, 100]], 150) for i in range(6)],
                     num_blocks=44), 4, 2),
        with_spec(_w("spec_overlapping_turns", [_r("t1", 0, [[90, 300]], 200, tag=91),
                                                _r("t2", 60, [[90, 300], [91, 200], [92, 50]], 20)]), 5, 3),
        with_spec(chat_workload(random.Random(54), "spec_multi_turn_chat", requests=80, span=600, num_blocks=700),
                  3, 4),
    ]


def state_workloads() -> list[dict]:
    """A full-attention group beside a state group (vLLM's MambaSpec, 'align' mode): a prompt cut at its last block
    boundary; a next turn hitting the state its turn before left at a block boundary while decoding; one prompt
    twice in a step (the second waits a step for the state the first caches); a shared prefix whose state no
    chunk ended on (no hit)."""
    return [_w("state_hybrid", [_r("t1", 0, [[90, 300]], 40, tag=91),
                                _r("t2", 60, [[90, 300], [91, 40], [92, 50]], 10),
                                _r("x", 80, [[5, 256]], 5), _r("y", 80, [[5, 256]], 5),
                                _r("a0", 100, [[1, 512], [10, 100]], 5), _r("a1", 120, [[1, 512], [11, 100]], 5)],
               kv_groups=[["full", 0], ["state", 0]])]


def chat_workload(rng: random.Random, name: str, requests: int = 200, span: int = 1500, **settings) -> dict:
    """A multi-turn chat of ``requests`` requests: sessions of 1 to 6 turns, each turn's prompt the
    previous turn's prompt, its whole output and a new message; a session's next turn arrives 5 to 120
    steps after the previous one, often while that one still decodes (agents' parallel calls); sessions
    start over ``span`` steps."""
    reqs: list[dict] = []
    session = 0
    while len(reqs) < requests:
        session += 1
        tag = 2000 + 100 * session
        prompt: list = [[tag, rng.randint(40, 400)]]
        t = rng.randint(0, span)
        for turn in range(min(rng.randint(1, 6), requests - len(reqs))):
            out = rng.randint(8, 180)
            reqs.append(_r(f"s{session}t{turn}", t, [list(x) for x in prompt], out, tag=tag + 50 + turn))
            prompt += [[tag + 50 + turn, out], [tag + 1 + turn, rng.randint(10, 150)]]
            t += rng.randint(5, 120)
    return _w(name, reqs, **{"num_blocks": 600, "max_num_batched_tokens": 512, "max_num_seqs": 16, **settings})


def hybrid_layouts() -> list[list[list]]:
    """The KV cache groups a random hybrid workload draws from: full + window 32, gpt-oss's, Gemma 3's, one window."""
    return [kv_groups([(FULL, 0), (WINDOW, 32)]), kv_groups([(WINDOW, 128), (FULL, 0)] * 12),
            kv_groups([(FULL, 0) if (i + 1) % 6 == 0 else (WINDOW, 64) for i in range(12)]), [[WINDOW, 48]]]


def state_layouts() -> list[list[list]]:
    """The KV cache groups a random state workload draws from: a full and a state group, Qwen3-Next's order (three
    state groups, then the full one)."""
    return [[[FULL, 0], [STATE, 0]], [[STATE, 0], [STATE, 0], [STATE, 0], [FULL, 0]]]


def random_workload(rng: random.Random, name: str, hybrid: bool = False, state: bool = False) -> dict:
    """A small random case: shared prefixes, a pool from tight to ample, budgets and seat limits that bind;
    ``hybrid``: with one of ``hybrid_layouts``, ``state``: of ``state_layouts`` (prefix caching on: the groups run
    with it)."""
    bs = 16
    s: dict = {"num_blocks": rng.choice([24, 40, 64, 128, 400]), "max_num_batched_tokens": rng.choice([128, 512, 2048]),
         "max_num_seqs": rng.choice([2, 4, 16]), "prefix_caching": rng.random() < 0.75,
         "max_model_len": rng.choice([8192, 8192, 1024])}
    cap = s["num_blocks"] * bs
    reqs, aborts = [], []
    for i in range(rng.randint(2, 9)):
        prompt = []
        if rng.random() < 0.5:
            prompt.append([rng.randint(1, 3), rng.choice([16, 64, 200, 512])])
        prompt.append([1000 + i, rng.randint(1, 700)])
        out = rng.randint(1, 120)
        while sum(n for _, n in prompt) + out > cap:  # every request fits the pool once alone
            prompt = [[1000 + i, max(1, prompt[-1][1] // 2)]]
            out = max(1, out // 2)
        reqs.append(_r(f"r{i}", rng.randint(0, 25), prompt, out))
        if rng.random() < 0.1:
            aborts.append({"id": f"r{i}", "step": reqs[-1]["arrive"] + rng.randint(0, 15)})
    if hybrid or state:
        s["kv_groups"] = rng.choice(state_layouts() if state else hybrid_layouts())
        s["prefix_caching"] = True
    return _w(name, reqs, aborts, **s)


def write_golden(w: dict, trace: dict, folder: Path = GOLDEN) -> Path:
    path = folder / f"{w['name']}.jsonl"
    header = {**trace["header"], "workload": w}
    lines = [json.dumps(header)] + [json.dumps(s) for s in trace["steps"]]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_golden(path: Path) -> tuple[dict, list[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="re-record the golden files")
    p.add_argument("--random", type=int, default=0, metavar="N", help="record N random workloads and compare")
    p.add_argument("--check", action="store_true", help="compare the golden files with kvemu (no vLLM)")
    p.add_argument("--state", action="store_true", help="record the state-layer cases into vllm_golden/ (--random: with state groups)")
    p.add_argument("--chat", type=int, default=0, metavar="BLOCKS",
                   help="record a 200-request multi-turn chat (chat_workload, --seed) with a pool of BLOCKS and compare")
    p.add_argument("--chat-span", type=int, default=1500, metavar="STEPS", help="--chat: sessions start over STEPS")
    p.add_argument("--hybrid", action="store_true", help="--random: with full and sliding-window KV cache groups")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="llama-3-8b", help="kvemu model preset the config.json is written from")
    a = p.parse_args(argv)
    try:
        get_model(a.model)
    except InputError as e:
        p.error(str(e))
    result: dict = {"vllm": VLLM_VERSION}
    if a.all:
        ws = golden_workloads()
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for w, t in zip(ws, record(ws, a.model)):
            write_golden(w, t)
        result["recorded"] = len(ws)
    if a.state and not a.random:
        ws = state_workloads()
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for w, t in zip(ws, record(ws, a.model)):
            write_golden(w, t)
        result["recorded_state"] = len(ws)
    if a.check or a.all:
        per = {}
        for path in sorted(GOLDEN.glob("*.jsonl")):
            header, steps = read_golden(path)
            per[path.stem] = compare(kvemu_trace(header["workload"]), steps)
        result["golden"] = per
    if a.chat:
        w = chat_workload(random.Random(a.seed), "chat", span=a.chat_span, num_blocks=a.chat)
        result["chat"] = compare(kvemu_trace(w), record([w], a.model)[0]["steps"])
    if a.random:
        rng = random.Random(a.seed)
        ws = [random_workload(rng, f"random{i}", a.hybrid, a.state) for i in range(a.random)]
        traces = record(ws, a.model)
        tot: dict = {"workloads": len(ws), "steps": 0, "agree": 0, "workloads_identical": 0,
               "preemptions_kvemu": 0, "preemptions_vllm": 0, "workloads_preemptions_equal": 0}
        firsts = []
        for w, t in zip(ws, traces):
            c = compare(kvemu_trace(w), t["steps"])
            for key in ("steps", "agree", "preemptions_kvemu", "preemptions_vllm"):
                tot[key] += c[key]
            tot["workloads_identical"] += c["first_difference"] is None
            tot["workloads_preemptions_equal"] += c["preemptions_kvemu"] == c["preemptions_vllm"]
            if c["first_difference"] is not None:
                firsts.append(w["name"])
        tot["agree_share"] = round(tot["agree"] / max(tot["steps"], 1), 4)
        tot["differing"] = firsts[:20]
        result["random"] = tot
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
