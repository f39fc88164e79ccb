-- The deadline index of schema version 1, which purge read before version 5: dropped without
-- blocking traffic once idem_records_reserved is valid (an index on the deadline makes every
-- completion a non-HOT update).
DROP INDEX CONCURRENTLY IF EXISTS idem_schema.idem_records_deadline
