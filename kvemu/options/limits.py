"""vLLM's admission and capacity rules as flags, for sim, sweep, replica and up:
``--max-model-len N`` (a request whose prompt plus max_tokens exceeds it is refused; default the
model's context window) and ``--gpu-memory-utilization U`` (the KV capacity vLLM's profiling run
leaves: ``shared.costmodel.CostModel.kv_budget``; an alternative to --capacity-gib / --capacity-blocks).

vLLM refuses to start where the KV pool cannot hold one request of ``max_model_len`` tokens; kvemu
prints ``length_warning``'s one line and goes on with the pool's size as the limit
(``replica.core.sched.sched_types.max_model_len_for``), so a sweep over small capacities still runs."""

from __future__ import annotations

from kvemu.options.option import Option

MAX_MODEL_LEN = Option("--max-model-len", None, type=int, metavar="N",
                       help="vLLM's length rule: a request whose prompt plus max_tokens exceeds N tokens is refused"
                            " (live: 400; virtual: counted as refused); default: the model's context window")
_UTIL_HELP = ("KV capacity as vLLM sizes it: U x each GPU's memory, less its share of the weights and the activation"
              " memory of the largest step (--token-budget tokens), over --tp GPUs; 0 < U <= 1 (docs/capacity.md)")
GPU_MEMORY_UTILIZATION = Option("--gpu-memory-utilization", None, type=float, metavar="U", help=_UTIL_HELP)
# sim and sweep take a list, as their other capacity flags do
GPU_MEMORY_UTILIZATIONS = Option("--gpu-memory-utilization", None, metavar="U1,U2,...", help=_UTIL_HELP)
# A live replica's KV capacity: exactly one of these (a mutually exclusive group; kvemu up gives
# --capacity-blocks 20000 where none is)
CAPACITY_BLOCKS = Option("--capacity-blocks", None, "KV blocks per replica", int)
CAPACITY_GIB = Option("--capacity-gib", None, "GiB of KV per replica (uses --model)", float)
CAPACITY_OPTIONS = (CAPACITY_BLOCKS, CAPACITY_GIB, GPU_MEMORY_UTILIZATION)

CAPACITY_WAYS_OUT = "--capacity-gib / --capacity-blocks / --gpu-memory-utilization"


def length_warning(asked: int, from_flag: bool, capacities: int | list[int], block_size: int) -> str | None:
    """One line where a pool of ``capacities`` blocks (or the smallest of several) cannot hold one
    request of ``asked`` tokens (vLLM would refuse to start), with both numbers and the two ways out;
    None where every pool can."""
    caps = [capacities] if isinstance(capacities, int) else sorted(set(capacities))
    short = [c for c in caps if c * block_size < asked]
    if not short:
        return None
    what = f"--max-model-len {asked:,}" if from_flag else f"the model's context window ({asked:,} tokens)"
    need = -(-asked // block_size)
    pool_tokens = short[0] * block_size
    more = f" (and {len(short) - 1} larger capacit{'y' if len(short) == 2 else 'ies'} short of it too)" \
        if len(short) > 1 else ""
    limit = f"{pool_tokens:,} tokens as the limit" if len(short) == 1 else "each such pool's size as its limit"
    return (f"warning: {what} needs {need:,} KV blocks of {block_size} tokens but the pool holds {short[0]:,}"
            f" ({pool_tokens:,} tokens){more}, where vLLM would refuse to start: give a larger capacity"
            f" ({CAPACITY_WAYS_OUT}) or --max-model-len {pool_tokens:,} or less; going on with {limit}")
