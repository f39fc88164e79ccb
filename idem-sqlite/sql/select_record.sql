-- The record as stored, for lookup: the same columns as decide_record.sql, the response always.
SELECT fingerprint, token, state, deadline, typeof(response) = 'null', response
FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3
