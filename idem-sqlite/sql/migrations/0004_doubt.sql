-- idem SQLite schema, version 4: records in doubt (docs/state-machine.md, "Records in doubt").
-- `doubt` is the mark of an answer whose outcome is unknown (C8), in the stored form of
-- `idem_core::reconcile::Doubt::encode`, written by a completion in doubt and changed only by a
-- fenced decision; NULL for an answer that is the execution's own, in progress, and for every
-- row written before version 4. SQLite has no ADD COLUMN IF NOT EXISTS: the store runs this step
-- only when the column is missing.
ALTER TABLE idem_records ADD COLUMN doubt BLOB;
