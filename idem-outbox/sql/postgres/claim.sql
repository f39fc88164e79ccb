-- Claims up to $3 due deliveries of enabled endpoints for $2 ms under the token $1, skipping
-- those another dispatcher holds or is claiming: a claim that runs out makes its delivery due
-- again. A due delivery of a disabled endpoint is set aside for $2 ms instead (not claimed, no
-- attempt counted; returned with `enabled` false), so it never blocks the others. One whose
-- endpoint is gone (its row deleted by hand) is claimed, returned with `enabled` NULL: the
-- dispatcher ends it dead, so it never fills the claims either.
--
-- It writes no indexed column (the token, the lease's end, the attempt count), so each row's
-- update is HOT: no index entry, the due time kept.
--
-- Shaped so its plan does not hang on the planner's statistics: the inner query reads the due
-- index in `next_at` order up to now, and stops at $3 rows whatever it believes about the
-- table; the rows held are passed over on the way, and the endpoint is looked up (by its key)
-- for the rows taken only. (With a join to the endpoints inside, missing or stale statistics
-- made it read and sort every pending row.)
UPDATE idem_outbox_deliveries AS d
SET claim_token = CASE WHEN (SELECT e.enabled FROM idem_outbox_endpoints AS e
                             WHERE e.name = d.endpoint) IS NOT FALSE THEN $1 END,
    claimed_until = now() + $2 * interval '1 millisecond',
    attempts = d.attempts + CASE WHEN (SELECT e.enabled FROM idem_outbox_endpoints AS e
                                       WHERE e.name = d.endpoint) IS NOT FALSE THEN 1 ELSE 0 END
WHERE d.id = ANY (ARRAY(
        SELECT due.id
        FROM idem_outbox_deliveries AS due
        WHERE due.state = 'pending' AND due.next_at <= now()
          AND (due.claimed_until IS NULL OR due.claimed_until <= now())
        ORDER BY due.next_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ))
RETURNING d.id, d.message_id, d.endpoint, d.payload, d.content_type, d.headers, d.attempts,
          (SELECT e.enabled FROM idem_outbox_endpoints AS e WHERE e.name = d.endpoint)
