"""What a new user meets first: each mistake is one line saying what to do, and a port that nothing
listens on is free, whatever its old connections left behind."""

from __future__ import annotations

import argparse
import socket
import time
import tomllib

import pytest

from kvemu.cli import main
from kvemu.up import add_cluster_args, validate
from kvemu.up_plan import port_free
from loadgen.formats import read_at_block_size, write_kvemu
from loadgen.trace import Trace, TraceRequest
from shared.errors import InputError
from tests.conftest import REPO
from tests.support.kvemu_cli import run_kvemu


def _error(capsys, *argv: str) -> str:
    """The whole of stderr of ``kvemu ARGV`` run in this process, which must exit with status 2."""
    capsys.readouterr()
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse's own mistakes exit from inside the parser
        status = exc.code
    assert status == 2
    return capsys.readouterr().err


def _time_wait_port() -> int:
    """A port whose listener is closed and whose one connection it closed first sits in TIME-WAIT,
    as a cluster's does for a minute after it stops."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server's side closes first: its end of the connection waits in TIME-WAIT
    time.sleep(0.05)
    client.close()
    srv.close()
    return port


def test_a_port_in_time_wait_is_free_and_a_listened_one_is_not():
    port = _time_wait_port()
    with socket.socket() as probe:  # what port_free did before: a bind without SO_REUSEADDR fails
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
    assert port_free(port)
    p = argparse.ArgumentParser()
    add_cluster_args(p, replicas=1)
    args = p.parse_args(["--capacity-blocks", "100"])
    args.port = port
    validate(args)  # kvemu up's check passes
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        args.port = listener.getsockname()[1]
        assert not port_free(args.port)
        with pytest.raises(InputError, match=f"--port: port {args.port} on 127.0.0.1 is in use"):
            validate(args)


def test_version_is_the_installed_distributions():
    out = run_kvemu("--version", timeout=30)
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (out.returncode, out.stdout, out.stderr) == (0, f"kvemu {want}\n", "")


def test_a_misspelt_flag_or_command_gets_the_one_meant(capsys):
    sim = ("sim", "--workload", "chat", "--duration", "5", "--capacity-blocks", "100")
    assert _error(capsys, *sim, "--polcy", "lru") == "error: unknown flag --polcy: did you mean --policy?\n"
    assert _error(capsys, *sim, "--routng=session") == "error: unknown flag --routng: did you mean --routing?\n"
    assert _error(capsys, *sim, "--zzzz") == "error: unrecognized argument --zzzz (kvemu sim --help lists every flag)\n"
    assert _error(capsys, "smi") == "error: unknown command 'smi': did you mean sim?\n"
    assert _error(capsys).startswith("error: give a command, one of gen, trace-stats, ")


# (no capacity flag is no mistake: vLLM's default, tests/kvemu/test_default_capacity.py)
SOURCE = "error: give one of --workload or --trace (the requests); kvemu {} --help lists every flag\n"


@pytest.mark.parametrize("argv", [("sim",), ("sweep", "--out", "x.jsonl")])
def test_no_requests_is_one_line_naming_the_flags(capsys, argv):
    assert _error(capsys, *argv) == SOURCE.format(argv[0])


def test_a_real_process_prints_one_line_not_a_usage_block():
    out = run_kvemu("sim", timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", SOURCE.format("sim"))


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000"])
def test_a_url_without_a_scheme_says_so(capsys, url):
    assert _error(capsys, "replay", "--url", url, "--workload", "chat") == \
        f"error: --url: '{url}' has no scheme: give http://{url}\n"


def test_a_hash_trace_keeps_its_own_block_size(capsys, tmp_path):
    line = _error(capsys, "sim", "--trace", "mooncake-conversation", "--block-size", "16", "--capacity-tokens",
                  "9358848", "--cache-only", "--quiet")
    assert line == ("error: --block-size: mooncake-conversation's hash ids each stand for a block of 512 tokens,"
                    " which cannot be cut into blocks of 16: drop --block-size (the run takes the trace's 512), or"
                    " study 16-token blocks on a preset (--workload) or a request log (--format openai)\n")
    assert read_at_block_size("mooncake-conversation", "auto", 512).block_size == 512
    # a kvemu trace says its size in its header; one without a header's block_size takes the one given
    reqs = [TraceRequest(0.0, "a", 0, [1, 2], 40, 1)]
    write_kvemu(Trace(reqs, block_size=32), tmp_path / "with.jsonl")
    with pytest.raises(InputError, match="--block-size: .*with.jsonl's hash ids each stand for a block of 32 tokens"):
        read_at_block_size(tmp_path / "with.jsonl", "auto", 16)
    (tmp_path / "bare.jsonl").write_text('{"t": 0, "session": "a", "turn": 0, "hash_ids": [1, 2],'
                                         ' "input_tokens": 40, "output_tokens": 1}\n')
    assert read_at_block_size(tmp_path / "bare.jsonl", "auto", 20).block_size == 20


def test_kvemu_pool_runs_kvemu_store_after_a_one_line_deprecation_note(capsys):
    from kvemu.cli import main

    assert main(["pool", "--shared-cache-gib", "0"]) == 2  # the store's own refusal: it ran
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "note: `kvemu pool` is deprecated and goes in the next release: use `kvemu store`"
    assert err[1].startswith("error: --shared-cache-gib: a ") and len(err) == 2
    assert main(["store", "--shared-cache-gib", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --shared-cache-gib")


@pytest.mark.parametrize("command, old, new, dest", [
    ("replica", "--shared-pool-url", "--shared-store-url", "shared_store_url"),
    ("sim", "--shared-pool-gbps", "--shared-store-gbps", "shared_store_gbps"),
    ("router", "--shared-pool", "--shared-store", "shared_store"),
    ("store", "--pool-id", "--store-id", "store_id"),
])
def test_each_renamed_store_flag_still_takes_its_old_spelling_and_help_names_the_new_first(command, old, new, dest):
    from kvemu.cli import SUBCOMMANDS, build_parser
    from kvemu.cli import parse_args as kvemu_args

    need = {"sim": ["--workload", "chat"], "router": ["--replicas", "http://127.0.0.1:1"]}.get(command, [])
    assert getattr(kvemu_args([command, *need, old, "7"]), dest) == getattr(kvemu_args([command, *need, new, "7"]), dest)
    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    assert next(a.option_strings for a in sub._actions if new in a.option_strings)[:2] == [new, old]
    assert SUBCOMMANDS["pool"][0] == SUBCOMMANDS["store"][0]
