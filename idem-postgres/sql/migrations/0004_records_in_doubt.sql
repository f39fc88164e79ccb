-- idem PostgreSQL schema, version 4: records in doubt (docs/state-machine.md, "Records in
-- doubt"; store rules 6 and 7).
-- `doubt` is the mark of an answer whose outcome is unknown (C8),
-- `idem_core::reconcile::Doubt::encode`'s bytes, beside the stored answer; NULL for an answer
-- that is the execution's own. `doubt_check_at` is when the record is next due for a check, the
-- server's time (C11) to the millisecond like reserved_at and completed_at; NULL without a mark.
-- Both are written by the completion, cleared by a new reservation, and changed only by a
-- decision fenced on the mark as read (resolve_*.sql). Nullable without a default: adding them
-- changes the catalog only and rewrites nothing. The index the in-doubt listing reads is built
-- afterwards, without blocking writes: index_in_doubt.sql.
ALTER TABLE idem_records
    ADD COLUMN IF NOT EXISTS doubt bytea,
    ADD COLUMN IF NOT EXISTS doubt_check_at timestamptz;
-- The audit trail of records in doubt, `<table>_reconciliations`: one row per decision applied
-- (`idem_core::reconcile::Reconciliation::encode`'s bytes in `entry`), written by the statement
-- that makes the change it records. Kept by (consumer, route, key), not by the record: a
-- released record's trail stays. `at` is when the decision was applied (the server's time, to
-- the millisecond) and `kept_until` when the purge may delete the row; `id` orders a record's
-- entries. A new table, empty: its indexes are built here, in the migration's transaction.
CREATE TABLE IF NOT EXISTS idem_records_reconciliations (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    route       text        NOT NULL,
    key         text        NOT NULL,
    at          timestamptz NOT NULL,
    entry       bytea       NOT NULL,
    kept_until  timestamptz NOT NULL
);
-- A record's trail, newest first from the end, read and stopped at a bounded number of rows.
CREATE INDEX IF NOT EXISTS idem_records_trail_record
    ON idem_records_reconciliations (consumer, route, key, id);
-- The purge finds the expired entries through this index, a bounded batch at a time.
CREATE INDEX IF NOT EXISTS idem_records_trail_kept
    ON idem_records_reconciliations (kept_until);
