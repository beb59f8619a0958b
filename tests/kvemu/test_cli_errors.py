"""Issue 17, item 10: what a user can type is one error line, never a traceback."""

import pytest

from tests.support.kvemu_cli import run_kvemu


def _error_line(*args: str) -> str:
    out = run_kvemu(*args, timeout=60)
    assert out.returncode == 2, out.stderr[-500:]
    assert "Traceback" not in out.stderr
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_capacity_gib_must_be_finite(capsys, value):
    assert _refused(capsys, "replica", "--capacity-gib", value) == \
        f"error: capacity_gib: must be a finite number > 0, got {value}"
    assert _refused(capsys, "up", "--capacity-gib", value) == \
        f"error: --capacity-gib: must be a finite number > 0, got {value}"
    assert _refused(capsys, "sim", "--workload", "chat", "--duration", "5", "--capacity-gib", value) == \
        f"error: --capacity-gib: must be a finite positive number, got {value}"


def test_sim_names_and_replicas_are_checked_before_capacity(capsys):
    line = _refused(capsys, "sim", "--workload", "chat", "--duration", "5", "--capacity-gib", "0.00001", "--policy", "nope")
    assert line.startswith("error: unknown policy 'nope'; valid: ")
    assert _refused(capsys, "sim", "--workload", "chat", "--duration", "5", "--capacity-gib", "0.00001",
                    "--replicas", "0") == ("error: --replicas: the cluster has no replica: give --replicas N or"
                                          " --prefill-replicas P --decode-replicas D")


# Issue 25, item 5: a flag that would do nothing is refused in one line naming it and why; a flag
# at its default never is (`--tier-mode exclusive` alone runs).
SIM_BASE = ("sim", "--workload", "chat", "--duration", "30", "--capacity-blocks", "30000", "--quiet")
NO_TIER = "does nothing without a memory tier below HBM: add --host-cache-gib or --ssd-cache-gib"
CACHE_ONLY = "does nothing with --cache-only (requests replayed one at a time, no scheduler and no clock)"


def _refused(capsys, *args: str) -> str:
    """The one error line of ``kvemu ARGS`` run in this process (exit status 2), fast enough for a
    grid of flags; ``test_a_refusal_is_one_line_from_a_real_process`` runs one as a process."""
    from kvemu.cli import main

    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err.strip()


def test_a_refusal_is_one_line_from_a_real_process():
    for command in (SIM_BASE, ("replica", "--capacity-blocks", "100"), ("up", "--port", "0")):
        assert _error_line(*command, "--no-hbm-caching") == f"error: --no-hbm-caching: {NO_TIER}"


@pytest.mark.parametrize("command", [
    SIM_BASE,
    ("sweep", "--workload", "chat", "--duration", "30", "--capacity-blocks", "30000", "--quiet", "--out", "/tmp/x"),
    ("replica", "--capacity-blocks", "100"),
    ("up", "--port", "0"),
])
@pytest.mark.parametrize("flags", [["--no-hbm-caching"], ["--tier-policy", "host=s3fifo"], ["--tier-mode", "inclusive"],
                                   ["--fetch", "always"], ["--host-link-gbps", "12"]])
def test_tier_flags_without_a_tier_are_refused(capsys, command, flags):
    assert _refused(capsys, *command, *flags) == f"error: {flags[0]}: {NO_TIER}"


@pytest.mark.parametrize("command", [SIM_BASE, ("replica", "--capacity-blocks", "100"),
                                     ("up", "--port", "0", "--capacity-blocks", "20000")])  # llama-3-70b fits no H200
def test_a_tier_smaller_than_one_block_is_refused_with_the_smallest_size(capsys, command):
    line = _refused(capsys, *command, "--model", "llama-3-70b", "--host-cache-gib", "0.001")
    assert line == ("error: --host-cache-gib: 0.001 GiB holds 0 blocks of 16 tokens of this model's KV (one block is"
                    " 5 MiB): give at least 0.00489 GiB, or 0 for no tier")
    assert _refused(capsys, *command, "--ssd-cache-gib", "0.0001").startswith("error: --ssd-cache-gib: 0.0001 GiB holds 0")


@pytest.mark.parametrize("flags", [["--scheduler", "reorder"], ["--token-budget", "4096"], ["--max-running", "4"],
                                   ["--watermark", "0.01"], ["--no-decode-kv"], ["--causal"]])
@pytest.mark.parametrize("command", ["sim", "sweep"])
def test_scheduler_and_clock_flags_with_cache_only_are_refused(capsys, command, flags):
    base = SIM_BASE if command == "sim" else ("sweep", *SIM_BASE[1:], "--out", "/tmp/x")
    assert _refused(capsys, *base, "--cache-only", *flags) == f"error: {flags[0]}: {CACHE_ONLY}: drop one of the two"


@pytest.mark.parametrize("flags", [["--routing", "session"], ["--routing-set", "bounded_load_factor=2"]])
def test_routing_with_one_replica_is_refused(capsys, flags):
    want = f"error: {flags[0]}: does nothing with one replica (every request goes to it): add --replicas N"
    assert _refused(capsys, *SIM_BASE, *flags) == want
    assert _refused(capsys, "sweep", *SIM_BASE[1:], "--out", "/tmp/x", *flags) == want


@pytest.mark.parametrize("command", [("replica", "--capacity-blocks", "100"), ("up", "--port", "0")])
@pytest.mark.parametrize("flags", [["--device", "cuda"], ["--layers", "2"]])
def test_backend_flags_without_the_torch_backend_are_refused(capsys, command, flags):
    assert _refused(capsys, *command, *flags) == \
        f"error: {flags[0]}: does nothing without the torch backend: add --backend torch"


def test_flags_at_their_defaults_are_not_refused(tmp_path):
    out = run_kvemu(*SIM_BASE, "--tier-mode", "exclusive", "--fetch", "auto", "--routing", "cache_aware",
                    "--json", str(tmp_path / "r.json"), timeout=120)
    assert out.returncode == 0, out.stderr[-500:]


LIVE_AND_SIM = [SIM_BASE, ("replica", "--capacity-blocks", "100"), ("up", "--port", "0")]


@pytest.mark.parametrize("command", LIVE_AND_SIM)
def test_ssd_drives_without_an_ssd_tier_are_refused(capsys, command):
    for tiers in ((), ("--host-cache-gib", "1")):
        assert _refused(capsys, *command, *tiers, "--ssd-drives", "2") == (
            "error: --ssd-drives: does nothing without an SSD tier: add --ssd-cache-gib, or drop it")
    assert _refused(capsys, *command, "--ssd-cache-gib", "1", "--ssd-drives", "0") == (
        "error: --ssd-drives: must be an integer >= 1, got 0")


@pytest.mark.parametrize("command", LIVE_AND_SIM)
def test_loans_without_reorder_and_a_watermark_out_of_range_are_refused(capsys, command):
    assert _refused(capsys, *command, "--max-loans", "3") == (
        "error: --max-loans: does nothing with --scheduler fcfs (nothing is admitted ahead of its turn): add"
        " --scheduler reorder, or drop it")
    assert _refused(capsys, *command, "--scheduler", "reorder", "--max-loans", "0") == (
        "error: --max-loans: must be an integer >= 1, got 0")
    assert _refused(capsys, *command, "--watermark", "0.9") == (
        "error: --watermark: must be a number >= 0 and <= 0.5, got 0.9")
