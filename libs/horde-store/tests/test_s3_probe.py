"""The ``s3`` store probe of /readyz (horde_store.stores.s3_probe): up while the object store answers."""

from __future__ import annotations

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from horde_store.objects import S3Settings, make_s3_client
from horde_store.stores import s3_probe
from horde_testing._proc import free_port
from horde_testing.stores import S3Endpoint


async def test_the_probe_answers_while_the_store_does(s3_endpoint: S3Endpoint) -> None:
    client = make_s3_client(S3Settings.from_env(s3_endpoint.env()))
    assert await s3_probe(client, s3_endpoint.image_bucket)() is None
    # A missing bucket is an answer of the store, but not one the service can work with: down.
    with pytest.raises(ClientError):
        await s3_probe(client, "horde-no-such-bucket")()


async def test_an_unreachable_store_is_down(s3_endpoint: S3Endpoint) -> None:
    settings = S3Settings.from_env(
        {**s3_endpoint.env(), "HORDE_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    )
    client = make_s3_client(settings, connect_timeout=0.5, read_timeout=0.5, max_attempts=1)
    with pytest.raises(BotoCoreError):
        await s3_probe(client, s3_endpoint.image_bucket)()
