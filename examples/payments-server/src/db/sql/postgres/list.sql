SELECT id, amount, currency, description, created, authorization_id
FROM charges WHERE account = $1 ORDER BY seq DESC LIMIT $2
