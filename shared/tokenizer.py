"""A deterministic built-in tokenizer: no model files, same ids in every process.

Words, numbers and single punctuation marks become tokens; each token id is a stable
hash of its text folded into a 32-bit vocabulary range (xxh3, never ``hash()``). It is
not a real BPE, but prompt lengths land in the same ballpark (about 1.3 tokens a word)
and identical text always gives identical ids, which is all prefix caching needs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import xxhash

VOCAB_SIZE = 151_936  # Qwen-sized vocabulary
_TOKEN_RE = re.compile(r"\s*(?:\w{1,8}|[^\w\s])", re.UNICODE)
_cache: dict[str, int] = {}


def _token_id(piece: str) -> int:
    tid = _cache.get(piece)
    if tid is None:
        tid = xxhash.xxh3_64_intdigest(piece.encode("utf-8")) % VOCAB_SIZE
        if len(_cache) < 200_000:
            _cache[piece] = tid
    return tid


def encode(text: str) -> list[int]:
    return [_token_id(m) for m in _TOKEN_RE.findall(text)]


# ---- ids back to text ---------------------------------------------------------------
# An id is a hash of its piece, so ids alone cannot be inverted: ``tokenize`` (the replica's
# /tokenize) remembers the piece behind each id it gives, and ``decode`` reads them back. The
# table is keyed by id, so it never holds more than VOCAB_SIZE entries, and pieces longer than
# MAX_PIECE_CHARS (a run of hundreds of blanks before a word) are not kept: at most about 39 MB.
# Two pieces can fold to one id (about n**2 / 2V pairs among n distinct pieces): the table keeps
# the latest, and marks the id shared, so a decode can say where it may read back another piece.
MAX_PIECE_CHARS = 256
_pieces: dict[int, str] = {}
_shared: set[int] = set()


def tokenize(text: str) -> Iterator[tuple[int, str]]:
    """``(id, piece)`` for each token of ``text`` (the ids ``encode`` gives; the pieces concatenate
    to ``text`` less its trailing whitespace), remembering each piece for ``decode``. Lazy, so a
    caller can pace a long text."""
    for match in _TOKEN_RE.finditer(text):
        piece = match.group()
        tid = _token_id(piece)
        if len(piece) <= MAX_PIECE_CHARS:
            old = _pieces.get(tid)
            if old != piece:
                if old is not None:
                    _shared.add(tid)
                _pieces[tid] = piece
        yield tid, piece


def decode(ids: Sequence[int]) -> tuple[str, list[int], list[int]]:
    """The text of ``ids`` as ``tokenize`` last saw them: ``(text, unknown, shared)``, the last two
    the positions of ids it never gave (their text is missing) and of ids two pieces have had."""
    get = _pieces.get
    parts: list[str] = []
    unknown: list[int] = []
    for i, tid in enumerate(ids):
        piece = get(tid)
        if piece is None:
            unknown.append(i)
        else:
            parts.append(piece)
    shared = [i for i, tid in enumerate(ids) if tid in _shared] if _shared else []
    return "".join(parts), unknown, shared


def chat_template(messages: list[dict], tools: str = "") -> str:
    """A ChatML-like rendering: the same conversation prefix renders to the same text.

    Tool definitions, when given, open the prompt (as real chat templates put them in the
    system turn), so a fixed tool set is a shared prefix."""
    parts = [f"<|im_start|>tools\n{tools}<|im_end|>\n"] if tools else []
    parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


_WORDS = ("the", "cache", "block", "prefix", "token", "replica", "router", "hit", "miss", "session")


def filler_text(n_tokens: int, seed: int = 0) -> str:
    """Deterministic response text of ``n_tokens`` words (one token each)."""
    return filler_piece(seed, 0, n_tokens)


def filler_piece(seed: int, start: int, n: int) -> str:
    """Words ``start .. start+n`` of ``filler_text(..., seed)``, with the space that precedes them:
    streamed pieces concatenate to exactly the non-streamed text."""
    text = " ".join(_WORDS[(seed + i * 7) % len(_WORDS)] for i in range(start, start + n))
    return " " + text if start and text else text
