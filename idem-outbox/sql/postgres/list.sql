SELECT id, message_id, endpoint, state, attempts, last_status, last_error
FROM idem_outbox_deliveries
WHERE state = $1
ORDER BY id
LIMIT $2
