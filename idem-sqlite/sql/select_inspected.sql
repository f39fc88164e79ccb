-- The record as stored, for inspect: select_record.sql's columns, then for operators when it was
-- reserved (0 unknown) and completed, and its holder (version 3); the mark of an answer in
-- doubt and when it is next due for a check (version 4).
SELECT fingerprint, token, state, deadline, typeof(response) = 'null', response,
       reserved_at, completed_at, substr(holder, 1, 300), doubt, doubt_check_at
FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3
