"""The hand-worked agent trace that the live replay (tests/loadgen/test_replay_dependent.py) and the simulator
(tests/sim/test_dependent_arrivals.py) both run with dependent arrivals: one trace, one expectation."""

from __future__ import annotations

from loadgen.trace import Trace, TraceRequest
from shared.hashing import chain_ids, content_id
from sim.run import simulate
from sim.settings import SimSettings

MODEL, GPU = "qwen3-coder-30b-a3b", "h200"


def req(name, t, turn, after=(), gap=0.0, session="agent"):
    hashes = chain_ids([content_id("system", 0), content_id(name, 0)])
    return TraceRequest(t, session, turn, hashes, 40, 2, "agent", id=name, after=tuple(after), gap_s=gap)


# turn t2 waits for t1 (gap 1.0); p fans out to c1, c2, c3 (gaps 0.5, 0, 0.25), which j joins (gap 2.0);
# their recorded times (9.0 and on) are what --arrivals recorded would send
AGENT = [req("t1", 0.0, 0), req("t2", 9.0, 1, ["t1"], 1.0),
         req("p", 0.2, 0, session="fan"), req("c1", 9.0, 1, ["p"], 0.5, "fan"), req("c2", 9.0, 1, ["p"], 0.0, "fan"),
         req("c3", 9.0, 1, ["p"], 0.25, "fan"), req("j", 9.5, 2, ["c1", "c2", "c3"], 2.0, "fan")]


def due(finish: dict[str, float], scale: float = 1.0) -> dict[str, float]:
    """Each waiting request's arrival from the finishes of what it waits for (seconds of the run; ``scale``: run
    seconds per trace second, 1 / a replay's speedup): the latest finish plus its gap."""
    return {r.id: max(finish[name] for name in r.after) + r.gap_s * scale for r in AGENT if r.after}


def simulate_by_hand(reqs, **kw) -> dict:
    """``reqs`` through ``kvemu sim``'s simulator on a 64-block pool of the default model and GPU, with the
    per-request records (what the simulator tests of this trace read)."""
    return simulate(Trace(reqs, 16, "hand"), SimSettings.of(capacity_blocks=64, model=MODEL, gpu=GPU, **kw),
                    records=True)
