"""Disaggregated prefill and decode (replica/core/disagg.py), hand-worked: the topology, the decider,
the transfer sizes, the NIC rates and the transfer network (1e9 B/s NICs: a gigabyte takes a second)."""

import math

import pytest

from replica.core.disagg import (
    DEFAULT_PD_LATENCY_S,
    Nic,
    PdNetwork,
    PdSettings,
    Topology,
    check_role,
    delivered_at,
    nic_gbps,
)
from shared.errors import InputError

GB = 10**9


def refused(make, **kw):
    with pytest.raises(InputError) as err:
        make(**kw)
    return err.value.field, err.value.message


# ---- Topology -----------------------------------------------------------------------------------


def test_a_default_topology_is_one_colocated_replica():
    topo = Topology()
    assert topo.members() == [("replica-0", "both")]
    assert not topo.disaggregated and topo.total == 1


def test_members_colocated_then_prefill_then_decode():
    topo = Topology(2, 1, 3)
    assert topo.members() == [("replica-0", "both"), ("replica-1", "both"), ("prefill-0", "prefill"),
                              ("decode-0", "decode"), ("decode-1", "decode"), ("decode-2", "decode")]
    assert topo.disaggregated and topo.total == 6


def test_a_pd_cluster_needs_no_colocated_replica():
    topo = Topology(0, 2, 1)
    assert topo.members() == [("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode")]
    assert topo.disaggregated and topo.total == 3


def test_prefill_without_decode_is_refused():
    assert refused(Topology, prefill=1) == (
        "--decode-replicas", "a P/D cluster needs both pools: prefill replicas (1) but no decode replica;"
                           " give --decode-replicas N (N >= 1), or neither for a colocated cluster")


def test_decode_without_prefill_is_refused():
    assert refused(Topology, colocated=0, decode=2) == (
        "--prefill-replicas", "a P/D cluster needs both pools: decode replicas (2) but no prefill replica;"
                            " give --prefill-replicas N (N >= 1), or neither for a colocated cluster")


def test_no_replica_is_refused():
    assert refused(Topology, colocated=0) == (
        "--replicas", "the cluster has no replica: give --replicas N or --prefill-replicas P --decode-replicas D")


@pytest.mark.parametrize(("kw", "field", "got"), [
    ({"colocated": -1}, "--replicas", "-1"),
    ({"prefill": -1, "decode": 1}, "--prefill-replicas", "-1"),
    ({"prefill": 1, "decode": -2}, "--decode-replicas", "-2"),
    ({"colocated": True}, "--replicas", "True"),
    ({"prefill": True, "decode": True}, "--prefill-replicas", "True"),
    ({"decode": False}, "--decode-replicas", "False"),
    ({"colocated": 1.0}, "--replicas", "1.0"),
    ({"colocated": "2"}, "--replicas", "'2'"),
])
def test_a_count_that_is_not_an_integer_at_least_zero_is_refused(kw, field, got):
    assert refused(Topology, **kw) == (field, f"must be an integer >= 0, got {got}")


def test_check_role():
    for role in ("both", "prefill", "decode"):
        check_role(role)
    assert refused(check_role, role="mixed") == ("role", "must be one of both, prefill, decode, got 'mixed'")
    assert refused(check_role, role="x", field_name="replica_role")[0] == "replica_role"


# ---- PdSettings: validation ---------------------------------------------------------------------


def test_defaults():
    pd = PdSettings()
    assert (pd.decider, pd.threshold_tokens, pd.link_gbps, pd.link_latency_s, pd.transfer) == \
        ("prefix", None, None, 50e-6, "missing")
    assert DEFAULT_PD_LATENCY_S == 50e-6


@pytest.mark.parametrize(("link", "message"), [
    (0, "must be a number > 0, got 0"),
    (0.0, "must be a number > 0, got 0.0"),
    (-1.0, "must be a number > 0, got -1.0"),
    (math.nan, "must be a number > 0, got nan"),
    (math.inf, "must be a finite number, got inf"),
    (True, "must be a number > 0, got True"),
    ("100", "must be a number > 0, got '100'"),
])
def test_a_bad_link_is_refused(link, message):
    assert refused(PdSettings, link_gbps=link) == ("pd_link_gbps", message)


def test_unknown_decider_and_transfer_are_refused():
    assert refused(PdSettings, decider="sometimes") == (
        "pd_decider", "must be one of always, never, prefix, got 'sometimes'")
    assert refused(PdSettings, transfer="half") == ("pd_transfer", "must be one of missing, full, got 'half'")


@pytest.mark.parametrize(("threshold", "message"), [
    (-1, "must be an integer >= 0, got -1"),
    (True, "must be an integer >= 0, got True"),
    (1.5, "must be an integer >= 0, got 1.5"),
])
def test_a_bad_threshold_is_refused(threshold, message):
    assert refused(PdSettings, threshold_tokens=threshold) == ("pd_threshold_tokens", message)


