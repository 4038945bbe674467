"""``POST /v2/generate/text/pop``: check the worker in with its chat declaration and hand it a job.

See docs/native-api.md#chat-declaration, #eligibility, #chat-job-payload, #job-lease,
#progress (the lease written at pop); docs/native-api.md#pop (fields, refusals, queue order,
``skipped``, ttl, payload) and §6 (creation, check-in).

Round trips: authentication, the check-in upsert (which also pays a due uptime reward,
docs/native-api.md#uptime-kudos), the pop statement; an empty pop adds the ``skipped`` count. Nothing reads the object store or Redis before the pop statement has committed.

Long-poll (``wait_seconds`` > 0, docs/worker-guide.md#long-poll): when the first pop statement finds nothing, the
route gives its connection back and waits in :mod:`horde_dispatch.longpoll`; each retry runs the pop
statement alone, on a freshly acquired connection, with the owner, worker row and :class:`PopWorker` of the
first attempt (the check-in is not repeated). ``skipped`` is counted once, when the time is up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from horde_contract import (
    RC,
    TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
    UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
)
from horde_contract.bridges import is_validated_bridge
from horde_contract.errors import HordeError
from horde_contract.refusals import wrong_credentials_error
from horde_core.capacity import leave_in_flight
from horde_core.chat_stream import StreamLease, write_stream_leases
from horde_core.metrics import requester_kind, size_bucket
from horde_store import users

from .auth import authenticate_worker_owner, owner_refusal
from .lease import effective_speed, lease_capacity, record_capacity_limit
from .longpoll import WaitOutcome
from .metrics import GATE_SHADOW_ASSIGNMENTS, QUEUE_WAIT_SECONDS
from .payload import chat_job_payload, text_job_payload
from .pop_body import PopBody, parse_pop_body, read_pop_body
from .queue import SLOW_WORKER_SPEED, PoppedJob, PopWorker, count_skipped, pop_job
from .state import DispatchState, get_state
from .workers import UptimeRule, WorkerRow, check_in

log = logging.getLogger(__name__)

router = APIRouter(tags=["workers"])

DEFAULT_MAINTENANCE_MESSAGE = "This worker has been put into maintenance mode by its owner."

#: What a long poll re-reads before each retry (its worker's and owner's flags).
_WAITER_STATE = """
SELECT w.maintenance, w.maintenance_msg, w.paused, u.trusted, u.flagged, u.deleted
FROM workers w JOIN users u ON u.id = w.user_id WHERE w.id = $1
"""


def _empty_pop(skipped: dict[str, int]) -> dict[str, Any]:
    """The answer of a pop without a job: ``{payload: {}, id: null, ids: [], skipped}``. ``payload`` is there
    because upstream's answer always holds one (its marshalled empty payload) and clients such as horde_sdk
    require it; empty, since there is no job to describe (docs/native-api.md#pop)."""
    return {"payload": {}, "id": None, "ids": [], "skipped": skipped}


def _record_assignment(job: PoppedJob, worker: PopWorker, capacity: int, speed: float) -> None:
    """Queue wait and the over-capacity shadow of a real assignment; a fake job only logs its ids (INFO)
    and is recorded in neither (docs/native-api.md#eligibility)."""
    if job.fake:
        log.info(
            "fake job assigned to a paused worker",
            extra={
                "generation_ids": [str(g) for g in job.generation_ids],
                "request_id": str(job.wp_id),
                "worker_id": str(worker.worker_id),
            },
        )
        return
    wait = max(0.0, (job.assigned - job.created).total_seconds())
    QUEUE_WAIT_SECONDS.labels(
        requester=requester_kind(anonymous=job.requester_id == 0, shared_key=job.shared_key_id is not None),
        chat=str(job.is_chat).lower(),
        requested_bucket=size_bucket(job.max_length),
    ).observe(wait)
    if job.over_capacity:
        # Legacy text jobs are not gated (docs/native-api.md#eligibility); the shadow records how often the gate would have held.
        GATE_SHADOW_ASSIGNMENTS.labels(
            worker_trusted=str(worker.trusted).lower(), size_bucket=size_bucket(job.max_length)
        ).inc()
        log.info(
            "legacy text job assigned over capacity",
            extra={
                "generation_ids": [str(g) for g in job.generation_ids],
                "request_id": str(job.wp_id),
                "worker_id": str(worker.worker_id),
                "max_length": job.max_length,
                "capacity": capacity,
                "speed": speed,
            },
        )


def _pop_worker(pop: PopBody, owner: users.AuthenticatedUser, worker: WorkerRow, job_ttl: int) -> PopWorker:
    """What the queue query needs: the pop's models and declaration, the stored text limits, the owner's
    trust, the bridge, the speed gate's capacity (counted in horde.pop.lease_capacity_limited) and the job
    lease ``job_ttl`` (seconds) a generation gets."""
    declaration = pop.declaration
    capacity = lease_capacity(worker.speed)
    record_capacity_limit(declaration.accepts_chat_jobs, declaration.chat_max_length, capacity)
    return PopWorker(
        worker_id=worker.id,
        owner_id=owner.id,
        priority_user_ids=tuple(pop.priority_user_ids),
        models=tuple(pop.models),
        accepts_prompt_jobs=declaration.accepts_prompt_jobs,
        text_max_length=worker.max_length,
        text_max_context_length=worker.max_context_length,
        accepts_chat_jobs=declaration.accepts_chat_jobs,
        chat_model_id=declaration.chat_model_id,
        chat_features=tuple(declaration.chat_features),
        chat_max_length=declaration.chat_max_length,
        chat_max_context_length=declaration.chat_max_context_length,
        chat_tools_max_temperature=declaration.chat_tools_max_temperature,
        image_transports=tuple(declaration.image_transports),
        capacity=capacity,
        trusted=owner.trusted,
        validated=is_validated_bridge(worker.bridge_agent),
        slow=effective_speed(worker.speed) < SLOW_WORKER_SPEED,
        maintenance=worker.maintenance,
        paused=worker.paused,
        amount=pop.text.amount,
        lease_cap=TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
        if owner.trusted
        else UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
        job_ttl=job_ttl,
    )


@router.post("/v2/generate/text/pop")
async def pop_text_job(
    request: Request,
    state: Annotated[DispatchState, Depends(get_state)],
    apikey: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    """Check the worker in and pop one text or chat job.

    Body: the text pop fields (name, models, max_length, max_context_length, threads 1–50, amount 1–20,
    bridge_agent, softprompts, priority_usernames, …) and the chat declaration (chat_jobs, prompt_jobs,
    chat_features, chat_limits, model_id, image_transports). Lengths are tokens.

    200 with a job: ``{payload, id, ids, model, ttl, softprompt: null, skipped: {}}`` plus ``chat: true`` for a
    chat job, ``ttl`` being the job lease in seconds (HORDE_TEXT_JOB_LEASE_SECONDS, 150 by default;
    docs/native-api.md#job-lease) and ``softprompt`` always null (soft prompts are not served; older bridges read
    the key); without one: ``{payload: {}, id: null, ids: [], skipped: {reason: count}}``. A paused worker's job
    for another user's request is a fake one, indistinguishable here (docs/native-api.md#workers).

    Long-poll (a Horde Chat extension): ``wait_seconds`` (a number, 0 to 20, default 0) holds an empty pop up
    to that many seconds (at most HORDE_POP_WAIT_MAX_SECONDS); the answer comes as soon as a job this worker
    may take is queued (or re-queued), and the empty answer when the time is up (``skipped`` counted then) or
    when dispatch shuts down (``skipped`` empty). A worker in maintenance gets its 403 at once. No database
    connection is held while waiting, and a waiting pop does not count toward HORDE_MAX_IN_FLIGHT_REQUESTS.

    Errors: 400 BadRequest / InvalidPriorityUsername / ChatDeclarationInvalid; 401 InvalidAPIKey;
    403 AnonForbiddenWorker, DeletedUser, WorkerFlaggedMaintenance, WrongCredentials (the name belongs to
    another user), WorkerMaintenance (a worker in maintenance with none of its owner's requests queued).
    """
    pop = parse_pop_body(await read_pop_body(request, state.settings.body_read_timeout_seconds))
    settings = state.settings
    ipaddr = request.client.host if request.client else None
    wait = min(pop.wait_seconds, settings.pop_wait_max_seconds)
    longpoll = state.longpoll if wait > 0 else None
    deadline = asyncio.get_running_loop().time() + wait
    # Announcements routed from here on are caught up by the wait (longpoll.LongPoll._catch_up).
    since = longpoll.sequence if longpoll is not None else 0
    # One connection for the whole pop: a request queues for the pool once, not once per statement.
    async with state.pool.acquire() as conn:
        owner = await authenticate_worker_owner(conn, apikey, settings.secret_key)
        uptime = UptimeRule(state.model_reference, settings.worker_uptime_reward_seconds)
        worker = await check_in(conn, owner.id, pop, ipaddr, uptime)
        pw = _pop_worker(pop, owner, worker, settings.text_job_lease_seconds)
        job = await pop_job(conn, pw, state.head)
        if job is None:
            if worker.maintenance:
                raise HordeError(
                    403, RC.WorkerMaintenance, worker.maintenance_msg or DEFAULT_MAINTENANCE_MESSAGE
                )
            # A worker waits with at most its threads' pops at once: more would only multiply rechecks.
            if (
                longpoll is None
                or longpoll.closed
                or longpoll.waiting_for(worker.id) >= max(1, worker.threads)
            ):
                skipped = await count_skipped(conn, pw, settings.pop_skipped_scan_limit)
                return _empty_pop(skipped)
    if job is None:
        # The connection went back to the pool above: a waiting pop holds none, and it no longer counts toward
        # the in-flight cap (idle workers waiting for a job never use it up).
        assert longpoll is not None
        leave_in_flight(request.scope)

        async def pop_again() -> PoppedJob | None:
            # The worker and its owner as they are now: put in maintenance, paused, flagged, deleted or no
            # longer trusted while it waited, it gets what a fresh pop would (the 403, or the narrower queue).
            nonlocal pw
            async with state.pool.acquire() as conn:
                now = await conn.fetchrow(_WAITER_STATE, worker.id)
                if now is None:
                    raise wrong_credentials_error()
                refusal = owner_refusal(False, now["deleted"], now["flagged"])
                if refusal is not None:
                    raise refusal
                pw = dataclasses.replace(
                    pw,
                    maintenance=now["maintenance"],
                    paused=now["paused"],
                    trusted=now["trusted"],
                    lease_cap=TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
                    if now["trusted"]
                    else UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
                )
                found = await pop_job(conn, pw, state.head)
            if found is None and now["maintenance"]:
                raise HordeError(
                    403, RC.WorkerMaintenance, now["maintenance_msg"] or DEFAULT_MAINTENANCE_MESSAGE
                )
            return found

        job, outcome = await longpoll.wait(
            pw, since=since, deadline=deadline, pop=pop_again, gone=request.is_disconnected
        )
        if job is None:
            if outcome is not WaitOutcome.timeout:
                # Shutting down, or nobody listens any more: no queue scan for an answer nobody needs.
                return _empty_pop({})
            async with state.pool.acquire() as conn:
                skipped = await count_skipped(conn, pw, settings.pop_skipped_scan_limit)
            return _empty_pop(skipped)

    speed = effective_speed(worker.speed)
    capacity = pw.capacity
    _record_assignment(job, pw, capacity, speed)
    ids = [str(g) for g in job.generation_ids]
    response: dict[str, Any] = {"id": ids[0] if ids else None, "ids": ids, "model": job.model}
    if job.is_chat:
        response["payload"] = await chat_job_payload(job, state.objects)
        response["chat"] = True
        if job.stream_progress:
            leases = {
                gid: StreamLease.at_pop(
                    request_id=str(job.wp_id),
                    worker_id=str(worker.id),
                    model=job.model,
                    owner_id=owner.id,
                    owner_key_hash=owner.api_key_hash,
                    max_length=job.max_length,
                    started=job.assigned,
                    job_ttl=pw.job_ttl,
                    lease_cap=pw.lease_cap,
                    trusted=pw.trusted,  # as re-read by a long poll
                    fake=job.fake,
                )
                for gid in ids
            }
            await write_stream_leases(state.signals, leases)
    else:
        response["payload"] = text_job_payload(job)
    response["ttl"] = pw.job_ttl
    response["softprompt"] = None
    response["skipped"] = {}
    return response
