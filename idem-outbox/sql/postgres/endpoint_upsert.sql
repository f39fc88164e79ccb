INSERT INTO idem_outbox_endpoints (name, url, secrets, timeout_ms, schedule_ms, enabled, failing_since, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, NULL, now())
ON CONFLICT (name) DO UPDATE SET
    url = excluded.url,
    secrets = excluded.secrets,
    timeout_ms = excluded.timeout_ms,
    schedule_ms = excluded.schedule_ms,
    enabled = excluded.enabled,
    failing_since = NULL,
    updated_at = excluded.updated_at
