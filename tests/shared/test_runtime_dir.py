"""The shared cluster token (shared/runtime_dir.py): where it lives (Jupyter's rule), made owner-only
and once when processes start together, and refused in one line where it is not private."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import stat
import threading
import time

import pytest

from shared import runtime_dir as rd
from shared.errors import InputError
from shared.runtime_dir import TokenFileError, cluster_token_path, read_token_file, runtime_dir, shared_cluster_token


@pytest.fixture
def where(tmp_path, monkeypatch):
    """A runtime directory of the test's own, not made yet."""
    path = tmp_path / "rt"
    monkeypatch.setenv(rd.RUNTIME_DIR_ENV, str(path))
    return path


def test_the_location_is_decided_as_jupyter_decides_its_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(rd.sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(rd.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))  # not used: removed at logout (jupyter_core #143)
    assert runtime_dir() == str(tmp_path / "home" / ".local" / "share" / "kvemu" / "runtime")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert runtime_dir() == str(tmp_path / "data" / "kvemu" / "runtime")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # the XDG spec: a relative one is ignored
    assert runtime_dir() == str(tmp_path / "home" / ".local" / "share" / "kvemu" / "runtime")
    monkeypatch.setenv(rd.RUNTIME_DIR_ENV, str(tmp_path / "mine"))
    assert runtime_dir() == str(tmp_path / "mine")
    assert cluster_token_path() == str(tmp_path / "mine" / "cluster-token")
    monkeypatch.setattr(rd.sys, "platform", "darwin")
    monkeypatch.delenv(rd.RUNTIME_DIR_ENV)
    assert runtime_dir() == str(tmp_path / "home" / "Library" / "kvemu" / "runtime")


def test_the_first_call_makes_an_owner_only_directory_and_file_and_later_ones_read_it(where):
    token, path = shared_cluster_token()
    assert path == str(where / "cluster-token") and len(token) == 32 and int(token, 16) >= 0
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert open(path).read() == token + "\n"
    assert shared_cluster_token() == (token, path) == (read_token_file(path), path)


def test_a_umask_cannot_loosen_or_lock_out_the_owner(where):
    old = os.umask(0o000)
    try:
        token, path = shared_cluster_token()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _race(barrier, out, i):
    barrier.wait()
    try:
        out[i] = shared_cluster_token()[0]
    except Exception as exc:  # reported, not raised in the child
        out[i] = f"error: {exc}"


