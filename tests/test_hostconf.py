"""In-process host configuration (emulation.hostconf) on real network namespaces and veths.

The reference is the shell version it replaces (`ip netns exec NAME sh -ec "..."` as lightnet/sharded run
it): one host is configured that way, the others by `configure_hosts`, and their interfaces must end up
with the same features, flags, MTU and addresses.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from emulation.hostconf import HostConfigError, HostIntf, configure_hosts
from tests.emulation_support import require_emulation

HOSTS = 4
MTU = 1400


def _ip(*args: str) -> Any:
    return json.loads(subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout)


def _features(ns: str, intf: str) -> list[str]:
    """`ethtool -k` of an interface, without its first line (which names the interface)."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "ethtool", "-k", intf], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()[1:]


def _shell_configure(ns: str, intf: str, address: str) -> None:
    """The configuration lines lightnet/sharded run in a host today."""
    script = (f"ip link set lo up; ip link set {intf} addrgenmode none; ip -6 addr flush dev {intf}; "
              f"ethtool -K {intf} tx off >/dev/null; ip link set {intf} mtu {MTU}; "
              f"ip addr add {address}/16 dev {intf}; ip link set {intf} up")  # fmt: skip
    subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec", script], check=True, capture_output=True)


@pytest.fixture(name="hosts")
def hosts_fixture() -> Iterator[list[HostIntf]]:
    """HOSTS namespaces of our own (unique prefix), each holding one end of a veth whose root end is up
    (so the host end gets a carrier, and a link-local address would appear if generation were on)."""
    if os.geteuid() != 0:
        require_emulation("network namespaces need root")
    prefix = "hc" + secrets.token_hex(2)
    names = [f"{prefix}{i}" for i in range(HOSTS)]
    lines = [f"netns add {n}\nlink add {n}r type veth peer name {n}-eth0 netns {n}\nlink set {n}r up\n"
             for n in names]  # fmt: skip
    try:
        subprocess.run(
            ["ip", "-batch", "-"], input="".join(lines), text=True, check=True, capture_output=True
        )
        yield [
            HostIntf(f"/run/netns/{n}", f"{n}-eth0", f"10.77.0.{i + 1}", 16, MTU) for i, n in enumerate(names)
        ]
    finally:
        for n in names:  # deleting the namespace deletes the veth pair with it
            subprocess.run(["ip", "netns", "del", n], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", f"{n}r"], capture_output=True, check=False)


def _check_host(host: HostIntf) -> None:
    ns = os.path.basename(host.netns)
    links = {link["ifname"]: link for link in _ip("-n", ns, "link", "show")}
    assert "UP" in links["lo"]["flags"]
    intf = links[host.interface]
    # Flags, not operstate: the kernel sets operstate later (linkwatch, up to a second under load).
    assert {"UP", "LOWER_UP"} <= set(intf["flags"])
    assert intf["mtu"] == host.mtu
    addrs = {a["ifname"]: a["addr_info"] for a in _ip("-n", ns, "addr", "show")}
    assert [(a["family"], a["local"], a["prefixlen"], a["scope"]) for a in addrs[host.interface]] == [
        ("inet", host.ipv4, host.prefix_len, "global")
    ]
    assert _ip("-n", ns, "-6", "addr", "show", "dev", host.interface) in ([], [{}])
    assert "tx-checksumming: off" in _features(ns, host.interface)


def test_configures_like_the_shell_version(hosts: list[HostIntf]) -> None:
    reference, *ours = hosts
    assert reference.ipv4 is not None
    _shell_configure(os.path.basename(reference.netns), reference.interface, reference.ipv4)
    home = os.readlink("/proc/self/ns/net")
    configure_hosts(ours)
    assert os.readlink("/proc/self/ns/net") == home
    for host in hosts:
        _check_host(host)
    expected = _features(os.path.basename(reference.netns), reference.interface)
    assert "tx-checksumming: off" in expected
    for host in ours:
        assert _features(os.path.basename(host.netns), host.interface) == expected


def test_existing_ipv6_addresses_are_flushed(hosts: list[HostIntf]) -> None:
    """An interface that was up with addresses before: its link-local and global IPv6 addresses go."""
    host = hosts[0]
    ns = os.path.basename(host.netns)
    subprocess.run(
        ["ip", "-n", ns, "addr", "add", "2001:db8::7/64", "dev", host.interface, "nodad"], check=True
    )
    subprocess.run(["ip", "-n", ns, "link", "set", host.interface, "up"], check=True)
    assert _ip("-n", ns, "-6", "addr", "show", "dev", host.interface)[0]["addr_info"]
    configure_hosts([host])
    _check_host(host)


def test_no_address_and_no_mtu_leave_them_alone(hosts: list[HostIntf]) -> None:
    host = HostIntf(hosts[0].netns, hosts[0].interface, None, 16)
    configure_hosts([host])
    ns = os.path.basename(host.netns)
    (link,) = _ip("-n", ns, "link", "show", "dev", host.interface)
    assert "UP" in link["flags"] and link["mtu"] == 1500
    assert _ip("-n", ns, "addr", "show", "dev", host.interface)[0]["addr_info"] == []


@pytest.mark.parametrize(
    ("change", "step", "reason"),
    [
        ({"interface": "nosuch0"}, "interface index", "No such device"),
        ({"interface": "x" * 20}, "interface index", "too long"),
        ({"netns": "/run/netns/hc-no-such-namespace"}, "enter namespace", "No such file"),
        ({"mtu": 10}, "mtu", "Invalid argument"),
        ({"ipv4": "10.77.0.300"}, "ipv4 address", "10.77.0.300"),
        ({"prefix_len": 40}, "ipv4 address", "Invalid argument"),
    ],
)
def test_a_bad_host_is_named_with_its_step(
    hosts: list[HostIntf], change: dict[str, Any], step: str, reason: str
) -> None:
    """The first failure stops the run with the host and step named; hosts before it are configured,
    hosts after it untouched, and the caller is back in its own namespace."""
    good, bad_base, after = hosts[0], hosts[1], hosts[2]
    bad = HostIntf(**{**bad_base.__dict__, **change})
    home = os.readlink("/proc/self/ns/net")
    with pytest.raises(HostConfigError) as caught:
        configure_hosts([good, bad, after])
    assert os.readlink("/proc/self/ns/net") == home
    assert (caught.value.host, caught.value.step) == (os.path.basename(bad.netns), step)
    assert reason in str(caught.value) and caught.value.host in str(caught.value)
    _check_host(good)
    (link,) = _ip("-n", os.path.basename(after.netns), "link", "show", "dev", after.interface)
    assert "UP" not in link["flags"]


def test_duplicate_address_is_reported(hosts: list[HostIntf]) -> None:
    configure_hosts(hosts[:1])
    with pytest.raises(HostConfigError, match="ipv4 address failed: File exists"):
        configure_hosts(hosts[:1])
