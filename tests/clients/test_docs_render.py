"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) render in a real browser with no network beyond the machine.

Headless Chromium (Debian's package, driven by playwright-core from tests/clients/js: ``render-docs.mjs``) loads
each service's pages with every request to a host other than 127.0.0.1/localhost blocked and recorded: the
front's through the one horde URL (the proxy routes ``/docs``, ``/docs/assets``, ``/redoc`` and
``/openapi.json`` to it), admission's, dispatch's and submit's on their own replica ports (behind the one URL
those paths are the front's). A page passes when no off-machine request reached the network, no local request failed,
no script error was raised, and the rendered DOM lists exactly the operations of the service's OpenAPI document
(method and path, and each operation id). ReDoc's bundle asks for its side menu's logo on cdn.redoc.ly; the
pages' Content-Security-Policy (horde_core.docs_policy) makes the browser refuse it before any request, which is
asserted too. Screenshots are saved in pytest's tmp dir (the path is printed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from horde_core.docs_policy import DOCS_CONTENT_SECURITY_POLICY

from .conftest import Horde

JS = Path(__file__).resolve().parent / "js"
#: The only request a viewer's bundle makes off the machine: ReDoc's "API docs by Redocly" logo, which the pages'
#: Content-Security-Policy refuses (img-src) before it is sent.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
#: The four services with an API (the janitor serves no docs: tests/test_offline_docs.py), and the two viewers.
SERVICES = ("oai-front", "admission", "dispatch", "submit")
VIEWERS = {"docs": "swagger", "redoc": "redoc"}
#: The operation the front's Swagger UI executes ("Try it out"; no key, no parameters).
TRY_IT_OUT = "list_models_v1_models_get"
METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")


def origin(horde: Horde, service: str) -> str:
    """Where the service's pages are: the one horde URL for the front, else its (first) replica's own port."""
    return str(horde.url if service == "oai-front" else horde.stack.urls.replicas[service][0])


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs-screenshots")


@pytest.fixture(scope="module")
def rendered(horde: Horde, screenshots: Path) -> dict[str, Any]:
    """Every page rendered once (one browser): ``{"pages": {name: result}, "probe": {...}}``."""
    node = shutil.which("node")
    assert node, "node is not on PATH (tests/clients/js/setup.sh)"
    assert (JS / "node_modules" / "playwright-core").is_dir(), "run tests/clients/js/setup.sh"
    assert Path("/usr/bin/chromium").exists(), "no /usr/bin/chromium (tests/clients/js/setup.sh installs it)"
    pages = [
        {"name": f"{service}-{path}", "url": f"{origin(horde, service)}/{path}", "viewer": viewer}
        for service in SERVICES
        for path, viewer in VIEWERS.items()
    ]
    # Swagger UI's "Try it out" still works under the pages' policy: the front's GET /v1/models, executed.
    front_swagger = next(p for p in pages if p["name"] == "oai-front-docs")
    front_swagger["tryItOut"] = TRY_IT_OUT
    spec = json.dumps({"outDir": str(screenshots), "pages": pages})
    run = subprocess.run(
        [node, "render-docs.mjs", spec], cwd=JS, capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, f"render-docs.mjs failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"docs screenshots: {screenshots}")
    return {"pages": {page["name"]: page for page in result["pages"]}, "probe": result["probe"]}


def document_operations(url: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """The OpenAPI document at ``url``, its operations as ``"METHOD /path"`` and their operation ids."""
    document = httpx.get(url, timeout=30, trust_env=False).raise_for_status().json()
    operations, ids = [], []
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                operations.append(f"{method.upper()} {path}")
                ids.append(item[method]["operationId"])
    return document, operations, ids


def listed(viewer: str, menu: list[str], operation_id: str) -> bool:
    """Whether the viewer's operation entries name ``operation_id``: Swagger UI's block ids are
    ``operations-<tag>-<operationId>``, ReDoc's menu items ``operation/<operationId>`` (or ``tag/<tag>/operation/…``)."""
    if viewer == "swagger":
        return any(m.startswith("operations-") and m.endswith(f"-{operation_id}") for m in menu)
    return any(m == f"operation/{operation_id}" or m.endswith(f"/operation/{operation_id}") for m in menu)


def test_the_recorder_blocks_and_records_off_machine_requests(rendered: dict[str, Any]) -> None:
    """The check behind "no off-machine request": a page's fetch of a CDN URL is blocked, and recorded."""
    probe = rendered["probe"]
    assert probe["outcome"].startswith("failed"), probe
    assert probe["recorded"] is not None and probe["recorded"]["intercepted"] is True, probe


@pytest.mark.parametrize("path", sorted(VIEWERS))
@pytest.mark.parametrize("service", SERVICES)
def test_docs_page_renders_every_operation_offline(
    rendered: dict[str, Any], horde: Horde, service: str, path: str
) -> None:
    page = rendered["pages"][f"{service}-{path}"]
    viewer = VIEWERS[path]
    # Served by the process, same origin only.
    assert page["status"] == 200, page
    assert page["headers"]["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY
    # Nothing left the machine: no off-machine request reached the network (the route would have aborted it);
    # the only one a viewer asks for, ReDoc's logo, the page's policy refused first. Nothing local failed; no
    # script error.
    reached = [o for o in page["offsite"] if o["intercepted"] or o["error"] != "csp"]
    assert reached == [], f"{page['url']} attempted off-machine requests: {reached}"
    refused_by_policy = (
        [{"url": REDOC_LOGO, "intercepted": False, "error": "csp"}] if viewer == "redoc" else []
    )
    assert page["offsite"] == refused_by_policy, page["offsite"]
    assert page["failed"] == [], page["failed"]
    assert page["pageErrors"] == [], page["pageErrors"]
    expected_refused = [{"directive": "img-src", "url": REDOC_LOGO}] if viewer == "redoc" else []
    assert page["refused"] == expected_refused, page["refused"]
    unexplained = [
        e for e in page["consoleErrors"] if not (REDOC_LOGO in e and "Content Security Policy" in e)
    ]
    assert unexplained == [], page["consoleErrors"]
    # The rendered DOM lists exactly the document's operations.
    document, operations, ids = document_operations(f"{origin(horde, service)}/openapi.json")
    assert document["info"]["title"] in page["title"], (page["title"], document["info"]["title"])
    assert sorted(page["operations"]) == sorted(operations), page["operations"]
    for operation_id in ids:
        assert listed(viewer, page["menu"], operation_id), (operation_id, page["menu"])
    assert len(page["menu"]) == len(ids), page["menu"]
    if service == "oai-front":
        assert "POST /v1/chat/completions" in page["operations"]
        assert "GET /v1/models" in page["operations"]
        if viewer == "swagger":
            # "Try it out" ran the page's own same-origin request and shows the answer: the worker's model.
            assert page["tryItOut"]["status"] == "200", page["tryItOut"]
            listed_ids = [card["id"] for card in json.loads(page["tryItOut"]["body"])["data"]]
            assert horde.model in listed_ids, page["tryItOut"]
    if service == "admission":
        assert "POST /api/v2/generate/chat/async" in page["operations"]
    if service == "dispatch":
        assert "POST /api/v2/generate/text/pop" in page["operations"]
    if service == "submit":
        assert "POST /api/v2/generate/text/submit" in page["operations"]
    assert Path(page["screenshot"]).stat().st_size > 10_000, page["screenshot"]
