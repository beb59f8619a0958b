"""vLLM's admission and capacity rules as flags, for sim, sweep, replica and up:
``--max-model-len N`` (a request whose prompt plus max_tokens exceeds it is refused; default the
model's context window) and ``--gpu-memory-utilization U`` (the KV capacity vLLM's profiling run
leaves: ``shared.costmodel.CostModel.kv_budget``; an alternative to --capacity-gib / --capacity-blocks).
With no capacity flag at all every command sizes the pool as vLLM does by default, at
``DEFAULT_GPU_MEMORY_UTILIZATION`` (``default_capacity``).

vLLM refuses to start where the KV pool cannot hold one request of ``max_model_len`` tokens; kvemu
prints ``length_warning``'s one line and goes on with the pool's size as the limit
(``replica.core.sched.sched_types.max_model_len_for``), so a sweep over small capacities still runs."""

from __future__ import annotations

from kvemu.options.option import Option
from shared.errors import InputError
from shared.hashing import DEFAULT_BLOCK_SIZE

MAX_MODEL_LEN = Option("--max-model-len", None, type=int, metavar="N",
                       help="vLLM's length rule: a request whose prompt plus max_tokens exceeds N tokens is refused"
                            " (live: 400; virtual: counted as refused); default: the model's context window")
# vLLM's default gpu_memory_utilization: the capacity of every command (sim, sweep, replica, up, the Python
# API) where no capacity flag is given, through the one memory rule (shared/memory_rule.py)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
_UTIL_HELP = ("KV capacity as vLLM sizes it: U x each GPU's memory, less its share of the weights and the activation"
              " memory of the largest step (--token-budget tokens), over --tp GPUs; 0 < U <= 1 (docs/capacity.md);"
              f" default {DEFAULT_GPU_MEMORY_UTILIZATION:g}, vLLM's, where no capacity flag is given")
GPU_MEMORY_UTILIZATION = Option("--gpu-memory-utilization", None, type=float, metavar="U", help=_UTIL_HELP)
# sim and sweep take a list, as their other capacity flags do
GPU_MEMORY_UTILIZATIONS = Option("--gpu-memory-utilization", None, metavar="U1,U2,...", help=_UTIL_HELP)
# --capacity-blocks counts blocks of --block-size tokens; under --matching radix, which has pages and no
# --block-size, blocks of the size --block-size defaults to (vLLM's 16), converted to pages: one number is
# one memory in either mode (pages of 1 would otherwise make it 16x less).
RADIX_BLOCK_TOKENS = DEFAULT_BLOCK_SIZE
_BLOCKS_HELP = (f"KV blocks of --block-size tokens per replica (under --matching radix, blocks of {RADIX_BLOCK_TOKENS}"
                " tokens, turned into pages)")
_TOKENS_HELP = "KV tokens per replica, in either --matching (rounded down to whole blocks or pages)"
_GIB_HELP = "GiB of KV per replica (uses --model)"
# A replica's KV capacity: at most one of these (a mutually exclusive group); none is
# --gpu-memory-utilization DEFAULT_GPU_MEMORY_UTILIZATION (default_capacity)
CAPACITY_BLOCKS = Option("--capacity-blocks", None, _BLOCKS_HELP, int)
CAPACITY_TOKENS = Option("--capacity-tokens", None, _TOKENS_HELP, int)
CAPACITY_GIB = Option("--capacity-gib", None, _GIB_HELP, float)
CAPACITY_OPTIONS = (CAPACITY_BLOCKS, CAPACITY_TOKENS, CAPACITY_GIB, GPU_MEMORY_UTILIZATION)
# sim and sweep take a list of each, one run per value
SIM_CAPACITY_OPTIONS = (Option("--capacity-blocks", None, _BLOCKS_HELP, metavar="N1,N2,..."),
                        Option("--capacity-tokens", None, _TOKENS_HELP, metavar="T1,T2,..."),
                        Option("--capacity-gib", None, _GIB_HELP, metavar="G1,G2,..."), GPU_MEMORY_UTILIZATIONS)

CAPACITY_WAYS_OUT = "--capacity-gib / --capacity-tokens / --capacity-blocks / --gpu-memory-utilization"


