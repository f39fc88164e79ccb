-- idem SQLite schema, version 2, second step.
-- In-progress rows by age, in the listing's order (so a page reads its rows and stops): a
-- partial index, so it holds only the running reservations and the orphans, never the
-- completed rows.
CREATE INDEX IF NOT EXISTS idem_records_in_progress
    ON idem_records (reserved_at, consumer, route, key) WHERE state = 0;
