-- When the oldest pending delivery was enqueued (ms), NULL when none is.
SELECT min(created_at) FROM idem_outbox_deliveries WHERE state = 'pending'
