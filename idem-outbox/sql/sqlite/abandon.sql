-- Ends a claimed delivery dead without an attempt (its row, or its endpoint's, cannot be read,
-- or its endpoint is gone), only under the claim ?2 that took it: ?3 why, at ?4 (ms). No
-- attempt is recorded and no endpoint's health changes.
UPDATE idem_outbox_deliveries
SET state = 'dead', claim_token = NULL, last_error = ?3, finished_at = ?4
WHERE id = ?1 AND claim_token = ?2
