"""The per-client share of a prefill instance's pool held for remote decodes (replica/pd_share.py), and its
flag's checks. Hand-worked: a pool of 100 blocks at --pd-hold-share 0.25 lets one client hold 25 blocks."""

import pytest

from replica.core.sched.sched_types import SchedRequest
from replica.pd_share import FLAG, HoldShareExceeded, HoldShares
from replica.settings import ReplicaSettings
from shared.errors import InputError


def request(rid: int) -> SchedRequest:
    return SchedRequest(rid, [], 160, 1, 0.0)


def test_a_client_is_refused_beyond_its_share_and_counted_again_once_its_holds_end():
    ended: set[int] = set()
    shares = HoldShares(0.25, 100, lambda req: req.rid not in ended)
    assert shares.limit == 25
    shares.add("10.0.0.1", request(1), 10)
    shares.add("10.0.0.1", request(2), 10)
    assert shares.charged("10.0.0.1") == 20
    shares.check("10.0.0.1", 5)  # 25: exactly the share
    with pytest.raises(HoldShareExceeded) as refused:
        shares.check("10.0.0.1", 6)
    assert refused.value.status == 429 and refused.value.field == "pd_hold_share"
    assert f"{FLAG} 0.25" in str(refused.value) and "holds 20 blocks" in str(refused.value)
    shares.check("10.0.0.2", 25)  # another client has its own share
    ended.add(1)  # its hold ended (pulled, released, timed out, or its client left)
    assert shares.charged("10.0.0.1") == 10
    shares.check("10.0.0.1", 15)
    ended.add(2)
    assert shares.charged("10.0.0.1") == 0 and "10.0.0.1" not in shares.by_client
    assert shares.stats() == {"share": 0.25, "limit_blocks": 25, "clients": 0, "refused": 1}


def test_a_prompt_larger_than_the_share_is_refused_even_alone():
    shares = HoldShares(0.1, 55, lambda req: True)  # floor(5.5): 5 blocks
    with pytest.raises(HoldShareExceeded, match="at most 5 of this prefill instance's 55 blocks"):
        shares.check("c", 6)


def test_clients_whose_holds_all_ended_are_swept_once_many_addresses_are_kept(monkeypatch):
    import replica.pd_share as mod

    monkeypatch.setattr(mod, "SWEEP_AT", 4)
    live = {0}
    shares = HoldShares(1.0, 100, lambda req: req.rid in live)
    shares._sweep_at = 4
    for i in range(4):  # the fourth address sweeps the three whose requests ended (and its own)
        shares.add(f"c{i}", request(i), 1)
    assert list(shares.by_client) == ["c0"] and shares._sweep_at == 4


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("nan"), True])
def test_the_share_must_be_a_fraction_of_the_pool(share):
    with pytest.raises(InputError, match="pd_hold_share"):
        ReplicaSettings(capacity_blocks=100, pd_hold_share=share)
