-- idem PostgreSQL schema, version 2: when each reservation was made, for operators (`list`,
-- `stats`). `reserved_at` is the server's time (C11) to the millisecond, set by a fresh
-- reservation and by a takeover; 'epoch' for a row written before version 2 (its age is
-- unknown). A constant default: adding the column does not rewrite the table.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS reserved_at timestamptz NOT NULL DEFAULT 'epoch';
-- In-progress rows by age, in the listing's order (so a page reads its rows and stops): a
-- partial index, so it holds only the running reservations and the orphans, never the
-- completed rows.
CREATE INDEX IF NOT EXISTS idem_records_in_progress
    ON idem_records (reserved_at, consumer, route, key) WHERE state = 0;
