"""horde_sdk (the AI Horde's own Python SDK) on the native routes, through the one horde URL.

horde_sdk reads its base URL once, at import: ``AI_HORDE_URL=http://127.0.0.1:7000/api/`` in the environment
before ``import horde_sdk`` (the trailing slash matters: the endpoint paths are joined to it). Its clients have no
base-URL parameter (``BaseAIHordeClient.base_url`` recurses), so these tests, which learn the URL from the
session's stack after import, set the module variable the request classes read,
``horde_sdk.ai_horde_api.apimodels.base.AI_HORDE_BASE_URL``.

The point is that the SDK's pydantic models accept what our services answer: every response below is asserted
to be parsed into the SDK's model (a field it rejects comes back as a ``RequestErrorResponse`` instead), and
the fields beyond its models are only Horde Chat's documented extensions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from horde_sdk import RequestErrorResponse
from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPIManualClient, AIHordeAPISimpleClient
from horde_sdk.ai_horde_api.apimodels import (
    AIHordeHeartbeatResponse,
    DeleteTextGenerateRequest,
    FindUserRequest,
    HordePerformanceRequest,
    HordePerformanceResponse,
    HordeStatusModelsAllRequest,
    HordeStatusModelsAllResponse,
    HordeStatusModelsSingleRequest,
    HordeStatusModelsSingleResponse,
    JobSubmitResponse,
    SingleWorkerDetailsResponse,
    SingleWorkerNameDetailsRequest,
    TextGenerateAsyncRequest,
    TextGenerateAsyncResponse,
    TextGenerateJobPopRequest,
    TextGenerateJobPopResponse,
    TextGenerateStatusRequest,
    TextGenerateStatusResponse,
    TextGenerationJobSubmitRequest,
    TextStatsModelResponse,
    TextStatsModelsRequest,
    TextStatsModelsTotalRequest,
    TextStatsModelsTotalResponse,
    UserDetailsResponse,
)
from horde_sdk.ai_horde_api.apimodels import base as sdk_base
from horde_sdk.ai_horde_api.consts import GENERATION_STATE, MODEL_TYPE
from horde_sdk.ai_horde_api.fields import JobID
from horde_sdk.generic_api.apimodels import HordeRequest, HordeResponseBaseModel, HordeResponseRootModel

from .conftest import Horde

GREETING = "Hello from the scripted backend:"
#: A model only this module's SDK worker serves, so its job cannot go to the scripted worker.
SDK_MODEL = "sdk-test/echo"
SDK_WORKER = "horde-sdk-worker"
#: Horde Chat's additions to the AI Horde's worker details (docs/native-api.md): beyond horde_sdk's model.
WORKER_EXTENSIONS = {"accepts_chat_jobs", "accepts_prompt_jobs", "nonconformant_replies", "chat"}
#: The AI Horde's user-details field horde_sdk 0.18 does not model yet.
USER_EXTRAS = {"deleted"}


@pytest.fixture(scope="module", autouse=True)
def _sdk_points_at_the_horde(horde: Horde) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdk_base, "AI_HORDE_BASE_URL", f"{horde.url}/api/")
        yield


R = TypeVar("R", bound=HordeResponseBaseModel | HordeResponseRootModel[Any])


def _submit(request: HordeRequest, expected: type[R]) -> R:
    """One request through the SDK's manual client; the response must parse as ``expected``."""
    response = AIHordeAPIManualClient().submit_request(request, expected)
    assert not isinstance(response, RequestErrorResponse), (response.message, response.object_data)
    assert isinstance(response, expected)
    return response


def _text_request(apikey: str, prompt: str, model: str, max_length: int) -> TextGenerateAsyncRequest:
    # model_validate: the SDK's models give their defaults through Field(), which mypy does not see.
    return TextGenerateAsyncRequest.model_validate(
        {
            "apikey": apikey,
            "prompt": prompt,
            "models": [model],
            "params": {"max_length": max_length, "max_context_length": 1024},
        }
    )


def _wait_done(job_id: JobID, timeout: float = 60.0) -> TextGenerateStatusResponse:
    deadline = time.monotonic() + timeout
    while True:
        status = _submit(TextGenerateStatusRequest(id=job_id), TextGenerateStatusResponse)
        if status.done:
            return status
        assert time.monotonic() < deadline, f"not done within {timeout} s: {status}"
        time.sleep(0.3)


