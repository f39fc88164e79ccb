-- idem PostgreSQL schema, version 6: no CHECK on `state`. PostgreSQL parses and plans a table's
-- CHECK expressions again in every INSERT and UPDATE (they are not part of the cached plan), so
-- `CHECK (state IN (0, 1))` of version 1 cost every reservation and every completion about a
-- tenth of its time on the server (scripts/statement-cost). Only the store writes `state`, 0 or
-- 1, and every read decodes any other value as a corrupt record (row.rs), so the constraint
-- guarded nothing the store does not. It is dropped by the name PostgreSQL gave it,
-- `<table>_state_check` (never cut: a table name has at most 47 bytes), so a constraint of your
-- own on the column stays; dropping it changes the catalog only.
ALTER TABLE idem_records DROP CONSTRAINT IF EXISTS idem_records_state_check;
