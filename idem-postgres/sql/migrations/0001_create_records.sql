-- idem PostgreSQL schema, version 1.
-- The store applies this itself (PgStore::migrate); to run it by hand or from your own
-- migration tool, take it from idem_postgres::schema_sql(schema, table), which puts your schema
-- and table in place of idem_records.
-- One row per (consumer, route, key) (C2): separate columns, the primary key decides the race of
-- fresh reservations (C4). `state` 0 = in progress, 1 = completed. `deadline` is lease_until (in
-- progress) or expires_at (completed), in the server's time (C11); a row with
-- deadline <= clock_timestamp() behaves as absent (C9, C10).
CREATE TABLE IF NOT EXISTS idem_records (
    consumer    text        NOT NULL,
    route       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    token       bytea       NOT NULL,
    state       smallint    NOT NULL CHECK (state IN (0, 1)),
    deadline    timestamptz NOT NULL,
    response    bytea,
    PRIMARY KEY (consumer, route, key)
);
-- Purge finds expired rows through this index, a bounded batch at a time (C10).
CREATE INDEX IF NOT EXISTS idem_records_deadline ON idem_records (deadline);
