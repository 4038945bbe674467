"""``horde_store_up{store}``: set by /readyz's store checks, and by its probes, which never fail readiness."""

from __future__ import annotations

import httpx
from horde_core.app import add_store_readiness, create_app
from prometheus_client import REGISTRY


def up(store: str) -> float | None:
    return REGISTRY.get_sample_value("horde_store_up", {"store": store})


async def test_readyz_sets_store_up_from_its_checks_and_probes() -> None:
    app = create_app("store-up-test")
    answers = {"postgres": True, "redis": True, "s3": True}

    class Pool:
        async def fetchval(self, _: str) -> int:
            if not answers["postgres"]:
                raise ConnectionError("refused")
            return 1

    def ping(store: str):  # type: ignore[no-untyped-def]
        async def check() -> object:
            if not answers[store]:
                raise TimeoutError(f"{store} does not answer")
            return True

        return check

    add_store_readiness(app, pool=Pool(), redis_ping=ping("redis"), s3_ping=ping("s3"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/readyz")
        assert r.status_code == 200
        assert r.json()["checks"] == {"database": "ok", "redis": "ok"}  # the S3 probe is no check
        assert (up("postgres"), up("redis"), up("s3")) == (1, 1, 1)

        answers["s3"] = False  # the object store down: still ready, store_up 0
        r = await c.get("/readyz")
        assert r.status_code == 200
        assert (up("postgres"), up("redis"), up("s3")) == (1, 1, 0)

        answers["redis"] = False
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert (up("postgres"), up("redis"), up("s3")) == (1, 0, 0)

        answers.update(redis=True, s3=True, postgres=False)
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert (up("postgres"), up("redis"), up("s3")) == (0, 1, 1)
