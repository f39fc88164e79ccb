-- The record as stored, for inspect (no lock, no write): select_record.sql's columns, then for
-- operators when it was reserved ('epoch' unknown) and completed, and its holder (version 3),
-- and the mark of an answer in doubt with its next check time (version 4).
-- `lookup` keeps to select_record.sql, so it reads a table a migration has not reached yet.
-- An operator's instant out of every range (infinity: a hand-made row) reads as NULL, unknown.
SELECT fingerprint, token, state,
       timestamptz_send(deadline) AS deadline_at,
       response,
       CASE WHEN isfinite(reserved_at) THEN round(extract(epoch FROM reserved_at) * 1000)::bigint END AS reserved_ms,
       CASE WHEN isfinite(completed_at) THEN round(extract(epoch FROM completed_at) * 1000)::bigint END AS completed_ms,
       substr(holder, 1, 300) AS holder,
       doubt, CASE WHEN isfinite(doubt_check_at) THEN round(extract(epoch FROM doubt_check_at) * 1000)::bigint END AS doubt_check_ms
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
