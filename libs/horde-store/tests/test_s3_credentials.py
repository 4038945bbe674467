"""S3 credentials (horde_store.objects.make_s3_client): boto3's provider chain unless ``HORDE_S3_*`` keys are
set, which then win (docs/operator-guide.md, HORDE_S3_ACCESS_KEY_ID)."""

from __future__ import annotations

import pytest
from horde_core.settings import HordeSettings
from horde_store.objects import make_s3_client

CHAIN_KEY, CHAIN_SECRET = "AKIACHAINEXAMPLE", "chain-secret"


@pytest.fixture
def chain_env(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """Only the environment's AWS keys in the chain: no HORDE_S3_* keys, no profile files, no role."""
    import os

    for name in list(os.environ):
        if name.startswith(("HORDE_S3_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CHAIN_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CHAIN_SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/no-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/no-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_unset_keys_use_the_provider_chain(chain_env: None) -> None:
    settings = HordeSettings()
    assert settings.s3_access_key_id is None and settings.s3_secret_access_key is None
    credentials = make_s3_client(settings)._get_credentials()
    assert credentials.method == "env"  # botocore's EnvProvider
    assert (credentials.access_key, credentials.secret_key) == (CHAIN_KEY, CHAIN_SECRET)


def test_empty_keys_are_unset(chain_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Secret that keeps the keys but leaves them empty (IRSA, an instance role) also means the chain."""
    monkeypatch.setenv("HORDE_S3_ACCESS_KEY_ID", "")
    monkeypatch.setenv("HORDE_S3_SECRET_ACCESS_KEY", "")
    settings = HordeSettings()
    assert settings.s3_access_key_id is None
    assert make_s3_client(settings)._get_credentials().method == "env"


def test_horde_keys_win_over_the_chain(chain_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORDE_S3_ACCESS_KEY_ID", "horde-key")
    monkeypatch.setenv("HORDE_S3_SECRET_ACCESS_KEY", "horde-secret-value")
    credentials = make_s3_client(HordeSettings())._get_credentials()
    assert credentials.method == "explicit"
    assert (credentials.access_key, credentials.secret_key) == ("horde-key", "horde-secret-value")


def test_no_credentials_anywhere_is_none(chain_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No dev default is slipped in: without keys and without a chain there are no credentials."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert make_s3_client(HordeSettings())._get_credentials() is None
