-- idem SQLite schema, version 1.
-- The store applies the migrations in order itself when it opens, and records each in
-- `idem_schema_migrations`; they are not for running by hand. To create the table by hand or
-- from your own migration tool, apply sql/schema.sql (`idem_sqlite::schema_sql(table)`), the
-- current version in one repeatable script.
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
