-- A charge's insert, the handler's (in the transaction that completes the idempotency record)
-- and the reconciler's: the id is the authorization's, so a second insert of one authorization
-- inserts nothing (a reconciler's pass again after a crash between its insert and the
-- settlement; the handler run again after a release the reconciler's settlement lost to).
INSERT INTO charges (id, account, amount, currency, description, created, authorization_id)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO NOTHING