def default_capacity(args, listed: bool = False) -> bool:
    """Where none of the capacity flags is given, vLLM's default: ``--gpu-memory-utilization``
    ``DEFAULT_GPU_MEMORY_UTILIZATION`` (``listed``: as sim's and sweep's comma-separated text), so that the
    start line, the JSON's ``memory_rule`` and a P/D pool on another GPU follow the one rule as for the flag.
    True where the default was taken."""
    if any(getattr(args, o.dest, None) is not None for o in CAPACITY_OPTIONS):
        return False
    value = DEFAULT_GPU_MEMORY_UTILIZATION
    args.gpu_memory_utilization = f"{value:g}" if listed else value
    return True


def capacity_in_tokens(flag: str, value: int, mode: str) -> int | None:
    """The tokens ``--capacity-blocks`` / ``--capacity-tokens`` ``value`` asks for where the pool does not
    count blocks of the flag's own unit (``--capacity-tokens``; ``--capacity-blocks`` under radix: blocks
    of ``RADIX_BLOCK_TOKENS``); None where ``value`` is the pool's own count (blocks mode's blocks)."""
    if flag == "--capacity-tokens":
        return value
    return value * RADIX_BLOCK_TOKENS if mode == "radix" else None


def pool_units(flag: str, value: int, tokens: int, unit: int, mode: str) -> tuple[int, str | None]:
    """The whole blocks (pages under radix) of ``unit`` tokens that ``tokens`` hold, and the note that
    says so where that is not exact (the rest is dropped); a pool of none is refused, naming ``flag``."""
    what = "page" if mode == "radix" else "block"
    units = tokens // unit
    if units < 1:
        given = f"{tokens:,} tokens" if flag == "--capacity-tokens" else f"{value:,} ({tokens:,} tokens)"
        raise InputError(flag, f"{given} is less than one {what} of {unit} tokens: give more")
    if units * unit == tokens:
        return units, None
    asked = f"{flag} {value:,}" + (f" ({tokens:,} tokens)" if flag != "--capacity-tokens" else "")
    return units, (f"note: {asked} is not a whole number of {what}s of {unit} tokens: the pool holds {units:,}"
                   f" ({units * unit:,} tokens)")


def length_warning(asked: int, from_flag: bool, capacities: int | list[int], block_size: int,
                   mode: str = "blocks") -> str | None:
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
    unit = f"KV {'pages' if mode == 'radix' else 'blocks'} of {block_size} token{'s' if block_size > 1 else ''}"
    return (f"warning: {what} needs {need:,} {unit} but the pool holds {short[0]:,}"
            f" ({pool_tokens:,} tokens){more}, where vLLM would refuse to start: give a larger capacity"
            f" ({CAPACITY_WAYS_OUT}) or --max-model-len {pool_tokens:,} or less; going on with {limit}")


def replica_capacity(args, mode: str) -> dict:
    """The capacity flags as ``ReplicaSettings`` fields: under radix ``--capacity-blocks N`` is the
    ``N x RADIX_BLOCK_TOKENS`` tokens it means, which the replica rounds down to whole pages."""
    blocks: int | None = args.capacity_blocks
    tokens: int | None = getattr(args, "capacity_tokens", None)
    if blocks is not None and mode == "radix":
        tokens = blocks * RADIX_BLOCK_TOKENS
        blocks = None
    return {"capacity_blocks": blocks, "capacity_tokens": tokens, "capacity_gib": args.capacity_gib,
            "gpu_memory_utilization": args.gpu_memory_utilization}


def capacity_note(args, block_size: int, mode: str) -> str | None:
    """The note (or the one-line error, naming the flag) where ``--capacity-blocks`` / ``--capacity-tokens``
    is not a whole number of the pool's blocks or pages; None where it is, or neither was given."""
    for flag, value in (("--capacity-blocks", args.capacity_blocks),
                        ("--capacity-tokens", getattr(args, "capacity_tokens", None))):
        tokens = None if value is None else capacity_in_tokens(flag, value, mode)
        if value is not None and tokens is not None:
            return pool_units(flag, value, tokens, block_size, mode)[1]
    return None
