"""horde_admission: the admission service (README.md#architecture): chat and text request intake, status and cancel.

Modules: ``chat`` and ``text`` (route families), ``models`` (GET /v2/status/models and /v2/status/models/{name}),
``horde_status`` (heartbeat, performance, modes, news, stats/text/models and totals), ``body`` (the 413 bound),
``auth``, ``ratelimit``, ``checks`` (concurrency, worker lists, shared keys), ``availability`` (dispatch's
WorkerPool over gRPC, known models), ``sizing`` (context adjustments), ``kudos`` (quote and free output
allowance), ``images`` (load, normalise, store), ``creation`` (hold, tax, activation), ``store`` (the SQL),
``status`` and ``lifecycle`` (status and cancel), ``app`` (factory) and ``__main__`` (the process).
"""
