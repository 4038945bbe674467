"""horde_worker: the reference Horde Chat worker (pop → backend → submit)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("horde-worker")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0.0.0"
