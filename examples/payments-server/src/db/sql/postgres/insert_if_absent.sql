-- The reconciler's insert: a second pass over the same authorization (after a crash between
-- this insert and the settlement) inserts nothing.
INSERT INTO charges (id, account, amount, currency, description, created, authorization_id)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO NOTHING
