-- Ends claims that made no attempt, each only under the claim $1 that took it, giving the
-- attempt the claim counted back: the schedule counts attempts made. $2 is a JSON array with
-- one object per delivery: `id`, and `error` why it ends dead without an attempt (its row, or
-- its endpoint's, cannot be read, or its endpoint is gone), or NULL: released, set aside for
-- $3 ms (as a disabled endpoint's are: no token, `claimed_until` ahead, its place in the queue
-- kept), so that a claim given back is not claimed again at once. No attempt is recorded and
-- no endpoint's health changes. Returns the deliveries changed.
WITH abandoned AS (
    SELECT *
    FROM json_to_recordset($2::json) AS a(id bigint, error text)
)
UPDATE idem_outbox_deliveries AS d
SET attempts = greatest(d.attempts - 1, 0), claim_token = NULL,
    claimed_until = CASE WHEN a.error IS NULL THEN now() + $3 * interval '1 millisecond' END,
    state = CASE WHEN a.error IS NULL THEN d.state ELSE 'dead' END,
    last_error = coalesce(a.error, d.last_error),
    finished_at = CASE WHEN a.error IS NULL THEN d.finished_at ELSE now() END
FROM abandoned AS a
WHERE d.id = a.id AND d.claim_token = $1
RETURNING d.id
