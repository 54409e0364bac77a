"""Workload planners, KV-cache transfers and traces: byte conservation, schedules, parsers, file format."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from topologies.generators import rail
from traffic.errors import TrafficError, parse_hosts, parse_size
from traffic.kvcache import PRESETS, kv_transfer, layer_owners, model_shape, summary
from traffic.patterns import (
    PLANNERS,
    Plan,
    allgather_ring,
    alltoall,
    broadcast,
    bus_factor,
    halving_doubling_allreduce,
    hotspot,
    incast,
    permutation,
    plan,
    rail_aware_order,
    reduce_scatter_ring,
    ring_allreduce,
    score,
    split_bytes,
    uniform,
)
from traffic.trace import TraceRecord, example_traces, from_kv, from_plan, read_trace, write_trace

TRACES = ROOT / "scenarios" / "traces"
MiB = 2**20


def hosts(n: int) -> list[str]:
    return [f"h{i}" for i in range(1, n + 1)]


# --- parsers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [(4096, 4096), ("4096", 4096), ("64KiB", 65536), ("256MiB", 256 * MiB), ("1GiB", 2**30), ("1GB", 10**9),
     ("1.5MB", 1_500_000), ("64kib", 65536), ("2 mb", 2_000_000), ("10B", 10), ("0", 0), ("0.5KiB", 512)],
)  # fmt: skip
def test_parse_size_accepts(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["12XB", "-5", -5, "", "abc", "1.5B", "1e3", "KiB", True, "4096 KiB x"])
def test_parse_size_rejects_naming_the_field(text: str | int) -> None:
    with pytest.raises(TrafficError) as err:
        parse_size(text, field="buffer")
    assert err.value.field == "buffer" and str(err.value).startswith("buffer: ")


def test_parse_size_error_text() -> None:
    with pytest.raises(
        TrafficError, match=r"^size: cannot parse '12XB' \(use e\.g\. 4096, 64KiB, 256MiB, 1GB\)$"
    ):
        parse_size("12XB")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("h1..h4", ["h1", "h2", "h3", "h4"]), ("h1,h2,h9", ["h1", "h2", "h9"]), ("h5..h5", ["h5"]),
     ("h3..h4, h9", ["h3", "h4", "h9"]), ("h9,h1..h2", ["h9", "h1", "h2"]), ("1..2", ["1", "2"]),
     ("gpu08..gpu10", ["gpu08", "gpu09", "gpu10"])],
)  # fmt: skip
def test_parse_hosts_accepts(text: str, expected: list[str]) -> None:
    assert parse_hosts(text) == expected
    assert parse_hosts("h1..h16") == hosts(16)


@pytest.mark.parametrize(
    ("text", "bad"),
    [("", "empty"), ("  ", "empty"), ("h1,,h2", "empty item"), ("h1,h2,h1", "'h1' is listed twice"),
     ("h1..h3,h2", "'h2' is listed twice"), ("h4..h1", "h4..h1"), ("h1..s3", "same prefix"), ("h1..", "h1.."),
     ("h1..h2..h3", "h1..h2..h3"), ("h1..h99", "unknown host 'h17'"), ("h1,x7", "unknown host 'x7'")],
)  # fmt: skip
def test_parse_hosts_rejects_naming_field_and_item(text: str, bad: str) -> None:
    with pytest.raises(TrafficError, match=r"^senders: .*" + bad.replace(".", r"\.")) as err:
        parse_hosts(text, known=hosts(16), field="senders")
    assert err.value.field == "senders"


# --- collectives ----------------------------------------------------------------------------------------


def moved(factor: int) -> Callable[[int, int], int]:
    """Bytes a collective must move in total for n ranks and buffer S: factor x (n-1) x S."""
    return lambda n, s: factor * (n - 1) * s


# kind -> (planner, total bytes, number of steps)
COLLECTIVES: dict[str, tuple[Callable[..., Plan], Callable[[int, int], int], Callable[[int], int]]] = {
    "allreduce-ring": (ring_allreduce, moved(2), lambda n: 2 * (n - 1)),
    "allreduce-hd": (halving_doubling_allreduce, moved(2), lambda n: 2 * (n.bit_length() - 1)),
    "alltoall": (alltoall, moved(1), lambda n: n - 1),
    "allgather": (allgather_ring, moved(1), lambda n: n - 1),
    "reduce-scatter": (reduce_scatter_ring, moved(1), lambda n: n - 1),
    "broadcast": (broadcast, moved(1), lambda n: n - 2 + 8),  # pipeline depth + 8 chunks
}


@pytest.mark.parametrize(
    ("kind", "n", "size"),
    [
        (kind, n, size)
        for kind in sorted(COLLECTIVES)
        for n in (2, 4, 5, 8, 16)
        for size in (64, 1000, 4099, 64 * MiB + 3)
        if not (kind == "allreduce-hd" and n & (n - 1))  # power of two only
    ],
)
def test_collectives_conserve_bytes_and_step_counts(kind: str, n: int, size: int) -> None:
    planner, total, steps = COLLECTIVES[kind]
    p = planner(hosts(n), size)
    assert PLANNERS[kind] is planner and p.kind == kind and p.name == f"{kind}-{n}"
    assert p.ranks == tuple(hosts(n)) and p.size_bytes == size
    assert p.total_bytes == total(n, size) == sum(p.bytes_by_pair().values())
    assert p.n_steps == steps(n)
    assert [t.step for t in p.transfers] == [i for i, step in enumerate(p.steps) for _ in step]
    assert all(t.src != t.dst and t.src in p.ranks and t.dst in p.ranks for t in p.transfers)


@pytest.mark.parametrize("kind", sorted(set(COLLECTIVES) - {"broadcast"}))
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_every_rank_sends_and_receives_once_per_step(kind: str, n: int) -> None:
    p = plan(kind, hosts(n), 64 * MiB)
    for step in p.steps:
        assert Counter(t.src for t in step) == Counter(t.dst for t in step) == Counter(hosts(n))


def test_ring_sends_to_the_successor_and_each_chunk_once_per_phase() -> None:
    p = ring_allreduce(hosts(5), 1003)
    assert {(t.src, t.dst) for t in p.transfers} == {(f"h{i}", f"h{i % 5 + 1}") for i in range(1, 6)}
    assert split_bytes(1003, 5) == [201, 201, 201, 200, 200]
    rs = Counter(t.tag for t in p.transfers if t.tag.startswith("reduce-scatter"))
    ag = Counter(t.tag for t in p.transfers if t.tag.startswith("all-gather"))
    assert rs == {f"reduce-scatter c{c}": 4 for c in range(5)}  # every chunk passes n-1 ranks
    assert ag == {f"all-gather c{c}": 4 for c in range(5)}


def test_alltoall_is_every_pair_once_with_its_chunk() -> None:
    p = alltoall(hosts(6), 6003)
    pairs = p.bytes_by_pair()
    assert len(pairs) == 30 and len(p.transfers) == 30
    chunks = split_bytes(6003, 6)
    assert all(size == chunks[int(dst[1:]) - 1] for (_, dst), size in pairs.items())
    assert {(t.src, t.dst) for t in p.steps[0]} == {(f"h{i}", f"h{i % 6 + 1}") for i in range(1, 7)}


def test_halving_doubling_partners_and_sizes() -> None:
    p = halving_doubling_allreduce(hosts(8), 8 * 1024)
    sent = [[t.size_bytes for t in step if t.src == "h1"] for step in p.steps]
    assert sent == [[4096], [2048], [1024], [1024], [2048], [4096]]
    partners = [next(t.dst for t in step if t.src == "h1") for step in p.steps]
    assert partners == ["h2", "h3", "h5", "h5", "h3", "h2"]  # rank XOR 2^k, then mirrored
    assert all(sum(t.size_bytes for t in p.transfers if t.src == h) == 2 * 8192 * 7 // 8 for h in hosts(8))


@pytest.mark.parametrize("n", [3, 6, 12])
def test_halving_doubling_rejects_non_powers_of_two(n: int) -> None:
    with pytest.raises(TrafficError, match=f"ranks: .*power-of-two.*got {n}") as err:
        plan("allreduce-hd", hosts(n), MiB)
    assert err.value.field == "ranks"


def test_broadcast_is_a_pipelined_chain_from_the_root() -> None:
    p = broadcast(hosts(4), 100, root="h3", chunks=4)
    assert p.n_steps == 4 + 4 - 2
    assert {(t.src, t.dst) for t in p.transfers} == {("h3", "h4"), ("h4", "h1"), ("h1", "h2")}
    chain = ["h3", "h4", "h1", "h2"]
    assert all(t.step == chain.index(t.src) + int(t.tag[1:]) for t in p.transfers)
    assert broadcast(hosts(3), 3).n_steps == 3 + 3 - 2  # never more chunks than bytes
    with pytest.raises(TrafficError, match=r"^root: 'h9' is not one of the ranks"):
        broadcast(hosts(4), 100, root="h9")
    with pytest.raises(TrafficError, match="chunks: "):
        plan("broadcast", hosts(4), 100, chunks=0)


def test_tiny_buffers_leave_out_empty_transfers() -> None:
    p = ring_allreduce(hosts(4), 2)
    assert p.total_bytes == 2 * 3 * 2 and all(t.size_bytes > 0 for t in p.transfers) and p.n_steps == 6


def test_bus_factors_and_scores() -> None:
    assert bus_factor("allreduce-ring", 8) == bus_factor("allreduce-hd", 8) == 2 * 7 / 8
    assert bus_factor("allreduce-ring", 1) == 0.0
    for kind in ("allgather", "reduce-scatter", "alltoall"):
        assert bus_factor(kind, 16) == 15 / 16
    assert bus_factor("broadcast", 16) == 1.0
    got = score("allreduce-ring", 8, "1GB", 0.5)
    assert got == pytest.approx({"algbw_GBps": 2.0, "busbw_GBps": 3.5})
    assert score("alltoall", 4, 4 * 10**9, 2.0) == pytest.approx({"algbw_GBps": 2.0, "busbw_GBps": 1.5})
    with pytest.raises(TrafficError, match=r"^kind: "):
        bus_factor("incast", 4)
    with pytest.raises(TrafficError, match=r"^seconds: "):
        score("broadcast", 4, 10, 0.0)


def test_registry_errors() -> None:
    assert set(PLANNERS) == {
        "allreduce-ring",
        "allreduce-hd",
        "alltoall",
        "allgather",
        "reduce-scatter",
        "broadcast",
    }
    assert plan("allgather", "h1..h4", "4KiB") == allgather_ring(hosts(4), 4096)
    with pytest.raises(TrafficError, match=r"^kind: unknown kind 'allreduce' .*allreduce-ring, allreduce-hd"):
        plan("allreduce", hosts(4), 1)
    with pytest.raises(TrafficError, match=r"^root: allreduce-ring has no option 'root'"):
        plan("allreduce-ring", hosts(4), 1, root="h1")
    for bad in (["h1"], [], "h1", ["h1", "h1"]):
        with pytest.raises(TrafficError, match=r"^ranks: ") as err:
            plan("alltoall", bad, 1024)
        assert err.value.field == "ranks"
    with pytest.raises(TrafficError, match=r"^size: "):
        plan("alltoall", hosts(2), 0)


# --- synthetic patterns ---------------------------------------------------------------------------------


def test_incast_and_permutation() -> None:
    p = incast(["h1", "h2", "h3"], "h9", 4096)
    assert p.n_steps == 1 and p.bytes_by_pair() == {(h, "h9"): 4096 for h in ("h1", "h2", "h3")}
    with pytest.raises(TrafficError, match=r"^receiver: 'h2' is also a sender"):
        incast("h1..h3", "h2", 1)
    for seed in range(20):
        perm = permutation(hosts(7), 100, seed=seed)
        assert all(t.src != t.dst for t in perm.transfers)
        assert (
            sorted(t.src for t in perm.transfers) == sorted(t.dst for t in perm.transfers) == sorted(hosts(7))
        )
    assert permutation(hosts(16), 1, seed=5) == permutation(hosts(16), 1, seed=5)
    assert permutation(hosts(16), 1, seed=5) != permutation(hosts(16), 1, seed=6)


def test_hotspot_and_uniform() -> None:
    everyone = hotspot(hosts(16), "h4", 10, fraction=1.0, seed=1)
    assert all(t.dst == "h4" for t in everyone.transfers if t.src != "h4") and len(everyone.transfers) == 16
    nobody = hotspot(hosts(16), "h4", 10, fraction=0.0, seed=1)
    assert all(t.dst not in ("h4", t.src) for t in nobody.transfers)
    many = [
        t
        for seed in range(50)
        for t in hotspot(hosts(11), "h1", 1, 0.3, seed=seed).transfers
        if t.src != "h1"
    ]
    assert 0.2 < sum(t.dst == "h1" for t in many) / len(many) < 0.4
    assert hotspot(hosts(8), "h1", 1, 0.5, seed=2) == hotspot(hosts(8), "h1", 1, 0.5, seed=2)
    with pytest.raises(TrafficError, match=r"^hot: "):
        hotspot(hosts(4), "h9", 1)
    with pytest.raises(TrafficError, match=r"^fraction: "):
        hotspot(hosts(4), "h1", 1, fraction=1.5)
    u = uniform(hosts(8), 64, flows=100, seed=3)
    assert len(u.transfers) == 100 and all(t.src != t.dst for t in u.transfers)
    assert u == uniform(hosts(8), 64, flows=100, seed=3) != uniform(hosts(8), 64, flows=100, seed=4)
    with pytest.raises(TrafficError, match=r"^flows: "):
        uniform(hosts(8), 64, flows=0)


def test_rail_aware_order_keeps_rails_contiguous() -> None:
    fabric = rail(4, 4)  # 4 servers x 4 NICs; NIC i of every server on rail leaf i
    names = [h.name for h in fabric.hosts]
    rail_of = {h.name: h.rail for h in fabric.hosts if h.rail is not None}
    server_of = {h.name: h.server for h in fabric.hosts if h.server is not None}
    order = rail_aware_order(names, rail_of, server_of)
    assert sorted(order) == sorted(names)
    rails = [rail_of[h] for h in order]
    runs = [r for i, r in enumerate(rails) if i == 0 or rails[i - 1] != r]
    assert rails == sorted(rails) and runs == [0, 1, 2, 3]

    def cross_rail(ring: list[str]) -> list[tuple[str, str]]:
        edges = zip(ring, ring[1:] + ring[:1], strict=True)
        return [(a, b) for a, b in edges if rail_of[a] != rail_of[b]]

    assert len(cross_rail(names)) == 16 and len(cross_rail(order)) == 4
    assert all(server_of[a] == server_of[b] for a, b in cross_rail(order))  # rail changes inside a server
    with pytest.raises(TrafficError, match=r"^rail_of: no rail for host 'h99'"):
        rail_aware_order([*names, "h99"], rail_of, server_of)


# --- KV cache -------------------------------------------------------------------------------------------


def test_kv_bytes_per_token() -> None:
    assert PRESETS["llama3-70b"].bytes_per_token == 80 * 8 * 128 * 2 * 2 == 320 * 1024
    assert PRESETS["gpt3-175b"].bytes_per_token == 2 * 96 * 96 * 128 * 2 == 4608 * 1024  # MHA: 4.5 MiB
    assert PRESETS["mqa-example"].bytes_per_token == 16 * 1024
    assert PRESETS["falcon-40b"].bytes_per_token_per_layer == 2 * 8 * 64 * 2
    assert model_shape("llama3-70b") is PRESETS["llama3-70b"]
    fp8 = model_shape("llama3-70b", dtype_bytes=1)
    assert fp8.bytes_per_token == 160 * 1024 and fp8.name == "llama3-70b[dtype_bytes=1]"
    assert model_shape(layers=2, kv_heads=4, head_dim=8).bytes_per_token == 2 * 2 * 4 * 8 * 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"name": "llama9"}, "model"), ({"layers": 2, "head_dim": 8}, "kv_heads"), ({"kv_heads": 1}, "layers"),
     ({"name": "llama3-8b", "layers": 0}, "layers"),
     ({"layers": 1, "kv_heads": 1, "head_dim": -1}, "head_dim")],
)  # fmt: skip
def test_model_shape_errors(kwargs: dict[str, int | str], field: str) -> None:
    with pytest.raises(TrafficError) as err:
        model_shape(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize(("tokens", "page"), [(1, 16), (15, 16), (16, 16), (17, 16), (1000, 16), (33, 1)])
@pytest.mark.parametrize("requests", [1, 3])
def test_kv_transfer_conserves_bytes(tokens: int, page: int, requests: int) -> None:
    model = PRESETS["llama3-8b"]
    msgs = kv_transfer(
        model, tokens, ["h1", "h2"], "h9", page_tokens=page, requests=requests, arrival_rate_per_s=50
    )
    assert sum(m.size_bytes for m in msgs) == requests * tokens * model.bytes_per_token
    assert len(msgs) == requests * model.layers * -(-tokens // page)
    assert all(m.dst == "h9" for m in msgs) and msgs == sorted(msgs, key=lambda m: m.time_us)
    info = summary(msgs)
    assert info["total_bytes"] == requests * info["bytes_per_request"] and info["requests"] == requests


def test_kv_pages_partial_at_the_end_and_layer_timing() -> None:
    model = model_shape(layers=4, kv_heads=2, head_dim=4)  # 32 bytes per token and layer
    msgs = kv_transfer(model, 40, ["p1", "p2"], "d", page_tokens=16, layer_time_us=100)
    assert [m.size_bytes for m in msgs if m.layer == 0] == [16 * 32, 16 * 32, 8 * 32]
    assert [m.page for m in msgs if m.layer == 3] == [0, 1, 2]
    assert {m.layer: m.time_us for m in msgs} == {0: 100.0, 1: 200.0, 2: 300.0, 3: 400.0}
    assert {m.layer: m.src for m in msgs} == {0: "p1", 1: "p1", 2: "p2", 3: "p2"}


def test_kv_layers_split_in_contiguous_blocks() -> None:
    owners = layer_owners(80, ["a", "b", "c"])
    assert owners == ["a"] * 27 + ["b"] * 27 + ["c"] * 26
    msgs = kv_transfer(PRESETS["llama3-70b"], 16, ["a", "b", "c"], "d")
    assert {m.layer: m.src for m in msgs} == dict(enumerate(owners))
    assert summary(msgs)["peak_senders"] == 3  # layer_time 0: every prefill host writes at once


def test_kv_arrivals_are_poisson_and_seeded() -> None:
    tiny = model_shape(layers=1, kv_heads=1, head_dim=1)
    runs = [
        kv_transfer(tiny, 1, ["p"], "d", requests=2000, arrival_rate_per_s=100, seed=s) for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1] != runs[2]
    times = [m.time_us for m in runs[0]]
    assert times[0] == 0.0 and times == sorted(times)
    assert 9000 < (times[-1] - times[0]) / 1999 < 11000  # mean gap 1/rate = 10 ms
    burst = kv_transfer(tiny, 1, ["p"], "d", requests=5)
    assert {m.time_us for m in burst} == {0.0}


def test_kv_summary_windows() -> None:
    msgs = kv_transfer(PRESETS["llama3-8b"], 64, ["a", "b"], "d", layer_time_us=200)
    assert summary(msgs)["peak_senders"] == 1  # one request walks the pipeline one layer at a time
    assert summary(msgs, window_us=200)["peak_senders"] == 2  # the hand-over from a to b
    info = summary(msgs)
    assert info["messages"] == 32 * 4 and info["duration_us"] == 31 * 200
    assert summary([])["messages"] == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"prompt_tokens": 0}, "prompt_tokens"), ({"page_tokens": 0}, "page_tokens"),
     ({"decode": "h1"}, "decode"), ({"prefill": []}, "prefill"), ({"decode": ""}, "decode"),
     ({"requests": 0}, "requests"),
     ({"arrival_rate_per_s": -1.0}, "arrival_rate_per_s"), ({"prefill": ["h1", "h1"]}, "prefill"),
     ({"layer_time_us": float("nan")}, "layer_time_us"), ({"prefill": hosts(33)}, "prefill")],
)  # fmt: skip
def test_kv_transfer_errors(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"prompt_tokens": 8, "prefill": ["h1"], "decode": "h9"}
    with pytest.raises(TrafficError) as err:
        kv_transfer(PRESETS["llama3-8b"], **(base | kwargs))  # type: ignore[arg-type]
    assert err.value.field == field


# --- traces ---------------------------------------------------------------------------------------------


def test_trace_round_trip_and_qps(tmp_path: Path) -> None:
    p = alltoall(hosts(4), 4096)
    records = from_plan(p, step_time_us=50.0)
    assert [r.time_us for r in records] == [50.0 * t.step for t in p.transfers]
    qps = {(r.src, r.dst): r.qp for r in records}
    assert all(sorted(q for (s, _), q in qps.items() if s == h) == [1, 2, 3] for h in hosts(4))
    assert from_plan(p, step_time_us=50.0) == records and records[0].tag == "alltoall/s0/c1"
    write_trace(tmp_path / "t.jsonl", records)
    assert read_trace(tmp_path / "t.jsonl") == records
    kv = from_kv(kv_transfer(PRESETS["mqa-example"], 20, ["a"], "b", page_tokens=8))
    assert kv[0].tag == "kv/r0/L0/p0" and {r.qp for r in kv} == {1}
    write_trace(tmp_path / "kv.jsonl", kv)
    assert read_trace(tmp_path / "kv.jsonl") == kv


GOOD = {"time_us": 5.0, "src": "h1", "dst": "h2", "bytes": 10, "qp": 1, "tclass": 3, "tag": ""}


@pytest.mark.parametrize(
    ("line", "field"),
    [("{nope", "json"), ("[1, 2]", "json"), (json.dumps({k: v for k, v in GOOD.items() if k != "qp"}), "qp"),
     (json.dumps(GOOD | {"byte": 1}), "byte"), (json.dumps(GOOD | {"bytes": "12"}), "bytes"),
     (json.dumps(GOOD | {"bytes": -1}), "bytes"), (json.dumps(GOOD | {"bytes": True}), "bytes"),
     (json.dumps(GOOD | {"tclass": 8}), "tclass"), (json.dumps(GOOD | {"qp": -1}), "qp"),
     (json.dumps(GOOD | {"time_us": 1.0}), "time_us"), (json.dumps(GOOD | {"dst": "h1"}), "dst"),
     (json.dumps(GOOD | {"src": ""}), "src"), (json.dumps(GOOD | {"tag": 3}), "tag"),
     ('{"time_us": NaN}', "json"), ('{"qp": 1, "qp": 2}', "qp")],
)  # fmt: skip
def test_read_trace_errors_name_file_line_and_field(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n", encoding="utf-8")
    with pytest.raises(TrafficError, match=f"^{re.escape(str(path))}:3: {field}: "):
        read_trace(path)


def test_trace_write_and_read_refusals(tmp_path: Path) -> None:
    late, early = TraceRecord(9.0, "h1", "h2", 1, 0, 0), TraceRecord(1.0, "h1", "h2", 1, 0, 0)
    with pytest.raises(TrafficError, match="time_us: record 2 goes back in time"):
        write_trace(tmp_path / "x.jsonl", [late, early])
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(TrafficError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TrafficError, match=r"^step_time_us: "):
        from_plan(alltoall(hosts(2), 2), step_time_us=-1)


@pytest.mark.parametrize("name", ["allreduce-ring-16.jsonl", "kv-llama3-70b.jsonl"])
def test_shipped_traces_are_valid_sorted_and_reproducible(tmp_path: Path, name: str) -> None:
    path = TRACES / name
    assert path.stat().st_size < 2_000_000
    records = read_trace(path)
    assert [r.time_us for r in records] == sorted(r.time_us for r in records)
    assert records == example_traces()[name]
    write_trace(tmp_path / name, records)
    assert (tmp_path / name).read_bytes() == path.read_bytes()
    total = sum(r.size_bytes for r in records)
    if name.startswith("allreduce"):
        assert total == 2 * 15 * 64 * MiB and len({r.src for r in records}) == 16
    else:
        assert total == 4 * 1024 * PRESETS["llama3-70b"].bytes_per_token
        assert {r.src for r in records} == {"h1", "h2"} and {r.dst for r in records} == {"h9"}
