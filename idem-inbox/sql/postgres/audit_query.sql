-- A source's entries first received in [$2, $3), oldest first (ties by event key, a stable
-- order), at most $4, through the source index.
SELECT event_id, first_received, last_received, processed, deliveries, conflicts, outcome
FROM idem_records_inbox_audit
WHERE source = $1 AND first_received >= $2 AND first_received < $3
ORDER BY first_received, event_key
LIMIT $4
