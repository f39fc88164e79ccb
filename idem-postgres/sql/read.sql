-- The record as a reservation reports it, read first (a plain read by primary key: no lock, no
-- write): a replay, an in-flight duplicate and a mismatch are answered by it, and only a fresh
-- or an expired record goes on to reserve.sql or replace_reservation.sql. The response is
-- fetched only for the same fingerprint ($4), as in reserve.sql; the time is the statement's
-- (C11), in milliseconds as reserve.sql computes them.
-- $1..$3 the record, $4 the request's fingerprint. No row: no record. `in_doubt`: whether it
-- carries a mark of doubt (its answer may still change); `server_ms`, when the server started.
SELECT fingerprint, token, state,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       CASE WHEN fingerprint = $4 THEN response END AS response,
       floor(date_part('epoch', clock_timestamp()) * 1000 + 0.0005)::bigint AS now_ms,
       doubt IS NOT NULL AS in_doubt,
       floor(date_part('epoch', pg_postmaster_start_time()) * 1000 + 0.0005)::bigint AS server_ms
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
