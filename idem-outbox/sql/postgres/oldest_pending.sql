-- How long ago the oldest pending delivery was enqueued (ms), NULL when none is.
SELECT (extract(epoch FROM now() - min(created_at)) * 1000)::bigint
FROM idem_outbox_deliveries
WHERE state = 'pending'
