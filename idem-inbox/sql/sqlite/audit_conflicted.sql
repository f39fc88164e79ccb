-- A delivery with another payload under the same id: counted, the outcome left as it is.
-- ?1 source, ?2 event key.
UPDATE idem_records_inbox_audit
SET conflicts = conflicts + 1
WHERE source = ?1 AND event_key = ?2
