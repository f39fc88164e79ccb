-- idem SQLite schema, version 4, fourth step: the audit trail of records in doubt, one row per
-- decision applied (`idem_core::reconcile::Reconciliation`), written in the transaction of the
-- change it records. Kept by (consumer, route, key), not by the record: a released record's trail
-- stays. `at` is when the decision was applied and `kept_until` when the purge may delete the
-- row, in ms since the Unix epoch by the store's clock; `entry` is
-- `idem_core::reconcile::Reconciliation::encode`'s bytes. `id` orders a record's entries.
CREATE TABLE IF NOT EXISTS idem_records_reconciliations (
    id          INTEGER PRIMARY KEY,
    consumer    TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    entry       BLOB    NOT NULL,
    kept_until  INTEGER NOT NULL
);
-- A record's trail, newest first from the end, read and stopped at a bounded number of rows.
CREATE INDEX IF NOT EXISTS idem_records_reconciliations_record
    ON idem_records_reconciliations (consumer, route, key, id);
-- The purge finds the expired entries through this index, a bounded batch at a time.
CREATE INDEX IF NOT EXISTS idem_records_reconciliations_kept
    ON idem_records_reconciliations (kept_until);
