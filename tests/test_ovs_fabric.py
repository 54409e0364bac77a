"""Fabrics realised on real Open vSwitch (emulation/ovs.py): bridges, port numbers, host namespaces, link
faults, cleanup, and the data path itself.

No controller is involved: in `fail_mode=secure` a bridge without a controller drops everything, which is all
the structural tests need; the data-path tests add a NORMAL flow by hand on a loop-free one-switch fabric.
The naming tests at the top need neither root nor OVS.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from emulation.ovs import IFNAMSIZ, OvsDaemon, OvsFabric, leftovers
from tests.emulation_support import ovs_daemon_fixture  # noqa: F401 - the `ovs_daemon` fixture
from topologies.generators import fat_tree
from topologies.model import Fabric, Link, Node, NodeKind, PortRef, make_guid


def host_addresses(fabric: Fabric) -> dict[tuple[str, int], tuple[str, str]]:
    """MAC and IP from the host's index: h1 -> 02:fa:b1:00:00:01, 10.0.0.1."""
    return {
        (host.name, 1): (f"02:fa:b1:00:00:{i:02x}", f"10.0.0.{i}") for i, host in enumerate(fabric.hosts, 1)
    }


def star(hosts: int) -> Fabric:
    """One switch, `hosts` hosts on ports 1..hosts: no loops, so a NORMAL flow is safe."""
    nodes = {"s1": Node("s1", NodeKind.SWITCH, make_guid(NodeKind.SWITCH, 1), ports=hosts)}
    links = []
    for i in range(1, hosts + 1):
        nodes[f"h{i}"] = Node(f"h{i}", NodeKind.HOST, make_guid(NodeKind.HOST, i), ports=1)
        links.append(Link(PortRef(f"h{i}", 1), PortRef("s1", i), 100.0))
    return Fabric(f"star{hosts}", nodes, tuple(links))


