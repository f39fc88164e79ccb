-- The handler's insert, in the transaction that completes the idempotency record.
INSERT INTO charges (id, account, amount, currency, description, created, authorization_id)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
