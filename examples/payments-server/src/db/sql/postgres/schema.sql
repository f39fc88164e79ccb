-- The charges table beside the idempotency records. A charge's id is derived from its card
-- network authorization's, so one authorization is one row. A table made before the card
-- network gets its authorization_id column.
CREATE TABLE IF NOT EXISTS charges (
    seq bigserial PRIMARY KEY,
    id text NOT NULL UNIQUE,
    account text NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    description text,
    created bigint NOT NULL
);
ALTER TABLE charges ADD COLUMN IF NOT EXISTS authorization_id text UNIQUE;
CREATE INDEX IF NOT EXISTS charges_by_account ON charges (account, seq);
