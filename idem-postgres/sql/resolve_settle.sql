-- A record in doubt settled (store rule 7): one statement makes the change and keeps its audit
-- entry, so both commit or neither does, without a transaction of its own (it runs behind
-- PgBouncer in transaction mode too). Fenced on a live completed record (deadline after now,
-- one reading of clock_timestamp()) that still carries the token ($4) and exactly the mark the
-- decider read ($5). The real answer ($8) replaces the one in doubt and is replayed until now +
-- $9 ms, never sooner than the record's deadline (a settled key never turns new before it
-- would have); the mark and its check time are cleared; completed_at stays (when the execution's
-- completion landed). A decider that raced another waits for its row (at most the store's lock
-- deadline), then reads it again and finds the mark changed or the row gone: nothing changed,
-- no entry. The entry ($6) is kept at now until now + $7 ms.
-- $1..$3 the record, $4 token, $5 the mark as read, $6 the audit entry, $7 its retention in
-- milliseconds, $8 the encoded response, $9 its retention in milliseconds. Changes one row (the
-- entry) or none (the record changed since it was read).
WITH clock AS (
    SELECT clock_timestamp() AS now
),
changed AS (
    UPDATE idem_records
    SET response = $8, deadline = GREATEST(deadline, clock.now + $9 * interval '1 millisecond'),
        doubt = NULL, doubt_check_at = NULL
    FROM clock
    WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 1
      AND deadline > clock.now AND doubt = $5
    RETURNING consumer, route, key
)
INSERT INTO idem_records_reconciliations (consumer, route, key, at, entry, kept_until)
SELECT changed.consumer, changed.route, changed.key, date_trunc('milliseconds', clock.now), $6,
       clock.now + $7 * interval '1 millisecond'
FROM changed, clock