#: The SDK worker's pop (besides its key).
POP = {
    "name": SDK_WORKER,
    "models": [SDK_MODEL],
    "bridge_agent": "horde-chat client tests:1:https://example.invalid",
    "max_length": 64,
    "max_context_length": 1024,
}


def _pop(horde: Horde) -> TextGenerateJobPopRequest:
    return TextGenerateJobPopRequest.model_validate({**POP, "apikey": horde.worker_key})


def test_requests_go_to_the_horde(horde: Horde) -> None:
    assert FindUserRequest.get_api_endpoint_url() == f"{horde.url}/api/v2/find_user"


def test_heartbeat() -> None:
    response = AIHordeAPISimpleClient().heartbeat_request()

    assert isinstance(response, AIHordeHeartbeatResponse)
    assert response.message == "OK"
    assert response.version


def test_performance() -> None:
    response = _submit(HordePerformanceRequest(), HordePerformanceResponse)

    assert response.text_worker_count is not None and response.text_worker_count >= 1
    assert response.text_thread_count is not None and response.text_thread_count >= 1
    assert response.worker_count == 0  # image workers: none on a text horde


def test_model_list(horde: Horde) -> None:
    response = _submit(HordeStatusModelsAllRequest(type=MODEL_TYPE.text), HordeStatusModelsAllResponse)

    models = {m.name: m for m in response.root}
    echo = models[horde.model]
    assert echo.type_ == MODEL_TYPE.text
    assert echo.count is not None and echo.count >= 1
    assert echo.queued is not None and echo.queued >= 0
    assert echo.eta is not None and echo.eta >= 0
    assert all(not m.model_extra for m in response.root)


def test_single_model_status(horde: Horde) -> None:
    """One model's statistics: a list with its entry (the name holds a /, sent as is); [] for a model no online
    worker serves, as upstream."""
    response = _submit(
        HordeStatusModelsSingleRequest(model_name=horde.model), HordeStatusModelsSingleResponse
    )

    [echo] = response.root
    assert (echo.name, echo.type_) == (horde.model, MODEL_TYPE.text)
    assert echo.count is not None and echo.count >= 1
    assert echo.queued is not None and echo.eta is not None
    assert not echo.model_extra

    unknown = _submit(
        HordeStatusModelsSingleRequest(model_name="nobody/serves-this"), HordeStatusModelsSingleResponse
    )
    assert unknown.root == []


def test_find_user_with_the_demo_key(horde: Horde) -> None:
    user = _submit(FindUserRequest(apikey=horde.api_key), UserDetailsResponse)

    assert user.username == f"demo#{user.id_}"
    assert user.id_ is not None and user.id_ > 0
    assert user.kudos is not None and 0 < user.kudos <= 5000
    assert user.worker_count == 0 and user.worker_ids == []
    assert user.concurrency is not None and user.concurrency > 0
    assert user.kudos_details is not None and user.records is not None
    assert user.records.fulfillment is not None and user.records.fulfillment.text == 0
    assert set(user.model_extra or {}) <= USER_EXTRAS


def test_find_user_with_the_anonymous_key() -> None:
    user = _submit(FindUserRequest(apikey="0000000000"), UserDetailsResponse)

    assert (user.username, user.id_) == ("Anonymous#0", 0)


def test_text_generation_async_and_status_polled_to_completion(horde: Horde) -> None:
    prompt = "Say hello to the horde"
    request = _text_request(horde.api_key, prompt, horde.model, 32)
    seen: list[TextGenerateStatusResponse] = []

    # The SDK's own loop: the async request, then the status until done (every 4 s).
    status, job_id = AIHordeAPISimpleClient().text_generate_request(
        request, timeout=120, check_callback=seen.append
    )

    assert isinstance(job_id, JobID)
    assert seen and all(isinstance(s, TextGenerateStatusResponse) for s in seen)
    assert isinstance(status, TextGenerateStatusResponse)
    assert (status.done, status.faulted, status.finished) == (True, False, 1)
    assert (status.processing, status.waiting, status.restarted) == (0, 0, 0)
    assert status.is_possible is True
    assert status.kudos is not None and status.kudos > 0
    assert len(status.generations) == 1
    generation = status.generations[0]
    assert generation.text == f"{GREETING} {prompt}"
    assert generation.model == horde.model
    assert generation.state == GENERATION_STATE.ok
    assert generation.worker_name == "local-reference-worker"
    assert generation.worker_id is not None
    assert not status.model_extra and not generation.model_extra


