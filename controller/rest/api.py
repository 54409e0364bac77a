"""REST API (`/api/v1`, OpenAPI at `/docs`): the fabric as the subnet manager sees it, and routing control.

Reads come from the snapshot the worker published last (`FabricService.snapshot()`): they never take a
lock the worker holds and never wait for a computation.  Changes go to the worker as requests and wait for
its reply; a dry run is computed here from the published snapshot, a few at a time.  Every response has a
schema (`controller.rest.models`); errors are `{"error", "field"}` (`controller.httpguard`), and a
rejected request changes nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from controller.core.fabric import dry_run
from controller.httpguard import (
    API,
    ApiError,
    ErrorBody,
    install,
    parse_body,
    require_token_dependency,
)
from controller.observe.web import Observability, mount
from controller.rest import models
from controller.rest.changes import run_change
from controller.rest.pkeys import mount_pkeys
from controller.rest.qos import mount_qos
from controller.rest.rendered import Rendered
from controller.service import FabricService, Published
from controller.sm.engines import UnknownEngine
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import UnknownSwitch
from controller.sm.policies import PolicyChoice, PolicyError, PolicyParams, class_map, default_policies
from controller.sm.tables import RouteError

#: Dry runs computed at once on REST threads; more get 503 (each can take seconds on a large fabric).
MAX_CONCURRENT_DRY_RUNS = 2


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


def create_app(
    service: FabricService,
    token: str | None = None,
    hosts: frozenset[str] | None = None,
    observability: Observability | None = None,
) -> FastAPI:
    """`hosts`: the Host header values accepted (see `controller.httpguard.allowed_hosts`);
    `observability`: metrics and the live view (default: unscaled capacities, no event thread)."""
    app = FastAPI(
        title="fabriclab controller",
        version="1",
        description="Subnet-manager-style controller for Ethernet/OpenFlow AI fabrics.",
        docs_url=None,
    )
    obs = observability or Observability.for_service(service.snapshot, token_required=token is not None)
    install(app, hosts, registry=obs.registry, detailed=obs.detailed)
    mount(app, obs)
    mutation = [Depends(require_token_dependency(token))]
    dry_runs = threading.BoundedSemaphore(MAX_CONCURRENT_DRY_RUNS)
    policies = default_policies()

    def snap() -> Published:
        return service.snapshot()

    def current_or_503(pub: Published) -> Any:
        if pub.state.current is None:
            raise ApiError(503, "routing not computed yet", None, {"Retry-After": "1"})
        return pub.state.current

    def switch_or_404(pub: Published, name: str) -> str:
        if name not in pub.context.dpids:
            raise ApiError(404, f"unknown switch {name[:64]!r}", "name")
        return name

    mount_qos(app, service, mutation)

    # The cheap reads run on the event loop itself (`async def`): a thread-pool hop costs a switch of the
    # interpreter lock each way, and while the worker computes each switch can wait a switch interval.
    @app.get(f"{API}/health", response_model=models.Health)
    async def health() -> models.Health:
        return models.health(snap(), time.time())

    fabric_view = Rendered(models.fabric)

    @app.get(f"{API}/fabric", response_model=models.FabricView)
    def fabric() -> Response:
        return fabric_view(snap())

    @app.get(f"{API}/switches", response_model=list[models.SwitchView])
    def switches() -> list[models.SwitchView]:
        pub = snap()
        return [models.switch(pub, s.name) for s in pub.context.declared.switches]

    @app.get(f"{API}/switches/{{name}}", response_model=models.SwitchView, responses=_errors(404))
    def switch(name: str) -> models.SwitchView:
        pub = snap()
        return models.switch(pub, switch_or_404(pub, name))

    @app.get(f"{API}/switches/{{name}}/lft", response_model=models.LftView, responses=_errors(404, 503))
    def lft(name: str) -> models.LftView:
        pub = snap()
        switch_or_404(pub, name)
        computation = current_or_503(pub)
        try:
            table = pub.context.lft(computation, name)
        except UnknownSwitch as exc:
            raise ApiError(404, str(exc), "name") from None
        endpoints = pub.context.lids.endpoints
        return models.LftView(
            switch=name,
            generation=computation.generation,
            engine=computation.engine,
            entries=[
                models.LftEntry(
                    lid=lid,
                    port=port,
                    dest=endpoints[lid].node + (f":{endpoints[lid].port}" if endpoints[lid].port else ""),
                )
                for lid, port in sorted(table.items())
                if lid in endpoints
            ],
        )

    @app.get(f"{API}/links", response_model=list[models.LinkView])
    def links(counters: bool = True) -> list[models.LinkView]:
        """Declared links, up or down, with the port counters polled last (`counters_at`)."""
        return models.links(snap(), counters)

    @app.get(f"{API}/routes", response_model=models.RouteView, responses=_errors(404, 409, 503))
    async def routes(
        src: Annotated[str, Query(max_length=128)],
        dst: Annotated[str, Query(max_length=128)],
        sport: Annotated[int | None, Query(ge=0, le=65535, description="UDP source port")] = None,
        dscp: Annotated[int, Query(ge=0, le=63, description="traffic class (DSCP)")] = 0,
    ) -> models.RouteView:
        """The table's path, or with `sport` the path a UDP packet from that source port takes under the
        routing policy (its slots, with adaptive routing's current weights)."""
        pub = snap()
        for field, value in (("src", src), ("dst", dst)):
            if value not in pub.context.declared.nodes:
                raise ApiError(404, f"unknown node {value!r}", field)
        computation = current_or_503(pub)
        try:
            path = pub.context.route(computation, src, dst, sport, dscp)
        except RouteError as exc:
            raise ApiError(409, str(exc), "dst") from None
        return models.RouteView(
            src=src,
            dst=dst,
            generation=computation.generation,
            hops=models.hops(path),
            path=" ".join(str(h) for h in path),
        )

    @app.get(f"{API}/routing", response_model=models.RoutingView, responses=_errors(503))
    def get_routing() -> models.RoutingView:
        pub = snap()
        current = current_or_503(pub)
        v = current.verification
        config = pub.state.config
        return models.RoutingView(
            engine=config.engine,
            engines=pub.context.registry.names(),
            fast_failover=config.options.fast_failover,
            multipath=config.options.multipath,
            policy=config.options.policy,
            generation=pub.state.generation,
            digest=current.tables.digest(),
            verification=models.VerificationView(
                ok=v.ok,
                unreachable_pairs=v.unreachable_pairs,
                loop_entries=v.loop_entries,
                deadlock_free=v.deadlock.acyclic if v.deadlock else None,
                alternatives_deadlock_free=(
                    v.deadlock_alternatives.acyclic if v.deadlock_alternatives else None
                ),
                mean_hops=round(v.mean_hops, 3),
                max_hops=v.max_hops,
            ),
            down_links=list(current.down_links),
            lost_hosts=list(current.lost_hosts),
        )

    @app.put(
        f"{API}/routing",
        dependencies=mutation,
        response_model=models.EventView | models.DryRunResult,
        response_model_exclude_none=True,
        responses=_errors(400, 401, 413, 415, 422, 500, 503),
        openapi_extra=_body_schema(models.RoutingUpdate),
    )
    async def put_routing(request: Request) -> Any:
        """Recompute with another engine/options and reprogram the switches (`dry_run`: report only)."""
        update = parse_body(await request.body(), models.RoutingUpdate)
        pub = snap()
        registry = pub.context.registry
        if update.engine is not None and update.engine not in registry:
            names = ", ".join(registry.names())
            raise ApiError(
                400, f"engine: unknown routing engine {update.engine!r} (available: {names})", "engine"
            )
        config = pub.state.config
        options = config.options
        if update.fast_failover is not None:
            options = replace(options, fast_failover=update.fast_failover)
        if update.multipath is not None and update.multipath != options.multipath:
            # the legacy switch: on means ecmp, off means static (see /routing/policy for the others)
            options = ForwardingOptions(options.fast_failover, update.multipath, classes=options.classes)
        if update.dry_run:
            return await dry_run_or_503(pub, update.engine, options)
        try:
            record = await run_change(service.set_routing, update.engine, options)
        except UnknownEngine as exc:
            raise ApiError(400, str(exc), "engine") from None
        return models.EventView(**record)

    @app.get(f"{API}/routing/policy", response_model=models.PolicyView, responses=_errors(503))
    def get_policy() -> models.PolicyView:
        pub = snap()
        current_or_503(pub)
        return models.policy(pub, policies)

    @app.put(
        f"{API}/routing/policy",
        dependencies=mutation,
        response_model=models.EventView | models.DryRunResult,
        response_model_exclude_none=True,
        responses=_errors(400, 401, 413, 415, 422, 500, 503),
        openapi_extra=_body_schema(models.PolicyUpdate),
    )
    async def put_policy(request: Request) -> Any:
        """Choose the routing policy (and adaptive routing's parameters) and reprogram the switches; the
        answer comes once every switch confirmed (`dry_run`: report only).  Validated whole: a bad value
        is a 4xx naming the field, and nothing changes."""
        update = parse_body(await request.body(), models.PolicyUpdate)
        pub = snap()
        current_or_503(pub)
        config = pub.state.config
        old = config.policy_params
        try:
            choice = PolicyChoice(
                config.options.policy if update.policy is None else update.policy,
                PolicyParams(
                    old.interval_ms if update.interval_ms is None else update.interval_ms,
                    old.threshold if update.threshold is None else update.threshold,
                    old.hysteresis if update.hysteresis is None else update.hysteresis,
                ),
                config.options.classes if update.classes is None else class_map(update.classes),
            ).validate(policies)
        except PolicyError as exc:
            status = 400 if exc.field == "policy" and update.policy not in policies else 422
            raise ApiError(status, str(exc), exc.field) from None
        if update.dry_run:
            options = replace(config.options, policy=choice.name, multipath=False, classes=choice.classes)
            return await dry_run_or_503(pub, None, options)
        record = await run_change(service.set_policy, choice)
        return models.EventView(**record)

    async def dry_run_or_503(pub: Published, engine: str | None, options: ForwardingOptions) -> Any:
        if not dry_runs.acquire(blocking=False):
            raise ApiError(503, "too many dry runs at once; try again shortly", None, {"Retry-After": "2"})
        try:
            return models.DryRunResult(**await run_in_threadpool(dry_run, pub.context, pub.state, engine,
                                                                 options))  # fmt: skip
        finally:
            dry_runs.release()

    @app.get(f"{API}/validation", response_model=models.ValidationView)
    def validation() -> models.ValidationView:
        pub = snap()
        report = pub.state.discovery.report(pub.context.declared, pub.state.ports_down, time.time())
        return models.ValidationView(**report)

    @app.get(f"{API}/events", response_model=list[models.EventView], response_model_exclude_none=True)
    def events(
        since: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[models.EventView]:
        records = [r for r in snap().state.records if r.id > since][-limit:]
        return [models.EventView(**r.as_dict()) for r in records]

    mount_pkeys(app, service, token)
    return app


def _body_schema(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


__all__ = ["API", "create_app"]
