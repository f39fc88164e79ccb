-- The record as a reservation reports it, read first (a plain read by primary key: no lock, no
-- write): a replay, an in-flight duplicate and a mismatch are answered by it, and only a fresh
-- or an expired record goes on to reserve.sql or replace_reservation.sql. The response is
-- fetched only for the request's fingerprint ($4) or its alternative ($5), as in reserve.sql;
-- the time is the statement's (C11). Instants are sent as reserve.sql sends them.
-- $1..$3 the record, $4 the request's fingerprint, $5 its alternative (C3; $4 again when it
-- has none). No row: no record. `in_doubt`: whether it
-- carries a mark of doubt (its answer may still change); `server_at`, when the server started.
SELECT fingerprint, token, state,
       timestamptz_send(deadline) AS deadline_at,
       CASE WHEN fingerprint IN ($4, $5) THEN response END AS response,
       timestamptz_send(clock_timestamp()) AS now_at,
       doubt IS NOT NULL AS in_doubt,
       timestamptz_send(pg_postmaster_start_time()) AS server_at
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
