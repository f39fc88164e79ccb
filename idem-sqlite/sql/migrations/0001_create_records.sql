-- idem SQLite schema, version 1.
-- The store applies this itself; to run it by hand, replace `idem_records` with your table name.
-- One row per (consumer, route, key) (C2). `state` 0 = in progress, 1 = completed.
-- `deadline` is lease_until (in progress) or expires_at (completed), in ms since the Unix epoch;
-- a row with deadline <= now behaves as absent (C9, C10).
CREATE TABLE IF NOT EXISTS idem_records (
    consumer    TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       BLOB    NOT NULL,
    state       INTEGER NOT NULL,
    deadline    INTEGER NOT NULL,
    response    BLOB,
    UNIQUE (consumer, route, key)
);
CREATE INDEX IF NOT EXISTS idem_records_deadline ON idem_records (deadline);
