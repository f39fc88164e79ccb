-- Run before endpoint_upsert.sql, in its transaction: when the endpoint ?1 is disabled and is
-- registered enabled again (?3 = 1), its waiting deliveries are due at once (?2, ms), as on
-- PostgreSQL. Claimed ones are left to their claim.
UPDATE idem_outbox_deliveries
SET next_at = ?2
WHERE endpoint = ?1 AND state = 'pending' AND claim_token IS NULL AND next_at > ?2
  AND ?3 = 1
  AND EXISTS (SELECT 1 FROM idem_outbox_endpoints WHERE name = ?1 AND enabled = 0)
