-- The charges table beside the idempotency records. A charge's id is derived from its card
-- network authorization's, so one authorization is one row.
CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    description TEXT,
    created INTEGER NOT NULL,
    authorization_id TEXT UNIQUE
);
CREATE INDEX IF NOT EXISTS charges_by_account ON charges (account, seq);
