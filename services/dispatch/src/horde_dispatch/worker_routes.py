"""``GET /v2/workers``, ``/v2/workers/{id}``, ``/v2/workers/name/{name}``: worker details with the chat
declaration of the last pop (docs/native-api.md#worker-details; details are read fresh, the 30 s
cache the spec allows is not used; ``paused`` and ``suspicious`` only for the owner's or a moderator's
``apikey``); ``PUT /v2/workers/{id}``: the owner's or a moderator's changes
(docs/native-api.md#modify-worker, :mod:`horde_dispatch.worker_update`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request

from .state import DispatchState, get_state
from .worker_update import modify_worker, read_modify_body
from .workers import DetailsViewer, details_viewer, get_worker_by_id, get_worker_by_name, list_workers

router = APIRouter(tags=["workers"])

#: Longest ``name`` query matched (a worker name has at most 100 characters); a longer one finds none.
MAX_NAME_QUERY = 100

#: The optional key of a details read: the owner's or a moderator's shows ``paused`` and ``suspicious``.
DetailsKey = Annotated[
    str | None,
    Header(description="Optional: the worker owner's or a moderator's API key shows paused and suspicious"),
]


async def _viewer(state: DispatchState, apikey: str | None) -> DetailsViewer:
    return await details_viewer(state.pool, apikey, state.settings.secret_key)


@router.get("/v2/workers")
async def workers(
    state: Annotated[DispatchState, Depends(get_state)],
    type: Annotated[
        str | None, Query(description="image, text or interrogation; dispatch serves text")
    ] = None,
    name: Annotated[
        str | None,
        Query(description="only the worker with this name (case-insensitive); type is then ignored"),
    ] = None,
    apikey: DetailsKey = None,
) -> list[dict[str, Any]]:
    """Details of every online worker (checked in within 300 s), as upstream lists only active workers. With
    ``name``, the online worker of that name compared case-insensitively (``type`` is then not applied, as
    upstream); otherwise ``type`` other than text lists none. ``paused`` and ``suspicious`` only on the
    workers the ``apikey``'s user owns, or on every one for a moderator."""
    if name is not None:
        if len(name) > MAX_NAME_QUERY:
            return []
        return await list_workers(state.pool, name, await _viewer(state, apikey))
    if type is not None and type != "text":
        return []
    return await list_workers(state.pool, viewer=await _viewer(state, apikey))


@router.get("/v2/workers/name/{worker_name}")
async def worker_by_name(
    worker_name: str, state: Annotated[DispatchState, Depends(get_state)], apikey: DetailsKey = None
) -> dict[str, Any]:
    """One worker's details by name (``paused``, ``suspicious`` for its owner or a moderator); 404
    WorkerNotFound."""
    return await get_worker_by_name(state.pool, worker_name, await _viewer(state, apikey))


@router.get("/v2/workers/{worker_id}")
async def worker_by_id(
    worker_id: str, state: Annotated[DispatchState, Depends(get_state)], apikey: DetailsKey = None
) -> dict[str, Any]:
    """One worker's details by id (``paused``, ``suspicious`` for its owner or a moderator); 404
    WorkerNotFound."""
    return await get_worker_by_id(state.pool, worker_id, await _viewer(state, apikey))


@router.put("/v2/workers/{worker_id}")
async def worker_modify(
    worker_id: str,
    request: Request,
    state: Annotated[DispatchState, Depends(get_state)],
    apikey: Annotated[str | None, Header(description="The owner's or a moderator's API key")] = None,
) -> dict[str, Any]:
    """Change a worker's maintenance (with its message), pause, info, name or team; the answer holds each
    field set, with its new value (upstream ``ModifyWorker``).

    400 BadRequest, NoWorkerModSelected, WorkerNameAlreadyExists; 401 InvalidAPIKey; 403 NotOwner, NotModerator,
    DeletedUser; 404 WorkerNotFound, TeamNotFound; 408 RequestBodyTimeout; 413 RequestTooLarge.
    docs/native-api.md#modify-worker.
    """
    body = await read_modify_body(request, state.settings.body_read_timeout_seconds)
    async with state.pool.acquire() as conn:
        return await modify_worker(conn, worker_id, body, apikey, state.settings.secret_key)
