"""One command-line option as a record: a parser adds it and `kvemu up` forwards it to a child
from the same record, so a flag cannot be taken by up and then be left off a child's command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_SAME = object()
# The Namespace attribute that holds the dests of tracked options (``Option.track``) given on the command
# line or in a --config file: a setting that fills in defaults (--vllm-version) leaves those alone.
GIVEN = "given_flags"


class _StoreGiven(argparse._StoreAction):
    """argparse's store, which also notes that the flag was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, GIVEN, frozenset((*getattr(namespace, GIVEN, ()), self.dest)))


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the tracked option stored under ``dest`` was given (not left at its default)."""
    return dest in getattr(args, GIVEN, ())


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    default: Any
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    switch: bool = False  # a flag without a value (store_true): forwarded only when set
    repeat: bool = False  # a flag given once per value (action="append"; the default: a tuple of them)
    track: bool = False  # note in the parsed arguments when it is given (``given``)
    # old spellings a renamed flag still answers to for one release (after the new one in --help; a child is
    # always handed the new one)
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under."""
        return self.flag.removeprefix("--").replace("-", "_")

    def add(self, p: argparse.ArgumentParser | argparse._ArgumentGroup, default: Any = _SAME,
            help: str | None = None) -> None:
        """Add the flag; ``default`` overrides the record's (a command whose default differs on purpose),
        ``help`` its text (a command that says more about it)."""
        kw: dict[str, Any] = {"default": self.default if default is _SAME else default, "help": help or self.help}
        if self.switch:
            p.add_argument(self.flag, *self.aliases, action="store_true", **kw)
            return
        if self.repeat:  # a fresh list per parse: argparse appends to the default it is given
            kw["default"] = list(kw["default"] or ())
            kw["action"] = "append"
        if self.track:
            kw["action"] = _StoreGiven
        if self.type is not None:
            kw["type"] = self.type
        if self.choices is not None:
            kw["choices"] = self.choices
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        p.add_argument(self.flag, *self.aliases, **kw)

    def argv(self, args: argparse.Namespace) -> list[str]:
        """The flag and its parsed value, for a child's command line (nothing when the value is None)."""
        value = getattr(args, self.dest)
        if self.switch:
            return [self.flag] if value else []
        if self.repeat:
            return [x for item in value or () for x in (self.flag, str(item))]
        if value is None or value == "" == self.default:  # the child's default is the same nothing
            return []
        # repr keeps every digit of a float (str would too in Python 3, but says so less plainly)
        return [self.flag, repr(value) if isinstance(value, float) else str(value)]


def add_options(p: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    for option in options:
        option.add(p)


def forward(options: Iterable[Option], args: argparse.Namespace) -> list[str]:
    """Every option's flag and value from ``args``, as a child process's arguments."""
    out: list[str] = []
    for option in options:
        out += option.argv(args)
    return out
