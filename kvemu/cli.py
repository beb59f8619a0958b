"""``kvemu`` console script: one subcommand per module, imported lazily.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``.
User errors (``KvemuError``) print one ``error:`` line and exit 2, never a traceback; so do the
command line's own mistakes (``kvemu.program.Parser``: a misspelt flag gets the one meant).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvemu.options.config_file import config_argv
from kvemu.program import Parser, run_parsed
from shared.errors import KvemuError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "gen": ("kvemu.gen_cmd", "generate a workload preset into a trace JSONL file"),
    "trace-stats": ("kvemu.stats_cmd", "summarise a trace: requests, blocks, reuse, sessions"),
    "audit": ("kvemu.audit_cmd", "prompt-cache audit of a request log (OpenAI bodies): where prompts part, why, hit ratios"),
    "demo": ("kvemu.demo", "up + replay a short built-in workload + report, then shut down"),
    "up": ("kvemu.up", "start a router and N replicas as local processes"),
    "replay": ("kvemu.replay_cmd", "replay a trace or preset against a running cluster"),
    "router": ("kvemu.router_cmd", "run the cache-aware router in front of replicas"),
    "replica": ("kvemu.replica_cmd", "run one replica: an emulated GPU serving over HTTP"),
    "store": ("kvemu.store_cmd", "run the shared KV store (every replica of its scope reads and writes it)"),
    "pool": ("kvemu.store_cmd", "deprecated spelling of `kvemu store`, kept for one release"),
    "kv-events": ("kvemu.kv_events_cmd", "print vLLM's KV events (--kv-events-config) from a replica or vLLM as JSON lines"),
    "sim": ("kvemu.sim_cmd", "virtual-time run of policies x capacities over a trace or preset"),
    "sweep": ("kvemu.sweep_cmd", "policies x capacities x routings x replica counts in parallel, resumable"),
    "estimate": ("kvemu.estimate_cmd", "mean-field LRU hit ratio (or capacity for a target) of scm or a trace"),
    "calibrate": ("kvemu.calibrate", "time a model's layers on this device (torch) and fit the cost model: a device profile"),
    "compare": ("kvemu.compare_cmd", "a measured run beside a predicted one of the same requests: TTFT, TPOT, E2E errors"),
}

# old command names kept for one release: each runs the new one after a one-line note on stderr
DEPRECATED_COMMANDS = {"pool": "store"}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Only the chosen subcommand's module is imported: `kvemu gen` never loads aiohttp."""
    parser = Parser(prog="kvemu", description="Emulate an LLM serving cluster built around its KV cache.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.configure(sp)
            sp.set_defaults(_run=module.run)
    return parser


def version() -> str:
    """The installed distribution's version (pyproject.toml's), or a word saying there is none."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kvemu")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed: pip install -e .)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The parsed command line, with a ``--config`` file's settings under the flags given."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in SUBCOMMANDS else None)
    if chosen in SUBCOMMANDS:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[chosen]
        at = argv.index(chosen)
        argv = argv[:at + 1] + config_argv(sub, argv[at + 1:])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except KvemuError as exc:  # a bad --config file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command in DEPRECATED_COMMANDS:
        new = DEPRECATED_COMMANDS[args.command]
        print(f"note: `kvemu {args.command}` is deprecated and goes in the next release: use `kvemu {new}`",
              file=sys.stderr, flush=True)
    return run_parsed(args._run, args)


if __name__ == "__main__":
    sys.exit(main())
