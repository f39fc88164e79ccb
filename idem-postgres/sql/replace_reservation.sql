-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw: it still carries its token ($7), is still in the state the decision saw ($8:
-- 0 = in progress for a takeover, 1 = completed for a start over) and is still expired by the
-- server's clock. A late completion or a renewal moves the state or the deadline, so it is never
-- overwritten. If the old holder's completion is being committed right now, this waits for that
-- commit (the row is locked) and then finds the record changed: 0 rows, the caller re-reads.
-- $1..$3 the record, $4 fingerprint, $5 new token, $6 lease in milliseconds.
UPDATE idem_records
SET fingerprint = $4, token = $5, state = 0, response = NULL,
    deadline = clock_timestamp() + $6 * interval '1 millisecond'
WHERE consumer = $1 AND route = $2 AND key = $3
  AND token = $7 AND state = $8 AND deadline <= clock_timestamp()
RETURNING floor(extract(epoch FROM deadline) * 1000)::bigint AS deadline_ms
