-- A record in doubt still unknown (store rule 7): the answer in doubt stays, the mark becomes $8
-- (one more attempt) and the record is due again at now + $9 ms (to the millisecond, like every
-- time the table keeps for operators). Fenced and audited in one statement like
-- resolve_settle.sql: a live completed record that still carries the token ($4) and exactly the
-- mark read ($5); the entry ($6) is kept at now until now + $7 ms.
-- $1..$3 the record, $4 token, $5 the mark as read, $6 the audit entry, $7 its retention in
-- milliseconds, $8 the new mark, $9 the delay in milliseconds. Changes one row (the entry) or
-- none (the record changed since it was read).
WITH clock AS (
    SELECT clock_timestamp() AS now
),
changed AS (
    UPDATE idem_records
    SET doubt = $8,
        doubt_check_at = date_trunc('milliseconds', clock.now + $9 * interval '1 millisecond')
    FROM clock
    WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 1
      AND deadline > clock.now AND doubt = $5
    RETURNING consumer, route, key
)
INSERT INTO idem_records_reconciliations (consumer, route, key, at, entry, kept_until)
SELECT changed.consumer, changed.route, changed.key, date_trunc('milliseconds', clock.now), $6,
       clock.now + $7 * interval '1 millisecond'
FROM changed, clock
