-- In-progress rows by age, in the listing's order (so a page of pending records reads its rows
-- and stops): a partial index, so it holds only the running reservations and the orphans, never
-- the completed rows. Built CONCURRENTLY, outside any transaction (PgStore::migrate runs it
-- after the migrations commit): reads and writes go on while it is built. To apply the schema
-- from your own migration tool, run this statement outside a transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_in_progress
    ON idem_records (reserved_at, consumer, route, key) WHERE state = 0
