"""The replay's count of later turns that left their session's replica, by the router's reason, on records
made by hand; and the line the printed report gives it."""

from __future__ import annotations

import io

from kvemu.replay_cmd import print_report
from loadgen.replay import Record, session_moves, summarize


def _rec(session: str, turn: int, replica: str, reason: str, status: int = 200) -> Record:
    return Record(session, turn, status, replica, 160, 0, 10, 0, 0.02, 0.5, 0.5, float(turn), route_reason=reason)


RECORDS = [
    # A stays on replica-0 for turn 1, leaves for replica-1 at turn 2 (load), stays there at turn 3
    _rec("A", 2, "replica-1", "load_over_cache"), _rec("A", 0, "replica-0", "cache_miss_balance"),
    _rec("A", 1, "replica-0", "cache_hit"), _rec("A", 3, "replica-1", "cache_hit"),
    # B leaves at turn 1 (the guard); C has one turn; D's turn 1 failed (no answer, no turn to compare)
    _rec("B", 0, "replica-2", "cache_miss_balance"), _rec("B", 1, "replica-3", "imbalance_guard"),
    _rec("C", 0, "replica-0", "cache_miss_balance"),
    _rec("D", 0, "replica-0", "cache_miss_balance"), _rec("D", 1, "", "", status=503),
    # E went straight to the replicas (no router, no reason): its move is "unknown"
    _rec("E", 0, "replica-0", ""), _rec("E", 1, "replica-1", ""),
]


def test_later_turns_that_left_their_replica_by_reason():
    ok = [r for r in RECORDS if r.status == 200]
    # later turns: A 1, 2, 3; B 1; E 1 = 5; left: A 2, B 1, E 1
    assert session_moves(ok) == {"turns": 5, "left": 3,
                                 "by_reason": {"imbalance_guard": 1, "load_over_cache": 1, "unknown": 1}}
    assert summarize(RECORDS, 16)["session_moves"] == session_moves(ok)


def test_the_report_says_how_many_turns_left_and_why():
    out = io.StringIO()
    print_report(summarize(RECORDS, 16), {"csr": 0.0, "replicas": {}, "hotspots": []}, out)
    assert ("turns that left their session's replica 3 of 5 (imbalance_guard 1, load_over_cache 1, unknown 1)"
            in out.getvalue().splitlines())
