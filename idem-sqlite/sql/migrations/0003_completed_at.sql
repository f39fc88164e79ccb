-- idem SQLite schema, version 3: when each completion landed, for operators (`inspect`,
-- listings). `completed_at` is in ms since the Unix epoch by the store's clock, set by the
-- completion and cleared by a new reservation; NULL in progress, and for a row completed before
-- version 3 (unknown). SQLite has no ADD COLUMN IF NOT EXISTS: the store runs this step only
-- when the column is missing.
ALTER TABLE idem_records ADD COLUMN completed_at INTEGER;
