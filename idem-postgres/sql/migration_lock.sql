-- One migrator at a time per schema, across processes (creating the schema and the migrations
-- table is not safe to race); released when the transaction ends. $1 the schema.
SELECT pg_advisory_xact_lock(hashtext('idem migrations ' || $1))
