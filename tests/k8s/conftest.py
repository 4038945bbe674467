"""The k8s policy rules (deploy/k8s/k8s_policy) need only PyYAML and the standard library, so their tests run in
the workspace's test environment; rendering and the schemas stay with ``make k8s-check``."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

for path in (Path(__file__).resolve().parents[2] / "deploy" / "k8s", Path(__file__).resolve().parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from k8s_manifests import BASE, Objects, deploy  # noqa: E402


@pytest.fixture
def objects() -> Objects:
    """A fresh copy of the base objects to break."""
    return copy.deepcopy(BASE)


@pytest.fixture
def deployed(objects: Objects) -> Objects:
    """The base as an overlay deploys it (tagged images, the store Secret, the trusted proxies)."""
    return deploy(objects)
