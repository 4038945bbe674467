"""RequestNeeds and Availability read and write the WorkerPool messages the same way at both ends."""

from __future__ import annotations

from horde.dispatch.v1 import worker_pool_pb2
from horde_core.worker_pool import Availability, RequestNeeds


def test_needs_round_trip() -> None:
    needs = RequestNeeds(
        models=["a", "b"],
        required_features=["seed", "tools"],
        max_length=64,
        max_context_length=2048,
        tools_temperature=0.0,
        has_images=True,
        only_worker_ids=["w1"],
        ignore_worker_ids=["w2"],
        trusted_workers=True,
        validated_backends=True,
        slow_workers=False,
        requester_user_id=7,
        prompt_jobs=True,
    )
    message = needs.to_proto()
    assert message.HasField("tools_temperature") and message.tools_temperature == 0.0
    assert RequestNeeds.from_proto(message) == needs


def test_needs_defaults_and_unconstrained_sizes() -> None:
    message = RequestNeeds(models=["a"]).to_proto()
    assert not message.HasField("tools_temperature")
    assert message.slow_workers and message.requester_user_id == 0
    negative = worker_pool_pb2.GetAvailabilityRequest(models=["a"], max_length=-1, max_context_length=-5)
    decoded = RequestNeeds.from_proto(negative)
    assert (decoded.max_length, decoded.max_context_length, decoded.tools_temperature) == (0, 0, None)


def test_availability_round_trip_and_gap() -> None:
    served = Availability(
        known_workers=3,
        serving_workers=2,
        max_chat_context_length=4096,
        max_chat_length=512,
        eligible_workers=1,
        eligible_threads=2,
        tokens_per_second=20.0,
        eligible_worker_ids=["w1"],
    )
    message = served.to_proto()
    assert not message.HasField("declaration_gap")
    assert Availability.from_proto(message) == served
    assert served.model_known and served.impossible_reason() is None

    refused = Availability(serving_workers=1, missing_declarations=["vision"], exceeded_limits=["max_length"])
    message = refused.to_proto()
    assert list(message.declaration_gap.missing_declarations) == ["vision"]
    assert list(message.declaration_gap.exceeded_limits) == ["max_length"]
    assert Availability.from_proto(message) == refused
    assert refused.impossible_reason() == {
        "kind": "declaration_gap",
        "missing_declarations": ["vision"],
        "exceeded_limits": ["max_length"],
    }


def test_model_known_without_known_workers() -> None:
    assert not Availability().model_known
    assert Availability(known_workers=1).model_known
    assert Availability(serving_workers=1).model_known
