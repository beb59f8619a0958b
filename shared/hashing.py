"""Chained, deterministic 64-bit block hashes.

``h_i = xxh3_64(h_{i-1} as 8 little-endian bytes || block i as little-endian uint32s)``
with a fixed root.  Every process, host and language that follows this rule gets
the same ids, so router, replicas and Redis agree.  Python's ``hash()`` is salted
per process and is never used.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

from shared.errors import InputError

DEFAULT_BLOCK_SIZE = 16


def reusable_prefix_tokens(held_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The cached tokens a prefix of ``held_tokens`` gives a prompt of ``prompt_tokens``: vLLM caps a hit at
    the prompt less one token (the last runs to produce logits) and hits are whole blocks, so a prompt
    cached whole computes its last block again. One rule: the scheduler's ``prefill_segments`` and the
    router's prediction both use it."""
    return max(0, min(held_tokens, max(prompt_tokens - 1, 0) // block_size * block_size))
# Fixed root so the first block of every prompt chains from the same value.
ROOT_HASH = 0x6B76656D75000000  # b"kvemu" as the high bytes
_MAX_TOKEN = 2**32 - 1
_PACK_U64 = struct.Struct("<Q").pack
_xxh3 = xxhash.xxh3_64_intdigest


def _as_token_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    if type(tokens) is list and len(tokens) <= _SMALL:  # a request's prompt: struct beats numpy's setup
        try:
            return struct.pack(f"<{len(tokens)}I", *tokens)
        except struct.error:
            pass  # a negative, too large or non-integer id: numpy's checks name the problem
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InputError("token_ids", "must be a flat list of integers")
    if arr.size == 0:
        return b""
    if arr.dtype.kind not in "iu":
        raise InputError("token_ids", f"must be integers, got {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN:
        raise InputError("token_ids", "token ids must be in [0, 2**32)")
    return arr.astype("<u4", copy=False).tobytes()


_SMALL = 8192


def block_hashes(
    tokens: Sequence[int] | np.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
    parent: int = ROOT_HASH,
) -> list[int]:
    """Hashes of the full blocks of ``tokens``; the partial tail is never hashed."""
    if block_size <= 0:
        raise InputError("block_size", f"must be positive, got {block_size}")
    raw = _as_token_bytes(tokens)
    width = 4 * block_size
    n_full = len(raw) // width
    out = [0] * n_full
    h = parent
    for i in range(n_full):
        h = _xxh3(_PACK_U64(h) + raw[i * width : (i + 1) * width])
        out[i] = h
    return out


def chain_ids(ids: Iterable[int], parent: int = ROOT_HASH) -> list[int]:
    """Chain per-block content ids (e.g. Qwen-Bailian's unchained SipHash ids).

    Block ``i`` gets ``H(h_{i-1}, id_i)``, so two prompts share a hash at depth i
    only if they share every id up to and including i.
    """
    out = []
    h = parent
    for raw_id in ids:
        h = _xxh3(_PACK_U64(h) + _PACK_U64(raw_id & 0xFFFFFFFFFFFFFFFF))
        out.append(h)
    return out


def content_id(*parts: int | str) -> int:
    """A stable 64-bit id for a named piece of synthetic content (session, block index...)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return _xxh3(text)


# XXH3-64 of one little-endian u64 (its 4-to-8-byte path with the default secret), vectorised.
_XXH3_BITFLIP = 0x1CAD21F72C81017C ^ 0xDB979083E96DD4DE  # default secret bytes 8..15 ^ 16..23
_XXH3_PRIME = np.uint64(0x9FB21C651E98DF25)
_MASK64 = (1 << 64) - 1


XXH3_PRIME_U64 = int(_XXH3_PRIME)


def xxh3_flip(seed: int) -> int:
    """The constant ``xxh3_u64`` xors into every value for ``seed`` (what the compiled pool's SHARDS
    sampling is given, so the seed's mixing has this one definition)."""
    seed &= _MASK64
    seed ^= int.from_bytes((seed & 0xFFFFFFFF).to_bytes(4, "little"), "big") << 32
    return (_XXH3_BITFLIP - seed) & _MASK64


def xxh3_u64(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """``xxh3_64_intdigest(struct.pack("<Q", v), seed)`` for every ``v`` of a uint64 array, in numpy."""
    h = (values >> np.uint64(32)) | (values << np.uint64(32))  # the two 32-bit halves swapped
    h ^= np.uint64(xxh3_flip(seed))
    h ^= ((h << np.uint64(49)) | (h >> np.uint64(15))) ^ ((h << np.uint64(24)) | (h >> np.uint64(40)))
    h *= _XXH3_PRIME
    h ^= (h >> np.uint64(35)) + np.uint64(8)
    h *= _XXH3_PRIME
    h ^= h >> np.uint64(28)
    return h
