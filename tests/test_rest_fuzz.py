"""REST fuzzing from the OpenAPI document (schemathesis): whatever a client sends — every operation, every
parameter, bodies generated from the schema and mutated past it — the controller answers without a server
error, within the documented status codes and response schemas, and stays healthy and in sync afterwards.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from controller.rest.api import create_app
from controller.service import FabricService
from controller.statestore import StateStore
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.generators import fat_tree

_SERVICE = FabricService.for_fabric(
    fat_tree(4), StateStore(Path(tempfile.mkdtemp(prefix="fabriclab-fuzz-"))), lldp_interval_s=3600
)
_FAKE = FakeFabric(_SERVICE.context.declared, _SERVICE.context.addresses)
_SB = FakeSouthbound(_FAKE, _SERVICE)
_SERVICE.start(_SB)
for _dpid in sorted(_SB.dpids.values()):
    _SB.up.add(_dpid)
    _SERVICE.switch_connected(_dpid, 0.0)
_SERVICE.sync()
APP = create_app(_SERVICE, token=None)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
schema.config.generation.update(modes=list(schemathesis.GenerationMode))  # valid and invalid input


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_makes_a_server_error(case: schemathesis.Case[Any]) -> None:
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])


def test_healthy_and_in_sync_after_fuzzing() -> None:
    _SERVICE.sync()
    health = _SERVICE.snapshot()
    assert health.state.current is not None and health.state.current.verification.ok
    assert health.state.in_sync and len(health.state.connected) == 20
    _FAKE.assert_delivers(_FAKE.all_pairs())
