-- Uptime kudos (docs/native-api.md#uptime-kudos; horde_dispatch.workers, the check-in upsert): the part of
-- workers.kudos a worker earned by staying online (its details' kudos_details.uptime), and when its last
-- uptime reward was paid (the check-in statement reads it back to credit the owner in the same statement).
ALTER TABLE workers
    ADD COLUMN uptime_kudos       double precision NOT NULL DEFAULT 0,
    ADD COLUMN last_uptime_reward timestamptz;
