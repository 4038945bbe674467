"""``GET /v2/workers``, ``/v2/workers/{id}``, ``/v2/workers/name/{name}``: worker details with the chat
declaration of the last pop (docs/native-api.md#worker-details; details are read fresh, the 30 s
cache the spec allows is not used)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from .state import DispatchState, get_state
from .workers import get_worker_by_id, get_worker_by_name, list_workers

router = APIRouter(tags=["workers"])


@router.get("/v2/workers")
async def workers(
    state: Annotated[DispatchState, Depends(get_state)],
    type: Annotated[
        str | None, Query(description="image, text or interrogation; dispatch serves text")
    ] = None,
    name: Annotated[str | None, Query(description="only the worker with this name")] = None,
) -> list[dict[str, Any]]:
    """Details of every online worker (checked in within 300 s). ``type`` other than text lists none."""
    if type is not None and type != "text":
        return []
    return await list_workers(state.pool, name)


@router.get("/v2/workers/name/{worker_name}")
async def worker_by_name(
    worker_name: str, state: Annotated[DispatchState, Depends(get_state)]
) -> dict[str, Any]:
    """One worker's details by name; 404 WorkerNotFound."""
    return await get_worker_by_name(state.pool, worker_name)


@router.get("/v2/workers/{worker_id}")
async def worker_by_id(worker_id: str, state: Annotated[DispatchState, Depends(get_state)]) -> dict[str, Any]:
    """One worker's details by id; 404 WorkerNotFound."""
    return await get_worker_by_id(state.pool, worker_id)
