"""Partition enforcement on fake switches that decode the controller's real OpenFlow bytes.

The decision core computes, the fake southbound sends what `controller.southbound.openflow` encodes, and the
fake switches apply it: isolation, forged sources, limited-limited, and a make-before-break membership change
are all checked on what the switches hold, packet by packet.
"""

from __future__ import annotations

import itertools

import pytest

from controller.core.events import PartitionsRequested
from controller.sm.intents import ForwardingOptions
from controller.sm.isolation import PRIORITY_PKEY_DENY, PRIORITY_PKEY_GUARD_IP, arp_allowed, drop_owner
from controller.sm.partitions import Partitions
from controller.sm.partitions_conf import parse_conf, resolve
from tests.core_driver import CoreDriver
from topologies.generators import fat_tree
from topologies.model import Fabric

CONF = """
train = 0x8001 : h1=full, h2=full, h5=full, h6=full, h9=limited ;
infer = 0x0002, defmember=full : h3, h7, h13 ;
storage = 0x0003 : h11=full, h12, h14 ;   # h12, h14 limited: they may not talk to each other
"""
TRAIN = ["h1", "h2", "h5", "h6", "h9"]
INFER = ["h3", "h7", "h13"]


@pytest.fixture(scope="module")
def k4() -> Fabric:
    return fat_tree(4)


def _driver(fabric: Fabric, partitions: Partitions | None, policy: str = "static") -> CoreDriver:
    driver = CoreDriver(fabric, options=ForwardingOptions(policy=policy), partitions=partitions)
    driver.start()
    driver.connect_all()
    return driver


@pytest.mark.parametrize("policy", ["static", "ecmp"])
def test_only_permitted_pairs_pass_at_the_ingress_edge(k4: Fabric, policy: str) -> None:
    partitions = resolve(parse_conf(CONF), k4)
    driver = _driver(k4, partitions, policy)
    driver.assert_holds_desired()
    hosts = [h.name for h in k4.hosts]
    passed = denied = 0
    for src, dst in itertools.permutations(hosts, 2):
        for sport in (None, 4791, 50000):
            delivered = driver.fake.delivers(src, dst, udp_src=sport)
            assert delivered == partitions.permitted(src, dst), (src, dst, sport)
            passed += delivered
            denied += not delivered
    assert passed and denied
    # inside a partition everyone full talks; across partitions nothing does
    assert all(driver.fake.delivers(a, b) for a, b in itertools.permutations(TRAIN[:4], 2))
    assert not any(driver.fake.delivers(a, b) for a in TRAIN for b in INFER)
    # limited-limited denied (h12, h14 in storage), full-limited allowed (h11 with both)
    assert not driver.fake.delivers("h12", "h14") and not driver.fake.delivers("h14", "h12")
    assert driver.fake.delivers("h11", "h12") and driver.fake.delivers("h14", "h11")
    # h9 is a limited member of train: it reaches the full members, so do they reach it
    assert driver.fake.delivers("h9", "h1") and driver.fake.delivers("h1", "h9")


def test_a_host_forging_another_hosts_source_gets_nothing_through(k4: Fabric) -> None:
    partitions = resolve(parse_conf(CONF), k4)
    driver = _driver(k4, partitions)
    # h3 (infer) claims h1's MAC and IP (train) to reach h2 (train): its port's flows only know h3
    assert not driver.fake.delivers("h3", "h2", forge="h1")
    assert not driver.fake.delivers("h3", "h5", forge="h1", udp_src=4791)
    # even forging a partition-mate's address inside its own partition is dropped (the port is h3's)
    assert not driver.fake.delivers("h3", "h7", forge="h13")
    assert driver.fake.delivers("h3", "h7")
    leaf = k4.peer("h3", 1)
    assert leaf is not None
    switch = driver.fake.switches[leaf.node]
    guards = [k for k in switch.packets if k[1] == PRIORITY_PKEY_GUARD_IP and ("in_port", leaf.port) in k[2]]
    # forged towards another tenant: that tenant's deny flow; forged within its own partition: the IPv4 guard
    assert guards and switch.packets[guards[0]] == 1
    denied = sum(n for k, n in switch.packets.items() if k[1] == PRIORITY_PKEY_DENY)
    assert denied == 2


def test_other_frames_of_a_permitted_pair_pass_and_nothing_else(k4: Fabric) -> None:
    """RoCE v1 (ethertype 0x8915, no IP header) and raw Ethernet between permitted hosts pass on their MACs
    and ingress port; to a denied host, or with a forged source MAC, they are dropped like IPv4."""
    driver = _driver(k4, resolve(parse_conf(CONF), k4))
    for eth_type in (0x8915, 0x88B5):
        assert driver.fake.delivers("h1", "h5", eth_type=eth_type)
        assert driver.fake.delivers("h9", "h1", eth_type=eth_type)  # full-limited
        assert not driver.fake.delivers("h1", "h3", eth_type=eth_type)  # another partition
        assert not driver.fake.delivers("h12", "h14", eth_type=eth_type)  # limited-limited
        assert not driver.fake.delivers("h3", "h7", eth_type=eth_type, forge="h13")  # forged source MAC


