-- idem SQLite schema, version 2: when each reservation was made, for operators (`list`, `stats`).
-- `reserved_at` is in ms since the Unix epoch by the store's clock, set by a fresh reservation
-- and by a takeover; 0 for a row written before version 2 (its age is unknown).
-- Runs once per table (SQLite has no ADD COLUMN IF NOT EXISTS): the store applies it, in
-- order, only to a table `idem_schema_migrations` does not record at version 2. To create a
-- table by hand, apply sql/schema.sql (the current version) instead.
ALTER TABLE idem_records ADD COLUMN reserved_at INTEGER NOT NULL DEFAULT 0;
-- In-progress rows by age, in the listing's order (so a page reads its rows and stops): a
-- partial index, so it holds only the running reservations and the orphans, never the
-- completed rows.
CREATE INDEX IF NOT EXISTS idem_records_in_progress
    ON idem_records (reserved_at, consumer, route, key) WHERE state = 0;
