"""Seeded request traces and a block cost shared by the eviction-policy tests.

Block hashes are chained as real prompts' are: a block always sits at the same depth and
a request never repeats a hash.
"""

from __future__ import annotations

import itertools
import random

from shared.costmodel import CostModel


def random_session_trace(seed: int, n: int = 2500) -> list[tuple[str | None, list[int]]]:
    """[(session, hashes)]: 24 sessions, each opening with 0-3 blocks of a shared system
    prompt, whose every request is the conversation so far plus 1-3 new blocks (past 12
    blocks it is cut back to its first 3); one request in 25 is anonymous: 1-3 blocks of
    the system prompt plus 0-2 new ones."""
    rng = random.Random(seed)
    chains: dict[int, list[int]] = {}
    fresh = iter(range(100, 10**9))
    system = [1, 2, 3]
    out = []
    for _ in range(n):
        s = rng.randrange(25)
        if s == 0:
            out.append((None, system[: rng.randrange(1, 4)] + [next(fresh) for _ in range(rng.randrange(0, 3))]))
            continue
        chain = chains.setdefault(s, list(system[: rng.randrange(0, 4)]))
        chain.extend(next(fresh) for _ in range(rng.randrange(1, 4)))
        if len(chain) > 12:
            chain[:] = chain[:3]
        out.append((f"s{s}", list(chain)))
    return out


def timed_prefix_trace(seed: int, n: int = 600, sessions: int = 25,
                       max_len: int = 12) -> list[tuple[float, list[int]]]:
    """[(t, hashes)]: chained prefixes (a block always sits at one depth), distinct times."""
    rng = random.Random(seed)
    ids = itertools.count(100)
    chains: dict[int, list[int]] = {}
    out, t = [], 0.0
    for _ in range(n):
        s = rng.randrange(sessions)
        chain = chains.setdefault(s, [next(ids)])
        if len(chain) < max_len:
            chain.extend(next(ids) for _ in range(rng.randrange(0, 3)))
        t += rng.expovariate(1.0)
        out.append((t, list(chain[: rng.randrange(1, len(chain) + 1)]) if rng.random() < 0.3 else list(chain)))
    return out


def session_workload(seed: int, sessions: int = 300, horizon: float = 1800.0, gap: float = 20.0,
                     sys_blocks: int = 4) -> list[tuple[float, str, list[int]]]:
    """Multi-turn sessions with growing prefixes: a shared system prompt, a first prompt of
    2-24 blocks, 1-6 new blocks per turn, heavy-tailed turn counts (<= 40), exponential gaps."""
    rng = random.Random(seed)
    ids = itertools.count(1000)
    system = list(range(1, sys_blocks + 1))
    events = []
    for s in range(sessions):
        t = rng.uniform(0, horizon)
        for _ in range(min(40, 1 + int(rng.paretovariate(0.9)))):
            events.append((t, s))
            t += rng.expovariate(1 / gap)
    events.sort()
    chains: dict[int, list[int]] = {}
    out = []
    for t, s in events:
        if s not in chains:
            chains[s] = system + [next(ids) for _ in range(rng.randint(2, 24))]
        else:
            chains[s].extend(next(ids) for _ in range(rng.randint(1, 6)))
        out.append((t, f"s{s}", list(chains[s])))
    return out


_QWEN_ON_H200 = CostModel.from_names("qwen3-coder-30b-a3b", "h200")


def block_cost_512(i: int) -> float:
    """Recompute cost of the 512-token block at depth `i` for Qwen3-Coder-30B-A3B on an H200:
    the attention term makes deep blocks several times dearer than shallow ones."""
    return _QWEN_ON_H200.block_cost(i, 512)
