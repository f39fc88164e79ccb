INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
SELECT id, attempts, ?2, ?3, ?4, ?5, ?6 FROM idem_outbox_deliveries WHERE id = ?1
