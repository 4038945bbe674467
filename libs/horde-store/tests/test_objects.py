"""Object storage against a real S3 API server."""

from __future__ import annotations

import secrets

import httpx
from horde_store.objects import S3Settings, chat_image_key, chat_messages_key, ensure_buckets, make_s3_client
from horde_testing.stores import S3Endpoint


def test_client_buckets_objects_and_presigned_urls(s3_endpoint: S3Endpoint) -> None:
    settings = S3Settings.from_env(s3_endpoint.env())
    assert settings.buckets == (s3_endpoint.image_bucket,)
    client = make_s3_client(settings)
    assert client.meta.config.s3["addressing_style"] == "path"

    extra = f"horde-test-{secrets.token_hex(4)}"
    assert ensure_buckets(client, [s3_endpoint.image_bucket, extra]) == [extra]
    assert ensure_buckets(client, [extra]) == []  # idempotent

    key = chat_image_key("abc", 0)
    assert key == "abc_chat_0.jpg" and chat_messages_key("abc") == "abc_chat_messages.json"
    client.put_object(Bucket=s3_endpoint.image_bucket, Key=key, Body=b"jpeg-bytes", ContentType="image/jpeg")
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": s3_endpoint.image_bucket, "Key": key}, ExpiresIn=600
    )
    assert url.startswith(f"{s3_endpoint.endpoint_url}/{s3_endpoint.image_bucket}/")  # path style
    assert httpx.get(url, trust_env=False).content == b"jpeg-bytes"
    client.delete_object(Bucket=s3_endpoint.image_bucket, Key=key)


def test_settings_from_a_settings_object() -> None:
    class Settings:
        s3_endpoint_url = "http://127.0.0.1:1"
        s3_access_key_id = "a"
        s3_secret_access_key = "b"
        s3_region = "eu-west-1"
        s3_image_bucket = "img"
        s3_messages_bucket = "msgs"

    s = S3Settings.from_settings(Settings())
    assert s.buckets == ("img", "msgs") and s.region == "eu-west-1"
    client = make_s3_client(Settings())
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.endpoint_url == "http://127.0.0.1:1"
