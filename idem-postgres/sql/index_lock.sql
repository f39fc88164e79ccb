-- One index builder at a time, across processes, for the table $1 (schema-qualified): taken by
-- a READ COMMITTED transaction that stays open, idle, while another connection builds the index
-- CONCURRENTLY (which cannot run in a transaction). A try-lock: a process that finds it taken
-- leaves the build to its holder, and nobody ever waits inside a statement (a waiting
-- statement's snapshot would make the concurrent build wait for it in turn).
SELECT pg_try_advisory_xact_lock(hashtext('idem index ' || $1))
