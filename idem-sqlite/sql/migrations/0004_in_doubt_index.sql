-- idem SQLite schema, version 4, third step: the records in doubt in the listing's order
-- (reservation time, then consumer, route, key), so a page of them reads its rows and stops: a
-- partial index, so it holds only the records in doubt.
CREATE INDEX IF NOT EXISTS idem_records_in_doubt
    ON idem_records (reserved_at, consumer, route, key) WHERE doubt IS NOT NULL;
