"""KV-cache transfer of disaggregated LLM serving: prefill hosts push a prompt's KV cache to a decode host.

Prefill (compute-bound) and decode (memory-bound) run on different GPUs, so after prefill the attention
keys and values of every prompt token must cross the fabric before decoding can start.  Engines send it
layer by layer as soon as a layer is computed (overlapping transfer with compute) and in pages of a few
tokens (the paged KV-cache block), so the decode host sees many small RDMA WRITEs from several prefill
hosts at once: an incast that a lossless RoCE fabric has to absorb with PFC/ECN.

Sizes come from the model shape only: per token and layer, K and V are kv_heads x head_dim values each.
Grouped-query attention (few KV heads) is why llama3-70b needs 320 KiB per token where GPT-3 with full
multi-head attention needs 4.5 MiB; multi-query attention (one KV head) is the extreme.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from traffic.errors import TrafficError

#: Longer than any published context window (10 million tokens).
MAX_PROMPT_TOKENS = 10_000_000
#: The messages of one workload are held in memory (about 280 bytes each): a 128k-token llama3-70b prompt
#: in 16-token pages is 640,000 of them; a million bounds what one command may allocate.
MAX_MESSAGES = 1_000_000


@dataclass(frozen=True)
class ModelShape:
    """The part of a transformer that sizes its KV cache (dtype 2 bytes: fp16/bf16)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for field in ("layers", "kv_heads", "head_dim", "dtype_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrafficError(f"must be an integer >= 1, got {value!r}", field=field)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes  # K and V

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.bytes_per_token_per_layer


#: Public model shapes (from the published configs; KV heads < attention heads = grouped-query attention).
PRESETS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("llama3-8b", layers=32, kv_heads=8, head_dim=128),
        ModelShape("llama3-70b", layers=80, kv_heads=8, head_dim=128),
        ModelShape("llama3-405b", layers=126, kv_heads=8, head_dim=128),
        ModelShape("mistral-7b", layers=32, kv_heads=8, head_dim=128),
        ModelShape("mixtral-8x7b", layers=32, kv_heads=8, head_dim=128),
        ModelShape("qwen2-72b", layers=80, kv_heads=8, head_dim=128),
        ModelShape("falcon-40b", layers=60, kv_heads=8, head_dim=64),  # 128 query heads of 64, 8 KV groups
        ModelShape("gpt3-175b", layers=96, kv_heads=96, head_dim=128),  # full multi-head attention
        ModelShape("mqa-example", layers=32, kv_heads=1, head_dim=128),  # multi-query attention
    )
}


def model_shape(
    name: str | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype_bytes: int | None = None,
) -> ModelShape:
    """A preset by name, with explicit numbers overriding it (e.g. llama3-70b with fp8 KV: dtype_bytes=1).

    Without a name all of layers, kv_heads and head_dim are needed; an overridden preset gets a name that
    says so, so reports never attribute modified numbers to the public model.
    """
    overrides = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype_bytes": dtype_bytes}
    given = {key: value for key, value in overrides.items() if value is not None}
    if name is None:
        for key in ("layers", "kv_heads", "head_dim"):
            if key not in given:
                raise TrafficError("needed when no model preset is given", field=key)
        return ModelShape(
            "custom", given["layers"], given["kv_heads"], given["head_dim"], given.get("dtype_bytes", 2)
        )
    base = PRESETS.get(name.lower()) if isinstance(name, str) else None
    if base is None:
        raise TrafficError(f"unknown model {name!r} (known: {', '.join(PRESETS)})", field="model")
    changed = {key: value for key, value in given.items() if getattr(base, key) != value}
    if not changed:
        return base
    label = ",".join(f"{key}={value}" for key, value in changed.items())
    return ModelShape(
        f"{base.name}[{label}]",
        changed.get("layers", base.layers),
        changed.get("kv_heads", base.kv_heads),
        changed.get("head_dim", base.head_dim),
        changed.get("dtype_bytes", base.dtype_bytes),
    )


@dataclass(frozen=True)
class KvMessage:
    """One RDMA WRITE: one page of one layer of one request's KV cache, posted at `time_us`."""

    time_us: float
    request: int
    layer: int
    src: str
    dst: str
    size_bytes: int
    page: int


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrafficError(f"must be an integer >= 1, got {value!r}", field=field)
    return value


