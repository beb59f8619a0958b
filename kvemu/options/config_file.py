"""``--config FILE.toml``: any subcommand's flags from a TOML file (``tomllib``), flags winning.

Keys are the long flag names without the dashes (``capacity_blocks`` or ``capacity-blocks``).
Values: strings and numbers as on the command line; a list for a comma-separated flag
(``policy = ["lru", "s3fifo"]``) or a repeatable one (``set = ["a=1", "b=2"]``, or a table
``[set]`` of ``name = value``); ``true`` for a switch. The file becomes command-line
arguments placed before the real ones, and a flag given on the command line (or one of its
mutually exclusive group) drops the file's value, so flags always override the file (a
repeatable flag given on the command line replaces the file's list).
"""

from __future__ import annotations

import argparse
import tomllib

from shared.errors import InputError


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml",
                   help="read any of these flags from a TOML file (keys: flag names); flags given here win")


def config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv):
                raise InputError("--config", "expected a TOML file after it")
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InputError("--config", f"no file {path}") from None
    except OSError as exc:
        raise InputError("--config", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError("--config", f"{path} is not valid TOML: {exc}") from None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt[2:]: a for a in parser._actions for opt in a.option_strings
            if opt.startswith("--") and opt not in ("--help", "--config")}


def _given(action: argparse.Action, argv: list[str]) -> bool:
    return any(arg == opt or arg.startswith(opt + "=") for arg in argv for opt in action.option_strings)


def _group_given(parser: argparse.ArgumentParser, action: argparse.Action, argv: list[str]) -> bool:
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions and any(_given(a, argv) for a in group._group_actions):
            return True
    return _given(action, argv)


def _scalar(key: str, value, path: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{path}: {key}", f"expected a string or a number, got {type(value).__name__}")
    return str(value)


def _values(key: str, action: argparse.Action, value, path: str) -> list[str]:
    flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise InputError(f"{path}: {key}", f"expected true or false, got {value!r}")
        return [flag] if value else []
    if isinstance(action, argparse._AppendAction):
        if isinstance(value, dict):
            value = [f"{k}={_scalar(key, v, path)}" for k, v in value.items()]
        items = value if isinstance(value, list) else [value]
        return [x for item in items for x in (flag, _scalar(key, item, path))]
    if isinstance(value, list):
        return [flag, ",".join(_scalar(key, v, path) for v in value)]
    return [flag, _scalar(key, value, path)]


def config_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with the ``--config`` file's settings in front (none when there is no --config)."""
    path = config_path(argv)
    if path is None:
        return argv
    options = _options(parser)
    out: list[str] = []
    for key, value in load_toml(path).items():
        action = options.get(key.replace("_", "-"))
        if action is None:
            raise InputError("--config", f"{path}: unknown key {key!r}; valid: {', '.join(sorted(options))}")
        if not _group_given(parser, action, argv):
            out += _values(key, action, value, path)
    return out + argv
