"""vLLM's prefix-cache block hash, for consumers that recompute it from token ids.

vLLM v1 (``vllm/v1/core/kv_cache_utils.py``) hashes block ``i`` of a request as
``H((parent, tuple(tokens_i), extra_keys))`` where ``parent`` is block ``i-1``'s hash (the
first block's parent is ``NONE_HASH = H(seed)``) and ``H`` is the ``--prefix-caching-hash-algo``:
``sha256`` (SHA-256 of the tuple's pickle, highest protocol: vLLM's default) or ``sha256_cbor``
(SHA-256 of its canonical CBOR: the same bytes in any language). The seed is ``PYTHONHASHSEED``
when set, else ``"vllm-none-hash"`` for these cryptographic algorithms (recent vLLM; older
releases drew a random one unless PYTHONHASHSEED was set). ``extra_keys`` (LoRA, multimodal,
cache salt) is ``None`` here: kvemu serves neither. The KV events carry each hash as vLLM's
``maybe_convert_block_hash`` does with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: the digest's low
64 bits, big-endian (``external``), the form Dynamo's and llm-d's indexers decode.

kvemu's own block hashes (``shared.hashing``, xxh3 chained over the same token blocks) stay
what the pool keys on; a block's vLLM hash is a function of the same chain, so the two map one
to one.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

from shared.errors import UnknownNameError

DEFAULT_SEED = "vllm-none-hash"
HASH_ALGOS = ("sha256", "sha256_cbor")
DEFAULT_HASH_ALGO = "sha256"  # vLLM's --prefix-caching-hash-algo default
_U64 = (1 << 64) - 1


def sha256_pickle(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def hash_function(algo: str) -> Callable[[Any], bytes]:
    try:
        return _FUNCTIONS[algo]
    except KeyError:
        raise UnknownNameError("hash_algo", algo, HASH_ALGOS) from None


def none_hash(algo: str = DEFAULT_HASH_ALGO, seed: str = DEFAULT_SEED) -> bytes:
    """The parent hash of every prefix's first block (vLLM's ``init_none_hash``)."""
    return hash_function(algo)(seed)


def block_hash(fn: Callable[[Any], bytes], parent: bytes, tokens: Sequence[int]) -> bytes:
    """vLLM's ``hash_block_tokens`` with no extra keys."""
    return fn((parent, tuple(tokens), None))


def block_hashes(tokens: Sequence[int], block_size: int, algo: str = DEFAULT_HASH_ALGO,
                 seed: str = DEFAULT_SEED) -> list[bytes]:
    """The hashes of ``tokens``' full blocks, chained from ``NONE_HASH`` (a partial tail is not hashed)."""
    fn = hash_function(algo)
    parent = none_hash(algo, seed)
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(fn, parent, tokens[start:start + block_size])
        out.append(parent)
    return out


def external(digest: bytes) -> int:
    """The 64-bit integer a KV event carries for a block hash (vLLM's ``maybe_convert_block_hash``)."""
    return int.from_bytes(digest, "big") & _U64
