-- The record as stored, for lookup (no lock, no write).
SELECT fingerprint, token, state,
       timestamptz_send(deadline) AS deadline_at,
       response
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
