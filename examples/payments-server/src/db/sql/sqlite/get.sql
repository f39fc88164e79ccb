SELECT id, amount, currency, description, created, authorization_id
FROM charges WHERE id = ?1 AND account = ?2
