-- A reservation-time index left INVALID by an interrupted concurrent build: dropped without
-- blocking traffic, so that index_reserved.sql builds it again.
DROP INDEX CONCURRENTLY IF EXISTS idem_schema.idem_records_reserved
