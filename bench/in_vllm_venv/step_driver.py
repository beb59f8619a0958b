"""Drive vLLM's own v1 scheduler step by step (run by bench/record_vllm_steps.py inside its vLLM
virtualenv; it imports vLLM and the standard library only, never kvemu).

Reads JSON lines on stdin: first ``{"model_dir"}``, then one workload a line as
bench/record_vllm_steps.py writes it (settings, requests with token ids, arrival and abort steps).
Answers each with one JSON line on stdout: its header (vLLM's version, the settings) and its steps.

The scheduler is built as vLLM's unit tests build one (tests/v1/core/utils.py ``create_scheduler``):
a model config read from a local config.json with no weights and no tokenizer, a KV cache config of
one full-attention group with the asked number of blocks, and no GPU. Each step: the requests that
arrive at it are added (one over ``max_model_len`` is refused as vLLM's serving front end refuses
it: never added), the aborts of that step applied (``finish_requests`` with FINISHED_ABORTED), then
``schedule()``, a model-runner output that samples the request's next output token for every
scheduled request whose prompt is done (nothing for a partial prefill chunk), ``update_from_output()``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
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
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    kv_cache_config = KVCacheConfig(
        num_blocks=s["num_blocks"], kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=s["block_size"], num_kv_heads=1,
                                                                       head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = s["num_blocks"]
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=s["block_size"])


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
        sampled = []
        for rid in ids:
            rq = sched.requests[rid]
            if rq.num_computed_tokens >= rq.num_tokens:
                sampled.append([reqs[rid]["output"][len(rq.output_token_ids)]])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                                sampled_token_ids=sampled)
        eco = sched.update_from_output(out, mro)
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


def main() -> None:
    model_dir = json.loads(sys.stdin.readline())["model_dir"]
    for line in sys.stdin:  # one workload a line, answered at once (a test keeps one driver running)
        if line.strip():
            sys.stdout.write(json.dumps(run(model_dir, json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