def _non_negative(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TrafficError(f"must be a number >= 0, got {value!r}", field=field)
    return float(value)


def layer_owners(layers: int, prefill: Sequence[str]) -> list[str]:
    """Pipeline-parallel split: host j owns a contiguous block; the first `layers % hosts` get one more."""
    base, extra = divmod(layers, len(prefill))
    owners: list[str] = []
    for j, host in enumerate(prefill):
        owners.extend([host] * (base + (1 if j < extra else 0)))
    return owners


def kv_transfer(
    model: ModelShape,
    prompt_tokens: int,
    prefill: Sequence[str],
    decode: str,
    page_tokens: int = 16,
    requests: int = 1,
    arrival_rate_per_s: float = 0.0,
    layer_time_us: float = 0.0,
    seed: int = 0,
) -> list[KvMessage]:
    """The WRITEs of `requests` prompts, sorted by (time_us, request, layer, page).

    Requests arrive as a Poisson process observed from the first arrival: request 0 at time 0, then
    exponential gaps of mean 1/rate (rate 0: all at time 0, the worst-case burst).  Layer L of a request is
    done at arrival + (L+1) x layer_time_us and its owner then writes every page of it to the decode host.
    Prefill hosts are assumed never to queue requests (no compute contention is modelled): the point is
    the network burst, not the prefill schedule.  Times are rounded to 1 ns to keep traces short.
    """
    if not isinstance(model, ModelShape):
        raise TrafficError(f"expected a ModelShape, got {type(model).__name__}", field="model")
    tokens = _positive_int(prompt_tokens, "prompt_tokens")
    page = _positive_int(page_tokens, "page_tokens")
    n_requests = _positive_int(requests, "requests")
    if tokens > MAX_PROMPT_TOKENS:
        raise TrafficError(
            f"at most {MAX_PROMPT_TOKENS:,} tokens (longer than any model's context), got {tokens:,}",
            field="prompt_tokens",
        )
    n_messages = n_requests * model.layers * -(-tokens // page)
    if n_messages > MAX_MESSAGES:
        raise TrafficError(
            f"{n_requests:,} request(s) x {model.layers} layers x {-(-tokens // page):,} pages = "
            f"{n_messages:,} WRITEs, more than the {MAX_MESSAGES:,} one workload may have "
            "(fewer tokens or requests, or larger pages)",
            field="requests" if n_requests > 1 else "prompt_tokens",
        )
    rate = _non_negative(arrival_rate_per_s, "arrival_rate_per_s")
    layer_us = _non_negative(layer_time_us, "layer_time_us")
    hosts = [prefill] if isinstance(prefill, str) else list(prefill)
    if not hosts:
        raise TrafficError("needs at least one prefill host", field="prefill")
    if any(not isinstance(h, str) or not h for h in hosts) or len(set(hosts)) != len(hosts):
        raise TrafficError(f"needs distinct host names, got {hosts!r}", field="prefill")
    if len(hosts) > model.layers:
        raise TrafficError(
            f"{len(hosts)} prefill hosts but only {model.layers} layers to split", field="prefill"
        )
    if not isinstance(decode, str) or not decode:
        raise TrafficError(f"bad host name {decode!r}", field="decode")
    if decode in hosts:
        raise TrafficError(f"{decode!r} is also a prefill host", field="decode")

    rng = random.Random(seed)
    arrivals_us = [0.0]
    for _ in range(n_requests - 1):
        gap_us = rng.expovariate(rate) * 1e6 if rate > 0 else 0.0
        arrivals_us.append(arrivals_us[-1] + gap_us)
    owners = layer_owners(model.layers, hosts)
    page_sizes = [
        min(page, tokens - p * page) * model.bytes_per_token_per_layer for p in range(-(-tokens // page))
    ]
    messages = [
        KvMessage(round(arrival + (layer + 1) * layer_us, 3), req, layer, owners[layer], decode, size, p)
        for req, arrival in enumerate(arrivals_us)
        for layer in range(model.layers)
        for p, size in enumerate(page_sizes)
    ]
    messages.sort(key=lambda m: (m.time_us, m.request, m.layer, m.page))
    return messages


def summary(messages: Sequence[KvMessage], window_us: float = 0.0) -> dict[str, int | float]:
    """What a CLI prints about a KV workload.

    `peak_senders` is the most distinct hosts writing to one decode host within `window_us` of each other
    (0: at the same instant); it is the incast degree the decode host's switch port has to absorb.
    """
    window = _non_negative(window_us, "window_us")
    if not messages:
        keys = ("messages", "requests", "total_bytes", "bytes_per_request", "duration_us", "peak_senders")
        return dict.fromkeys(keys, 0)
    per_request: dict[int, int] = {}
    for m in messages:
        per_request[m.request] = per_request.get(m.request, 0) + m.size_bytes
    total = sum(per_request.values())
    ordered = sorted(messages, key=lambda m: m.time_us)
    peak = start = 0
    active: dict[tuple[str, str], int] = {}  # sliding window: (dst, src) -> its messages in the window
    active_per_dst: dict[str, int] = {}  # dst -> distinct senders in the window
    for m in ordered:
        while ordered[start].time_us < m.time_us - window:
            old = ordered[start]
            active[old.dst, old.src] -= 1
            if active[old.dst, old.src] == 0:
                del active[old.dst, old.src]
                active_per_dst[old.dst] -= 1
            start += 1
        if (m.dst, m.src) not in active:
            active[m.dst, m.src] = 0
            active_per_dst[m.dst] = active_per_dst.get(m.dst, 0) + 1
        active[m.dst, m.src] += 1
        peak = max(peak, active_per_dst[m.dst])
    sizes = set(per_request.values())
    return {
        "messages": len(messages),
        "requests": len(per_request),
        "total_bytes": total,
        "bytes_per_request": sizes.pop() if len(sizes) == 1 else total / len(per_request),
        "duration_us": ordered[-1].time_us - ordered[0].time_us,
        "peak_senders": peak,
    }