def vsctl(*commands: list[str]) -> list[str]:
    """Several ovs-vsctl commands in one invocation, one output line each."""
    argv = ["ovs-vsctl", "--timeout=30"]
    for command in commands:
        argv += ["--", *command]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [line.strip().strip('"') for line in out.splitlines()]


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> float:
    """Seconds until `check()` held; fails the test after `timeout_s`."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"condition not met within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def link_state(interface: str) -> str:
    return vsctl(["get", "Interface", interface, "link_state"])[0]


# --- names (no root needed) ---------------------------------------------------------------------------


def test_names_are_short_unique_and_consistent() -> None:
    fabric = fat_tree(8)
    net = OvsFabric(fabric, host_addresses(fabric), tag="abc")
    names = [net.bridge_of(s.name) for s in fabric.switches]
    names += [net.veth_of(ref.node, ref.port) for ref in fabric.port_map if fabric.nodes[ref.node].is_switch]
    assert len(set(names)) == len(names)
    assert max(len(n) for n in names) <= IFNAMSIZ
    assert all(n.startswith("abc") for n in names)
    assert net.bridge_of("leaf1") == "abcs0"
    assert net.veth_of("leaf1", 1) == "abcs0p1"
    assert net.veth_of("h1", 1) == net.veth_of("leaf1", 1)  # a host port's root end is the switch side
    assert net.namespace_of("h1") == "abch0"
    assert net.host_interface("h1", 1) == "eth0"
    assert len({net.namespace_of(h.name) for h in fabric.hosts}) == len(fabric.hosts)
    assert len(OvsFabric(fabric, {}).tag) == 3


def test_bad_tags_are_rejected() -> None:
    fabric = fat_tree(8)
    with pytest.raises(ValueError, match="letters"):
        OvsFabric(fabric, {}, tag="Ab-1")
    with pytest.raises(ValueError, match="too long"):
        OvsFabric(fabric, {}, tag="abcdefghijk")


# --- a k=4 fat-tree on OVS ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k4(ovs_daemon: OvsDaemon) -> Iterator[OvsFabric]:
    fabric = fat_tree(4)
    net = OvsFabric(fabric, host_addresses(fabric), controller=None)
    with net:
        yield net
    assert leftovers(net.tag) == []


def test_bridges_have_datapath_ids_and_port_numbers(k4: OvsFabric) -> None:
    fabric = k4.fabric
    for switch in fabric.switches:
        br = k4.bridge_of(switch.name)
        ports = sorted(r.port for r in fabric.port_map if r.node == switch.name)
        values = vsctl(
            ["get", "Bridge", br, "datapath_id"],
            ["get", "Bridge", br, "datapath_type"],
            ["get", "Bridge", br, "fail_mode"],
            ["get", "Bridge", br, "protocols"],
            ["get", "Bridge", br, "other-config:disable-in-band"],
            ["get", "Bridge", br, "controller"],
            *(["get", "Interface", k4.veth_of(switch.name, p), "ofport"] for p in ports),
        )
        assert values[:6] == [f"{switch.guid:016x}", "netdev", "secure", "[OpenFlow13]", "true", "[]"]
        assert values[6:] == [str(p) for p in ports], f"{switch.name}: OpenFlow ports differ from topology"
    assert len(k4.bridges) == 20
    assert k4.dump_flows("leaf1") == []  # secure mode, no controller: no flows at all


def test_namespaces_have_addresses(k4: OvsFabric) -> None:
    for (host, port), (mac, ip) in k4.addresses.items():
        dev = k4.host_interface(host, port)
        out = k4.run(host, ["ip", "-o", "addr", "show", "dev", dev], capture_output=True, text=True).stdout
        assert f"inet {ip}/16" in out and "inet6" not in out, out
        link = k4.run(host, ["ip", "-o", "link", "show", "dev", dev], capture_output=True, text=True).stdout
        assert f"link/ether {mac}" in link and "mtu 1500" in link and ",UP," in link, link
    offload = k4.run("h1", ["ethtool", "-k", "eth0"], capture_output=True, text=True, check=True).stdout
    assert "tx-checksumming: off" in offload
    # No IPv6 address anywhere, so the kernel never sends solicitations or MLD reports into the fabric.
    root_end = k4.veth_of("leaf1", 3)
    argv = ["ip", "-6", "-o", "addr", "show", "dev", root_end]
    shown = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert shown.stdout == "", shown
    host_end = ["ip", "-6", "-o", "addr", "show", "dev", k4.host_interface("h1", 1)]
    assert "inet6" not in k4.run("h1", host_end, capture_output=True, text=True, check=True).stdout


def test_set_link_changes_link_state(k4: OvsFabric) -> None:
    fabric = k4.fabric
    link = next(lk for lk in fabric.links if all(fabric.nodes[e.node].is_switch for e in (lk.a, lk.b)))
    near, far = k4.veth_of(link.a.node, link.a.port), k4.veth_of(link.b.node, link.b.port)
    assert link_state(near) == link_state(far) == "up"
    k4.set_link(link.a.node, link.a.port, up=False)
    took = wait_until(lambda: link_state(far) == "down")
    assert link_state(near) == "down"
    k4.set_link(link.a.node, link.a.port, up=True)
    took = max(took, wait_until(lambda: link_state(far) == "up" and link_state(near) == "up"))
    assert took < 5.0

    switch_end = k4.veth_of("h1", 1)
    k4.set_link("h1", 1, up=False)
    wait_until(lambda: link_state(switch_end) == "down")
    inside = k4.run("h1", ["ip", "-o", "link", "show", "dev", "eth0"], capture_output=True, text=True).stdout
    assert "NO-CARRIER" in inside
    k4.set_link("h1", 1, up=True)
    wait_until(lambda: link_state(switch_end) == "up")


def test_set_controller_on_all_bridges(k4: OvsFabric) -> None:
    target = "tcp:127.0.0.1:9"  # nothing listens: the bridges keep retrying, harmless
    try:
        k4.set_controller(target)
        for br in k4.bridges:
            assert vsctl(["get-controller", br]) == [target]
        record = vsctl(["get", "Bridge", k4.bridges[0], "controller"])[0].strip("[]")
        columns = (["get", "Controller", record, column] for column in ("inactivity_probe", "max_backoff"))
        assert vsctl(*columns) == ["30000", "1000"]
    finally:
        k4.set_controller(None)
    assert all(vsctl(["get-controller", br]) == [] for br in k4.bridges)


# --- lifecycle -----------------------------------------------------------------------------------------


def test_down_is_idempotent_and_leaves_nothing(ovs_daemon: OvsDaemon) -> None:
    fabric = star(2)
    net = OvsFabric(fabric, host_addresses(fabric), controller=None)
    net.up()
    try:
        assert len(leftovers(net.tag)) == 6  # bridge, its internal (tap) interface, two veths, two namespaces
    finally:
        net.down()
    assert leftovers(net.tag) == []
    net.down()


def test_failed_up_cleans_up(ovs_daemon: OvsDaemon) -> None:
    fabric = star(2)
    bad = {**host_addresses(fabric), ("h2", 1): ("not-a-mac", "10.0.0.2")}
    net = OvsFabric(fabric, bad, controller=None)
    with pytest.raises(RuntimeError):
        net.up()
    assert leftovers(net.tag) == []


def test_tag_in_use_is_refused_without_touching_the_owner(ovs_daemon: OvsDaemon) -> None:
    fabric = star(2)
    with OvsFabric(fabric, host_addresses(fabric), controller=None) as owner:
        before = leftovers(owner.tag)
        intruder = OvsFabric(fabric, host_addresses(fabric), controller=None, tag=owner.tag)
        with pytest.raises(RuntimeError, match="in use"):
            intruder.up()
        intruder.down()
        assert leftovers(owner.tag) == before


# --- the data path -------------------------------------------------------------------------------------

TCP_SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5001)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(10); n = 0
while (chunk := c.recv(65536)):
    n += len(chunk)
print(n, flush=True)
"""
TCP_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5001), timeout=10); s.sendall(b"x" * 4_000_000); s.close()
"""


def test_data_path_with_a_normal_flow(ovs_daemon: OvsDaemon) -> None:
    fabric = star(5)
    with OvsFabric(fabric, host_addresses(fabric), controller=None) as net:
        names = [h.name for h in fabric.hosts]
        hosts = [(a, b) for a in names for b in names if a != b]
        assert not any(net.ping_all(hosts[:2], timeout_s=0.5).values())  # secure mode: no flow, no traffic
        br = net.bridge_of("s1")
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "add-flow", br, "actions=NORMAL"], check=True)
        assert any("actions=NORMAL" in flow for flow in net.dump_flows("s1"))
        result = net.ping_all(hosts, timeout_s=2.0, parallel=4)  # 4 at a time: several batches per source
        assert len(result) == 20 and all(result.values()), result

        # TCP works only because TX checksum offload is off in the namespaces.
        server = net.popen("h2", [sys.executable, "-c", TCP_SERVER], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "listening"
            client = net.run("h1", [sys.executable, "-c", TCP_CLIENT, "10.0.0.2"], timeout=30, check=False)
            assert client.returncode == 0
            assert server.communicate(timeout=30)[0].strip() == "4000000"
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


def test_static_arp_installs_permanent_neighbours(ovs_daemon: OvsDaemon) -> None:
    """Permanent entries do not count against the kernel's (all-namespace) ARP table limit, and hosts
    using them never ARP: pings work with a flow that forwards only IPv4."""
    fabric = star(3)
    with OvsFabric(fabric, host_addresses(fabric), controller=None, static_arp=True) as net:
        neigh = net.run("h1", ["ip", "neigh", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert sorted(line.strip() for line in neigh.splitlines()) == [
            f"10.0.0.{i} lladdr 02:fa:b1:00:00:{i:02x} PERMANENT" for i in (2, 3)
        ], neigh
        br = net.bridge_of("s1")
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "add-flow", br, "ip,actions=NORMAL"], check=True)
        result = net.ping_all([("h1", "h2"), ("h3", "h1")], timeout_s=2.0)
        assert all(result.values()), result