def test_processes_starting_at_once_agree_on_one_token(tmp_path, monkeypatch):
    """Twelve processes released together on a fresh directory, ten times: one file, one token each time."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        monkeypatch.setenv(rd.RUNTIME_DIR_ENV, str(tmp_path / f"round-{round_}" / "rt"))
        n = 12
        barrier, out = ctx.Barrier(n), ctx.Manager().dict()
        procs = [ctx.Process(target=_race, args=(barrier, out, i)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        tokens = set(out.values())
        assert len(out) == n and len(tokens) == 1, dict(out)
        assert os.listdir(tmp_path / f"round-{round_}" / "rt") == ["cluster-token"]
        assert read_token_file(cluster_token_path()) == tokens.pop()


def test_a_file_being_written_is_waited_for_and_a_token_written_by_hand_is_taken(where):
    where.mkdir(mode=0o700)
    path = where / "cluster-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # made, not written yet

    def write_soon():
        time.sleep(0.2)
        os.write(fd, b"abc123\n")
        os.close(fd)

    t = threading.Thread(target=write_soon)
    t.start()
    assert shared_cluster_token() == ("abc123", str(path))
    t.join()
    path.write_text("my-own-token")  # no newline: still one token
    assert shared_cluster_token()[0] == "my-own-token"


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_file_open_to_others_is_refused_naming_the_path_and_the_fix(where):
    token, path = shared_cluster_token()
    os.chmod(path, 0o644)
    with pytest.raises(TokenFileError) as exc:
        shared_cluster_token()
    assert one_line(exc) == (f"cluster token file {path} is open to group or others (mode 0644): chmod 600 {path} if"
                             f" nobody else can have read it, else remove it (a new token is made), or set"
                             f" KVEMU_RUNTIME_DIR")
    os.chmod(path, 0o600)
    assert shared_cluster_token()[0] == token  # refused, never changed


def test_a_directory_open_to_others_is_refused(where):
    where.mkdir()
    os.chmod(where, 0o755)
    with pytest.raises(TokenFileError) as exc:
        shared_cluster_token()
    assert one_line(exc).startswith(f"cluster token directory {where} is open to group or others (mode 0755):"
                                    f" chmod 700 {where}")
    assert not (where / "cluster-token").exists()  # nothing written into it


def test_a_file_or_directory_of_someone_else_is_refused(where, monkeypatch):
    shared_cluster_token()
    monkeypatch.setattr(rd.os, "geteuid", lambda: os.stat(where).st_uid + 1)
    with pytest.raises(TokenFileError) as exc:
        shared_cluster_token()
    assert one_line(exc).startswith(f"cluster token directory {where} is owned by uid {os.stat(where).st_uid},"
                                    " not by you")
    monkeypatch.setattr(rd, "_refuse_unless_private", _only_files(rd._refuse_unless_private))
    with pytest.raises(TokenFileError) as exc:
        shared_cluster_token()
    assert one_line(exc).startswith(f"cluster token file {where / 'cluster-token'} is owned by uid")


def _only_files(check):
    def checked(path, st, kind, mode):
        if kind == "file":
            check(path, st, kind, mode)

    return checked


@pytest.mark.parametrize("make, says", [
    (lambda p: os.symlink("/etc/hostname", p), "is a symbolic link"),
    (lambda p: os.mkdir(p, 0o700), "is not a regular file"),
    (lambda p: p.write_text("two words\n"), "holds more than one word"),
    (lambda p: p.write_text(""), "is empty: remove it"),
])
def test_what_the_file_must_not_be(where, monkeypatch, make, says):
    monkeypatch.setattr(rd, "_WAIT_FOR_WRITER_S", 0.05)
    where.mkdir(mode=0o700)
    make(where / "cluster-token")
    if (where / "cluster-token").is_file() and not (where / "cluster-token").is_symlink():
        os.chmod(where / "cluster-token", 0o600)
    with pytest.raises(TokenFileError) as exc:
        shared_cluster_token()
    assert says in one_line(exc) and str(where / "cluster-token") in str(exc.value)


def test_a_given_token_is_used_and_nothing_is_written(where, monkeypatch):
    from kvemu.options.serving import cluster_token, token_line

    monkeypatch.delenv("KVEMU_CLUSTER_TOKEN", raising=False)
    args = argparse.Namespace(cluster_token="given", host="127.0.0.1")
    assert cluster_token(args) == "given" and token_line(args).startswith("cluster token: from --cluster-token; warning")
    monkeypatch.setenv("KVEMU_CLUSTER_TOKEN", "from-env")
    args.cluster_token = None
    assert cluster_token(args) == "from-env" and token_line(args) == "cluster token: from KVEMU_CLUSTER_TOKEN"
    assert not where.exists()
    monkeypatch.delenv("KVEMU_CLUSTER_TOKEN")
    assert token_line(args) == f"cluster token: {where / 'cluster-token'}"
    assert cluster_token(args) == read_token_file(str(where / "cluster-token"))


def test_beyond_loopback_the_file_is_not_used_and_a_token_must_be_given(where, monkeypatch):
    from kvemu.options.serving import cluster_token
    from shared.serving import ServingSettings

    monkeypatch.delenv("KVEMU_CLUSTER_TOKEN", raising=False)
    assert cluster_token(argparse.Namespace(cluster_token=None, host="0.0.0.0")) is None
    with pytest.raises(InputError, match="required to bind 0.0.0.0"):
        ServingSettings(host="0.0.0.0", cluster_token=None)
    assert not where.exists()
