ALTER TABLE charges ADD COLUMN authorization_id TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS charges_by_authorization ON charges (authorization_id);
