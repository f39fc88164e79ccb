-- Claims up to $3 due deliveries of enabled endpoints for $2 ms under the token $1, skipping
-- those another dispatcher is claiming: a claim that runs out makes its delivery due again.
-- A due delivery of a disabled endpoint is set aside for $2 ms instead (not claimed, no
-- attempt counted; returned with `enabled` false), so it never blocks the others.
--
-- Shaped so its plan does not hang on the planner's statistics: the inner query has only the
-- due index's own predicate, so the planner walks that index in `next_at` order and stops at
-- $3 rows whatever it believes about the table; the due time and the endpoint are checked on
-- those rows only. (With the due time and a join to the endpoints inside, missing or stale
-- statistics made it read and sort every pending row.) Rows are taken in due order, so a
-- row that is not due yet comes after every due one.
UPDATE idem_outbox_deliveries AS d
SET claim_token = CASE WHEN e.enabled THEN $1 END,
    next_at = now() + $2 * interval '1 millisecond',
    attempts = d.attempts + CASE WHEN e.enabled THEN 1 ELSE 0 END
FROM idem_outbox_endpoints AS e
WHERE d.id = ANY (ARRAY(
        SELECT due.id
        FROM idem_outbox_deliveries AS due
        WHERE due.state = 'pending'
        ORDER BY due.next_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ))
  AND d.next_at <= now()
  AND e.name = d.endpoint
RETURNING d.id, d.message_id, d.endpoint, d.payload, d.content_type, d.headers, d.attempts,
          e.enabled
