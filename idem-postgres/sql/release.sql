-- Fenced release (C8): the holder gives the key back because nothing happened.
DELETE FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
