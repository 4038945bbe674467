"""Secrets: each workload reads exactly the Secret keys it uses, one key at a time; the proxy passkeys come
from the Secret only, and the front's passkey is one admission accepts."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from .contract import OPTIONAL_SECRET_KEYS, PASSKEY_SETTINGS, SECRET_KEYS, STORE_SECRET, STORE_SECRET_KEYS
from .model import Target, Workload, env_sources, ident, name_of, workloads


def _secret_keys_read(target: Target, where: str, env: dict[str, tuple[str, Any]]) -> set[str]:
    """The Secret keys a workload's env reads, one key at a time, each into a setting of its own name."""
    keys = set()
    for name, (kind, value) in env.items():
        if kind != "secret":
            continue
        if value[1] == "*":
            target.error(where, f"envFrom Secret {value[0]} gives it every key; reference the keys it uses")
            continue
        keys.add(value[1])
        if name != value[1]:
            target.error(where, f"env {name} reads Secret key {value[1]} (name them alike)")
    return keys


def _check_workload_secrets(target: Target, w: Workload) -> None:
    where = f"{w.obj.get('kind')}/{w.name}"
    env = env_sources(target, w)
    keys = _secret_keys_read(target, where, env)
    allowed = SECRET_KEYS.get(w.name)
    if allowed is None:
        if keys:
            target.error(where, f"reads Secret keys {sorted(keys)} but SECRET_KEYS does not list it")
        return
    for extra in sorted(keys - allowed):
        target.error(where, f"reads Secret key {extra}, which it does not use")
    for missing in sorted(allowed - keys - OPTIONAL_SECRET_KEYS):
        target.error(where, f"does not get Secret key {missing}, which it needs")
    setting = PASSKEY_SETTINGS.get(w.name)
    if setting is not None and env.get(setting, ("",))[0] != "secret":
        target.error(where, f"{setting} must come from a Secret (secretKeyRef)")


def _check_front_passkey(target: Target, obj: dict[str, Any]) -> None:
    """A rendered store Secret (dev): the front's passkey must be one admission accepts."""
    data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    front, accepted = data.get("HORDE_OAI_PROXY_PASSKEY"), data.get("HORDE_PROXY_PASSKEYS")
    if front is None or accepted is None:
        return
    try:
        keys_list = json.loads(accepted)
    except ValueError:
        keys_list = None
    if not isinstance(keys_list, list):
        target.error(ident(obj), "HORDE_PROXY_PASSKEYS must be a JSON list of passkeys")
    elif front not in keys_list:
        target.error(ident(obj), "HORDE_OAI_PROXY_PASSKEY is not in HORDE_PROXY_PASSKEYS")


def check_secret_keys(target: Target) -> None:
    """Each workload reads exactly the Secret keys it uses (SECRET_KEYS), one key at a time; the proxy passkeys
    come from the Secret and from nowhere else, and the front's passkey is one admission accepts."""
    for w in workloads(target, {"Deployment", "Job"}):
        _check_workload_secrets(target, w)
    for obj in target.objects:
        if obj.get("kind") == "ConfigMap":
            for k in set(obj.get("data") or {}) & (set(PASSKEY_SETTINGS.values()) | set(STORE_SECRET_KEYS)):
                target.error(ident(obj), f"holds {k}, a secret: keep it in the Secret")
    for obj in target.objects:
        if obj.get("kind") == "Secret" and re.fullmatch(rf"{STORE_SECRET}(-[a-z0-9]{{10}})?", name_of(obj)):
            _check_front_passkey(target, obj)
