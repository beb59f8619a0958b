"""``--kv-cache-dtype auto|fp8|fp8_e4m3|fp8_e5m2``: the KV cache's element type, as vLLM's flag of that name, for
every command that sizes a block pool or the shared store (sim, sweep, replica, up, store). ``auto`` keeps the model's dtype; an FP8 type
takes one byte a KV element, so a block is half the bytes, the memory rule fits about twice the blocks and the
cost model's KV reads move half the bytes (shared/model_kinds.py, docs/capacity.md).

The dtype travels inside the model setting, as ``--tp`` travels inside ``--gpu``: ``model_setting`` makes
``deepseek-v3@kv=fp8`` of ``--model deepseek-v3 --kv-cache-dtype fp8``, which every cost model built from the
setting reads, the sim cells', the replicas' and the P/D pools' alike."""

from __future__ import annotations

from kvemu.options.option import Option
from shared.costmodel import get_model
from shared.model_kinds import KV_CACHE_DTYPES, KV_FLAG, with_kv_dtype

KV_CACHE_DTYPE = Option(KV_FLAG, "auto", metavar="DTYPE",
                        help=f"KV cache element type, as vLLM's flag: {', '.join(KV_CACHE_DTYPES)} (auto: the model's"
                             " dtype; fp8: one byte a value, about twice the blocks, half the bytes a KV read;"
                             " MLA models take auto, fp8 and fp8_e4m3)")


def model_setting(args) -> str:
    """The one model string the settings carry: ``--model`` with ``--kv-cache-dtype`` after it (``@kv=DTYPE``)
    unless auto; an unknown dtype, or one the model's attention cannot store, refused in one line naming the flag."""
    setting = with_kv_dtype(args.model, getattr(args, "kv_cache_dtype", "auto") or "auto")
    get_model(setting)  # an MLA model refuses fp8_e5m2 here, before anything starts
    return setting
