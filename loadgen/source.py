"""Where requests come from, for every command that takes them: a trace file or a generated preset
(its flags are ``kvemu.options.source``)."""

from __future__ import annotations

from loadgen.formats import TOKEN_FORMATS, detect_format, read_at_block_size
from loadgen.trace import HASHES_U64, Trace
from shared.errors import InputError
from shared.overrides import parse_pairs


def load_source(args, unit: int | None = None, tokens: bool = False) -> Trace:
    """The requests ``args`` name. ``unit``: the tokens per block (or radix page) to hash prompts in, for
    sources that carry their tokens (presets are cut at it; a trace of hashes keeps its own, and one that
    states another is refused: ``read_at_block_size``). ``tokens``: the run matches by token (radix), which a
    trace of block hashes cannot give: refused, naming what can."""
    if args.trace:
        fmt = detect_format(args.trace) if args.format == "auto" else args.format
        # a trace of hashes keeps its own block size (and under radix is refused just below)
        trace = read_at_block_size(args.trace, fmt, unit if fmt in TOKEN_FORMATS or not tokens else None)
        if tokens and not trace.meta.get("tokens"):
            raise InputError("--matching", f"radix matches prompts token by token, but {trace_name(args.trace)} carries"
                                           f" only block hashes ({trace.block_size} tokens a block), which cannot be"
                                           " cut into pages: use a preset (--workload), a request log (--format openai) or"
                                           " --matching blocks")
        return trace
    from loadgen.workloads import generate

    if args.duration <= 0:
        raise InputError("--duration", f"must be positive, got {args.duration}")
    overrides = parse_pairs(args.set)
    if unit is not None:
        if overrides.get("block_size", str(unit)) != str(unit):
            raise InputError("--set", f"block_size={overrides['block_size']} and --block-size / --page-size {unit}"
                                      " disagree: give one")
        overrides["block_size"] = str(unit)
    trace = generate(args.workload, args.duration, args.seed, overrides)
    trace.meta["tokens"] = True  # a preset is a token stream: cut at any block or page size
    trace.meta[HASHES_U64] = True  # chained by xxhash
    return trace


def trace_name(source: str) -> str:
    """What a figure calls a trace: a built-in name, a file's base name, or '<name> preset'."""
    from loadgen.formats import BUILTIN_TRACES
    from loadgen.workloads import PRESETS

    source = str(source)
    base = source.replace("\\", "/").rsplit("/", 1)[-1]
    for name, file in BUILTIN_TRACES.items():
        if base == file:
            return name
    return f"{source} preset" if source in PRESETS else base
