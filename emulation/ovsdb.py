"""Bridges, ports and controllers created in one OVSDB transaction over JSON-RPC (RFC 7047).

`ovs-vsctl` with every bridge of a k=16 fat-tree on one command line (320 bridges, 5,120 ports) spends
minutes of its own CPU before it sends anything (its per-command lookups grow with the command line), and
one `ovs-vsctl` per switch costs a transaction and an ovs-vswitchd reconfiguration each, which grow with the
database: 10 s per switch at 300 bridges.  The database itself takes the same rows as one `transact` in
well under a second, and ovs-vswitchd then reconfigures once.  So a fabric's bridges are written here as
JSON rows straight to ovsdb-server's socket; only names the caller chose are inserted, and nothing is
deleted (removal stays `ovs-vsctl del-br`, which also cleans up ports and controllers).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DB_SOCK = "/var/run/openvswitch/db.sock"


class OvsdbError(RuntimeError):
    pass


@dataclass(frozen=True)
class BridgeSpec:
    """A bridge as the emulator wants it: netdev datapath, OpenFlow 1.3, fail_mode secure, in-band off."""

    name: str
    dpid: int
    #: (interface name, OpenFlow port number) of every port.
    ports: Sequence[tuple[str, int]]
    controller: str | None = None
    inactivity_probe_ms: int = 30000
    other_config: Mapping[str, str] = field(default_factory=dict)
    #: Ports that are OVS patch ports: interface name -> the peer patch port's interface name (on a bridge
    #: of the same ovs-vswitchd).
    patches: Mapping[str, str] = field(default_factory=dict)
    #: Ports read and written through AF_XDP sockets instead of packet sockets: interface name -> the
    #: Interface type (`afxdp-nonpmd`: polled by ovs-vswitchd's main thread) and its options.
    fast_ports: Mapping[str, tuple[str, Mapping[str, str]]] = field(default_factory=dict)


def _map(items: Mapping[str, str]) -> list[Any]:
    return ["map", [[k, v] for k, v in sorted(items.items())]]


def _uuid_name(kind: str, i: int, j: int = 0) -> str:
    return f"{kind}{i}x{j}"


def _controller_insert(br: BridgeSpec, i: int) -> dict[str, Any]:
    row = {"target": br.controller, "inactivity_probe": br.inactivity_probe_ms, "max_backoff": 1000}
    return {"op": "insert", "table": "Controller", "uuid-name": _uuid_name("c", i), "row": row}


def controller_operations(bridges: Sequence[BridgeSpec]) -> list[dict[str, Any]]:
    """The `transact` operations giving existing bridges (by name) their controller, for a build that
    writes its bridges first and lets them dial the controller only once every host end of their cables
    is up: a switch that connects with ports still down makes the controller route around them, then
    route again as each comes up (at k=16 that took the tables from 18 s to 45 s)."""
    ops: list[dict[str, Any]] = []
    for i, br in enumerate(bridges):
        if br.controller is None:
            continue
        ops.append(_controller_insert(br, i))
        ops.append({"op": "update", "table": "Bridge", "where": [["name", "==", br.name]],
                    "row": {"controller": ["named-uuid", _uuid_name("c", i)]}})  # fmt: skip
    ops.append({"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [["next_cfg", "+=", 1]]})
    return ops


def bridge_operations(bridges: Sequence[BridgeSpec], controllers: bool = True) -> list[dict[str, Any]]:
    """The `transact` operations inserting these bridges (with their local port, ports, interfaces and
    — unless `controllers` is False, see `controller_operations` — controller) and adding them to the
    Open_vSwitch record; `next_cfg` is bumped so ovs-vswitchd's `cur_cfg` tells when it has applied
    them."""
    ops: list[dict[str, Any]] = []
    refs: list[list[str]] = []
    for i, br in enumerate(bridges):
        ports: list[list[str]] = []
        for j, (intf, ofport) in enumerate([(br.name, -1), *br.ports]):
            row: dict[str, Any] = {"name": intf}
            if ofport < 0:
                row["type"] = "internal"
            else:
                row["ofport_request"] = ofport
            if intf in br.patches:
                row["type"] = "patch"
                row["options"] = _map({"peer": br.patches[intf]})
            elif intf in br.fast_ports:
                row["type"], options = br.fast_ports[intf]
                row["options"] = _map(dict(options))
            ops.append({"op": "insert", "table": "Interface", "row": row, "uuid-name": _uuid_name("i", i, j)})
            ops.append(
                {
                    "op": "insert",
                    "table": "Port",
                    "uuid-name": _uuid_name("p", i, j),
                    "row": {"name": intf, "interfaces": ["named-uuid", _uuid_name("i", i, j)]},
                }
            )
            ports.append(["named-uuid", _uuid_name("p", i, j)])
        bridge: dict[str, Any] = {
            "name": br.name,
            "ports": ["set", ports],
            "datapath_type": "netdev",
            "protocols": "OpenFlow13",
            "fail_mode": "secure",
            "other_config": _map(
                {"datapath-id": f"{br.dpid:016x}", "disable-in-band": "true", **br.other_config}
            ),
        }
        if br.controller is not None and controllers:
            ops.append(_controller_insert(br, i))
            bridge["controller"] = ["named-uuid", _uuid_name("c", i)]
        ops.append({"op": "insert", "table": "Bridge", "row": bridge, "uuid-name": _uuid_name("b", i)})
        refs.append(["named-uuid", _uuid_name("b", i)])
    ops.append(
        {
            "op": "mutate",
            "table": "Open_vSwitch",
            "where": [],
            "mutations": [["bridges", "insert", ["set", refs]], ["next_cfg", "+=", 1]],
        }
    )
    return ops


class Ovsdb:
    """A JSON-RPC connection to ovsdb-server (the `Open_vSwitch` database)."""

    def __init__(self, path: str = DB_SOCK, timeout_s: float = 120.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise OvsdbError(f"cannot connect to ovsdb-server at {path}: {exc}") from None
        self._buf = b""
        self._decoder = json.JSONDecoder()
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Ovsdb:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, params: list[Any]) -> Any:
        self._next_id += 1
        msg_id = self._next_id
        self.sock.sendall(json.dumps({"method": method, "params": params, "id": msg_id}).encode())
        while True:
            msg = self._read()
            if msg.get("method") == "echo":  # the server's keepalive: answer it
                reply = {"result": msg["params"], "error": None, "id": msg["id"]}
                self.sock.sendall(json.dumps(reply).encode())
                continue
            if msg.get("id") == msg_id:
                if msg.get("error") is not None:
                    raise OvsdbError(f"{method}: {msg['error']}")
                return msg["result"]

    def _read(self) -> dict[str, Any]:
        while True:
            text = self._buf.lstrip()
            if text:
                try:
                    obj, end = self._decoder.raw_decode(text.decode())
                except (ValueError, UnicodeDecodeError):
                    pass  # incomplete: read more
                else:
                    self._buf = text.decode()[end:].encode()
                    return dict(obj)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise OvsdbError("ovsdb-server closed the connection")
            self._buf += chunk

    def transact(self, ops: list[dict[str, Any]]) -> list[Any]:
        result: list[Any] = self.call("transact", ["Open_vSwitch", *ops])
        for op, res in zip([*ops, None], result, strict=False):
            if isinstance(res, dict) and "error" in res:
                what = op["op"] + " " + op.get("table", "") if op else "commit"
                raise OvsdbError(f"{what}: {res['error']}: {res.get('details', '')}")
        return result

    def select(self, table: str, columns: Iterable[str]) -> list[dict[str, Any]]:
        ops = [{"op": "select", "table": table, "where": [], "columns": list(columns)}]
        return list(self.transact(ops)[0]["rows"])

    def applied(self) -> bool:
        """Whether ovs-vswitchd has applied the database as it is now (`cur_cfg` reached `next_cfg`)."""
        row = self.select("Open_vSwitch", ["cur_cfg", "next_cfg"])[0]
        return bool(row["cur_cfg"] >= row["next_cfg"])

    def wait_applied(self, timeout_s: float = 300.0) -> None:
        """Until ovs-vswitchd has applied the database as it is now (`cur_cfg` reaches `next_cfg`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            row = self.select("Open_vSwitch", ["cur_cfg", "next_cfg"])[0]
            if row["cur_cfg"] >= row["next_cfg"]:
                return
            if time.monotonic() > deadline:
                raise OvsdbError(f"ovs-vswitchd did not apply the configuration within {timeout_s:g} s")
            time.sleep(0.1)


__all__ = [
    "DB_SOCK",
    "BridgeSpec",
    "Ovsdb",
    "OvsdbError",
    "bridge_operations",
    "controller_operations",
]


def delete_bridges(
    names: Iterable[str], db: str = DB_SOCK, timeout_s: float = 300.0, wait: bool = True
) -> list[str]:
    """Delete the bridges of exactly these names (their ports, interfaces and controllers go with them:
    the database collects unreferenced rows) in one transaction; returns the names deleted."""
    wanted = set(names)
    with Ovsdb(db, timeout_s) as conn:
        rows = [r for r in conn.select("Bridge", ["_uuid", "name"]) if r["name"] in wanted]
        if not rows:
            return []
        uuids = [r["_uuid"] for r in rows]
        mutations = [["bridges", "delete", ["set", uuids]], ["next_cfg", "+=", 1]]
        ops: list[dict[str, Any]] = [
            {"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": mutations}
        ]
        ops += [{"op": "delete", "table": "Bridge", "where": [["_uuid", "==", u]]} for u in uuids]
        conn.transact(ops)
        if wait:
            conn.wait_applied(timeout_s)
    return sorted(r["name"] for r in rows)
