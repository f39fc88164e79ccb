-- idem PostgreSQL schema, version 6: no CHECK on `state`. PostgreSQL parses and plans a table's
-- CHECK expressions again in every INSERT and UPDATE (they are not part of the cached plan), so
-- `CHECK (state IN (0, 1))` of version 1 cost every reservation and every completion about a
-- tenth of its time on the server (scripts/statement-cost). Only the store writes `state`, 0 or
-- 1, and every read decodes any other value as a corrupt record (row.rs), so the constraint
-- guarded nothing the store does not. It is found by its column and PostgreSQL's generated name
-- (`<table>_state_check`), whatever the table is called; dropping it changes the catalog only.
DO $$
DECLARE
    name text;
BEGIN
    FOR name IN
        SELECT c.conname
        FROM pg_constraint c
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'state'
        WHERE c.conrelid = 'idem_records'::regclass
          AND c.contype = 'c'
          AND c.conkey = ARRAY[a.attnum]
          AND c.conname LIKE '%state_check'
    LOOP
        EXECUTE format('ALTER TABLE idem_records DROP CONSTRAINT %I', name);
    END LOOP;
END
$$;
