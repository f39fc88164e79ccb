-- A fresh reservation alone (C4), for a reserve that expects a fresh key
-- (idem_core::store::Claim::expects_fresh: nearly all recent reservations were fresh keys).
-- It writes exactly what reserve.sql's `inserted` writes, under the same two conditions:
-- * no record is visible in the statement's snapshot, so a duplicate never waits for another
--   request's transaction (C5), not even one completing the row (this one-time filter runs
--   before the gate: no lock is taken for a record that is there);
-- * the gate is open, with reserve.sql's locks in reserve.sql's order: a two-commit
--   reservation ($10 false) takes the record's key ($8) shared for this statement; a one-commit
--   one (C15, inside the execution's transaction, at READ COMMITTED only: at REPEATABLE READ
--   this statement would take the transaction's snapshot and reserve.sql, next, would decide on
--   it) takes the fingerprint's key ($9), then the record's, exclusively until that transaction
--   ends. No one-commit execution then holds the key with its uncommitted reservation.
-- Otherwise it writes nothing and returns no row, and the engine's next step is reserve.sql,
-- which reports what is there; the locks this one took are taken again there (they are
-- re-entrant) and tell the same. One INSERT costs the server less than reserve.sql's CTEs
-- (scripts/statement-cost, the `insert_first` side); an answer pays a round trip more, which
-- is why the engine asks for it only while answers are rare.
-- $1 consumer, $2 route, $3 key, $4 fingerprint, $5 new token, $6 lease in milliseconds, $7 the
-- holder (for operators), $8 the record's lock key, $9 the record's and fingerprint's lock key,
-- $10 whether this is a one-commit reservation. Returns the lease's deadline and when the
-- server started, sent as reserve.sql sends instants; no row when nothing was written.
INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, reserved_at, holder,
                          doubt, doubt_check_at)
SELECT $1, $2, $3, $4, $5, 0, clock.now + $6 * interval '1 millisecond',
       date_trunc('milliseconds', clock.now), $7::text, NULL::bytea, NULL::timestamptz
FROM (SELECT clock_timestamp() AS now) AS clock
WHERE NOT EXISTS (SELECT 1 FROM idem_records WHERE consumer = $1 AND route = $2 AND key = $3)
  AND CASE
          WHEN NOT $10::boolean THEN pg_try_advisory_xact_lock_shared($8::bigint)
          WHEN pg_try_advisory_xact_lock($9::bigint) THEN pg_try_advisory_xact_lock($8::bigint)
          ELSE false
      END
ON CONFLICT (consumer, route, key) DO NOTHING
RETURNING timestamptz_send(deadline) AS deadline_at,
          timestamptz_send(pg_postmaster_start_time()) AS server_at
