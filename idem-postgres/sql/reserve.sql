-- Reserve in one round trip (C4, C5): the current record, or a fresh reservation when there is
-- none. Never SELECT-then-INSERT from the application: this one statement does both.
--
-- * `existing` reads the record from the statement's snapshot without taking any lock, so a
--   duplicate never waits for another request's business transaction, not even one that has
--   already run its completion UPDATE on this row and not committed yet: it sees the record as
--   committed (in progress) and is answered in flight at once.
-- * `inserted` writes a fresh in-progress row only when no row is visible; the primary key
--   decides a race with a concurrent reservation (ON CONFLICT DO NOTHING). A row committed after
--   this statement's snapshot (read committed) shows up as neither: the caller runs the
--   statement again, and then reads it.
-- * The response is fetched only for the same fingerprint (the only case it can be replayed), so
--   a mismatch or an in-flight answer costs the same whatever the stored body's size.
-- * Time is the server's (C11): clock_timestamp() is the moment this statement runs, and the
--   reservation's time (reserved_at, to the millisecond) for operators.
--
-- $1 consumer, $2 route, $3 key, $4 fingerprint, $5 new token, $6 lease in milliseconds, $7 the
-- holder (the reserving process, for operators; never part of a decision).
-- Returns one row: source ('existing' or 'inserted'), the record's columns, and now.
WITH clock AS (
    SELECT clock_timestamp() AS now
),
existing AS (
    SELECT fingerprint, token, state, deadline,
           CASE WHEN fingerprint = $4 THEN response END AS response
    FROM idem_records
    WHERE consumer = $1 AND route = $2 AND key = $3
),
inserted AS (
    INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, reserved_at, holder)
    SELECT $1, $2, $3, $4, $5, 0, clock.now + $6 * interval '1 millisecond',
           date_trunc('milliseconds', clock.now), $7::text
    FROM clock
    WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (consumer, route, key) DO NOTHING
    RETURNING fingerprint, token, state, deadline, response
)
SELECT 'existing' AS source, e.fingerprint, e.token, e.state,
       CASE WHEN isfinite(e.deadline) THEN floor(extract(epoch FROM e.deadline) * 1000)::bigint END AS deadline_ms,
       e.response,
       floor(extract(epoch FROM c.now) * 1000)::bigint AS now_ms
FROM existing e, clock c
UNION ALL
SELECT 'inserted', i.fingerprint, i.token, i.state,
       floor(extract(epoch FROM i.deadline) * 1000)::bigint,
       i.response,
       floor(extract(epoch FROM c.now) * 1000)::bigint
FROM inserted i, clock c
