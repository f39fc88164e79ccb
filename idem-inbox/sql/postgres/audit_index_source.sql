-- A source's entries by first delivery, in the order query returns them: with `event_key` in
-- the index, `ORDER BY first_received, event_key LIMIT n` reads n entries and sorts nothing.
CREATE INDEX IF NOT EXISTS idem_records_inbox_audit_source
ON idem_records_inbox_audit (source, first_received, event_key)