def test_text_generation_manual_status_and_cancel(horde: Horde) -> None:
    # [[sleep:5]] keeps the job at the worker for 5 s: the request is neither done nor finished when cancelled.
    request = _text_request(horde.api_key, "Wait for me [[sleep:5]]", horde.model, 16)

    queued = _submit(request, TextGenerateAsyncResponse)
    assert queued.id_ is not None
    assert queued.kudos is not None and queued.kudos > 0
    status = _submit(TextGenerateStatusRequest(id=queued.id_), TextGenerateStatusResponse)
    assert (status.done, status.finished, status.generations) == (False, 0, [])
    assert status.processing + status.waiting == 1

    cancelled = _submit(DeleteTextGenerateRequest(id=queued.id_), TextGenerateStatusResponse)
    assert (cancelled.finished, cancelled.generations) == (0, [])


def test_text_stats_models(horde: Horde) -> None:
    queued = _submit(_text_request(horde.api_key, "Count me", horde.model, 16), TextGenerateAsyncResponse)
    assert queued.id_ is not None
    assert _wait_done(queued.id_).generations[0].text == f"{GREETING} Count me"

    stats = _submit(TextStatsModelsRequest(), TextStatsModelResponse)

    assert stats.total.get(horde.model, 0) >= 1
    assert stats.day.get(horde.model, 0) >= 1
    assert stats.month.get(horde.model, 0) >= 1


def test_text_stats_totals(horde: Horde) -> None:
    queued = _submit(_text_request(horde.api_key, "Total me", horde.model, 16), TextGenerateAsyncResponse)
    assert queued.id_ is not None
    assert _wait_done(queued.id_).generations[0].text == f"{GREETING} Total me"

    totals = _submit(TextStatsModelsTotalRequest(), TextStatsModelsTotalResponse)

    periods = (totals.minute, totals.hour, totals.day, totals.month, totals.total)
    assert all(set(p) == {"requests", "tokens"} for p in periods)
    # the generation just completed, in every period (a text reply counts its request's max_length, 16)
    assert all(p["requests"] >= 1 and p["tokens"] >= 16 for p in periods)
    requests = [p["requests"] for p in periods]
    assert requests == sorted(requests)  # each period holds the shorter ones
    assert not totals.model_extra


def test_worker_pop_submit_round_trip(horde: Horde) -> None:
    """horde_sdk as a worker: pop a job, submit its text; the requester's status shows it."""
    # The worker's first pop checks it in, so that its model is known; nothing is queued for it yet, so the
    # answer is the empty pop, which the SDK parses too (an empty payload, no id, no model).
    idle = _submit(_pop(horde), TextGenerateJobPopResponse)
    assert (idle.id_, idle.ids, idle.model) == (None, [], None)
    assert idle.payload.prompt is None and not idle.payload.model_extra

    prompt = "A prompt for the SDK worker"
    queued = _submit(
        _text_request(horde.api_key, prompt, SDK_MODEL, 32),
        TextGenerateAsyncResponse,
    )
    assert queued.id_ is not None

    job = _submit(_pop(horde), TextGenerateJobPopResponse)
    assert job.model == SDK_MODEL
    assert job.id_ is not None and job.ids == [job.id_]
    assert job.payload.prompt == prompt
    assert (job.payload.max_length, job.payload.max_context_length) == (32, 1024)
    assert job.ttl is not None and job.ttl > 0
    assert job.softprompt is None
    assert not job.model_extra and not job.payload.model_extra

    reply = "Hello from the SDK worker"
    submitted = _submit(
        TextGenerationJobSubmitRequest(
            apikey=horde.worker_key, id=job.id_, generation=reply, state=GENERATION_STATE.ok
        ),
        JobSubmitResponse,
    )
    assert submitted.reward > 0

    status = _wait_done(queued.id_)
    assert (status.finished, status.faulted) == (1, False)
    assert [(g.text, g.model, g.worker_name) for g in status.generations] == [(reply, SDK_MODEL, SDK_WORKER)]

    worker = _submit(SingleWorkerNameDetailsRequest(worker_name=SDK_WORKER), SingleWorkerDetailsResponse)
    assert worker.name == SDK_WORKER and worker.online is True
    assert worker.models == [SDK_MODEL]
    assert worker.requests_fulfilled == 1
    assert worker.bridge_agent == POP["bridge_agent"]
    assert set(worker.model_extra or {}) <= WORKER_EXTENSIONS
    assert (worker.model_extra or {}).get("accepts_chat_jobs") is False
