-- The charges table as it was before the card network (a test fixture: a file made by an
-- older server gets its authorization_id column on open).
CREATE TABLE charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    description TEXT,
    created INTEGER NOT NULL
);
INSERT INTO charges (id, account, amount, currency, description, created)
VALUES ('ch_old', 'acct_1', 100, 'usd', NULL, 1700000000);
