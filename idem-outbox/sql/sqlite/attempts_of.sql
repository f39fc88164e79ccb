SELECT a.attempt, a.started_at, a.duration_ms, a.status, a.error, a.response
FROM idem_outbox_attempts AS a
WHERE a.delivery_id = ?1
ORDER BY a.id
