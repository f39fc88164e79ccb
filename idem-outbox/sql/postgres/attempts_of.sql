SELECT attempt, (extract(epoch FROM started_at) * 1000)::bigint, duration_ms, status, error, response
FROM idem_outbox_attempts
WHERE delivery_id = $1
ORDER BY id
