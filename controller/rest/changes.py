"""Operator changes through the service, as REST answers: the one place where a change's failures become
status codes (bad input 422 naming the field, a refused P_Key edit 404/409/422, a busy worker 503 with
Retry-After, state that could not be saved 500 — nothing changed in every case)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from controller.core.fabric import StateNotSaved
from controller.httpguard import ApiError
from controller.service import Busy
from controller.sm.pkey_edits import EditError
from topologies.errors import InputError

_EDIT_STATUS = {"not_found": 404, "conflict": 409, "invalid": 422}


def refused(exc: EditError) -> ApiError:
    """A refused P_Key edit as its status: 404 no such P_Key, 409 it exists, 422 a field is wrong."""
    return ApiError(_EDIT_STATUS[exc.kind], exc.message, exc.field)


async def run_change(change: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """`change(*args)` on a worker thread (it waits for the rollout), its record or the ApiError."""
    try:
        return await run_in_threadpool(change, *args)
    except EditError as exc:
        raise refused(exc) from None
    except InputError as exc:
        raise ApiError(422, str(exc), exc.field) from None
    except Busy as exc:
        raise ApiError(503, str(exc), None, {"Retry-After": str(exc.retry_after_s)}) from None
    except StateNotSaved as exc:
        raise ApiError(500, str(exc), None) from None


__all__ = ["refused", "run_change"]
