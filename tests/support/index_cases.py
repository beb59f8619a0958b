"""What the prefix index suites share: hashes at the extremes of the uint64 range, event and
batch builders, and ``run`` (one fresh index per body; the ``make`` fixture is in
tests/shared/conftest.py)."""

from __future__ import annotations

import asyncio

from shared.index import EventBatch, IndexEvent

H1, H2, H3, H4, H5, H6 = 0, 17, 2**63, 2**64 - 1, 123456789, 42  # extremes of the uint64 range


def ev(kind: str, *hashes: int) -> IndexEvent:
    return IndexEvent(kind, tuple(hashes))


def batch(rid: str, seq: int, *events: IndexEvent, epoch: str = "e1") -> EventBatch:
    return EventBatch(rid, epoch, seq, list(events))


def run(make, body, **kw) -> None:
    async def main():
        idx = make(**kw)
        try:
            await body(idx)
        finally:
            await idx.close()

    asyncio.run(main())
