"""Drive vLLM's own v1 scheduler step by step (run by bench/record_vllm_steps.py inside its vLLM
virtualenv; it imports vLLM and the standard library only, never kvemu).

Reads JSON lines on stdin: first ``{"model_dir"}``, then one workload a line as
bench/record_vllm_steps.py writes it (settings, requests with token ids, arrival and abort steps).
Answers each with one JSON line on stdout: its header (vLLM's version, the settings) and its steps.

The scheduler is built as vLLM's unit tests build one (tests/v1/core/utils.py ``create_scheduler``):
a model config read from a local config.json with no weights and no tokenizer, a KV cache config of
one full-attention group (or, with ``settings["kv_groups"]``, the full, sliding-window and state groups it lists,
vLLM's hybrid manager; a state group a MambaSpec in vLLM's 'align' mode) with the asked number of blocks, and no
GPU. Each step: the requests that arrive at it are added (one over ``max_model_len`` is refused as vLLM's serving front end refuses
it: never added), the aborts of that step applied (``finish_requests`` with FINISHED_ABORTED), then
``schedule()``, a model-runner output that samples the request's next output token for every
scheduled request whose prompt is done (nothing for a partial prefill chunk), ``update_from_output()``.

With ``settings["speculative"]`` (``{"method": "ngram", "k": K}``) the scheduler runs vLLM's speculative
decoding: a verified request's output is the drafts its forced acceptance list accepts (``accept``: the
request's i-th verification accepts ``accept[i]`` drafts, 0 past the list) plus one sampled token, and
after ``update_from_output`` every scheduled request gets K drafts, cut at ``max_model_len`` as vLLM's n-gram
proposer cuts them (``update_draft_token_ids``, what EngineCore's ``post_step`` does with the runner's drafts).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MAX_STEPS = 100_000


def build(model_dir: str, s: dict) -> Scheduler:
    model_config = ModelConfig(model=model_dir, dtype="float16", seed=0, skip_tokenizer_init=True,
                               max_model_len=s["max_model_len"])
    scheduler_config = SchedulerConfig(max_num_seqs=s["max_num_seqs"],
                                       max_num_batched_tokens=s["max_num_batched_tokens"],
                                       max_model_len=s["max_model_len"], enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=s["block_size"], enable_prefix_caching=s["prefix_caching"])
    spec = None
    if s.get("speculative"):
        spec = SpeculativeConfig(method=s["speculative"]["method"], num_speculative_tokens=s["speculative"]["k"],
                                 prompt_lookup_max=3, prompt_lookup_min=1, target_model_config=model_config,
                                 target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"),
                             speculative_config=spec)
    if any(kind == "state" for kind, _ in s.get("kv_groups") or []):
        # what vLLM 0.33 sets for a hybrid model with prefix caching on (MambaModelConfig): states kept at block
        # boundaries, blocks of the attention block size
        cache_config.mamba_cache_mode, cache_config.mamba_block_size = "align", s["block_size"]
    kv_cache_config = KVCacheConfig(num_blocks=s["num_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=_groups(s.get("kv_groups") or [["full", 0]], s["block_size"]))
    cache_config.num_gpu_blocks = s["num_blocks"]
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=s["block_size"])


def _groups(kinds: list, block_size: int) -> list[KVCacheGroupSpec]:
    """One KV cache group per ``[kind, window]`` (``full``: FullAttentionSpec, ``window``: SlidingWindowSpec of that
    many tokens), a layer each, every page one size: the groups vLLM's hybrid manager forms for such a model."""
    out = []
    for i, (kind, window) in enumerate(kinds):
        common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
        if kind == "state":  # a state layer (MambaSpec in 'align' mode); its page the attention page's, one value
            spec = MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
        elif kind == "window":
            spec = SlidingWindowSpec(**common, sliding_window=window)
        else:
            spec = FullAttentionSpec(**common)
        out.append(KVCacheGroupSpec([f"layer{i}"], spec))
    return out


