-- idem SQLite schema, version 3, third step: the records of one key across consumers and routes
-- (`idem inspect KEY`), in the listing's order (consumer, route), so a lookup by key reads its
-- rows and stops. The primary key leads with the consumer, so it cannot serve it.
CREATE INDEX IF NOT EXISTS idem_records_key ON idem_records (key, consumer, route);
