-- The inbox's audit trail (idem_core::inbox::Audit): one row per (source, event id), beside the
-- records in `<table>_inbox_audit`. The event id is the sender's, of any bytes and any length:
-- the key is its 32-byte blake3 digest (`event_key`), the original is kept in `event_id`.
-- Times are bigint ms since the Unix epoch, exactly the ones the inbox passes (its clock, not
-- the server's): they round-trip without conversion and compare as integers. `outcome` is
-- AuditOutcome::code (0 received, 1 processed, 2 failed); `processed` is set only with 1.
CREATE TABLE IF NOT EXISTS idem_records_inbox_audit (
    source         text     NOT NULL,
    event_key      bytea    NOT NULL,
    event_id       bytea    NOT NULL,
    first_received bigint   NOT NULL,
    last_received  bigint   NOT NULL,
    processed      bigint,
    deliveries     bigint   NOT NULL,
    conflicts      bigint   NOT NULL,
    outcome        smallint NOT NULL,
    PRIMARY KEY (source, event_key)
)
