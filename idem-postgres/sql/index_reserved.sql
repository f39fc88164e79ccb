-- Records by reservation time, in the in-progress listing's order: what purge reads a bounded
-- window of, oldest first (purge_expired.sql), and the in-progress listing reads in order. On
-- columns the completion never changes, so that it stays a HOT update (migration 5). Built
-- CONCURRENTLY, outside any transaction (PgStore::migrate runs it after the migrations commit):
-- reads and writes go on while it is built. To apply the schema from your own migration tool,
-- run this statement outside a transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_reserved
    ON idem_records (reserved_at, consumer, route, key)
