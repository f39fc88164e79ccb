-- The record once no transaction holds it (classifying a commit whose answer was lost, C8):
-- FOR SHARE waits for a transaction that is committing or rolling back the row and then reads
-- what it left; the caller bounds the wait with SET LOCAL lock_timeout, past which the outcome
-- stays in doubt. Reads only: the share lock ends with this statement's transaction. A
-- one-commit execution's fresh row is invisible until it commits (nothing to lock): the caller
-- first waits, in the same transaction, for the record's gate lock (src/gate.rs).
SELECT fingerprint, token, state,
       timestamptz_send(deadline) AS deadline_at,
       response
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
FOR SHARE
