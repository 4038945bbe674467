"""horde_testing: real stores for tests and the local stack, and a launcher for e2e processes.

* :mod:`horde_testing.stores` — PostgreSQL / Redis / S3 as context managers (env URL → container →
  embedded); :mod:`horde_testing.embedded` — the embedded servers themselves.
* :mod:`horde_testing.pytest_plugin` — the fixtures (``database_url``, ``redis_url``, ``s3_endpoint``,
  ``horde_settings_env``, …), auto-registered.
* :mod:`horde_testing.local_stores` — ``horde-local-stores`` for ``make run``.
* :mod:`horde_testing.launcher` — ``ServiceProcess`` and ``free_port`` for e2e tests.
* :mod:`horde_testing.seed` — ``Factory`` and ``create_test_user``: seed users, workers, requests and
  generations by SQL; :mod:`horde_testing.signals` — ``Subscriber`` on a request's completion channel.
"""
