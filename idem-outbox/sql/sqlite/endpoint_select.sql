SELECT name, url, secrets, timeout_ms, schedule_ms, enabled
FROM idem_outbox_endpoints
WHERE name = ?1
