SELECT id, message_id, endpoint, state, attempts, last_status, last_error
FROM idem_outbox_deliveries
WHERE message_id = $1
ORDER BY endpoint
