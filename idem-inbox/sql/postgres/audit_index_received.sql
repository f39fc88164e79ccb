-- Purge finds the oldest entries of every source through this index, a bounded batch at a time.
CREATE INDEX IF NOT EXISTS idem_records_inbox_audit_received
ON idem_records_inbox_audit (first_received)
