-- Records an attempt's end, only under the claim that made it (a stale claim changes nothing).
UPDATE idem_outbox_deliveries
SET state = ?3, next_at = ?4, claim_token = NULL, last_status = ?5, last_error = ?6,
    finished_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE ?7 END
WHERE id = ?1 AND claim_token = ?2
