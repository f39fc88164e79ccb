-- The audit trail of one (consumer, route, key) (Operator rule 4): its entries kept past now, the
-- newest $4 of them, oldest first, read backwards along the trail's index
-- (idem_records_trail_record) and stopped. `at` to the millisecond, as written.
-- $1..$3 the record, $4 the most entries.
SELECT at_ms, entry
FROM (
    SELECT id, round(extract(epoch FROM at) * 1000)::bigint AS at_ms, entry
    FROM idem_records_reconciliations
    WHERE consumer = $1 AND route = $2 AND key = $3 AND kept_until > (SELECT clock_timestamp())
    ORDER BY id DESC
    LIMIT $4
) AS newest
ORDER BY id
