-- Reserve in one round trip (C4, C5): the current record, or a fresh reservation when there is
-- none. Never SELECT-then-INSERT from the application: this one statement does both.
--
-- * `existing` reads the record from the statement's snapshot without taking any lock, so a
--   duplicate never waits for another request's business transaction, not even one that has
--   already run its completion UPDATE on this row and not committed yet: it sees the record as
--   committed (in progress) and is answered in flight at once.
-- * `gate` (only when no row is visible) keeps a fresh reservation from ever waiting on one
--   that is not committed yet: a one-commit execution (C15) inserts its reservation inside its
--   own transaction, and an INSERT .. ON CONFLICT on that key would wait for it. Every fresh
--   reservation first takes transaction-scoped advisory locks on two keys computed by the
--   store: $8, the record's, and $9, the record's with the fingerprint. A two-commit
--   reservation ($10 false, an autocommit statement: its locks last for this statement only)
--   takes the record's key shared, so two-commit reservations never keep each other out; not
--   taken, a one-commit execution holds the record: the same fingerprint's key tells whether it
--   is this request ('held_same': in flight) or another body ('held_other': mismatch, C3),
--   once the record's key is tried again: taken then, the holder ended between the two tries
--   (a holder of this request's fingerprint would otherwise read as another body), and the
--   insert decides, or finds the row it committed (then neither: read again). A
--   one-commit reservation ($10 true, inside the execution's transaction: its locks last until
--   COMMIT or ROLLBACK) takes the fingerprint's key exclusively first (not taken: the same
--   request is being executed), then the record's key exclusively (taken: it inserts); not
--   taken, the record's key shared tells two-commit reservations in their statement right now
--   (in flight) from a one-commit execution of another body (mismatch). The locks are tried,
--   never waited for, and in this order: nested CASE expressions, evaluated in order, in one
--   CTE.
-- * `inserted` writes a fresh in-progress row, not in doubt (store rule 6), only when no row is
--   visible and the gate is open; the primary key decides a race with a concurrent reservation
--   (ON CONFLICT DO NOTHING). A row committed after this statement's snapshot (read committed)
--   shows up as neither: the caller runs the statement again, and then reads it.
-- * The response is fetched only for the request's fingerprint or its alternative ($11, C3: the
--   only cases it can be replayed, the alternative's from this one step, never a step written
--   under it), so a mismatch or an in-flight answer costs the same whatever the stored body's
--   size.
-- * Time is the server's (C11): clock_timestamp() is the moment this statement runs, and the
--   reservation's time (reserved_at, to the millisecond) for operators. An instant the engine
--   decides on is sent as `timestamptz_send(t)`, its 8-byte binary form (microseconds since
--   2000-01-01) in either protocol: the server converts nothing, where computing milliseconds
--   (`floor(date_part('epoch', t) * 1000 + 0.0005)`) cost a read a sixth of its server
--   instructions; the store turns it into milliseconds (src/row.rs, `instant`).
--
-- $1 consumer, $2 route, $3 key, $4 fingerprint, $5 new token, $6 lease in milliseconds, $7 the
-- holder (the reserving process, for operators; never part of a decision), $8 the record's lock
-- key, $9 the record's and fingerprint's lock key, $10 whether this is a one-commit reservation,
-- $11 the request's alternative fingerprint ($4 again when it has none).
-- Returns one row: source ('existing', 'inserted', 'held_same' or 'held_other'), the record's
-- columns (NULL for a held record), now, whether the record carries a mark of doubt, and when
-- the server started (another server, or a restart: what this connection acknowledged before
-- may be gone; the store's generation moves).
WITH clock AS (
    SELECT clock_timestamp() AS now,
           timestamptz_send(pg_postmaster_start_time()) AS server_at
),
existing AS (
    SELECT fingerprint, token, state, deadline,
           CASE WHEN fingerprint IN ($4, $11) THEN response END AS response,
           doubt IS NOT NULL AS in_doubt
    FROM idem_records
    WHERE consumer = $1 AND route = $2 AND key = $3
),
gate AS (
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM existing) THEN 'open'
        WHEN NOT $10::boolean THEN
            CASE
                WHEN pg_try_advisory_xact_lock_shared($8::bigint) THEN 'open'
                WHEN NOT pg_try_advisory_xact_lock_shared($9::bigint) THEN 'held_same'
                WHEN pg_try_advisory_xact_lock_shared($8::bigint) THEN 'open'
                ELSE 'held_other'
            END
        ELSE
            CASE
                WHEN NOT pg_try_advisory_xact_lock($9::bigint) THEN 'held_same'
                WHEN pg_try_advisory_xact_lock($8::bigint) THEN 'open'
                WHEN pg_try_advisory_xact_lock_shared($8::bigint) THEN 'held_same'
                ELSE 'held_other'
            END
    END AS verdict
),
inserted AS (
    INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, reserved_at, holder,
                              doubt, doubt_check_at)
    SELECT $1, $2, $3, $4, $5, 0, clock.now + $6 * interval '1 millisecond',
           date_trunc('milliseconds', clock.now), $7::text, NULL::bytea, NULL::timestamptz
    FROM clock, gate
    WHERE gate.verdict = 'open' AND NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (consumer, route, key) DO NOTHING
    RETURNING fingerprint, token, state, deadline, response
)
SELECT 'existing' AS source, e.fingerprint, e.token, e.state,
       timestamptz_send(e.deadline) AS deadline_at,
       e.response,
       timestamptz_send(c.now) AS now_at,
       e.in_doubt, c.server_at
FROM existing e, clock c
UNION ALL
SELECT 'inserted', i.fingerprint, i.token, i.state,
       timestamptz_send(i.deadline),
       i.response,
       timestamptz_send(c.now),
       false, c.server_at
FROM inserted i, clock c
UNION ALL
SELECT g.verdict, NULL::bytea, NULL::bytea, NULL::smallint, NULL::bytea, NULL::bytea,
       timestamptz_send(c.now), false, c.server_at
FROM gate g, clock c
WHERE g.verdict <> 'open'
