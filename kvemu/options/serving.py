"""The serving flags: body limits, connection caps and timeouts every server process takes
(router and replica, and `kvemu up` for both), and the cluster token. Their defaults are
``ServingSettings``'s own, read from the dataclass so a flag cannot drift from its field.

The cluster token is the one given (``--cluster-token``, else ``KVEMU_CLUSTER_TOKEN``), else, for a
process bound to loopback, the one its user's processes on this host share through a private file
(``shared.runtime_dir``): never none, so internal endpoints are never open. Beyond loopback a token
must be given (a file on one host cannot reach the others)."""

from __future__ import annotations

import argparse
import os

from kvemu.options.option import Option
from shared.auth import is_loopback
from shared.runtime_dir import cluster_token_path, shared_cluster_token
from shared.serving import SERVING_DEFAULTS, ServingSettings

_D = SERVING_DEFAULTS

# Flag -> ServingSettings field; the seconds fields drop their "_s" on the command line.
SERVER_OPTIONS = (
    Option("--parse-workers", _D["parse_workers"], type=int,
           help="processes that parse bodies of --offload-bytes or more off the event loop (0 = inline)"),
    Option("--offload-bytes", _D["offload_bytes"], type=int, help="bodies from this size on are parsed in those processes"),
    Option("--large-bodies-per-client", _D["large_bodies_per_client"], type=int,
           help="such big bodies one client address may have being parsed at once (429 beyond)"),
    Option("--max-body-bytes", _D["max_body_bytes"], type=int, help="larger request bodies get 413"),
    Option("--max-prompt-tokens", _D["max_prompt_tokens"], type=int, help="longer prompts are refused (400)"),
    Option("--max-output-tokens", _D["max_output_tokens"], type=int, help="a larger max_tokens is refused (400)"),
    Option("--max-connections", _D["max_connections"], type=int, help="open connections beyond which new ones get 503"),
    Option("--max-connections-per-client", _D["max_connections_per_client"], type=int,
           help="a client address's share of --max-connections (default: a quarter of it): below the cap any address"
                " may open more; at the cap, an address holding fewer than this takes the oldest idle connection of"
                " the address holding the most, if that one holds more, and one holding this many gets 503"),
    Option("--header-timeout", _D["header_timeout_s"], type=float, help="seconds for a request head to arrive"),
    Option("--body-timeout", _D["body_timeout_s"], type=float, help="seconds for a request body to arrive"),
    Option("--write-timeout", _D["write_timeout_s"], type=float,
           help="seconds the server may be blocked on a client that reads nothing of its response (the send buffer"
                " full) before the connection is cut"),
)

TOKEN_ENV = "KVEMU_CLUSTER_TOKEN"


def command_line_token_warning(flag: str, env: str) -> str:
    """What a process prints when a token came on its command line, which every local user can read."""
    return (f"warning: {flag} is readable by every user of this host (ps, /proc/PID/cmdline); prefer {env} in"
            " the environment")


COMMAND_LINE_TOKEN_WARNING = command_line_token_warning("--cluster-token", TOKEN_ENV)
_TOKEN_HELP = ("shared by the cluster's routers and replicas: guards /kv/* (or KVEMU_CLUSTER_TOKEN); required with a"
               " --host beyond loopback; default on loopback: the one in the runtime directory's cluster-token file"
               " (KVEMU_RUNTIME_DIR, else ~/.local/share/kvemu/runtime), made there by the first process to start;"
               f" warning: a token on a command line is readable by every user of this host: prefer {TOKEN_ENV}")


def add_server_args(p: argparse.ArgumentParser, token_help: str = _TOKEN_HELP) -> None:
    """The cluster token and every serving flag."""
    p.add_argument("--cluster-token", default=None, help=token_help)
    for option in SERVER_OPTIONS:
        option.add(p)


def given_cluster_token(args: argparse.Namespace) -> str | None:
    """The token given, else the environment's (how `kvemu up` hands it to children: not on a command line)."""
    return getattr(args, "cluster_token", None) or os.environ.get(TOKEN_ENV) or None


def cluster_token(args: argparse.Namespace) -> str | None:
    """The token a process started with ``args`` uses: the one given, else on loopback the shared
    file's (made if missing; TokenFileError in one line if it is not private), else None (which
    ``ServingSettings`` refuses beyond loopback)."""
    given = given_cluster_token(args)
    if given is None and is_loopback(args.host):
        return shared_cluster_token()[0]
    return given


def token_line(args: argparse.Namespace) -> str:
    """What a process prints on stderr at start: where its cluster token is."""
    if getattr(args, "cluster_token", None):
        return "cluster token: from --cluster-token; " + COMMAND_LINE_TOKEN_WARNING
    if os.environ.get(TOKEN_ENV):
        return f"cluster token: from {TOKEN_ENV}"
    return f"cluster token: {cluster_token_path()}"


def serving_settings(args: argparse.Namespace, find_token: bool = True) -> ServingSettings:
    """The serving flags and ``--host`` as one validated ``ServingSettings``; ``find_token=False``
    takes only a given token (a check before any process starts must not make the file)."""
    return ServingSettings(
        host=args.host, cluster_token=cluster_token(args) if find_token else given_cluster_token(args),
        parse_workers=args.parse_workers,
        offload_bytes=args.offload_bytes, large_bodies_per_client=args.large_bodies_per_client,
        max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens, max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout, write_timeout_s=args.write_timeout)