@pytest.mark.parametrize(("latency", "message"), [
    (-1e-6, "must be a number >= 0, got -1e-06"),
    (math.nan, "must be a number >= 0, got nan"),
    (math.inf, "must be a finite number, got inf"),
])
def test_a_bad_latency_is_refused(latency, message):
    assert refused(PdSettings, link_latency_s=latency) == ("pd_link_latency_s", message)


def test_edge_values_are_accepted():
    assert PdSettings(threshold_tokens=0, link_latency_s=0.0, link_gbps=0.001).threshold(16) == 0


# ---- PdSettings: the decider --------------------------------------------------------------------


def test_prefix_default_threshold_is_sixteen_blocks():
    pd = PdSettings()
    assert pd.threshold(16) == 256 and pd.threshold(32) == 512
    assert not pd.remote(256, 0, 16)  # exactly at the threshold: local
    assert pd.remote(257, 0, 16)  # one token more: remote
    assert not pd.remote(255, 0, 16)
    assert not pd.remote(512, 0, 32) and pd.remote(513, 0, 32)


def test_prefix_counts_only_what_the_decoder_lacks():
    pd = PdSettings()
    assert not pd.remote(1000, 744, 16)  # 256 missing: local
    assert pd.remote(1000, 743, 16)  # 257 missing: remote
    assert not pd.remote(1000, 1000, 16)


def test_an_explicit_threshold_overrides_the_blocks():
    pd = PdSettings(threshold_tokens=100)
    assert pd.threshold(16) == 100 and pd.threshold(64) == 100
    assert not pd.remote(100, 0, 16) and pd.remote(101, 0, 16)
    zero = PdSettings(threshold_tokens=0)
    assert zero.remote(1, 0, 16) and not zero.remote(0, 0, 16) and not zero.remote(10, 10, 16)


def test_always_and_never():
    assert PdSettings(decider="always").remote(0, 0, 16)
    assert PdSettings(decider="always").remote(1, 1, 16)
    assert not PdSettings(decider="never").remote(10**6, 0, 16)


# ---- PdSettings: what crosses, and how fast -----------------------------------------------------


def test_transfer_tokens_missing_moves_what_the_decoder_lacks():
    pd = PdSettings()
    assert pd.transfer_tokens(300, 0, 16) == 300
    assert pd.transfer_tokens(300, 10, 16) == 140
    assert pd.transfer_tokens(300, 18, 16) == 12
    assert pd.transfer_tokens(300, 19, 16) == 0  # hits cover more than the prompt: nothing, never negative


def test_transfer_tokens_full_moves_the_whole_prompt():
    pd = PdSettings(transfer="full")
    assert pd.transfer_tokens(300, 0, 16) == 300 and pd.transfer_tokens(300, 18, 16) == 300


def test_nic_rates():
    pd = PdSettings()
    assert pd.nic_bytes_per_s("h200", 2) == 100e9  # 400 Gb/s x 2 GPUs = 800 Gb/s = 100 GB/s
    assert pd.nic_bytes_per_s("h100", 1) == 50e9
    assert pd.nic_bytes_per_s("a100-80gb", 1) == 25e9  # 200 Gb/s
    assert pd.nic_bytes_per_s("a100-80gb-pcie", 4) == 100e9
    assert pd.nic_bytes_per_s("ascend-910b2", 1) == 25e9
    assert pd.nic_bytes_per_s("some-calibrated-gpu", 1) == 50e9  # a profile names no NIC: 400 Gb/s
    assert PdSettings(link_gbps=100).nic_bytes_per_s("h200", 4) == 50e9  # the flag is per GPU, times tp
    assert nic_gbps("h100", 8) == 3200.0 and nic_gbps("a100-80gb") == 200.0 and nic_gbps("unknown", 2) == 800.0


# ---- PdNetwork -----------------------------------------------------------------------------------


def network(latency=0.25, *ids):
    net = PdNetwork(latency_s=latency)
    for rid in ids or ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        net.add(rid, 1e9)
    return net


def test_one_transfer_takes_its_bytes_over_the_nic_plus_the_latency():
    net = network()
    tr = net.start(0.0, "prefill-0", "decode-0", GB)
    assert net.finish(tr) == 1.25
    assert net.transfers == 1 and (tr.src, tr.dst, tr.nbytes, tr.start, tr.end) == \
        ("prefill-0", "decode-0", GB, 0.0, -1.0)


def test_the_default_latency():
    net = PdNetwork()
    net.add("p", 1e9)
    net.add("d", 1e9)
    assert net.finish(net.start(2.0, "p", "d", 3 * GB)) == 5.0 + 50e-6


