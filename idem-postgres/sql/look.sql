-- What a reservation of the record would find, writing nothing and taking no lock (C5, C15):
-- asked by a one-commit reservation that has waited a few milliseconds for a connection for its
-- transaction, every one still taken, so that a duplicate is answered at once on a connection no
-- effect holds.
-- The committed record as reserve.sql reads it; with none, whether a one-commit execution holds
-- the key, seen in `pg_locks` rather than by trying the gate's locks: a look that held the
-- record's key, even shared and for its statement only, would make a fresh one-commit
-- reservation of the key at that moment answer "in flight" for an execution nobody runs
-- (reserve.sql takes a shared holder for a two-commit reservation about to insert). A
-- one-commit execution holds the record's key ($6) exclusively until it ends, and the
-- fingerprint's ($7) when it runs this request: 'held_same' (in flight), else 'held_other'
-- (mismatch, C3). A bigint advisory key shows as its high and low 32 bits (classid, objid)
-- with objsubid 1, in this database. Reading pg_locks costs a pass over the lock table: the
-- look is for the busy case only. The response is fetched for the request's fingerprint ($4)
-- or its alternative ($5); the time is the statement's (C11).
-- $1..$3 the record, $4 the request's fingerprint, $5 its alternative ($4 again when it has
-- none), $6 the record's lock key, $7 the record's and fingerprint's lock key.
-- Returns reserve.sql's columns: source ('existing', 'held_same' or 'held_other'); no row: no
-- record and no holder.
WITH clock AS (
    SELECT clock_timestamp() AS now,
           timestamptz_send(pg_postmaster_start_time()) AS server_at
),
existing AS (
    SELECT fingerprint, token, state, deadline,
           CASE WHEN fingerprint IN ($4, $5) THEN response END AS response,
           doubt IS NOT NULL AS in_doubt
    FROM idem_records
    WHERE consumer = $1 AND route = $2 AND key = $3
),
held AS (
    SELECT bool_or(l.classid = (($6::bigint >> 32) & 4294967295)::oid
                   AND l.objid = ($6::bigint & 4294967295)::oid) AS record,
           bool_or(l.classid = (($7::bigint >> 32) & 4294967295)::oid
                   AND l.objid = ($7::bigint & 4294967295)::oid) AS same
    FROM pg_locks l
    WHERE NOT EXISTS (SELECT 1 FROM existing)
      AND l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT 'existing' AS source, e.fingerprint, e.token, e.state,
       timestamptz_send(e.deadline) AS deadline_at,
       e.response,
       timestamptz_send(c.now) AS now_at,
       e.in_doubt, c.server_at
FROM existing e, clock c
UNION ALL
SELECT CASE WHEN h.same THEN 'held_same' ELSE 'held_other' END, NULL::bytea, NULL::bytea,
       NULL::smallint, NULL::bytea, NULL::bytea, timestamptz_send(c.now), false, c.server_at
FROM held h, clock c
WHERE h.record
