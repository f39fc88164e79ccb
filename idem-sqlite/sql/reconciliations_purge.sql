-- One bounded batch of audit entries whose keeping passed at ?1 (now), at most ?2; the
-- kept_until index finds them.
DELETE FROM idem_records_reconciliations
WHERE id IN (
    SELECT id FROM idem_records_reconciliations WHERE kept_until <= ?1 LIMIT ?2
)