# Two 1 GB transfers at 0 beside prefill-0 -> decode-0, over 1 GB/s NICs and 0.25 s of latency: each
# takes 1 s alone, 2 s when the two share a NIC (a sender's or a receiver's).
@pytest.mark.parametrize("src, dst, each_ends", [
    ("prefill-0", "decode-1", 2.25),  # one sender to two decoders shares the sender's NIC
    ("prefill-1", "decode-1", 1.25),  # two senders to two decoders do not share
    ("prefill-1", "decode-0", 2.25),  # two senders into one decoder share the receiver's NIC
])
def test_two_transfers_share_a_nic_only_when_they_have_a_side_in_common(src, dst, each_ends):
    net = network()
    a = net.start(0.0, "prefill-0", "decode-0", GB)
    b = net.start(0.0, src, dst, GB)
    assert net.finish(a) == each_ends and net.finish(b) == each_ends


def test_one_started_halfway_through_another_on_the_same_sender():
    # a alone 0 -> 0.5, shared 0.5 -> 1.5 (a's bytes done), b alone 1.5 -> 2.0
    net = network()
    a = net.start(0.0, "prefill-0", "decode-0", GB)
    assert net.finish(a) == 1.25  # projected alone
    b = net.start(0.5, "prefill-0", "decode-1", GB)
    assert net.finish(a) == 1.75 and net.finish(b) == 2.25


def test_the_later_of_the_two_sides_decides():
    # a's receiver is shared with c (decode-0), its sender is not: a ends when its receive side does
    net = network()
    a = net.start(0.0, "prefill-0", "decode-0", GB)
    c = net.start(0.0, "prefill-1", "decode-0", 3 * GB)
    assert net.finish(a) == 2.25  # recv: 2 x 1 GB shared -> 2.0
    assert net.finish(c) == 4.25  # recv: 2.0 shared, then 2 GB alone


def test_settle():
    net = network()
    tr = net.start(0.0, "prefill-0", "decode-0", GB)
    assert not net.settle(tr, 1.0) and tr.end == -1.0
    assert not net.settle(tr, 1.2499)
    assert net.settle(tr, 1.25) and tr.end == 1.25
    assert net.settle(tr, 10.0) and net.finish(tr) == 1.25  # known once settled


def test_a_later_start_delays_a_projection_until_it_is_settled():
    net = network()
    a = net.start(0.0, "prefill-0", "decode-0", GB)
    b = net.start(0.0, "prefill-0", "decode-1", GB)
    assert not net.settle(a, 1.25)  # b came: a's projected end moved to 2.25
    assert net.settle(a, 2.25) and net.settle(b, 2.25) and a.end == b.end == 2.25


def test_stats_bytes_and_utilization_of_the_directions_with_traffic():
    net = network()
    net.start(0.0, "prefill-0", "decode-0", GB)
    net.start(0.0, "prefill-0", "decode-1", GB)
    assert net.stats(4.0) == {
        "prefill-0:send": {"bytes": 2 * GB, "gbps": 8.0, "utilization": 0.5},  # busy 0 -> 2
        "decode-0:recv": {"bytes": GB, "gbps": 8.0, "utilization": 0.25},  # busy 0 -> 1
        "decode-1:recv": {"bytes": GB, "gbps": 8.0, "utilization": 0.25},
    }


def test_stats_since_the_network_started():
    net = network()
    net.since = 2.0
    net.start(2.0, "prefill-1", "decode-1", 2 * GB)
    assert net.stats(6.0) == {"prefill-1:send": {"bytes": 2 * GB, "gbps": 8.0, "utilization": 0.5},
                              "decode-1:recv": {"bytes": 2 * GB, "gbps": 8.0, "utilization": 0.5}}


def test_stats_of_a_quiet_network_is_empty():
    assert network().stats(1.0) == {}


def test_an_unknown_instance_is_refused():
    net = network()
    with pytest.raises(InputError) as err:
        net.start(0.0, "prefill-0", "decode-9", GB)
    assert (err.value.field, err.value.message) == ("remote_engine_id", "no NIC for 'decode-9'")
    with pytest.raises(InputError) as err:
        net.start(0.0, "prefill-9", "decode-0", GB)
    assert err.value.message == "no NIC for 'prefill-9'"
    assert net.transfers == 0 and net.stats(1.0) == {}


def test_a_nic_is_one_shape_wherever_it_lives_and_a_transfer_is_delivered_when_its_later_side_is():
    # the live replica holds its own Nic.of, the simulator's network one per instance: the same links
    nic = Nic.of("decode-0", 5e10, 2e-5)
    assert (nic.send.name, nic.recv.name) == ("decode-0:send", "decode-0:recv")
    assert (nic.send.bandwidth, nic.recv.bandwidth, nic.send.latency_s, nic.recv.latency_s) == (5e10, 5e10, 2e-5, 2e-5)
    net = PdNetwork(latency_s=2e-5)
    net.add("decode-0", 5e10)
    assert net.nics["decode-0"] == nic
    assert delivered_at(2.0, 3.5) == delivered_at(3.5, 2.0) == 3.5
