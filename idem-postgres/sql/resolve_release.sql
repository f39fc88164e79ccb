-- A record in doubt released (store rule 7, C8): its effect did not happen, the key is given
-- back. Fenced and audited in one statement like resolve_settle.sql: a live completed record
-- that still carries the token ($4) and exactly the mark read ($5) is deleted, and the entry
-- ($6) kept at now until now + $7 ms; the trail outlives the record.
-- $1..$3 the record, $4 token, $5 the mark as read, $6 the audit entry, $7 its retention in
-- milliseconds. Changes one row (the entry) or none (the record changed since it was read).
WITH clock AS (
    SELECT clock_timestamp() AS now
),
changed AS (
    DELETE FROM idem_records
    USING clock
    WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 1
      AND deadline > clock.now AND doubt = $5
    RETURNING consumer, route, key
)
INSERT INTO idem_records_reconciliations (consumer, route, key, at, entry, kept_until)
SELECT changed.consumer, changed.route, changed.key, date_trunc('milliseconds', clock.now), $6,
       clock.now + $7 * interval '1 millisecond'
FROM changed, clock
