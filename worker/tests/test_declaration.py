"""Declaration computation from backend capabilities (worker/README.md#what-the-worker-declares)."""

from __future__ import annotations

import pytest
from horde_contract.vocab import CHAT_FEATURE_VALUES, CHAT_GUARANTEE_VALUES
from horde_worker.backends.openai import (
    GENERIC,
    KOBOLDCPP,
    LLAMA_CPP_PYTHON,
    LLAMA_SERVER,
    OLLAMA,
    VLLM,
    Discovery,
    capabilities_for,
)
from horde_worker.backends.scripted import ScriptedBackend
from horde_worker.declaration import Capabilities, build_declaration, chat_features, chat_limits


def test_features_and_guarantees_share_one_sorted_list() -> None:
    caps = Capabilities(
        features=frozenset({"tools", "seed"}), guarantees=frozenset({"prompt_overflow_refused"})
    )
    assert chat_features(caps) == ["prompt_overflow_refused", "seed", "tools"]


def test_operator_override_and_removal_drop_unknown_values() -> None:
    caps = Capabilities(features=frozenset({"tools", "seed"}))
    assert chat_features(caps, only=["json_schema", "made_up"]) == ["json_schema"]
    assert chat_features(caps, disabled=["tools"]) == ["seed"]


def test_limits_are_lowered_to_the_backend() -> None:
    caps = Capabilities(max_context_length=1024, max_length=100, tools_max_temperature=1.0)
    assert chat_limits(caps, 4096, 512) == {
        "max_context_length": 1024,
        "max_length": 100,
        "tools_max_temperature": 1.0,
    }
    assert chat_limits(Capabilities(), 4096, 512) == {"max_context_length": 4096, "max_length": 512}
    # an output limit above the context makes no sense: it is capped at the context
    assert chat_limits(Capabilities(max_context_length=256), 4096, 512)["max_length"] == 256


def test_build_declaration_fields() -> None:
    caps = Capabilities(features=frozenset({"seed"}))
    decl = build_declaration(caps, model_id="m", prompt_jobs=False, max_context_length=2048, max_length=256)
    assert decl == {
        "chat_jobs": True,
        "prompt_jobs": False,
        "chat_features": ["seed"],
        "chat_limits": {"max_context_length": 2048, "max_length": 256},
        "model_id": "m",
        "image_transports": [],
    }


def test_messages_url_is_added_to_the_backends_transports() -> None:
    """The worker fetches offloaded messages itself (HORDE_WORKER_MESSAGES_URL), whatever the backend."""
    caps = Capabilities(image_transports=("url",))
    kwargs = {"model_id": "m", "prompt_jobs": False, "max_context_length": 2048, "max_length": 256}
    assert build_declaration(caps, messages_url=True, **kwargs)["image_transports"] == ["url", "messages_url"]
    assert build_declaration(Capabilities(), messages_url=True, **kwargs)["image_transports"] == [
        "messages_url"
    ]
    assert build_declaration(caps, **kwargs)["image_transports"] == ["url"]


async def test_scripted_declares_everything_but_vision() -> None:
    caps = await ScriptedBackend().start()
    assert set(caps.features) == set(CHAT_FEATURE_VALUES) - {"vision"}
    assert set(caps.guarantees) == set(CHAT_GUARANTEE_VALUES)
    caps = await ScriptedBackend(features=["tools", "tool_choice_enforced"]).start()
    assert caps.features == {"tools"} and caps.guarantees == {"tool_choice_enforced"}


ALL_TOOL_GUARANTEES = {"tool_choice_enforced", "single_tool_call_enforced"}


@pytest.mark.parametrize(
    ("flavor", "features", "guarantees", "tools_max_temperature"),
    [
        (
            KOBOLDCPP,
            {"seed", "presence_penalty", "tools", "json_object", "json_schema"},
            ALL_TOOL_GUARANTEES | {"prompt_overflow_refused"},
            1.0,
        ),
        (
            LLAMA_SERVER,
            {
                "seed",
                "presence_penalty",
                "frequency_penalty",
                "reasoning_effort",
                "tools",
                "json_object",
                "json_schema",
            },
            ALL_TOOL_GUARANTEES | {"prompt_overflow_refused", "structured_output_enforced"},
            None,
        ),
        (
            VLLM,
            {
                "seed",
                "presence_penalty",
                "frequency_penalty",
                "tools",
                "json_object",
                "json_schema",
                "tools_with_response_format",
            },
            ALL_TOOL_GUARANTEES | {"prompt_overflow_refused", "structured_output_enforced"},
            None,
        ),
        (
            OLLAMA,
            {"seed", "presence_penalty", "frequency_penalty", "tools", "json_object", "json_schema"},
            {"single_tool_call_enforced", "structured_output_enforced"},
            None,
        ),
        (
            LLAMA_CPP_PYTHON,
            {"seed", "presence_penalty", "frequency_penalty", "tools", "json_object", "json_schema"},
            ALL_TOOL_GUARANTEES | {"prompt_overflow_refused", "structured_output_enforced"},
            None,
        ),
        (GENERIC, {"seed", "presence_penalty", "frequency_penalty"}, set(), None),
    ],
)
def test_openai_flavor_declarations(
    flavor: str, features: set[str], guarantees: set[str], tools_max_temperature: float | None
) -> None:
    caps = capabilities_for(
        Discovery(flavor=flavor, model_name="/models/Qwen3-8B-Q4_K_M.gguf", max_context_length=8192)
    )
    assert set(caps.features) == features
    assert set(caps.guarantees) == guarantees
    assert caps.tools_max_temperature == tools_max_temperature
    assert caps.max_context_length == 8192
    assert caps.model_name == "Qwen3-8B-Q4_K_M"
    assert "vision" not in caps.features and caps.image_transports == ()


def test_ollama_capabilities_narrow_tools_and_add_thinking() -> None:
    caps = capabilities_for(Discovery(flavor=OLLAMA, ollama_capabilities=["completion", "thinking"]))
    assert "tools" not in caps.features
    assert "reasoning_effort" in caps.features
