"""``/docs`` and ``/redoc`` of every process render without the internet: the pages load Swagger UI and ReDoc
from the process itself (fastapi-offline's bundled assets under ``horde_core.app.DOCS_ASSETS_URL``), never
from a CDN, and the OpenAPI document they show is served beside them.

The pages are read as a browser would fetch them: every ``src``/``href`` and the document URL the page's
script is given must be a path on the same origin, and each must answer 200 with the asset's content. The
apps are built by each service's own ``create_app`` and asked in process (the docs need no store).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from horde_admission.app import create_app as admission_app
from horde_core.app import DOCS_ASSETS_URL
from horde_core.docs_policy import DOCS_CONTENT_SECURITY_POLICY
from horde_dispatch.app import create_app as dispatch_app
from horde_janitor.app import create_app as janitor_app
from horde_oai.app import create_app as front_app
from horde_submit.app import create_app as submit_app

APPS: dict[str, Callable[[], FastAPI]] = {
    "admission": admission_app,
    "dispatch": dispatch_app,
    "submit": submit_app,
    "oai-front": front_app,
}

#: Every URL a page loads: element attributes and the strings its inline script passes to the viewer.
_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
_SCRIPT_URL = re.compile(r"""(?:url|spec-url)\s*[:=]\s*["']([^"']+)["']""")
_ASSETS = {
    "/docs": ("swagger-ui-bundle.js", "swagger-ui.css"),
    "/redoc": ("redoc.standalone.js",),
}


def _loaded_urls(html: str) -> list[str]:
    return _ATTR.findall(html) + _SCRIPT_URL.findall(html)


@pytest.mark.parametrize("service", sorted(APPS))
@pytest.mark.parametrize("page", sorted(_ASSETS))
async def test_docs_pages_load_everything_from_the_process(
    service: str, page: str, horde_settings_env: dict[str, Any]
) -> None:
    app = APPS[service]()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://horde") as client:
        r = await client.get(page)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        # Same origin only (horde_core.docs_policy): the browser refuses ReDoc's CDN logo before asking.
        assert r.headers["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY
        urls = _loaded_urls(r.text)
        assert urls, r.text
        off_origin = [u for u in urls if not u.startswith("/")]
        assert off_origin == [], f"{service}{page} loads {off_origin}"
        for asset in _ASSETS[page]:
            assert f"{DOCS_ASSETS_URL}/{asset}" in urls
        for url in urls:
            loaded = await client.get(url)
            assert loaded.status_code == 200, url
            assert len(loaded.content) > 100, url
        document = await client.get(app.openapi_url or "")
        assert document.status_code == 200
        assert "content-security-policy" not in document.headers  # the pages only
        assert document.json()["paths"], f"{service} publishes no operations"


async def test_the_janitor_has_no_api_pages(horde_settings_env: dict[str, Any]) -> None:
    """The janitor serves health, readiness and metrics only: no document, no viewers."""
    app = janitor_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://horde") as client:
        for path in ("/docs", "/redoc", "/openapi.json", f"{DOCS_ASSETS_URL}/swagger-ui.css"):
            assert (await client.get(path)).status_code == 404, path


@pytest.mark.parametrize("service", sorted(APPS))
async def test_every_docs_html_page_has_the_policy(service: str, horde_settings_env: dict[str, Any]) -> None:
    """Every HTML page FastAPI serves under /docs and /redoc (Swagger UI's OAuth2 redirect page included) has
    the policy, which forbids framing and off-origin form posts; the assets under them are not pages."""
    assert "frame-ancestors 'none'" in DOCS_CONTENT_SECURITY_POLICY.split("; ")
    assert "form-action 'self'" in DOCS_CONTENT_SECURITY_POLICY.split("; ")
    app = APPS[service]()
    html_pages = [
        path
        for route in app.routes
        if (path := str(getattr(route, "path", ""))).startswith(("/docs", "/redoc"))
        and hasattr(route, "methods")
    ]
    assert {"/docs", "/docs/oauth2-redirect", "/redoc"} <= set(html_pages), html_pages
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://horde") as client:
        for page in html_pages:
            r = await client.get(page)
            assert r.status_code == 200, page
            assert r.headers["content-type"].startswith("text/html"), page
            assert r.headers["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY, page
        asset = await client.get(f"{DOCS_ASSETS_URL}/swagger-ui.css")
        assert asset.status_code == 200
        assert "content-security-policy" not in asset.headers
