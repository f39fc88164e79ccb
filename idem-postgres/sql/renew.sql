-- Fenced heartbeat (C9): the lease runs again from this statement's moment. A row another
-- transaction holds is waited for at most a quarter of the store's lock deadline (lock_timeout,
-- set by the one-time filter before the row is taken; the store writes its own in place of
-- '3s'): past it this beat gives up and the next one tries again.
-- $1..$3 the record, $4 token, $5 lease in milliseconds.
UPDATE idem_records
SET deadline = clock_timestamp() + $5 * interval '1 millisecond'
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
  AND (SELECT set_config('lock_timeout', '3s', true)) IS NOT NULL
RETURNING timestamptz_send(deadline) AS deadline_at
