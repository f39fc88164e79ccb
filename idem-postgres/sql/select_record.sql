-- The record as stored, for lookup (no lock, no write).
SELECT fingerprint, token, state,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       response
FROM idem_records
WHERE consumer = $1 AND route = $2 AND key = $3
