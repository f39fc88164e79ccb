-- ?2 = 1: the attempt succeeded (the endpoint changes only when it was failing); otherwise the
-- endpoint fails since its first failure, and is disabled once that is ?4 ms before now (?3).
UPDATE idem_outbox_endpoints
SET failing_since = CASE WHEN ?2 = 1 THEN NULL ELSE coalesce(failing_since, ?3) END,
    enabled = CASE WHEN ?2 = 0 AND coalesce(failing_since, ?3) <= ?3 - ?4 THEN 0 ELSE enabled END
WHERE name = ?1 AND (?2 = 0 OR failing_since IS NOT NULL)
