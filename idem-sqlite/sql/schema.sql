-- idem SQLite schema, current version (4), for applying by hand or from your own migration tool:
-- `idem_sqlite::schema_sql(table)` (or `idem migrate --print`) gives it with your table name in
-- place of `idem_records`. Every statement is IF NOT EXISTS / OR IGNORE, so it can be applied
-- again, and it records its version in `idem_schema_migrations`: the store opens a database
-- created from it as up to date and re-runs nothing. It creates a new table at the current
-- version; it does not upgrade an older table (opening the store does that, through
-- sql/migrations/). It must describe the same table as the migrations applied in order
-- (tests/schema.rs checks it): change both together, and add a row below for a new version.
--
-- One row per (consumer, route, key) (C2). `state` 0 = in progress, 1 = completed.
-- `deadline` is lease_until (in progress) or expires_at (completed), in ms since the Unix epoch;
-- a row with deadline <= now behaves as absent (C9, C10). `reserved_at` is when the reservation
-- was made (a fresh one or a takeover), in ms since the Unix epoch by the store's clock; 0 for a
-- row written before version 2 (its age is unknown). `completed_at` is when the completion landed
-- (NULL in progress, or completed before version 3); `holder` the process that made the
-- reservation (`idem_core::Holder`'s stored form; NULL for a row reserved before version 3).
-- `doubt` is the mark of an answer whose outcome is unknown (C8; docs/state-machine.md, "Records
-- in doubt"), `idem_core::reconcile::Doubt::encode`'s bytes, NULL for an answer that is the
-- execution's own; `doubt_check_at` when such a record is next due for a check (ms, the store's
-- clock), NULL whenever `doubt` is.
CREATE TABLE IF NOT EXISTS idem_records (
    consumer    TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       BLOB    NOT NULL,
    state       INTEGER NOT NULL,
    deadline    INTEGER NOT NULL,
    response    BLOB,
    reserved_at INTEGER NOT NULL DEFAULT 0,
    completed_at INTEGER,
    holder      TEXT,
    doubt       BLOB,
    doubt_check_at INTEGER,
    UNIQUE (consumer, route, key)
);
CREATE INDEX IF NOT EXISTS idem_records_deadline ON idem_records (deadline);
-- In-progress rows by age, in the listing's order (so a page reads its rows and stops): a
-- partial index, so it holds only the running reservations and the orphans, never the
-- completed rows.
CREATE INDEX IF NOT EXISTS idem_records_in_progress
    ON idem_records (reserved_at, consumer, route, key) WHERE state = 0;
-- The records of one key across consumers and routes, in the listing's order.
CREATE INDEX IF NOT EXISTS idem_records_key ON idem_records (key, consumer, route);
-- The records in doubt in the listing's order: a partial index, holding only them.
CREATE INDEX IF NOT EXISTS idem_records_in_doubt
    ON idem_records (reserved_at, consumer, route, key) WHERE doubt IS NOT NULL;
-- The audit trail of records in doubt, one row per decision applied
-- (`idem_core::reconcile::Reconciliation`), kept by (consumer, route, key): a released record's
-- trail stays. `at` is when the decision was applied and `kept_until` when the purge may delete
-- the row (ms, the store's clock); `entry` is `Reconciliation::encode`'s bytes; `id` orders a
-- record's entries.
CREATE TABLE IF NOT EXISTS idem_records_reconciliations (
    id          INTEGER PRIMARY KEY,
    consumer    TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    entry       BLOB    NOT NULL,
    kept_until  INTEGER NOT NULL
);
-- A record's trail, read from its newest entry and stopped at a bounded number of rows.
CREATE INDEX IF NOT EXISTS idem_records_reconciliations_record
    ON idem_records_reconciliations (consumer, route, key, id);
-- The purge finds the expired entries through this index, a bounded batch at a time.
CREATE INDEX IF NOT EXISTS idem_records_reconciliations_kept
    ON idem_records_reconciliations (kept_until);
-- Which migrations have been applied, per idem table.
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    table_name TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (table_name, version)
);
-- The table above is at every version up to the current one (applied_at in ms since the Unix
-- epoch); a row already there (the schema applied before) is kept.
-- A version is recorded only if what it made is there, so a statement above that failed (a
-- shell that goes on after an error, on an older table) never records a version it did not
-- reach: opening the store then applies the migrations.
INSERT OR IGNORE INTO idem_schema_migrations (table_name, version, applied_at)
SELECT 'idem_records', 1, CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_deadline');
INSERT OR IGNORE INTO idem_schema_migrations (table_name, version, applied_at)
SELECT 'idem_records', 2, CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'reserved_at')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_in_progress');
INSERT OR IGNORE INTO idem_schema_migrations (table_name, version, applied_at)
SELECT 'idem_records', 3, CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'completed_at')
  AND EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'holder')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_key');
INSERT OR IGNORE INTO idem_schema_migrations (table_name, version, applied_at)
SELECT 'idem_records', 4, CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'doubt')
  AND EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'doubt_check_at')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_in_doubt')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idem_records_reconciliations')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_reconciliations_record')
  AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_reconciliations_kept');
