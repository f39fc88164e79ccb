SELECT fingerprint, token, state, deadline, response
FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3
