"""horde_contract is pure: it imports no store client, web framework, network library or other workspace
member (README.md#architecture)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import horde_contract

PACKAGE = Path(horde_contract.__file__).parent
ALLOWED_THIRD_PARTY = {"pydantic", "jsonschema", "jsonschema_specifications", "referencing", "re2"}
FORBIDDEN = {
    "redis", "asyncpg", "psycopg", "psycopg2", "sqlalchemy", "boto3", "botocore", "fastapi", "starlette",
    "flask", "httpx", "requests", "aiohttp", "urllib3", "grpc", "socket", "horde", "horde_core", "horde_store",
    "horde_testing", "horde_admission", "horde_dispatch", "horde_submit", "horde_janitor", "horde_oai",
    "horde_worker",
}  # fmt: skip


def _imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[path.name] = names
    return found


def test_source_imports_only_stdlib_and_allowed() -> None:
    allowed = set(sys.stdlib_module_names) | ALLOWED_THIRD_PARTY | {"__future__"}
    for module, names in _imports().items():
        assert names <= allowed, (module, names - allowed)
        assert not names & FORBIDDEN, (module, names & FORBIDDEN)


def test_import_loads_no_forbidden_module() -> None:
    code = (
        "import sys, json, horde_contract\n"
        "horde_contract.parse_chat_request({'model': 'm', 'messages': [{'role': 'user', 'content': 'x'}]})\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert not loaded & (FORBIDDEN - {"socket"}), loaded & FORBIDDEN
