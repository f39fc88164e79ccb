-- idem SQLite schema, version 2: when each reservation was made, for operators (`list`, `stats`).
-- `reserved_at` is in ms since the Unix epoch by the store's clock, set by a fresh reservation
-- and by a takeover; 0 for a row written before version 2 (its age is unknown).
-- SQLite has no ADD COLUMN IF NOT EXISTS: the store runs this step only when the column is
-- missing (a table rolled back to version 1 keeps it). Its index is the next step,
-- 0002_in_progress_index.sql. To create a table by hand, apply sql/schema.sql (the current
-- version) instead.
ALTER TABLE idem_records ADD COLUMN reserved_at INTEGER NOT NULL DEFAULT 0;
