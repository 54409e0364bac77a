"""The QoS policy: model, file layers (errors with line and field), resolution, tc realisation, CLI, REST."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from controller.formats.qosfile import QosFileError, parse_policy, policy_from_data
from controller.formats.qosload import load_policy
from controller.rest.api import create_app
from controller.service import FabricService
from controller.sm.qos import (
    default_policy,
    dscp_to_sl,
    group_members,
    match_level,
    policy_data,
    queue_plan,
    sl_to_dscp,
    sl_to_pcp,
)
from controller.statestore import STATE_FILE, StateStore
from emulation.qosqueues import PortShape, leaf_of, parse_class_stats, tc_lines
from emulation.qosreport import class_summary
from fabriclab.cli import main
from tests.conftest import ROOT
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.errors import InputError
from topologies.loader import load_topology

K4 = ROOT / "topologies" / "fat-tree-k4.yaml"
TENANTS = ROOT / "scenarios" / "qos-tenants.yaml"


@pytest.fixture(scope="module", name="k4")
def k4_fixture() -> Any:
    return load_topology(K4)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "qos.yaml"
    path.write_text(text)
    return path


# --- model and DSCP map -----------------------------------------------------------------------------------


def test_the_dscp_map_round_trips_every_sl() -> None:
    policy = parse_policy("qos_levels: {DEFAULT: {sl: 0}}\ndscp_to_sl: {26: 3, 46: 7}\n", "p")
    table, marks = dscp_to_sl(policy), sl_to_dscp(policy)
    assert table[26] == 3 and table[46] == 7 and table[24] == 6 and table[0] == 0
    for sl, dscp in enumerate(marks):  # what a sender marks for an SL is classified back into that SL
        assert dscp is not None and table[dscp] == sl
    assert marks[3] == 26  # the named code wins over the block's first
    assert sl_to_pcp(policy) == tuple(sl % 8 for sl in range(16))


def test_first_matching_rule_wins_and_default_catches_the_rest(k4: Any) -> None:
    policy = load_policy(TENANTS, k4)
    members = {g.name: group_members(g, k4) for g in policy.port_groups}
    assert match_level(policy, members, "h1", "h2").name == "training"
    assert match_level(policy, members, "h3", "h4").name == "kvcache"
    assert match_level(policy, members, "h1", "h3").name == "DEFAULT"  # across tenants
    assert match_level(policy, members, "h1", "h2", dscp=28).name == "control"  # listed first
    assert match_level(policy, members, "h3", "h4", dscp=12).name == "bulk"


def test_queue_plan_weights_strict_and_caps(k4: Any) -> None:
    plan = queue_plan(load_policy(TENANTS, k4))
    by_queue = {q.queue: q for q in plan.queues}
    assert by_queue[1].share == pytest.approx(3 * by_queue[2].share)  # 192:64
    assert by_queue[7].strict and not by_queue[1].strict
    assert dict(by_queue[3].rate_limits_gbps) == {3: 100.0}
    assert plan.queue_of_dscp(4) == 1 and plan.queue_of_dscp(28) == 7 and plan.default_queue == 0


def test_group_members_by_guid_node_type_and_pkey(k4: Any) -> None:
    policy = parse_policy(
        "port_groups:\n"
        "  byguid: {guids: [0x02fab10100000200]}\n"
        "  switches: {node_types: [SWITCH]}\n"
        "  everyone: {pkeys: [0x7fff]}\n"
        "qos_levels: {DEFAULT: {sl: 0}}\n",
        "p",
        k4,
    )
    groups = {g.name: g for g in policy.port_groups}
    assert group_members(groups["byguid"], k4) == ["h3"]
    assert len(group_members(groups["switches"], k4)) == len(k4.switches)
    assert len(group_members(groups["everyone"], k4)) == len(k4.hosts)
    assert group_members(groups["everyone"], k4, {0x7FFF: ["h1"]}) == ["h1"]


def test_file_round_trips_through_state_data(k4: Any) -> None:
    policy = load_policy(TENANTS, k4)
    assert policy_from_data(json.loads(json.dumps(policy_data(policy))), "saved", k4) == policy


def test_opensm_default_is_one_queue() -> None:
    plan = queue_plan(default_policy())
    assert [q.queue for q in plan.queues] == [0] and plan.default_queue == 0


# --- bad policies: rejected whole, line and field named ----------------------------------------------------

BAD = [
    ("qos_levels:\n  gold: {sl: 1}\n", 2, "qos_levels", "DEFAULT"),
    ('qos_levels:\n  DEFAULT: {sl: 0}\nvlarb:\n  low: "0:64, 1:abc"\n', 4, "vlarb.low", "VL:weight"),
    ('qos_levels:\n  DEFAULT: {sl: 0}\nvlarb:\n  low: "0:64, 1:300"\n', 4, "vlarb.low", "0-255"),
    (
        "qos_levels:\n  DEFAULT: {sl: 0}\n  gold: {sl: 1}\nmatch_rules:\n  - {source: nobody, level: gold}\n",
        5,
        "match_rules[0].source",
        "unknown port group",
    ),
    (
        "qos_levels:\n  DEFAULT: {sl: 0}\nmatch_rules:\n  - {level: silver}\n",
        4,
        "match_rules[0].level",
        "silver",
    ),
    ("qos_levels:\n  DEFAULT: {sl: 0}\nport_groups:\n  a: {hosts: [h99]}\n", 4, "port_groups.a.hosts", "h99"),
    ("qos_levels:\n  DEFAULT: {sl: 0}\n  gold: {sl: 2}\n", 3, "qos_levels.gold.sl", "never be sent"),
    ("qos_levels:\n  DEFAULT: {sl: 0, pkey: 0x8000}\n", 2, "qos_levels.DEFAULT.pkey", "0x0001-0x7fff"),
    ("qos_levels:\n  DEFAULT: {sl: 16}\n", 2, "qos_levels.DEFAULT.sl", "15"),
    ('qos_levels:\n  DEFAULT: {sl: 0}\nvlarb: {low: "0:1", hihg: 2}\n', 3, "vlarb.hihg", "did you mean"),
    ("qos_levels:\n  DEFAULT: {sl: 0\n", 3, None, "invalid YAML"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), BAD)
def test_bad_policies_name_line_and_field(
    tmp_path: Path, k4: Any, text: str, line: int, field: str | None, words: str
) -> None:
    with pytest.raises(QosFileError) as info:
        load_policy(write(tmp_path, text), k4)
    assert info.value.line == line, str(info.value)
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)


@pytest.mark.parametrize(("text", "line", "field", "words"), BAD[:3])
def test_qos_check_cli_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, field: str, words: str
) -> None:
    path = write(tmp_path, text)
    assert main(["qos", "check", str(path), "--topology", str(K4)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}:{line}: {field}:" in err and words in err


def test_qos_check_prints_the_resolved_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["qos", "check", str(TENANTS), "--topology", str(K4)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["port_groups"]["trainers"]["members"][:2] == ["h1", "h10"]
    assert {q["queue"]: q["arbitration"] for q in out["queues"]} == {
        0: "weighted", 1: "weighted", 2: "weighted", 3: "weighted", 7: "strict",
    }  # fmt: skip
    assert out["sl_to_dscp"][7] == 28


# --- realisation on tc -------------------------------------------------------------------------------------


def test_tc_lines_give_each_class_its_leaf_and_filters(k4: Any) -> None:
    policy = load_policy(TENANTS, k4)
    ip, tc = tc_lines(policy, PortShape("leaf2-eth1", 40.0, 0.1), 200, "64k")
    assert ip[0] == "link add leaf2-eth1q type ifb"
    text = "\n".join(tc)
    assert "filter add dev leaf2-eth1 egress protocol ip prio 1 u32 match u32 0 0 action mirred egress " \
        "redirect dev leaf2-eth1q" in text  # fmt: skip
    rate = {m[1]: float(m[2]) for m in re.finditer(r"classid 1:(\w+) htb rate ([\d.]+)mbit", text)}
    assert rate["11"] == pytest.approx(3 * rate["12"])  # weights 192:64 of the weighted queues
    assert rate["17"] == pytest.approx(40.0)  # strict: the whole link, served first
    assert "classid 1:103 htb rate 4.000mbit ceil 10.000mbit" in text  # bulk capped at 100 Gb/s * 0.1
    plan = queue_plan(policy)
    assert leaf_of(plan, 3) == 0x103 and leaf_of(plan, 11) == 0x53 and leaf_of(plan, 5) == 0x10
    assert "match ip dsfield 0x70 0xf0 flowid 1:17" in text  # DSCP 28-31 (SL 7) -> strict queue


def test_tc_class_stats_are_parsed() -> None:
    text = (
        "class htb 1:11 parent 1:1 prio 1 rate 3Mbit ceil 4Mbit burst 3028b cburst 3028b \n"
        " Sent 1042000 bytes 1000 pkt (dropped 17, overlimits 5 requeues 0) \n backlog 0b 3p requeues 0\n\n"
        "class htb 1:1 root rate 4Mbit ceil 4Mbit burst 64Kb cburst 1600b \n"
        " Sent 5 bytes 1 pkt (dropped 0, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n"
    )
    stats = parse_class_stats(text)
    assert stats[0x11] == {
        "bytes": 1042000,
        "packets": 1000,
        "drops": 17,
        "overlimits": 5,
        "backlog_packets": 3,
    }
    assert stats[1]["packets"] == 1


def test_class_summary_shares(k4: Any) -> None:
    policy = load_policy(TENANTS, k4)
    flows = [
        {"dscp": 4, "sent": 100, "received": 90, "goodput_mbps": 3.0, "latency_ms": {"p50": 1, "p99": 2}},
        {"dscp": 8, "sent": 100, "received": 30, "goodput_mbps": 1.0, "latency_ms": {"p50": 5, "p99": 9}},
    ]
    rows = {c["class"]: c for c in class_summary(policy, flows)}
    assert rows["training"]["share"] == 0.75 and rows["kvcache"]["share"] == 0.25
    assert rows["kvcache"]["latency_p99_ms"] == 9


# --- REST ------------------------------------------------------------------------------------------------


class Rig:
    def __init__(self, state_dir: Path, token: str | None = None) -> None:
        fabric = load_topology(K4)
        self.service = FabricService.for_fabric(fabric, StateStore(state_dir), lldp_interval_s=3600)
        fake = FakeFabric(fabric, self.service.context.addresses)
        self.service.start(FakeSouthbound(fake, self.service))
        self.fabric = fabric
        self.client = TestClient(create_app(self.service, token))

    def put(self, body: Any, query: str = "", **headers: str) -> Any:
        return self.client.put(f"/api/v1/qos{query}", content=json.dumps(body),
                               headers={"Content-Type": "application/json", **headers})  # fmt: skip


@pytest.fixture(name="rig")
def rig_fixture(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path, token="s3cret")
    try:
        yield rig
    finally:
        rig.service.stop()


def tenants() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(TENANTS.read_text())
    return data


def test_rest_put_dry_run_then_apply_persist_and_event(rig: Rig, tmp_path: Path) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    first = rig.client.get("/api/v1/qos").json()
    assert first["source"] == "default"
    start = first["generation"]
    assert start == rig.client.get("/api/v1/health").json()["generation"]  # one generation for everything
    assert rig.put(tenants()).status_code == 401  # mutations need the token
    dry = rig.put(tenants(), "?dry_run=true", **auth)
    assert dry.status_code == 200 and "queues" in dry.json()["changes"]
    assert rig.client.get("/api/v1/qos").json() == first  # a dry run changes nothing
    done = rig.put(tenants(), **auth)
    assert done.status_code == 200, done.text
    assert done.json()["generation"] == start + 1 and "qos_levels" in done.json()["changes"]
    now = rig.client.get("/api/v1/qos").json()
    assert now["generation"] == start + 1 and len(now["policy"]["queues"]) == 5 and now["source"] == "rest"
    events = rig.client.get("/api/v1/qos/events").json()
    assert [e["kind"] for e in events] == ["qos_policy"] and events[0]["id"] == done.json()["id"]
    log = rig.client.get("/api/v1/events").json()  # the one event log, the one id sequence
    assert [e["id"] for e in log if e["kind"] == "qos_policy"] == [done.json()["id"]]
    assert rig.client.get(f"/api/v1/qos/events?since={done.json()['id']}").json() == []
    saved = json.loads((tmp_path / STATE_FILE).read_text())  # saved with the rest, before it took effect
    assert saved["qos_source"] == "rest" and saved["generation"] > start
    running = rig.service.snapshot().state.config.qos
    again = FabricService.for_fabric(rig.fabric, StateStore(tmp_path))  # a restarted controller has it back
    assert again.snapshot().state.config.qos == running
    assert again.snapshot().state.config.qos_source == "rest"
    path = rig.client.get("/api/v1/qos/path?src=h1&dst=h2").json()
    assert (path["level"], path["sl"], path["dscp"], path["queue"]) == ("training", 1, 4, 1)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["qos_levels"].pop("DEFAULT"), "qos_levels"),
        (lambda d: d["vlarb"].update(low="0:32, x"), "vlarb.low"),
        (lambda d: d["match_rules"][2].update(source="ghosts"), "match_rules[2].source"),
        (lambda d: d["port_groups"]["trainers"].update(hosts=["h1", "h77"]), "port_groups.trainers.hosts"),
    ],
)
def test_rest_rejects_bad_policy_whole_with_422(rig: Rig, mutate: Any, field: str) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    assert rig.put(tenants(), **auth).status_code == 200
    before = rig.client.get("/api/v1/qos").json()
    body = tenants()
    mutate(body)
    for query in ("", "?dry_run=true"):
        answer = rig.put(body, query, **auth)
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == field
    assert rig.client.get("/api/v1/qos").json() == before  # the running policy is untouched
    assert rig.put([1, 2], **auth).status_code == 422
    assert (
        rig.client.put(
            "/api/v1/qos", content=b"{nope", headers={**auth, "Content-Type": "application/json"}
        ).status_code
        == 400
    )


# --- scenarios --------------------------------------------------------------------------------------------


def test_tenants_scenario_loads_its_policy_and_marks_flows() -> None:
    from labspec.scenario import RoceCollective, load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "tenants-k4.yaml")
    assert scenario.qos is not None and scenario.qos.level("training").sl == 1
    assert {f.dscp for f in scenario.flows()} == {8}
    collective = scenario.spec.traffic[0]
    assert isinstance(collective, RoceCollective) and collective.dscp == 4  # the all-reduce's RoCE packets


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            lambda t: t.replace("qos: qos-tenants.yaml", "qos: ../tests/data/qos-bad-weights.yaml"),
            "vlarb.low",
        ),
        (lambda t: t.replace("scale: 400G=1M\n", ""), "QoS needs `scale:`"),
        (lambda t: t.replace("dscp: 8}", "dscp: 64}", 1), "traffic[1].dscp"),
    ],
)
def test_scenario_with_bad_qos_is_refused(tmp_path: Path, edit: Any, words: str) -> None:
    from labspec.scenario import load_scenario

    text = edit((ROOT / "scenarios" / "tenants-k4.yaml").read_text())
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "qos-tenants.yaml").write_text(TENANTS.read_text())
    (tmp_path / "topologies").symlink_to(ROOT / "topologies")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    path = folder / "tenants.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_scenario(path)
    assert words in str(info.value) and "tenants.yaml:" in str(info.value)


def test_emulator_api_serves_per_port_per_queue_counters() -> None:
    from emulation.api import create_app as emulator_app

    counters = {
        "leaf2:1": {"q1": {"bytes": 10, "packets": 1, "drops": 0, "overlimits": 0, "backlog_packets": 0}}
    }
    app = emulator_app(lambda a, t: "", {}, qos_counters=lambda: counters)
    base = "http://127.0.0.1:8081"
    assert TestClient(app, base_url=base).get("/api/v1/qos/counters").json() == counters
    plain = TestClient(emulator_app(lambda a, t: "", {}), base_url=base)
    assert plain.get("/api/v1/qos/counters").status_code == 404  # no QoS, no counters


# --- OpenSM's qos-policy.conf syntax ----------------------------------------------------------------------


def test_opensm_syntax_reads_as_the_same_policy(k4: Any) -> None:
    conf = load_policy(ROOT / "scenarios" / "qos-tenants.conf", k4)
    assert conf == load_policy(TENANTS, k4)


@pytest.mark.parametrize(
    ("old", "new", "line", "field", "words"),
    [
        ("rate-limit: 16", "rate-limit: 99", 46, "qos_levels.bulk.rate_limit_gbps", "unknown rate code 99"),
        ("source: trainers", "source: nobody", 64, "match_rules[2].source", "unknown port group 'nobody'"),
        ("vlarb-low: 0:32,1:192", "vlarb-low: 0:32,1:x", 18, "vlarb.low", "not VL:weight"),
        ("        name: DEFAULT\n", "        name: NOTDEFAULT\n", 1, "qos_levels", "DEFAULT"),
        ("    end-qos-level\nend-qos-levels", "end-qos-levels", 51, None, "unexpected"),
        ("        sl: 2\n", "        sl: 2\n        colour: blue\n", 42, None, "unknown statement 'colour'"),
    ],
)
def test_opensm_syntax_errors_name_line_and_field(
    tmp_path: Path, k4: Any, old: str, new: str, line: int, field: str | None, words: str
) -> None:
    text = (ROOT / "scenarios" / "qos-tenants.conf").read_text()
    assert old in text
    path = tmp_path / "qos-policy.conf"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(QosFileError) as info:
        load_policy(path, k4)
    assert (info.value.line, info.value.field) == (line, field), str(info.value)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["emulate", "up", str(K4), "--qos", str(TENANTS)], "--qos: needs --scale"),
        (
            [
                "emulate",
                "up",
                str(K4),
                "--scale",
                "400G=1M",
                "--qos",
                str(ROOT / "tests/data/qos-bad-weights.yaml"),
            ],
            "qos-bad-weights.yaml:4: vlarb.low",
        ),
        (
            ["controller", "--topology", str(K4), "--qos", str(ROOT / "tests/data/qos-bad-weights.yaml")],
            "qos-bad-weights.yaml:4: vlarb.low",
        ),
    ],
)
def test_bad_qos_options_exit_2_before_anything_starts(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    assert main(argv) == 2
    assert words in capsys.readouterr().err