def run(model_dir: str, w: dict) -> dict:
    s = w["settings"]
    sched = build(model_dir, s)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(s["block_size"], sha256)
    reqs = {r["id"]: r for r in w["requests"]}
    arrivals: dict[int, list[dict]] = {}
    for r in w["requests"]:
        arrivals.setdefault(r["arrive"], []).append(r)
    aborts: dict[int, list[str]] = {}
    for a in w.get("aborts", []):
        aborts.setdefault(a["step"], []).append(a["id"])
    last_event = max([*arrivals, *aborts, 0])
    first_seen: set[str] = set()
    verifies: dict[str, int] = {}  # verifications so far, per request (its next forced acceptance)
    steps = []
    for k in range(MAX_STEPS):
        refused = []
        for r in arrivals.get(k, []):
            if len(r["prompt"]) + len(r["output"]) > s["max_model_len"]:
                refused.append(r["id"])  # the serving front end's 400: the scheduler never sees it
                continue
            sp = SamplingParams(max_tokens=len(r["output"]), ignore_eos=True)
            sched.add_request(Request(request_id=r["id"], prompt_token_ids=list(r["prompt"]), sampling_params=sp,
                                      pooling_params=None, arrival_time=float(k), block_hasher=hasher))
        aborted = [rid for rid in aborts.get(k, []) if rid in sched.requests]
        if aborted:
            sched.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
        waiting_before = {rid for rid, rq in sched.requests.items() if rq.status != RequestStatus.RUNNING}
        running_before = [rq.request_id for rq in sched.running]
        out = sched.schedule()
        num = dict(out.num_scheduled_tokens)
        cached = {}
        for rid, n in num.items():
            rq = sched.requests[rid]
            if rid in waiting_before:  # admitted in this step: what it found computed
                cached[rid] = rq.num_computed_tokens - n
                first_seen.add(rid)
        # victims leave the running list from its end: their order is the reverse of that list's
        preempted = [rid for rid in reversed(running_before) if sched.requests[rid].status == RequestStatus.PREEMPTED]
        ids = list(num)
        sampled = [_sampled(sched.requests[rid], reqs[rid], out.scheduled_spec_decode_tokens.get(rid), verifies)
                   for rid in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                                sampled_token_ids=sampled)
        eco = sched.update_from_output(out, mro)
        if s.get("speculative"):
            _propose(sched, ids, s["speculative"]["k"], s["max_model_len"])
        finished = []
        for outs in eco.values():
            for o in outs.outputs:
                if o.finish_reason is not None:
                    finished.append(o.request_id)
        steps.append({"step": k, "scheduled": num, "cached": cached, "preempted": preempted,
                      "finished": finished, "refused": refused, "aborted": aborted})
        if k >= last_event and not sched.requests:
            break
    header = {"vllm": vllm.__version__, "settings": s, "name": w.get("name", "")}
    return {"header": header, "steps": steps}


def _sampled(rq: Request, r: dict, drafts: list[int] | None, verifies: dict[str, int]) -> list[int]:
    """The tokens the model runner returns for a scheduled request: none for a partial prefill chunk, else its
    accepted drafts (the forced count, at most the drafts scheduled) and one sampled token, the request's next
    output tokens (a filler past its output: vLLM trims at max_tokens)."""
    if rq.num_computed_tokens < rq.num_tokens:
        return []
    accepted = 0
    if drafts:
        i = verifies.get(rq.request_id, 0)
        verifies[rq.request_id] = i + 1
        forced = r.get("accept", [])
        accepted = min(len(drafts), forced[i] if i < len(forced) else 0)
    have = len(rq.output_token_ids)
    return [r["output"][j] if j < len(r["output"]) else 7 for j in range(have, have + accepted + 1)]


def _propose(sched: Scheduler, ids: list[str], k: int, max_model_len: int) -> None:
    """K drafts for every scheduled request still running, cut at max_model_len (vLLM's n-gram proposer); the
    scheduler keeps them for requests past their prefill only."""
    live = [rid for rid in ids if rid in sched.requests and not sched.requests[rid].is_finished()]
    drafts = [[11] * max(0, min(k, max_model_len - sched.requests[rid].num_tokens)) for rid in live]
    sched.update_draft_token_ids(DraftTokenIds(req_ids=live, draft_token_ids=drafts))


def main() -> None:
    model_dir = json.loads(sys.stdin.readline())["model_dir"]
    for line in sys.stdin:  # one workload a line, answered at once (a test keeps one driver running)
        if line.strip():
            sys.stdout.write(json.dumps(run(model_dir, json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
