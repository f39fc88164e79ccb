-- A fresh reservation alone (C4), for a reserve that expects a fresh key
-- (idem_core::store::Claim::expects_fresh: nearly all recent reservations were fresh keys).
-- It writes exactly what reserve.sql's `inserted` writes, under the same two conditions:
-- * no record is visible in the statement's snapshot, so a duplicate never waits for another
--   request's transaction (C5), not even one completing the row;
-- * the gate is open: the record's advisory key ($8) taken shared for this statement, so no
--   one-commit execution (C15) holds the key with its uncommitted reservation (reserve.sql).
-- Otherwise it writes nothing and returns no row, and the engine's next step is reserve.sql,
-- which reports what is there. One INSERT costs the server less than reserve.sql's CTEs
-- (scripts/statement-cost, the `insert_first` side); an answer pays a round trip more, which
-- is why the engine asks for it only while answers are rare. Two-commit reservations only: a
-- one-commit reservation always runs reserve.sql.
-- $1 consumer, $2 route, $3 key, $4 fingerprint, $5 new token, $6 lease in milliseconds, $7 the
-- holder (for operators), $8 the record's lock key. Returns the lease's deadline and when the
-- server started, in milliseconds as reserve.sql computes them; no row when nothing was written.
INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, reserved_at, holder,
                          doubt, doubt_check_at)
SELECT $1, $2, $3, $4, $5, 0, clock.now + $6 * interval '1 millisecond',
       date_trunc('milliseconds', clock.now), $7::text, NULL::bytea, NULL::timestamptz
FROM (SELECT clock_timestamp() AS now) AS clock
WHERE NOT EXISTS (SELECT 1 FROM idem_records WHERE consumer = $1 AND route = $2 AND key = $3)
  AND pg_try_advisory_xact_lock_shared($8::bigint)
ON CONFLICT (consumer, route, key) DO NOTHING
RETURNING floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint AS deadline_ms,
          floor(date_part('epoch', pg_postmaster_start_time()) * 1000 + 0.0005)::bigint AS server_ms
