-- Fenced heartbeat (C9): the lease runs again from this statement's moment.
-- $1..$3 the record, $4 token, $5 lease in milliseconds.
UPDATE idem_records
SET deadline = clock_timestamp() + $5 * interval '1 millisecond'
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
RETURNING CASE WHEN isfinite(deadline) THEN floor(extract(epoch FROM deadline) * 1000)::bigint END AS deadline_ms
