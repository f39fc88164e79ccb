-- idem PostgreSQL schema, version 2: when each reservation was made, for operators (`list`,
-- `stats`). `reserved_at` is the server's time (C11) to the millisecond, set by a fresh
-- reservation and by a takeover; 'epoch' for a row written before version 2 (its age is
-- unknown). A constant default: adding the column changes the catalog only, it rewrites nothing,
-- so the table lock it needs is held for a moment (and is only waited for under a short
-- lock_timeout, see PgStore::migrate). The index listings read is built afterwards, without
-- blocking writes: index_in_progress.sql.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS reserved_at timestamptz NOT NULL DEFAULT 'epoch';
