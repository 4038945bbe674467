-- no-transaction
-- One claim per (user, operation key) (spec: Operation key; Schema). CREATE INDEX CONCURRENTLY cannot
-- run inside a transaction block, so this file runs statement by statement in autocommit. A failed
-- build leaves an INVALID index that IF NOT EXISTS would then skip: horde_store.migrate drops such a
-- leftover (any index this file names) and runs the file again.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS ix_waiting_prompts_user_operation_key
    ON waiting_prompts (user_id, operation_key)
    WHERE operation_key IS NOT NULL;
