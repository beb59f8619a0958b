"""Sessions of a trace that has none (Mooncake's): inferred from the chained block ids of its prompts.

``SessionInferrer`` is the definition; ``infer_sessions`` the one seam that runs its C twin
(``loadgen/_traceread.c``, built at install where a C compiler is present) over a whole trace, about
six times faster: a day-long trace has hundreds of thousands of prompts, read before every run."""

from __future__ import annotations

from collections import OrderedDict

from shared.native import load

_read, READ_MISSING = load("loadgen._traceread")

TAIL_BLOCKS = 4  # a prompt's last ids remembered (SessionInferrer says why 4)
MIN_SHARED_BLOCKS = 2  # and the shortest shared prefix that joins a session (why 2)


class SessionInferrer:
    """Assigns session ids and turns to session-less requests from their chained block ids.

    Heuristic: request B continues the session of an earlier request A when B's prompt
    contains all of A's prompt except at most A's last ``tail_blocks - 1`` blocks, and the
    shared prefix is at least ``min_shared_blocks`` blocks long.

    * Why a tail window and not "any shared block": a multi-turn prompt is the previous
      prompt + response + new message, so it contains the previous prompt almost whole.
      Matching any shared block would merge every conversation that opens with the same
      long template or document.  Only A's last ``tail_blocks`` ids are remembered, so a
      match means B swallowed (nearly) all of A.
    * Why a window of 4 and not 1: A's last id is its partial tail block, which B (having
      appended to it) never repeats.  The traces also show continuations that diverge 2-3
      blocks before A's end, likely template text at the end of A's prompt that the next
      turn rewrites (generation prompt, stripped think tags).  On the Mooncake conversation
      trace windows of 1 / 2 / 4 / 8 join 130 / 4,003 / 4,075 / 4,120 requests (synthetic:
      192 / 1,444 / 1,730 / 1,748): 4 catches the rewrites and the gain flattens after it.
    * Why ``min_shared_blocks = 2``: in Mooncake's conversation trace every request starts
      with the same block 0 (the system prompt); a match on it alone says nothing.
    * Ids are prefix-chained, so one id identifies the whole prefix up to it; the deepest
      match is found by scanning B's ids from the end.  The map is bounded (oldest entries
      dropped first): a conversation idle for ``limit`` / ``tail_blocks`` newer requests
      starts a new session.

    Turns are 0-based in arrival order within the session.
    """

    __slots__ = ("tail_blocks", "min_shared_blocks", "limit", "_owner", "_turns")

    def __init__(self, tail_blocks: int = TAIL_BLOCKS, min_shared_blocks: int = MIN_SHARED_BLOCKS,
                 limit: int = 1 << 20) -> None:
        self.tail_blocks = tail_blocks
        self.min_shared_blocks = min_shared_blocks
        self.limit = limit
        self._owner: OrderedDict[int, int] = OrderedDict()  # tail block id -> session number, oldest first
        self._turns: list[int] = []  # session number -> requests so far

    def assign(self, hash_ids: list[int]) -> tuple[str, int]:
        owner = self._owner
        session = -1
        for i in range(len(hash_ids) - 1, max(self.min_shared_blocks, 1) - 2, -1):  # the deepest match
            found = owner.get(hash_ids[i])
            if found is not None:
                session = found
                break
        turns = self._turns
        if session < 0:
            session = len(turns)
            turns.append(0)
        turn = turns[session]
        turns[session] = turn + 1
        for h in hash_ids[-self.tail_blocks:]:
            owner[h] = session
            owner.move_to_end(h)  # the newest owner is also the last to be evicted
        while len(owner) > self.limit:
            owner.popitem(last=False)
        return str(session), turn

    @property
    def sessions(self) -> int:
        return len(self._turns)


def infer_sessions(hash_lists: list[list[int]], tail_blocks: int = TAIL_BLOCKS, min_shared_blocks: int = MIN_SHARED_BLOCKS,
                   limit: int = 1 << 20) -> tuple[list[str], list[int]]:
    """``SessionInferrer(tail_blocks, min_shared_blocks, limit).assign`` of each prompt in turn: their
    sessions and turns. In C where it was built and every id is an int in [0, 2**64) (a trace reader's
    checked ids); a session's requests then share one ``str``."""
    if tail_blocks < 1 or min_shared_blocks < 0 or limit < 0:
        raise ValueError(f"tail_blocks >= 1, min_shared_blocks >= 0 and limit >= 0, got {tail_blocks},"
                         f" {min_shared_blocks}, {limit}")
    if _read is not None:
        try:
            return _read.infer_sessions(hash_lists, tail_blocks, min_shared_blocks, limit)
        except (TypeError, OverflowError):
            pass  # ids the reader did not check: the definition takes any
    inferrer = SessionInferrer(tail_blocks, min_shared_blocks, limit)
    pairs = list(map(inferrer.assign, hash_lists))
    return [session for session, _ in pairs], [turn for _, turn in pairs]
