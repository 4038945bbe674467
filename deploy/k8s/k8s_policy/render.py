"""Rendering a kustomization: with the kustomize library (pykustomize), and again with ``kubectl kustomize``
when asked, requiring the same objects."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .model import Target


def render(path: Path) -> str:
    """Build the kustomization at ``path`` with the kustomize library (default load restrictions)."""
    import pykustomize  # only here: the rules and their tests need no kustomize

    return str(asyncio.run(pykustomize.build(path)).yaml)


def load_objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def canonical(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(o, sort_keys=True) for o in objects)


def kubectl_crosscheck(target: Target, mode: str) -> str:
    """Render with ``kubectl kustomize`` too and compare; return a note for the summary line."""
    kubectl = shutil.which("kubectl")
    if mode == "never" or (kubectl is None and mode == "auto"):
        return ""
    if kubectl is None:
        target.error("kubectl", "--kubectl-crosscheck=always but kubectl is not on PATH")
        return ""
    proc = subprocess.run(
        [kubectl, "kustomize", str(target.path)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        target.error("kubectl kustomize", proc.stderr.strip() or f"exit status {proc.returncode}")
        return ""
    theirs = canonical(load_objects(proc.stdout))
    ours = canonical(target.objects)
    if theirs != ours:
        only_ours = sorted(set(ours) - set(theirs))
        only_theirs = sorted(set(theirs) - set(ours))
        target.error(
            "kubectl kustomize",
            f"renders differently ({len(only_ours)} objects only in pykustomize's render, "
            f"{len(only_theirs)} only in kubectl's); first difference:\n    ours:   "
            f"{(only_ours or ['-'])[0][:400]}\n    theirs: {(only_theirs or ['-'])[0][:400]}",
        )
        return ""
    return ", same as kubectl kustomize"
