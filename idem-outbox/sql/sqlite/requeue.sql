-- An operator's new attempt of a message's unclaimed deliveries, due at ?2 with a fresh
-- schedule, under the same message id: ?3 = 1 only dead ones (retry), otherwise any (replay).
UPDATE idem_outbox_deliveries
SET state = 'pending', next_at = ?2, attempts = 0, finished_at = NULL
WHERE message_id = ?1 AND claim_token IS NULL AND (?3 = 0 OR state = 'dead')
