"""Where one user's kvemu processes on one host meet: the runtime directory, and in it the cluster
token that routers, replicas and ``kvemu up`` started without a token share.

The directory follows Jupyter's (``jupyter_core.paths.jupyter_runtime_dir``): ``$KVEMU_RUNTIME_DIR``
when set, else ``$XDG_DATA_HOME/kvemu/runtime`` (``~/.local/share/kvemu/runtime`` without it, or with
a relative one, which the XDG spec says to ignore; ``~/Library/kvemu/runtime`` on macOS). Not
``$XDG_RUNTIME_DIR``: Jupyter stopped using it (jupyter_core pull request 143) because it is removed
when the user logs out while a server started under nohup or screen still runs (here: a router
started later would make a second token), the spec lets files in it be cleaned after a few hours,
and it is carried over into contexts where it is not the user's (su, sudo, batch schedulers).

The directory must be the user's and private (0700), the file too (0600); anything else is refused
in one line naming the path and what to do, never repaired, since someone else may have read it.
The file is made with ``O_CREAT | O_EXCL``: of processes starting at once, one writes it and the
others read the winner's token.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
import time

from shared.errors import KvemuError

RUNTIME_DIR_ENV = "KVEMU_RUNTIME_DIR"
TOKEN_FILE = "cluster-token"
_WAIT_FOR_WRITER_S = 2.0  # a file another process has just created but not yet written


class TokenFileError(KvemuError):
    """The shared token file or its directory cannot be used; the message names the path and the fix."""


def runtime_dir() -> str:
    """The directory, decided as Jupyter decides its runtime directory (the module's docstring)."""
    given = os.environ.get(RUNTIME_DIR_ENV)
    if given:
        return os.path.abspath(os.path.expanduser(given))
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "kvemu", "runtime")
    data = os.environ.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(data):
        data = os.path.join(home, ".local", "share")
    return os.path.join(data, "kvemu", "runtime")


def cluster_token_path() -> str:
    return os.path.join(runtime_dir(), TOKEN_FILE)


def _refuse_unless_private(path: str, st: os.stat_result, kind: str, mode: str) -> None:
    if st.st_uid != os.geteuid():
        raise TokenFileError(f"cluster token {kind} {path} is owned by uid {st.st_uid}, not by you (uid"
                             f" {os.geteuid()}): set {RUNTIME_DIR_ENV} to a directory of your own, or give"
                             " --cluster-token / KVEMU_CLUSTER_TOKEN")
    if st.st_mode & 0o077:
        raise TokenFileError(f"cluster token {kind} {path} is open to group or others (mode"
                             f" {stat.S_IMODE(st.st_mode):04o}): chmod {mode} {path} if nobody else can have read"
                             f" it, else remove it (a new token is made), or set {RUNTIME_DIR_ENV}")


def private_runtime_dir() -> str:
    """The runtime directory, made (0700) if missing; refused when not a directory of this user's
    that only this user can enter."""
    path = runtime_dir()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TokenFileError(f"cannot make the cluster token directory {path} ({exc.strerror}): set"
                             f" {RUNTIME_DIR_ENV} to a directory you can write, or give --cluster-token") from None
    st = os.stat(path)  # a symbolic link is followed: the directory it names is the one that must be private
    if not stat.S_ISDIR(st.st_mode):
        raise TokenFileError(f"cluster token directory {path} is not a directory: remove it, or set {RUNTIME_DIR_ENV}")
    _refuse_unless_private(path, st, "directory", "700")
    return path


def shared_cluster_token() -> tuple[str, str]:
    """``(token, path)``: the token in the runtime directory's file, made there (a random one) by
    the first process to ask. TokenFileError (one line) for a file or directory that is not private."""
    path = os.path.join(private_runtime_dir(), TOKEN_FILE)
    token = secrets.token_hex(16)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_token_file(path), path
    except OSError as exc:
        raise TokenFileError(f"cannot make the cluster token file {path} ({exc.strerror}): set {RUNTIME_DIR_ENV}"
                             " to a directory you can write, or give --cluster-token") from None
    try:
        os.fchmod(fd, 0o600)  # exactly: a umask could have taken the owner's read bit too
        os.write(fd, (token + "\n").encode())  # one write: a reader sees nothing or all of it
        os.fsync(fd)
    finally:
        os.close(fd)
    return token, path


def read_token_file(path: str) -> str:
    """The token in ``path``, a regular file of this user's that only this user can read. A file
    still empty (its maker is between creating and writing it) is read again for a moment."""
    deadline = time.monotonic() + _WAIT_FOR_WRITER_S
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise TokenFileError(f"cluster token file {path} is a symbolic link: remove it (a new token is"
                                     f" made), or set {RUNTIME_DIR_ENV}") from None
            raise TokenFileError(f"cannot read the cluster token file {path} ({exc.strerror}): remove it (a new"
                                 " token is made), or give --cluster-token") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TokenFileError(f"cluster token file {path} is not a regular file: remove it, or set"
                                     f" {RUNTIME_DIR_ENV}")
            _refuse_unless_private(path, st, "file", "600")
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        token = data.decode("utf-8", errors="replace").strip()
        if token:
            if not token.isprintable() or any(c.isspace() for c in token):
                raise TokenFileError(f"cluster token file {path} holds more than one word: write one token on"
                                     " one line, or remove it (a new token is made)")
            return token
        if time.monotonic() > deadline:
            raise TokenFileError(f"cluster token file {path} is empty: remove it (a new token is made), or write a"
                                 " token in it")
        time.sleep(0.01)
