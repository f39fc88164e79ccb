-- The in-progress index (partial, on `state`) of schema versions 2 to 4, and one left INVALID by
-- an interrupted build: dropped without blocking traffic once idem_records_reserved is valid
-- (an index whose predicate reads `state` makes every completion a non-HOT update).
DROP INDEX CONCURRENTLY IF EXISTS idem_schema.idem_records_in_progress
