-- Ends claimed deliveries dead without an attempt (their row, or their endpoint's, cannot be
-- read, or their endpoint is gone), each only under the claim $1 that took it. $2 is a JSON
-- array with one object per delivery: `id`, `error` why. No attempt is recorded and no
-- endpoint's health changes. Returns the deliveries ended.
WITH abandoned AS (
    SELECT *
    FROM json_to_recordset($2::json) AS a(id bigint, error text)
)
UPDATE idem_outbox_deliveries AS d
SET state = 'dead', claim_token = NULL, claimed_until = NULL, last_error = a.error,
    finished_at = now()
FROM abandoned AS a
WHERE d.id = a.id AND d.claim_token = $1
RETURNING d.id
