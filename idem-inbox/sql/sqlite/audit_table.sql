-- The inbox's audit trail (idem_core::inbox::Audit): one row per (source, event id), beside the
-- records in `<table>_inbox_audit`. The event id is the sender's, of any bytes and any length:
-- the key is its 32-byte blake3 digest (`event_key`), the original is kept in `event_id`.
-- Times are in ms since the Unix epoch, as the inbox passes them; `outcome` is
-- AuditOutcome::code (0 received, 1 processed, 2 failed), and `processed` is set only with 1.
CREATE TABLE IF NOT EXISTS idem_records_inbox_audit (
    source         TEXT    NOT NULL,
    event_key      BLOB    NOT NULL,
    event_id       BLOB    NOT NULL,
    first_received INTEGER NOT NULL,
    last_received  INTEGER NOT NULL,
    processed      INTEGER,
    deliveries     INTEGER NOT NULL,
    conflicts      INTEGER NOT NULL,
    outcome        INTEGER NOT NULL,
    PRIMARY KEY (source, event_key)
)
