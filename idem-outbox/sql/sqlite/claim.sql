-- Claims up to ?4 due deliveries of endpoints not disabled for ?3 ms under the token ?1 at ?2
-- (ms): a claim that runs out makes its delivery due again. One whose endpoint is gone (its row
-- deleted by hand), or whose `enabled` is neither 0 nor 1 (written by hand), is claimed too:
-- the dispatcher ends it dead, as on PostgreSQL (`IS NOT FALSE`), never pending forever.
UPDATE idem_outbox_deliveries
SET claim_token = ?1, next_at = ?2 + ?3, attempts = attempts + 1
WHERE id IN (
    SELECT d.id
    FROM idem_outbox_deliveries AS d
    LEFT JOIN idem_outbox_endpoints AS e ON e.name = d.endpoint
    WHERE d.state = 'pending' AND d.next_at <= ?2 AND (e.name IS NULL OR e.enabled IS NOT 0)
    ORDER BY d.next_at
    LIMIT ?4
)
RETURNING id, message_id, endpoint, payload, content_type, headers, attempts
