"""vLLM v0's step rule (``SchedulerSettings.step_rule = "v0"``; ``--step-rule v0``), the scheduler the
FlashGen paper's baseline ran (vLLM v0's ``Scheduler._schedule_default`` with chunked prefill off).

A step is prefills or decodes, never both. Each step first admits waiting requests in order, each
with its whole prompt (no chunking), while the step's token budget (``max_num_batched_tokens``)
holds their prompts, ``max_num_seqs`` (``max_running``) the running count, and the pool their
blocks (the watermark included); if it admitted any, the step prefills them and the running
requests do not decode ("don't schedule decodes if prefills are scheduled"): v0 prioritises
prefills whenever a waiting request fits. Otherwise the step decodes every running request
(preempting, by recompute, when a decode block is missing). A prompt the budget can never hold is
refused, as v0 refuses one longer than ``min(max_model_len, max_num_batched_tokens)``.

v1 (the default, vLLM today) mixes decodes and prefill chunks in one step and admits by memory
alone: ``scheduler.py``. The budget counts a prompt's tokens before cache hits (with prefix
caching off, as the paper's baseline runs, that is exactly what v0 counts).
"""

from __future__ import annotations

from replica.core.sched.sched_types import SchedRequest, prefill_len
from shared.errors import InputError

STEP_RULES = ("v1", "v0")
DEFAULT_STEP_RULE = "v1"


def check_step_rule(name: str, field: str = "step_rule") -> None:
    if name not in STEP_RULES:
        raise InputError(field, f"must be one of {', '.join(STEP_RULES)}, got {name!r}")


class StepBudget:
    """The prompt tokens one v0 step may still admit (a plain class: the scheduler is compiled)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def takes(self, req: SchedRequest) -> bool:
        """Whether ``req``'s whole prompt (and, preempted, its generated tokens) fits what is left."""
        return prefill_len(req) <= self.left

    def took(self, req: SchedRequest) -> None:
        self.left -= prefill_len(req)


def refusal(req: SchedRequest, token_budget: int) -> InputError | None:
    """v0's prompt limit: a prompt longer than the step's token budget never runs."""
    if req.input_tokens > token_budget:
        return InputError("prompt", f"the prompt has {req.input_tokens} tokens, more than a step of vLLM v0's"
                                    f" (max_num_batched_tokens {token_budget}) holds; raise --token-budget")
    return None
