-- The record a reservation decides on (C5): fingerprint, token, state, deadline, whether a
-- response is stored, and the response itself only for a completed record of the request's
-- fingerprint (?4) or its alternative (?5, C3; ?4 again when it has none), the cases it can
-- be replayed: its replay needs no second read. SQLite reads a column's overflow pages only
-- when its value is needed: typeof() needs only its type (`response IS NULL` would load a 1 MiB
-- body), so a mismatch or an in-flight answer costs the same whatever the stored body's size.
-- Last, whether the record carries a mark of doubt (its answer may still change).
SELECT fingerprint, token, state, deadline, typeof(response) = 'null',
       CASE WHEN state = 1 AND fingerprint IN (?4, ?5) THEN response END,
       doubt IS NOT NULL
FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3
