-- The records of one key across consumers and routes (`idem inspect KEY`), in the listing's
-- order (consumer, route), so a lookup by key reads its rows and stops: the primary key leads
-- with the consumer and cannot serve it. Built CONCURRENTLY, outside any transaction
-- (PgStore::migrate runs it after the migrations commit): reads and writes go on while it is
-- built. To apply the schema from your own migration tool, run this statement outside a
-- transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_key
    ON idem_records (key, consumer, route)
