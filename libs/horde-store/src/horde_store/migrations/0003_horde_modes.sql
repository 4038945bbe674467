-- The horde-wide modes an operator switches (docs/operator-guide.md#operator-controls): one row, read by
-- admission before it admits a request and by GET /v2/status/modes. Durable in PostgreSQL, not Redis, so a
-- cache flush never lifts maintenance mode.
CREATE TABLE horde_modes (
    id           smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    maintenance  boolean NOT NULL DEFAULT false,
    invite_only  boolean NOT NULL DEFAULT false,
    raid         boolean NOT NULL DEFAULT false,
    changed      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO horde_modes DEFAULT VALUES;
