-- Ends a claim that made no attempt, only under the claim ?2 that took it, giving the attempt
-- the claim counted back: the schedule counts attempts made. ?3 is why it ends dead without an
-- attempt (its row, or its endpoint's, cannot be read, or its endpoint is gone), or NULL:
-- released, due again at ?5 (ms), after a pause, so that a claim given back is not claimed
-- again at once; ?4 is now (ms). No attempt is recorded and no endpoint's health changes.
UPDATE idem_outbox_deliveries
SET attempts = max(attempts - 1, 0), claim_token = NULL,
    next_at = CASE WHEN ?3 IS NULL THEN ?5 ELSE ?4 END,
    state = CASE WHEN ?3 IS NULL THEN state ELSE 'dead' END,
    last_error = coalesce(?3, last_error),
    finished_at = CASE WHEN ?3 IS NULL THEN finished_at ELSE ?4 END
WHERE id = ?1 AND claim_token = ?2