def test_denied_packets_are_counted_per_partition(k4: Fabric) -> None:
    partitions = resolve(parse_conf(CONF), k4)
    driver = _driver(k4, partitions)
    for _ in range(5):
        assert not driver.fake.delivers("h3", "h1")
    leaf = k4.peer("h3", 1)
    assert leaf is not None
    switch = driver.fake.switches[leaf.node]
    program = driver.state.current.programs[leaf.node]  # type: ignore[union-attr]
    counted: dict[int, int] = {}
    for key, n in switch.packets.items():
        owner = drop_owner(program.flows[key], leaf.node, partitions, driver.context.attached)
        if owner is not None and owner[0] == "denied":
            for pkey in owner[1]:
                counted[pkey] = counted.get(pkey, 0) + n
    assert counted[0x0001] == 5  # h1's partition (train) was protected five times
    assert any(k[1] == PRIORITY_PKEY_DENY for k in switch.packets)


def test_arp_answers_respect_partitions(k4: Fabric) -> None:
    partitions = resolve(parse_conf(CONF), k4)
    context = _driver(k4, partitions).context
    leaf = k4.peer("h3", 1)
    assert leaf is not None
    assert arp_allowed(partitions, context.attached, leaf.node, leaf.port, "h7")
    assert not arp_allowed(partitions, context.attached, leaf.node, leaf.port, "h1")
    assert not arp_allowed(partitions, context.attached, leaf.node, 99, "h7")  # nobody on that port
    assert arp_allowed(None, context.attached, leaf.node, leaf.port, "h1")  # no file: everyone talks


def test_no_partitions_file_changes_nothing(k4: Fabric) -> None:
    plain = _driver(k4, None)
    default = _driver(k4, resolve(parse_conf("Default=0x7fff : ALL=full ;"), k4))
    hosts = [h.name for h in k4.hosts]
    assert plain.fake.assert_delivers(plain.fake.all_pairs(hosts)) == 240
    assert default.fake.assert_delivers(default.fake.all_pairs(hosts)) == 240
    # a file without a Default rule: hosts only talk through the partitions the file gives them
    only = _driver(k4, resolve(parse_conf("a=1 : h1=full, h16 ;"), k4))
    assert only.fake.delivers("h1", "h16") and not only.fake.delivers("h2", "h3")


def test_membership_change_is_make_before_break_and_leaves_other_partitions_alone(k4: Fabric) -> None:
    before = resolve(parse_conf(CONF), k4)
    driver = _driver(k4, before)
    others = [(a, b) for a, b in itertools.permutations(TRAIN[:4], 2)]
    # move h7 from infer to train
    moved = CONF.replace("h3, h7, h13", "h3, h13").replace("h9=limited", "h9=limited, h7=full")
    after = resolve(parse_conf(moved), k4)
    seen: list[tuple[bool, bool]] = []

    def between() -> None:  # after every switch confirmed the adds, before any delete
        assert all(driver.fake.delivers(a, b) for a, b in others)
        seen.append((driver.fake.delivers("h7", "h1"), driver.fake.delivers("h7", "h3")))

    driver.sb.between_phases.append(between)
    untouched = {n: dict(s.flows) for n, s in driver.fake.switches.items()}
    driver.feed(PartitionsRequested(1, after, "move h7 to train"))
    assert driver.replies[1].error is None, driver.replies[1].error
    assert seen == [(True, True)]  # new pair allowed (make) before the old one is removed (break)
    assert driver.fake.delivers("h7", "h1") and not driver.fake.delivers("h7", "h3")
    assert all(driver.fake.delivers(a, b) for a, b in others)
    driver.assert_holds_desired()
    # flows of pairs whose permission did not change were never rewritten
    changed = {
        n for n, s in driver.fake.switches.items() if {k: f.actions for k, f in s.flows.items()}
        != {k: f.actions for k, f in untouched[n].items()}
    }  # fmt: skip
    leaves_with_h7_peers = {p.node for h in ("h7", "h1", "h2", "h3", "h5", "h6", "h9", "h13")
                            if (p := k4.peer(h, 1)) is not None}  # fmt: skip
    assert changed and changed <= leaves_with_h7_peers
    record = driver.records("partition_change")[-1]
    assert record.reason == "move h7 to train"
    assert driver.saves[-1].partitions is not None


def test_a_failed_save_changes_nothing(k4: Fabric) -> None:
    before = resolve(parse_conf(CONF), k4)
    driver = _driver(k4, before)
    flows = {n: dict(s.flows) for n, s in driver.fake.switches.items()}
    driver.save_error = "disk full"
    driver.feed(PartitionsRequested(7, resolve(parse_conf("x=9 : ALL=full;"), k4), "open everything"))
    assert driver.replies[7].error is not None
    assert driver.state.config.partitions == before
    assert {n: dict(s.flows) for n, s in driver.fake.switches.items()} == flows
    assert not driver.fake.delivers("h3", "h1")
