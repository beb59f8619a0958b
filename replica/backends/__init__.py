"""Compute backends of a replica. The emulated one is the cost model (no code here); ``torch``
runs the model's real layer stack over a real paged KV tensor (needs ``kvemu[torch]``). The flags
that choose one are ``kvemu.options.backend``'s; their checks are here."""

from shared.errors import InputError
from shared.validate import check_positive_int


def check_backend_flags(a) -> None:
    """``--device`` and ``--layers`` shape the torch backend only: refused (one line) without it. The torch
    backend's layer stack is GQA attention with a KV tensor in the model's dtype: a model or KV dtype it cannot
    run (MLA, --kv-cache-dtype fp8) is refused with it, rather than run as something else."""
    if a.backend != "torch":
        for flag, given in (("--device", a.device != "cpu"), ("--layers", a.layers is not None)):
            if given:
                raise InputError(flag, "does nothing without the torch backend: add --backend torch")
        return
    from shared.costmodel import get_model

    model = get_model(getattr(a, "model", "tiny"))
    if model.kv_cache_dtype != "auto":
        raise InputError("--kv-cache-dtype", "the torch backend keeps its KV in the model's dtype: leave it auto, or"
                                             " use the emulated backend")
    if model.mla is not None:
        raise InputError("--backend", f"the torch backend's layers have no multi-head latent attention, which"
                                      f" {model.name} uses: use the emulated backend")


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
