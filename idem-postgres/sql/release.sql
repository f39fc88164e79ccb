-- Fenced release (C8): the holder gives the key back because nothing happened. A row another
-- transaction holds is waited for at most the store's lock deadline (lock_timeout, set by the
-- one-time filter before the row is taken; the store writes its own in place of '3s'): past it the release fails and the record is left to its
-- lease (C13).
-- $1..$3 the record, $4 token.
DELETE FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
  AND (SELECT set_config('lock_timeout', '3s', true)) IS NOT NULL
