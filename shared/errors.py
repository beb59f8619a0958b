"""User-facing errors: each names the field (or file and line) that is wrong."""

from __future__ import annotations


class KvemuError(Exception):
    """Base for errors shown to a user as one line, never as a traceback."""

    def __reduce__(self):
        # Subclasses take other constructor arguments than the message they pass up, so the
        # default pickling (cls(*args)) would fail; rebuild from the message and attributes,
        # so an error raised in a worker process (parallel sim cells, Dask) arrives intact.
        return (_rebuild, (type(self), str(self), self.__dict__))


def _rebuild(cls: type[KvemuError], message: str, state: dict) -> KvemuError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class InputError(KvemuError, ValueError):
    """A value a user or client supplied is invalid.  ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownNameError(KvemuError, KeyError):
    """An unknown preset / policy / model name; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...], hint: str = ""):
        self.kind = kind
        self.name = name
        self.valid = sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}{hint}")

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return self.args[0]


class TraceFormatError(KvemuError):
    """A malformed trace line, with file, line number and field."""

    def __init__(self, path: str, line: int, field: str, message: str):
        self.path = path
        self.line = line
        self.field = field
        super().__init__(f"{path}:{line}: field {field!r}: {message}")
