-- An operator's new attempt of a message's unclaimed deliveries, due now with a fresh
-- schedule, under the same message id: $2 only dead ones (retry), otherwise any (replay).
UPDATE idem_outbox_deliveries
SET state = 'pending', next_at = now(), claimed_until = NULL, attempts = 0, finished_at = NULL
WHERE message_id = $1 AND claim_token IS NULL AND (NOT $2 OR state = 'dead')
