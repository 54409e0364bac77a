"""Every file the controller reads at start (`controller-state.json`, and the `qos.json` older controllers
kept their QoS policy in, read once) goes through one reader
and one set of field checks (`controller.statefile`): damaged, hostile or hand-edited files are refused
whole, naming the file and the field, and `fabriclab controller` exits 2 before it listens — no traceback,
no hang (a FIFO), no memory blow-up (`/dev/zero`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.service import FabricService
from controller.sm.intents import MAX_GENERATION
from controller.statefile import MAX_DEPTH, read_json, write_json
from controller.statestore import LEGACY_QOS_FILE as QOS_FILE
from controller.statestore import STATE_FILE, StateError, StateStore
from emulation.controlproc import free_port
from tests.conftest import ROOT
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.generators import fat_tree
from topologies.loader import load_topology

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
STATE = {"format": 1, "engine": "ftree", "fast_failover": True, "multipath": False, "generation": 3}
QOS = {"generation": 2, "source": "rest", "policy": {"qos_levels": {"DEFAULT": {"sl": 0}}}}

# The same damage in either file: (content, what the message says).
DAMAGE: dict[str, tuple[bytes, str]] = {
    "binary": (bytes(range(256)), "not UTF-8 text"),
    "nested-100k": (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply (100,000 levels, at most 32)"),
    "infinity": (b'{"generation": Infinity}', "Infinity is not a number JSON allows"),
    "nan": (b'{"generation": NaN}', "NaN is not a number JSON allows"),
    "duplicate": (b'{"generation": 1, "generation": 2}', "'generation': field appears twice"),
    "5000-digits": (b'{"generation": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
    "huge": (b" " * 1_100_000 + b"{}", "too large: 1,100,002 bytes (at most 1,048,576)"),
    "not-json": (b"generation = 3", "invalid JSON"),
    "array": (b"[1, 2]", "the file: expected a JSON object, got [1, 2]"),
}

# qos.json's fields, each wrong alone (what used to be accepted silently or crash).
QOS_FIELDS: dict[str, tuple[object, str]] = {
    "generation=-7": ({**QOS, "generation": -7}, f"generation: must be 0..{MAX_GENERATION}, got -7"),
    "generation=1.9": ({**QOS, "generation": 1.9}, "generation: expected int, got 1.9"),
    "generation=true": ({**QOS, "generation": True}, "generation: expected int, got True"),
    "generation='12'": ({**QOS, "generation": "12"}, "generation: expected int, got '12'"),
    "generation=1e300": ({**QOS, "generation": 10**300}, "generation: must be 0..281474976710655, got an "
                         "integer of 997 bits"),
    "unknown-key": ({**QOS, "colour": "blue"}, "'colour': unknown field"),
    "no-generation": ({k: v for k, v in QOS.items() if k != "generation"}, "generation: missing"),
    "no-policy": ({"generation": 1}, "policy: missing"),
    "policy-list": ({**QOS, "policy": [1]}, "policy: expected dict, got [1]"),
    "source-long": ({**QOS, "source": "x" * 1000}, "source: at most 200 characters, got 1,000"),
    "bad-policy": ({**QOS, "policy": {"qos_levels": {"x": {"sl": 1}}}}, "policy.qos_levels"),
}  # fmt: skip


def _qos(path: Path) -> FabricService:
    """A controller starting on a state directory of an older controller: its qos.json beside its state."""
    if not (path / STATE_FILE).exists():
        (path / STATE_FILE).write_text(json.dumps(STATE))
    return FabricService.for_fabric(load_topology(TOPOLOGY), StateStore(path))


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("name", [STATE_FILE, QOS_FILE])
def test_the_same_damage_is_refused_alike_in_every_state_file(tmp_path: Path, name: str, kind: str) -> None:
    content, message = DAMAGE[kind]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(StateError) as info:
        StateStore(tmp_path).load() if name == STATE_FILE else _qos(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / name}: ") and message in str(info.value), info.value
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("kind", sorted(QOS_FIELDS))
def test_qos_json_fields_are_checked_exactly(tmp_path: Path, kind: str) -> None:
    data, message = QOS_FIELDS[kind]
    (tmp_path / QOS_FILE).write_text(json.dumps(data))
    with pytest.raises(StateError) as info:
        _qos(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / QOS_FILE}: ") and message in str(info.value), info.value


def test_a_good_qos_json_is_read_once_then_saved_with_the_rest(tmp_path: Path) -> None:
    (tmp_path / QOS_FILE).write_text(
        json.dumps({**QOS, "policy": {"qos_levels": {"DEFAULT": {"sl": 0}, "gold": {"sl": 0}}}})
    )
    config = _qos(tmp_path).snapshot().state.config
    assert config.qos_source == "rest" and [lv.name for lv in config.qos.levels] == ["DEFAULT", "gold"]
    state = StateStore(tmp_path).load()
    assert state is not None and state.qos is not None  # the state file has none yet: qos.json it is
    fabric = load_topology(TOPOLOGY)
    service = FabricService.for_fabric(fabric, StateStore(tmp_path), lldp_interval_s=3600)
    service.start(FakeSouthbound(FakeFabric(fabric, service.context.addresses), service))  # saves at start
    service.stop()
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["qos_source"] == "rest" and "gold" in saved["qos"]["qos_levels"]
    (tmp_path / QOS_FILE).write_text("damaged: not read again")
    again = _qos(tmp_path).snapshot().state.config
    assert again.qos == config.qos


def test_the_qos_policy_in_the_state_file_is_checked_against_the_fabric(tmp_path: Path) -> None:
    policy = {"qos_levels": {"DEFAULT": {"sl": 0}}, "port_groups": {"g": {"hosts": ["h1", "h99"]}}}
    (tmp_path / STATE_FILE).write_text(json.dumps({**STATE, "qos": policy, "qos_source": "rest"}))
    with pytest.raises(StateError) as info:
        _qos(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / STATE_FILE}: qos.port_groups.g.hosts"), info.value
    (tmp_path / STATE_FILE).write_text(json.dumps({**STATE, "qos": [1]}))
    with pytest.raises(StateError, match="qos: expected dict, got \\[1\\]"):
        _qos(tmp_path)


@pytest.mark.parametrize("name", [STATE_FILE, QOS_FILE])
def test_only_regular_files_are_read(tmp_path: Path, name: str) -> None:
    """A symlink to /dev/zero used to be read until MemoryError; a FIFO hung the start forever."""
    (tmp_path / name).symlink_to("/dev/zero")
    with pytest.raises(StateError, match="not a regular file \\(a character device\\)"):
        read_json(tmp_path / name)
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    with pytest.raises(StateError, match="not a regular file \\(a named pipe\\)"):
        read_json(tmp_path / name)
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    with pytest.raises(StateError, match="is a directory"):
        read_json(tmp_path / name)


def test_nesting_is_measured_outside_strings(tmp_path: Path) -> None:
    """Brackets inside strings do not count; the limit is what any real state file stays far below."""
    inner = json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"name": '[\\"[' * 1000, "list": inner}))
    loaded = read_json(path)
    assert isinstance(loaded, dict) and loaded["name"] == '[\\"[' * 1000
    path.write_text(json.dumps({"name": "]", "list": [inner]}))
    with pytest.raises(StateError, match=f"nested too deeply \\({MAX_DEPTH + 1} levels"):
        read_json(path)


def test_write_json_refuses_nan_and_leaves_no_temporary(tmp_path: Path) -> None:
    write_json(tmp_path / "x.json", {"a": 1})
    with pytest.raises(ValueError):
        write_json(tmp_path / "x.json", {"a": float("nan")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"] and read_json(tmp_path / "x.json") == {
        "a": 1
    }


# --- partitions saved in controller-state.json -------------------------------------------------------


def _partition(pkey: str, name: str, hosts: list[str]) -> dict[str, object]:
    return {"name": name, "pkey": pkey, "members": [{"host": h, "membership": "full"} for h in hosts]}


def test_a_partition_saved_twice_is_refused_not_dropped(tmp_path: Path) -> None:
    """0x0001 and 0x8001 are one partition (bit 15 is membership): the controller used to start and keep
    one of them silently."""
    parts = [_partition("0x0001", "a", ["h1", "h2"]), _partition("0x8001", "b", ["h3", "h4"])]
    (tmp_path / STATE_FILE).write_text(json.dumps({**STATE, "partitions": parts}))
    with pytest.raises(StateError) as info:
        StateStore(tmp_path).load()
    assert str(info.value) == (
        f"{tmp_path / STATE_FILE}: partitions[1].pkey: P_Key '0x8001' is partition 0x0001 again "
        "(partitions[0]): each partition is saved once"
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "a", "pkey": True, "members": []}, "partitions[0].pkey: P_Key must be a number, not True"),
        ({"name": "a", "pkey": "0x10000"}, "partitions[0].pkey: P_Key 0x10000 is outside 0x0001-0x7fff"),
        ({"name": "a b", "pkey": "0x1"}, "partitions[0].name: name must be 1-64 characters"),
        ({"name": "a", "pkey": "0x1", "colour": 1}, "partitions[0].colour: unknown key 'colour'"),
        ("0x0001", "partitions[0]: a partition must be a mapping"),
    ],
)
def test_partition_errors_name_the_file_and_the_entry(tmp_path: Path, entry: object, message: str) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps({**STATE, "partitions": [entry]}))
    with pytest.raises(StateError) as info:
        StateStore(tmp_path).load()
    assert str(info.value).startswith(f"{tmp_path / STATE_FILE}: {message}"), info.value
    assert "line 0" not in str(info.value)


def test_saved_members_the_topology_no_longer_has_name_the_file(tmp_path: Path) -> None:
    parts = [_partition("0x0001", "a", ["h1", "h99"])]
    (tmp_path / STATE_FILE).write_text(json.dumps({**STATE, "partitions": parts}))
    with pytest.raises(StateError) as info:
        FabricService.for_fabric(fat_tree(4), StateStore(tmp_path))
    assert str(info.value).startswith(f"{tmp_path / STATE_FILE}: partitions: unknown member 'h99'"), (
        info.value
    )


# --- the controller process refuses before it listens ------------------------------------------------


def _controller(state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", "controller", "--topology", str(TOPOLOGY), "--state-dir",
         str(state_dir), "--openflow", f"127.0.0.1:{free_port()}", "--api", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (QOS_FILE, b"[" * 100_000, "JSON nested too deeply"),
        (QOS_FILE, b'{"generation": Infinity, "policy": {}}', "Infinity is not a number JSON allows"),
        (QOS_FILE, json.dumps({**QOS, "generation": 1.9}).encode(), "generation: expected int, got 1.9"),
        (QOS_FILE, None, "not a regular file (a named pipe)"),
        (
            STATE_FILE,
            json.dumps(
                {
                    **STATE,
                    "partitions": [_partition("0x0001", "a", ["h1"]), _partition("0x8001", "b", ["h2"])],
                }
            ).encode(),
            "partitions[1].pkey",
        ),
    ],
    ids=["qos-nested", "qos-infinity", "qos-float-generation", "qos-fifo", "state-pkey-twice"],
)
def test_the_controller_exits_2_naming_file_and_field(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    if name == QOS_FILE:  # an older controller's directory: its state file beside its qos.json
        (tmp_path / STATE_FILE).write_text(json.dumps(STATE))
    if content is None:
        os.mkfifo(tmp_path / name)
    else:
        (tmp_path / name).write_bytes(content)
    done = _controller(tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"--state-dir: {tmp_path / name}: " in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
