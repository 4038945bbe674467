"""horde_store: the PostgreSQL schema and its one migration history (:mod:`horde_store.migrate`), the
asyncpg pool (:mod:`horde_store.db`), users and keys (:mod:`horde_store.users`), object storage
(:mod:`horde_store.objects`), the text model reference loader (:mod:`horde_store.model_reference`) and the
``horde-admin`` CLI (:mod:`horde_store.admin`)."""
