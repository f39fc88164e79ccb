-- A delivery: the first creates the entry (received, one delivery), the others count; the last
-- delivery's time only moves forward. The event id (?3) is written once, never again.
-- ?1 source, ?2 event key, ?3 event id, ?4 received at (ms).
INSERT INTO idem_records_inbox_audit
    (source, event_key, event_id, first_received, last_received, processed, deliveries, conflicts, outcome)
VALUES (?1, ?2, ?3, ?4, ?4, NULL, 1, 0, 0)
ON CONFLICT (source, event_key) DO UPDATE
SET deliveries = deliveries + 1,
    last_received = max(last_received, excluded.last_received)
