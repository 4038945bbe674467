"""Uptime kudos at check-in (docs/native-api.md#uptime-kudos; upstream ``WorkerTemplate.check_in`` and
``TextWorker.calculate_uptime_reward``).

The interval is shortened to 60 s through HORDE_WORKER_UPTIME_REWARD_SECONDS; the tests move the stored
``last_check_in`` back instead of waiting, so a pop accrues a known number of seconds (45, give or take the
one the statement may round into).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from horde_dispatch.settings import DispatchSettings
from horde_testing.launcher import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY

Harness = Any
pytestmark = pytest.mark.asyncio(loop_scope="session")

INTERVAL = 60
KNOWN_13B = "koboldcpp/uptime-13b"
KNOWN_1B = "koboldcpp/uptime-1b"
UNKNOWN = "koboldcpp/not-in-the-reference"
VALIDATED = "KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp"
UNVALIDATED = "SomeBridge:1:https://example.invalid"
# 25 + 15 * 4096 / 1024 at a 4096-token context.
BASE = 85.0


@pytest.fixture(scope="module")
def dispatch_settings(
    horde_settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> DispatchSettings:
    reference = tmp_path_factory.mktemp("uptime") / "models.json"
    reference.write_text(
        json.dumps(
            {"org/uptime-13b": {"parameters": 13_000_000_000}, "org/uptime-1b": {"parameters": 1_000_000_000}}
        )
    )
    values: dict[str, Any] = {
        k.removeprefix("HORDE_").lower(): v for k, v in horde_settings_env.items() if k.startswith("HORDE_")
    }
    values.setdefault("secret_key", TEST_SECRET_KEY)
    values.update(
        dispatch_grpc_port=free_port(),
        log_json=False,
        worker_uptime_reward_seconds=INTERVAL,
        text_model_reference=str(reference),
    )
    return DispatchSettings(**values)


def classic_body(name: str, model: str = KNOWN_13B, bridge: str = VALIDATED) -> dict[str, Any]:
    """A classic text worker's pop: no chat fields."""
    return {
        "name": name,
        "models": [model],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": bridge,
    }


async def rewind(h: Harness, name: str, seconds: int = 45, **columns: Any) -> None:
    """Move the worker's last check-in ``seconds`` back (outside the 30 s window, still online)."""
    await h.db.execute(
        "UPDATE workers SET last_check_in = now() - make_interval(secs => $2), created = now() - interval '1 hour'"
        " WHERE name = $1",
        name,
        seconds,
    )
    if columns:
        await h.set_worker(name, **columns)


async def state(h: Harness, name: str, uid: int) -> dict[str, Any]:
    row = await h.db.fetchrow(
        """SELECT w.kudos, w.uptime_kudos, w.uptime, w.last_reward_uptime, u.kudos AS owner_kudos,
                  u.evaluating_kudos AS owner_escrow
           FROM workers w JOIN users u ON u.id = w.user_id WHERE w.name = $1 AND u.id = $2""",
        name,
        uid,
    )
    assert row is not None
    return dict(row)


async def test_a_worker_popping_across_the_interval_earns_the_reward(h: Harness) -> None:
    uid, key = await h.user(trusted=True)
    assert (await h.pop(key, classic_body("up-known"))).status_code == 200
    await rewind(h, "up-known")
    assert (await h.pop(key, classic_body("up-known"))).status_code == 200
    before = await state(h, "up-known", uid)
    assert 45 <= before["uptime"] <= 46
    assert (before["kudos"], before["uptime_kudos"], before["owner_kudos"]) == (0, 0, 0)

    await rewind(h, "up-known")
    assert (await h.pop(key, classic_body("up-known"))).status_code == 200
    after = await state(h, "up-known", uid)
    reward = round(BASE * 13 / 7, 2)
    assert reward == 157.86
    assert after["uptime"] > INTERVAL
    assert after["last_reward_uptime"] == after["uptime"]
    assert (after["kudos"], after["uptime_kudos"]) == (reward, reward)
    assert (after["owner_kudos"], after["owner_escrow"]) == (reward, 0)

    # Inside the 30 s window nothing accrues, and the next interval starts from the reward.
    assert (await h.pop(key, classic_body("up-known"))).status_code == 200
    await rewind(h, "up-known")
    assert (await h.pop(key, classic_body("up-known"))).status_code == 200
    again = await state(h, "up-known", uid)
    assert (again["kudos"], again["owner_kudos"]) == (reward, reward)

    worker_id = await h.db.fetchval("SELECT id::text FROM workers WHERE name = 'up-known'")
    details = (await h.client.get(f"/api/v2/workers/{worker_id}")).json()
    assert details["kudos_rewards"] == reward
    assert details["kudos_details"] == {"generated": 0, "uptime": reward}


@pytest.mark.parametrize(
    ("model", "bridge", "expected"),
    [
        (KNOWN_13B, UNVALIDATED, round(BASE * 0.3 * 13 / 7, 2)),
        (UNKNOWN, VALIDATED, BASE * 0.5),
        (UNKNOWN, UNVALIDATED, BASE * 0.5),
        (KNOWN_1B, VALIDATED, BASE * 0.25),
        (KNOWN_1B, UNVALIDATED, round(BASE * 0.3 * 0.25, 2)),
    ],
)
async def test_the_reward_follows_the_model_and_the_bridge(
    h: Harness, model: str, bridge: str, expected: float
) -> None:
    uid, key = await h.user(trusted=True)
    body = classic_body("up-rate", model, bridge)
    assert (await h.pop(key, body)).status_code == 200
    await rewind(h, "up-rate", uptime=INTERVAL)
    assert (await h.pop(key, body)).status_code == 200
    after = await state(h, "up-rate", uid)
    assert (after["uptime_kudos"], after["owner_kudos"]) == (expected, expected)


@pytest.mark.parametrize(
    ("columns", "seconds", "status"),
    [({"paused": True}, 45, 200), ({"maintenance": True}, 45, 403), ({}, 400, 200)],
    ids=["paused", "maintenance", "stale"],
)
async def test_paused_maintenance_and_stale_workers_earn_nothing(
    h: Harness, columns: dict[str, Any], seconds: int, status: int
) -> None:
    uid, key = await h.user(trusted=True)
    assert (await h.pop(key, classic_body("up-idle"))).status_code == 200
    await rewind(h, "up-idle", seconds, uptime=INTERVAL, **columns)
    r = await h.pop(key, classic_body("up-idle"))
    assert r.status_code == status
    if status == 403:
        assert r.json()["rc"] == "WorkerMaintenance"
    after = await state(h, "up-idle", uid)
    assert (after["uptime"], after["uptime_kudos"], after["owner_kudos"]) == (INTERVAL, 0, 0)
    # The count restarts: the worker has to stay up a whole interval again.
    assert after["last_reward_uptime"] == INTERVAL


async def test_an_untrusted_owners_reward_is_escrowed(h: Harness) -> None:
    uid, key = await h.user(trusted=False)
    assert (await h.pop(key, classic_body("up-untrusted"))).status_code == 200
    await rewind(h, "up-untrusted", uptime=INTERVAL)
    assert (await h.pop(key, classic_body("up-untrusted"))).status_code == 200
    after = await state(h, "up-untrusted", uid)
    reward = round(BASE * 13 / 7, 2)
    assert (after["kudos"], after["uptime_kudos"]) == (reward, reward)
    assert (after["owner_kudos"], after["owner_escrow"]) == (0, reward)
