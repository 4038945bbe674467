"""Package boundaries, read from the source (ast) of every workspace package under ``*/src``:

* no service package imports another service package (services talk over HTTP and gRPC only);
* the OpenAI front (horde_oai) never imports horde_store: it reaches the data only through the native API;
* horde_contract imports no workspace package and no I/O library (it is pure rules);
* the libraries (horde_contract, horde_core, horde_store, horde_testing) import no service package.

A violation names the file, the line and the import.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVICES = frozenset(
    {"horde_admission", "horde_dispatch", "horde_submit", "horde_janitor", "horde_oai", "horde_worker"}
)
LIBRARIES = frozenset({"horde_contract", "horde_core", "horde_store", "horde_testing"})
# The generated gRPC package (proto/src/horde) counts as a workspace package: it pulls in grpc.
WORKSPACE = SERVICES | LIBRARIES | {"horde"}
IO_LIBRARIES = frozenset(
    {
        "redis", "valkey", "asyncpg", "psycopg", "psycopg2", "sqlalchemy", "boto3", "botocore", "aioboto3",
        "fastapi", "starlette", "uvicorn", "flask", "httpx", "requests", "aiohttp", "urllib3", "grpc",
        "socket", "ssl", "http", "urllib", "subprocess", "asyncio", "selectors",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Import:
    package: str  # the importing workspace package
    path: Path
    line: int
    module: str  # the imported module, dotted

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.package} imports {self.module}"


def packages(root: Path) -> dict[str, Path]:
    """Every workspace package directory (``<member>/src/<pkg>``, ``<group>/<member>/src/<pkg>``) by name."""
    found: dict[str, Path] = {}
    for pattern in ("*/src/*/__init__.py", "*/*/src/*/__init__.py"):
        for init in root.glob(pattern):
            if ".venv" not in init.parts:
                found[init.parent.name] = init.parent
    return found


def imports(package: str, directory: Path) -> Iterator[Import]:
    """The absolute imports of every module of a package (relative ones stay inside it)."""
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(package, path, node.lineno, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield Import(package, path, node.lineno, node.module)


def violations(root: Path) -> list[str]:
    """Every import that breaks one of the module docstring's rules, as ``path:line: <pkg> imports <mod> (rule)``."""
    found: list[str] = []
    for package, directory in sorted(packages(root).items()):
        for imp in imports(package, directory):
            if imp.top == package:
                continue
            if package in SERVICES and imp.top in SERVICES:
                found.append(f"{imp} (a service imports another service)")
            if package == "horde_oai" and imp.top == "horde_store":
                found.append(f"{imp} (the front imports the store)")
            if package == "horde_contract" and imp.top in WORKSPACE:
                found.append(f"{imp} (horde_contract imports a workspace package)")
            if package == "horde_contract" and imp.top in IO_LIBRARIES:
                found.append(f"{imp} (horde_contract imports an I/O library)")
            if package in LIBRARIES and imp.top in SERVICES:
                found.append(f"{imp} (a library imports a service)")
    return found


def test_the_workspace_keeps_its_boundaries() -> None:
    found = packages(ROOT)
    assert SERVICES | LIBRARIES <= set(found), sorted(SERVICES | LIBRARIES - set(found))
    assert violations(ROOT) == []


def _write(root: Path, member: str, package: str, source: str) -> None:
    directory = root / member / "src" / package
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "__init__.py").touch()
    (directory / "mod.py").write_text(textwrap.dedent(source))


def test_a_planted_violation_of_each_rule_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "services/submit", "horde_submit", "from horde_submit import mod\nimport horde_core\n")
    assert violations(tmp_path) == []

    _write(tmp_path, "services/dispatch", "horde_dispatch", "from horde_admission.app import build\n")
    _write(tmp_path, "services/oai-front", "horde_oai", "import horde_store.db as db\n")
    _write(
        tmp_path,
        "libs/horde-contract",
        "horde_contract",
        """
        import json
        from horde_core import logging


        def f():
            import httpx
        """,
    )
    _write(tmp_path, "libs/horde-core", "horde_core", "if False:\n    from horde_worker import loop\n")
    _write(tmp_path, "worker", "horde_worker", "import horde_janitor\n")
    found = violations(tmp_path)
    assert [line.split(": ", 1)[1] for line in found] == [
        "horde_contract imports horde_core (horde_contract imports a workspace package)",
        "horde_contract imports httpx (horde_contract imports an I/O library)",
        "horde_core imports horde_worker (a library imports a service)",
        "horde_dispatch imports horde_admission.app (a service imports another service)",
        "horde_oai imports horde_store.db (the front imports the store)",
        "horde_worker imports horde_janitor (a service imports another service)",
    ]
    assert found[0].startswith(str(tmp_path / "libs/horde-contract/src/horde_contract/mod.py") + ":3:")
