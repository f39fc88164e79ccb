-- idem SQLite schema, version 4, second step: when a record in doubt is next due for a check,
-- in ms since the Unix epoch by the store's clock (the completion's time, then as each deferral
-- says); NULL whenever `doubt` is.
ALTER TABLE idem_records ADD COLUMN doubt_check_at INTEGER;
