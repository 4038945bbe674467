"""``horde-worker``: run the reference worker (flags and ``HORDE_WORKER_*`` env; ``horde-worker --help``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from horde_worker.backends.base import Backend
from horde_worker.config import WorkerSettings, load_settings
from horde_worker.worker import Worker


def make_backend(settings: WorkerSettings) -> Backend:
    """The backend the settings name: ``scripted``, ``openai`` or ``llamacpp``."""
    if settings.backend == "openai":
        from horde_worker.backends.openai import OpenAIBackend

        return OpenAIBackend(
            settings.backend_url,
            flavor=settings.openai_flavor,
            model=settings.backend_model,
            api_key=settings.backend_api_key,
        )
    if settings.backend == "llamacpp":
        from horde_worker.backends.llamacpp import LlamaCppBackend

        if settings.threads > 1:
            logging.getLogger("horde_worker").warning(
                "the llamacpp backend runs one job at a time: with threads > 1, popped jobs wait for the model"
            )

        return LlamaCppBackend(
            model_path=settings.model_path,
            n_ctx=settings.max_context_length,
            n_threads=settings.llama_threads,
            seed=settings.seed,
        )
    from horde_worker.backends.scripted import ScriptedBackend

    return ScriptedBackend(model_name="scripted")


async def _run(settings: WorkerSettings) -> None:
    worker = Worker(settings, make_backend(settings))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop)
    await worker.run()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``horde-worker`` console script; returns the exit status."""
    settings = load_settings(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        asyncio.run(_run(settings))
    except Exception as exc:
        logging.getLogger("horde_worker").error("worker failed: %r", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
