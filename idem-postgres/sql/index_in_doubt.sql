-- Records in doubt by age, in the in-doubt listing's order (so a reconciler's page reads its rows
-- and stops): a partial index, so it holds only the records carrying a mark, never the others.
-- Built CONCURRENTLY, outside any transaction (PgStore::migrate runs it after the migrations
-- commit): reads and writes go on while it is built. To apply the schema from your own
-- migration tool, run this statement outside a transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_in_doubt
    ON idem_records (reserved_at, consumer, route, key) WHERE doubt IS NOT NULL
