-- The record a reservation decides on (C5): fingerprint, token, state, deadline, whether a
-- response is stored, and the response itself only for a completed record of the same
-- fingerprint (?4), the one case it can be replayed. SQLite reads a column's overflow pages only
-- when its value is needed: typeof() needs only its type (`response IS NULL` would load a 1 MiB
-- body), so a mismatch or an in-flight answer costs the same whatever the stored body's size.
-- Last, whether the record carries a mark of doubt (its answer may still change).
SELECT fingerprint, token, state, deadline, typeof(response) = 'null',
       CASE WHEN state = 1 AND fingerprint = ?4 THEN response END,
       doubt IS NOT NULL
FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3
