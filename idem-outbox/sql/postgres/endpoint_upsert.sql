-- Registers an endpoint, or replaces the one of that name (its failures forgotten). An
-- endpoint enabled again gets its waiting deliveries due at once: a claim sets those of a
-- disabled endpoint aside for a lease.
WITH previous AS (
    SELECT enabled FROM idem_outbox_endpoints WHERE name = $1 FOR UPDATE
), registered AS (
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
)
UPDATE idem_outbox_deliveries
SET next_at = least(next_at, now()), claimed_until = NULL
WHERE endpoint = $1 AND state = 'pending' AND claim_token IS NULL
  AND (next_at > now() OR claimed_until > now())
  AND $6 AND EXISTS (SELECT FROM previous WHERE NOT enabled)
