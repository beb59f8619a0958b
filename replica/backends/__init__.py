"""Compute backends of a replica. The emulated one is the cost model (no code here); ``torch``
runs the model's real layer stack over a real paged KV tensor (needs ``kvemu[torch]``)."""

from shared.errors import InputError
from shared.validate import check_positive_int


def add_backend_args(p) -> None:
    """``--backend``, ``--device``, ``--layers``: for ``kvemu replica`` and ``kvemu up``."""
    p.add_argument("--backend", default="emulated", choices=["emulated", "torch"],
                   help="emulated: step times from the cost model; torch: the model's real layers (random weights) "
                        "over a real paged KV tensor, timed on --device (pip install 'kvemu[torch]')")
    p.add_argument("--device", default="cpu", help="torch backend: cpu, cuda, cuda:N")
    p.add_argument("--layers", type=int, default=None, help="torch backend: run this many of the model's layers")


def backend_argv(a) -> list[str]:
    """The same flags again, for a replica process started by ``kvemu up``."""
    out = ["--backend", a.backend, "--device", a.device]
    return out + (["--layers", str(a.layers)] if a.layers is not None else [])

def check_backend_flags(a) -> None:
    """``--device`` and ``--layers`` shape the torch backend only: refused (one line) without it."""
    if a.backend != "torch":
        for flag, given in (("--device", a.device != "cpu"), ("--layers", a.layers is not None)):
            if given:
                raise InputError(flag, "does nothing without the torch backend: add --backend torch")


def check_backend(backend: str, layers: int | None) -> None:
    if backend not in ("emulated", "torch"):
        raise InputError("backend", f"must be emulated or torch, got {backend!r}")
    if layers is not None:
        check_positive_int("layers", layers)
    if backend == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise InputError("backend", "torch is not installed: pip install 'kvemu[torch]'") from None
